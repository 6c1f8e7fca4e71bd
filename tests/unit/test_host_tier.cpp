// The host tier controller in one process (an agreement of one rank), hand-computed: write ACKs
// consumed in FIFO order and only when finished, a node split while its write is pending publishes
// both fragments, write policies (write_through, write_through_selective's hit threshold), the
// load-back threshold, a failed copy that publishes nothing. verify() after each step.
#include <gtest/gtest.h>

#include "tier_rig.hpp"

namespace kvgrid::cache {
namespace {

// Host tier only; host_link 1 byte/ns: a digest page (2 layers × 2 heads × 8 bytes) takes 32 ns.
Rig host_rig(const std::string& tag, std::string write = "write_through", std::function<void(HostTierConfig&)> f = {},
             Pages device = Pages(64)) {
  return Rig(tag, "wait_complete", 2, std::move(write), device, /*with_storage=*/false, std::move(f));
}

// Computes and commits `p` (all of it: kv = p.size()) as one request.
void run_request(Rig& rig, RequestId id, const std::vector<TokenId>& p) {
  auto r = rig.dc.reserve(id, p, Tokens(static_cast<std::int64_t>(p.size())));
  ASSERT_TRUE(r.has_value());
  for (auto& e : r->load_events) e.synchronize();
  rig.dc.commit(id, *r, p);
}

TEST(HostTier, WriteAcksAreConsumedInOrderAndOnlyWhenFinished) {
  auto rig = host_rig("fifo");
  run_request(rig, RequestId(1), prompt(32, 1));    // 8 pages: one write of 256 ns
  run_request(rig, RequestId(2), prompt(16, 100));  // 4 pages: queued behind it on the same stream
  auto* host = rig.dc.host_tier();
  EXPECT_EQ(host->pending_writes(), 2u);
  EXPECT_EQ(rig.dc.tree().host_pages(), Pages(0));
  host->writing_check();  // nothing finished at t = 0
  EXPECT_EQ(host->pending_writes(), 2u);
  rig.clock = host->oldest_write_ns();
  host->writing_check();  // the first only
  EXPECT_EQ(host->pending_writes(), 1u);
  EXPECT_EQ(rig.dc.tree().host_pages(), Pages(8));
  rig.clock = host->oldest_write_ns();
  host->writing_check();
  EXPECT_EQ(host->pending_writes(), 0u);
  EXPECT_EQ(rig.dc.tree().host_pages(), Pages(12));
  EXPECT_EQ(host->stats().d2h_pages, 12u);
  rig.dc.verify();
}

TEST(HostTier, ANodeSplitWhileItsWriteIsPendingPublishesBothFragments) {
  auto rig = host_rig("split");
  const auto a = prompt(32, 1);
  run_request(rig, RequestId(1), a);  // one 8-page node, write pending
  // A second prompt sharing the first 4 pages splits that node before the write's ACK.
  std::vector<TokenId> b(a.begin(), a.begin() + 16);
  for (TokenId t = 500; t < 516; ++t) b.push_back(t);
  run_request(rig, RequestId(2), b);
  EXPECT_GE(rig.dc.tree().node_count(), 3u);
  rig.clock = 1'000'000;
  rig.dc.host_tier()->writing_check();
  EXPECT_EQ(rig.dc.host_tier()->pending_writes(), 0u);
  EXPECT_EQ(rig.dc.tree().host_pages(), Pages(12));  // both fragments of a (8) and b's own part (4)
  rig.dc.verify();
  auto m = rig.dc.tree().peek_prefix(a);
  EXPECT_EQ(m.matched, Tokens(28));  // a is still whole (prompt - 1, rounded down to pages)
}

TEST(HostTier, WriteThroughSelectiveBacksUpOnlyAfterTheHitThreshold) {
  auto rig = host_rig("selective", "write_through_selective", [](HostTierConfig& c) { c.write_through_threshold = 2; });
  const auto a = prompt(33, 1);
  for (int round = 0; round < 3; ++round) {
    run_request(rig, RequestId(static_cast<std::uint64_t>(round + 1)), a);
    rig.clock += 1'000'000;
    rig.dc.host_tier()->writing_check();
    // hit counts after round r: r (the first request found nothing); backed up once it is 2
    EXPECT_EQ(rig.dc.tree().host_pages(), Pages(round >= 2 ? 8 : 0)) << "round " << round;
  }
  rig.dc.verify();
}

TEST(HostTier, OnlyHostHitsOfAtLeastTheThresholdAreLoadedBack) {
  for (const std::int64_t threshold : {8, 20}) {
    SCOPED_TRACE("threshold " + std::to_string(threshold));
    auto rig = host_rig("threshold-" + std::to_string(threshold), "write_through",
                        [threshold](HostTierConfig& c) { c.load_back_threshold = Tokens(threshold); }, Pages(10));
    const auto a = prompt(17, 1);  // 4 pages (16 tokens) reusable
    run_request(rig, RequestId(1), a);
    rig.clock = 1'000'000;
    rig.dc.host_tier()->writing_check();
    run_request(rig, RequestId(2), prompt(37, 1000));  // 10 pages: evicts a to the host
    rig.clock = 2'000'000;
    rig.dc.host_tier()->writing_check();  // (its own backup unlocks it: evictable for the load)
    ASSERT_EQ(rig.dc.tree().peek_prefix(a).matched, Tokens(0));
    ASSERT_EQ(rig.dc.tree().peek_prefix(a).host_matched, Tokens(16));
    auto r = rig.dc.reserve(RequestId(3), a, Tokens(17));
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->host_loaded, Tokens(threshold <= 16 ? 16 : 0));
    for (auto& e : r->load_events) e.synchronize();
    rig.dc.commit(RequestId(3), *r, a);
    rig.dc.verify();
  }
}

TEST(HostTier, AFailedCopyPublishesNothingAndFreesItsHostPages) {
  bool fail = true;
  auto rig = host_rig("fail", "write_through", [&fail](HostTierConfig& c) { c.transfer_fault = [&fail] { return fail; }; });
  const auto a = prompt(32, 1);
  run_request(rig, RequestId(1), a);
  rig.clock = 1'000'000;
  rig.dc.host_tier()->writing_check();
  EXPECT_EQ(rig.dc.tree().host_pages(), Pages(0));
  EXPECT_EQ(rig.dc.host_tier()->pool().used_pages(), Pages(0));
  EXPECT_EQ(rig.dc.host_tier()->stats().writes_failed, 1u);
  rig.dc.verify();
  // The node stays device-only; the next insert along the path backs it up again.
  fail = false;
  auto b = a;
  for (TokenId t = 900; t < 904; ++t) b.push_back(t);
  run_request(rig, RequestId(2), b);
  rig.clock = 2'000'000;
  rig.dc.host_tier()->writing_check();
  EXPECT_EQ(rig.dc.tree().host_pages(), Pages(9));
  rig.dc.verify();
}

}  // namespace
}  // namespace kvgrid::cache

