// The host tier controller in one process (an agreement of one rank), hand-computed: write ACKs
// consumed in FIFO order and only when finished, a node split while its write is pending publishes
// both fragments, write policies (write_through, write_through_selective's hit threshold), the
// load-back threshold, a failed copy that publishes nothing; private restores (P/D decode): nobody
// else reads or restores them again before they are confirmed, a copy another request published
// meanwhile makes ours a duplicate, a failed one is never published and frees its pages.
// verify() after each step.
#include <gtest/gtest.h>

#include <algorithm>

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

// `a` (4 reusable pages) cached on the host only: computed, backed up, then evicted from a
// device pool of 10 pages by a 10-page request.
std::vector<TokenId> host_only_prefix(Rig& rig) {
  const auto a = prompt(17, 1);
  run_request(rig, RequestId(1), a);
  rig.clock = 1'000'000;
  rig.dc.host_tier()->writing_check();
  run_request(rig, RequestId(2), prompt(37, 1000));
  rig.clock = 2'000'000;
  rig.dc.host_tier()->writing_check();
  EXPECT_EQ(rig.dc.tree().peek_prefix(a).matched, Tokens(0));
  EXPECT_EQ(rig.dc.tree().peek_prefix(a).host_matched, Tokens(16));
  // Distinct KV words in its host pages (the rig computes nothing), so a restore can be checked.
  const auto hp = rig.dc.tree().peek_prefix(a).host_pages;
  for (std::size_t i = 0; i < hp.size(); ++i)
    for (std::size_t l = 0; l < rig.host.layers(); ++l) {
      std::uint64_t* b = rig.host.layer_block(hp[i], l);
      for (std::size_t w = 0; w < rig.host.layer_block_bytes() / 8; ++w) b[w] = 0xa000 + 100 * i + 10 * l + w;
    }
  return a;
}

// The device page's layer blocks equal the host page's (what a restore must have copied).
bool same_kv(Rig& rig, PageId device_page, PageId host_page) {
  for (std::size_t l = 0; l < rig.device.layers(); ++l)
    if (std::memcmp(rig.device.layer_block(device_page, l), rig.host.layer_block(host_page, l), rig.device.layer_block_bytes()))
      return false;
  return true;
}

TEST(PrivateRestore, NobodyReadsItBeforeItIsConfirmedNorRestoresItTwice) {
  auto rig = host_rig("private", "write_through", {}, Pages(12));
  const auto a = host_only_prefix(rig);
  const auto host_of_a = rig.dc.tree().peek_prefix(a).host_pages;
  ASSERT_EQ(host_of_a.size(), 4u);
  rig.dc.set_private_restores(true);
  auto x = rig.dc.reserve(RequestId(3), a, Tokens(17));
  ASSERT_TRUE(x.has_value());
  EXPECT_EQ(x->matched, Tokens(16));
  EXPECT_EQ(x->host_loaded, Tokens(16));
  ASSERT_NE(x->restore_hold, nullptr);
  EXPECT_EQ(x->shared, Tokens(0));
  // The nodes stay host-only: nobody else gets a device hit on pages that may not have landed.
  EXPECT_EQ(rig.dc.tree().peek_prefix(a).matched, Tokens(0));
  EXPECT_EQ(rig.dc.reserved_pages(), Pages(5));  // 4 restored + 1 for the last token
  rig.dc.verify();
  // A second request meanwhile neither reads them nor restores them again: it reuses nothing.
  const auto loads = rig.dc.host_tier()->stats().h2d_pages;
  auto y = rig.dc.reserve(RequestId(4), a, Tokens(17));
  ASSERT_TRUE(y.has_value());
  EXPECT_EQ(y->matched, Tokens(0));
  EXPECT_EQ(y->host_loaded, Tokens(0));
  EXPECT_EQ(y->restore_hold, nullptr);
  EXPECT_EQ(rig.dc.host_tier()->stats().h2d_pages, loads);
  EXPECT_EQ(rig.dc.reserved_pages(), Pages(10));  // y: 5 fresh pages for everything
  rig.dc.verify();
  // x confirmed: its pages enter the tree, holding the host's KV.
  rig.dc.confirm_restore(RequestId(3), *x, a, true);
  EXPECT_EQ(x->restore_hold, nullptr);
  EXPECT_EQ(x->shared, Tokens(16));
  auto m = rig.dc.tree().peek_prefix(a);
  ASSERT_EQ(m.matched, Tokens(16));
  for (std::size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(m.device_pages[i], x->pages[i]);
    EXPECT_TRUE(same_kv(rig, x->pages[i], host_of_a[i])) << "page " << i;
  }
  EXPECT_EQ(rig.dc.reserved_pages(), Pages(6));
  rig.dc.verify();
  // y commits what it computed: the prefix is in the tree already, y's pages are duplicates.
  rig.dc.commit(RequestId(4), *y, a);
  rig.dc.commit(RequestId(3), *x, a);
  EXPECT_EQ(rig.dc.reserved_pages(), Pages(0));
  EXPECT_EQ(rig.dc.pool().used_pages(), rig.dc.tree().total_pages());
  rig.dc.verify();
  // The next request finds the prefix on the device.
  auto z = rig.dc.reserve(RequestId(5), a, Tokens(17));
  ASSERT_TRUE(z.has_value());
  EXPECT_EQ(z->matched, Tokens(16));
  EXPECT_EQ(z->host_loaded, Tokens(0));
  rig.dc.commit(RequestId(5), *z, a);
  rig.dc.verify();
}

TEST(PrivateRestore, AnotherRequestsInsertMeanwhileMakesOursADuplicate) {
  auto rig = host_rig("private-dup", "write_through", {}, Pages(12));
  const auto a = host_only_prefix(rig);
  rig.dc.set_private_restores(true);
  auto x = rig.dc.reserve(RequestId(3), a, Tokens(17));
  ASSERT_TRUE(x.has_value());
  ASSERT_NE(x->restore_hold, nullptr);
  // y reuses nothing (x's restore is in flight), receives the whole prompt and commits it first:
  // the host-only nodes take y's pages.
  auto y = rig.dc.reserve(RequestId(4), a, Tokens(17));
  ASSERT_TRUE(y.has_value());
  rig.dc.commit(RequestId(4), *y, a);
  EXPECT_EQ(rig.dc.tree().peek_prefix(a).matched, Tokens(16));
  const auto tree_pages = rig.dc.tree().peek_prefix(a).device_pages;
  const Pages used = rig.dc.pool().used_pages();
  rig.dc.confirm_restore(RequestId(3), *x, a, true);  // x's restored copies are freed as duplicates
  EXPECT_EQ(rig.dc.pool().used_pages(), used - Pages(4));
  for (std::size_t i = 0; i < 4; ++i) EXPECT_EQ(x->pages[i], tree_pages[i]);
  rig.dc.verify();
  rig.dc.commit(RequestId(3), *x, a);
  EXPECT_EQ(rig.dc.reserved_pages(), Pages(0));
  rig.dc.verify();
}

TEST(PrivateRestore, AFailedRestoreIsNeverPublishedAndFreesItsPages) {
  std::optional<std::size_t> fail_from = 1;  // of 2 layers: layer 1's copies fail
  int draws = 0;
  auto rig = host_rig("private-fail", "write_through", [&](HostTierConfig& c) {
    c.load_fault = [&](std::size_t layers) {
      ++draws;
      EXPECT_EQ(layers, 2u);
      return fail_from;
    };
  }, Pages(12));
  const auto a = host_only_prefix(rig);
  draws = 0;
  rig.dc.set_private_restores(true);
  const Pages tree_pages = rig.dc.tree().total_pages(), host_pages = rig.dc.tree().host_pages();
  auto x = rig.dc.reserve(RequestId(3), a, Tokens(17));
  ASSERT_TRUE(x.has_value());
  EXPECT_EQ(draws, 1) << "one draw per restore";
  ASSERT_EQ(x->load_events.size(), 2u);  // one node × 2 layers
  for (auto& e : x->load_events) e.synchronize();
  EXPECT_FALSE(x->load_events[0].failed());
  EXPECT_TRUE(x->load_events[1].failed());
  const auto host_of_a = rig.dc.tree().peek_prefix(a).host_pages;
  ASSERT_EQ(host_of_a.size(), 4u);
  EXPECT_TRUE(same_kv(rig, x->pages[0], host_of_a[0]) == false) << "layer 1 was not copied";
  rig.dc.confirm_restore(RequestId(3), *x, a, false);
  rig.dc.abort(RequestId(3), *x);
  // Nothing of it is left: the prefix is host-only as before, its host pages kept, no page reserved.
  auto m = rig.dc.tree().peek_prefix(a);
  EXPECT_EQ(m.matched, Tokens(0));
  EXPECT_EQ(m.host_matched, Tokens(16));
  EXPECT_EQ(rig.dc.tree().host_pages(), host_pages);
  EXPECT_EQ(rig.dc.reserved_pages(), Pages(0));
  EXPECT_EQ(rig.dc.pool().used_pages(), rig.dc.tree().total_pages());
  EXPECT_LE(rig.dc.tree().total_pages(), tree_pages);
  rig.dc.verify();
  // The next restore (no fault) copies every layer and is published.
  fail_from.reset();
  auto z = rig.dc.reserve(RequestId(5), a, Tokens(17));
  ASSERT_TRUE(z.has_value());
  rig.dc.confirm_restore(RequestId(5), *z, a, true);
  for (std::size_t i = 0; i < 4; ++i) EXPECT_TRUE(same_kv(rig, z->pages[i], host_of_a[i])) << "page " << i;
  EXPECT_EQ(rig.dc.tree().peek_prefix(a).matched, Tokens(16));
  rig.dc.commit(RequestId(5), *z, a);
  rig.dc.verify();
}