#include "protocols/pp_sync.hpp"

namespace kvgrid::cache {
namespace {

// protocol.pp_sync on one rank per stage: PP0 counts its leading finished write ACKs; a later
// stage takes PP0's count and consumes exactly that many, blocking on its own copies, without
// looking at whether they finished.
TEST(PpSyncRelay, Pp0CountsItsReadyAcksAndALaterStageConsumesExactlyThatMany) {
  auto pp0 = host_rig("relay-pp0");
  auto pp1 = host_rig("relay-pp1", "write_through", [](HostTierConfig&) {}, Pages(64));
  auto relay = protocols::make_pp_sync("pp_sync");
  for (auto* rig : {&pp0, &pp1}) {
    run_request(*rig, RequestId(1), prompt(32, 1));
    run_request(*rig, RequestId(2), prompt(16, 100));
  }
  // PP0's copies: [done, not done]. PP1's are slower: [not done, not done].
  pp0.clock = pp0.dc.host_tier()->oldest_write_ns();
  const std::size_t n = relay->write_acks(*pp0.dc.host_tier(), std::nullopt);
  EXPECT_EQ(n, 1u);
  pp0.dc.host_tier()->consume_writes(n);
  EXPECT_EQ(pp1.clock, 0u);
  const std::size_t m = relay->write_acks(*pp1.dc.host_tier(), n);  // never queries PP1's events
  EXPECT_EQ(m, 1u);
  pp1.dc.host_tier()->consume_writes(m);  // blocks on its own first copy: the modelled clock moves on
  EXPECT_GT(pp1.clock, 0u);
  EXPECT_EQ(pp1.dc.host_tier()->pending_writes(), 1u);  // the second stays queued, whatever PP1 sees
  EXPECT_EQ(pp0.dc.tree().digest(), pp1.dc.tree().digest());  // same published state on both stages
  // The buggy variant lets PP1 decide from its own (slower) events: it consumes nothing yet.
  auto pp1b = host_rig("relay-pp1b");
  run_request(pp1b, RequestId(1), prompt(32, 1));
  run_request(pp1b, RequestId(2), prompt(16, 100));
  EXPECT_EQ(protocols::make_pp_sync("independent_polling")->write_acks(*pp1b.dc.host_tier(), n), 0u);
}

}  // namespace
}  // namespace kvgrid::cache