TEST(PrivateRestore, ANodeSplitWhileItsRestoreIsPendingIsReleasedWhole) {
  auto rig = host_rig("private-split", "write_through", {}, Pages(12));
  const auto a = host_only_prefix(rig);
  rig.dc.set_private_restores(true);
  auto x = rig.dc.reserve(RequestId(3), a, Tokens(17));
  ASSERT_TRUE(x.has_value());
  ASSERT_EQ(x->host_loaded, Tokens(16));
  // y shares a's first 2 pages only: its match splits the host-only node x is restoring.
  auto b = std::vector<TokenId>(a.begin(), a.begin() + 8);
  for (TokenId t = 700; t < 709; ++t) b.push_back(t);
  const std::size_t nodes = rig.dc.tree().node_count();
  auto y = rig.dc.reserve(RequestId(4), b, Tokens(17));
  ASSERT_TRUE(y.has_value());
  EXPECT_EQ(rig.dc.tree().node_count(), nodes + 1) << "the restored node was split";
  EXPECT_EQ(y->host_loaded, Tokens(0)) << "the first fragment is being restored by x";
  rig.dc.abort(RequestId(4), *y);
  // x's restore breaks: both fragments lose their mark and stay host-only, whole again for z.
  rig.dc.confirm_restore(RequestId(3), *x, a, false);
  rig.dc.abort(RequestId(3), *x);
  rig.dc.verify();
  auto z = rig.dc.reserve(RequestId(5), a, Tokens(17));
  ASSERT_TRUE(z.has_value());
  EXPECT_EQ(z->host_loaded, Tokens(16));
  rig.dc.confirm_restore(RequestId(5), *z, a, true);
  EXPECT_EQ(rig.dc.tree().peek_prefix(a).matched, Tokens(16));
  rig.dc.commit(RequestId(5), *z, a);
  EXPECT_EQ(rig.dc.reserved_pages(), Pages(0));
  rig.dc.verify();
}

TEST(PrivateRestore, ARequestThatCannotBeAdmittedFreesItsRestore) {
  auto rig = host_rig("private-refused", "write_through", {}, Pages(12));
  const auto a = host_only_prefix(rig);
  rig.dc.set_private_restores(true);
  // 4 restored pages would fit, the 20 more pages it needs do not: refused before any copy (a
  // restore for nothing, repeated at every retry, would hold up the restores behind it).
  const Pages used = rig.dc.pool().used_pages();
  const auto loaded = rig.dc.host_tier()->stats().h2d_pages;
  auto x = rig.dc.reserve(RequestId(3), a, Tokens(17 + 80));
  EXPECT_FALSE(x.has_value());
  EXPECT_EQ(rig.dc.host_tier()->stats().h2d_pages, loaded) << "refused before anything was copied";
  EXPECT_EQ(rig.dc.tree().peek_prefix(a).matched, Tokens(0));
  EXPECT_EQ(rig.dc.reserved_pages(), Pages(0));
  EXPECT_LE(rig.dc.pool().used_pages(), used);
  EXPECT_EQ(rig.dc.pool().used_pages(), rig.dc.tree().total_pages());
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
// A freed page is poisoned, so a restore into the very page its prefix was evicted from is stale
// until its copy lands — without poisoning, the page would still hold exactly that KV and a read
// that jumps ahead of the load event would pass.
TEST(Poison, ARestoreIntoThePageItWasEvictedFromIsStaleUntilItsCopyLands) {
  for (const bool poison : {false, true}) {
    auto rig = host_rig(poison ? "poison" : "no-poison", "write_through", {}, Pages(4));
    if (poison) rig.dc.set_on_free([&rig](std::span<const PageId> p) { rig.device.poison(p); });
    const auto a = prompt(16, 1);  // 4 pages: the whole device pool
    auto r = rig.dc.reserve(RequestId(1), a, Tokens(16));
    ASSERT_TRUE(r.has_value());
    const std::vector<PageId> pages_of_a = r->pages;
    std::vector<std::uint32_t> page, slot;
    std::vector<std::uint64_t> F;
    for (std::uint32_t t = 0; t < 16; ++t) {
      page.push_back(pages_of_a[t / kPage].value());
      slot.push_back(t % kPage);
      F.push_back(0x1234 + t);
    }
    rig.device.write(page, slot, F);
    rig.dc.commit(RequestId(1), *r, a);
    rig.clock = 1'000'000;
    rig.dc.host_tier()->writing_check();  // backed up: a is on device and host
    // b takes the whole pool (a is evicted to host-only), then goes away without writing anything.
    auto b = rig.dc.reserve(RequestId(2), prompt(16, 500), Tokens(16));
    ASSERT_TRUE(b.has_value());
    rig.dc.abort(RequestId(2), *b);
    ASSERT_EQ(rig.dc.tree().peek_prefix(a).matched, Tokens(0));
    const auto host_of_a = rig.dc.tree().peek_prefix(a).host_pages;  // (a match reuses at most 15 tokens: 3 pages)
    ASSERT_EQ(host_of_a.size(), 3u);
    // a again: loaded back from the host into its old pages (the allocator returns the last freed first).
    auto again = rig.dc.reserve(RequestId(3), a, Tokens(16));
    ASSERT_TRUE(again.has_value());
    ASSERT_FALSE(again->load_events.empty());
    std::vector<PageId> sorted_old = pages_of_a, sorted_new(again->pages.begin(), again->pages.begin() + 3);
    std::sort(sorted_old.begin(), sorted_old.end());
    std::sort(sorted_new.begin(), sorted_new.end());
    EXPECT_TRUE(std::includes(sorted_old.begin(), sorted_old.end(), sorted_new.begin(), sorted_new.end()));
    bool early = true;  // read before the load event: does the page look like the restore landed?
    for (std::size_t i = 0; i < 3; ++i) early = early && same_kv(rig, again->pages[i], host_of_a[i]);
    EXPECT_EQ(early, !poison) << (poison ? "a read before the copy landed found the right KV"
                                         : "(without poisoning the old KV is still there)");
    for (auto& e : again->load_events) e.synchronize();
    for (std::size_t i = 0; i < 3; ++i) EXPECT_TRUE(same_kv(rig, again->pages[i], host_of_a[i])) << "page " << i;
    rig.dc.abort(RequestId(3), *again);
    rig.dc.verify();
  }
}

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
  const std::size_t n = relay->write_acks(pp0.dc.host_tier()->acks(), std::nullopt);
  EXPECT_EQ(n, 1u);
  pp0.dc.host_tier()->consume_writes(n);
  EXPECT_EQ(pp1.clock, 0u);
  const std::size_t m = relay->write_acks(pp1.dc.host_tier()->acks(), n);  // never queries PP1's events
  EXPECT_EQ(m, 1u);
  pp1.dc.host_tier()->consume_writes(m);  // blocks on its own first copy: the modelled clock moves on
  EXPECT_GT(pp1.clock, 0u);
  EXPECT_EQ(pp1.dc.host_tier()->pending_writes(), 1u);  // the second stays queued, whatever PP1 sees
  EXPECT_EQ(pp0.dc.tree().digest(), pp1.dc.tree().digest());  // same published state on both stages
  // The buggy variant lets PP1 decide from its own (slower) events: it consumes nothing yet.
  auto pp1b = host_rig("relay-pp1b");
  run_request(pp1b, RequestId(1), prompt(32, 1));
  run_request(pp1b, RequestId(2), prompt(16, 100));
  EXPECT_EQ(protocols::make_pp_sync("independent_polling")->write_acks(pp1b.dc.host_tier()->acks(), n), 0u);
}

}  // namespace
}  // namespace kvgrid::cache
