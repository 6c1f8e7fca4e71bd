// The cache controller's storage tier in one process (an agreement of one rank): hand-computed
// prefetches — batches with one ACK each, stop policies on the modelled clock, failed / corrupt /
// short objects becoming misses, abort releasing everything, host-only insertion, write-through
// of published backups, and write_back on eviction. `verify()` (tree + pools + accounting) after
// every step.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <numeric>

#include "tier_rig.hpp"

namespace kvgrid::cache {
namespace {


TEST(StorageTier, WaitCompleteConsumesOneAckPerBatchAndInsertsHostOnlyNodes) {
  Rig rig("wait", "wait_complete");
  const auto p = prompt(41);  // 10 whole pages reusable (at most prompt - 1 tokens)
  rig.store(p, 10);
  rig.dc.on_arrival(RequestId(1), p);
  ASSERT_TRUE(rig.st().prefetching(RequestId(1)));
  EXPECT_EQ(rig.st().held_pages(), Pages(10));
  rig.dc.verify();
  // Five batches of two pages; each ACK appears 1000 ns after the previous one.
  std::vector<std::uint64_t> acks;
  while (!rig.dc.prefetch_ready(RequestId(1))) {
    acks.push_back(rig.st().next_ack_ns());
    rig.clock = acks.back();
  }
  EXPECT_EQ(acks, (std::vector<std::uint64_t>{1000, 2000, 3000, 4000, 5000}));
  EXPECT_EQ(rig.st().held_pages(), Pages(0));
  EXPECT_EQ(rig.dc.tree().host_pages(), Pages(10));
  rig.dc.verify();
  auto m = rig.dc.tree().peek_prefix(p);
  EXPECT_EQ(m.matched, Tokens(0));
  EXPECT_EQ(m.host_matched, Tokens(40));
  for (std::size_t i = 0; i < m.host_pages.size(); ++i) EXPECT_EQ(*rig.host.layer_block(m.host_pages[i], 1), 1000 + i) << i;
  EXPECT_EQ(rig.st().prefetched_range(RequestId(1)), (std::pair<Tokens, Tokens>{Tokens(0), Tokens(40)}));
  // Admission loads the host-only path back to the device and counts it as a storage hit.
  auto r = rig.dc.reserve(RequestId(1), p, Tokens(44));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->matched, Tokens(40));
  EXPECT_EQ(r->host_loaded, Tokens(40));
  EXPECT_EQ(r->storage_loaded, Tokens(40));
  for (auto& e : r->load_events) e.synchronize();
  EXPECT_EQ(*rig.device.layer_block(r->pages[3], 0), 1003u);
  rig.dc.verify();
}

TEST(StorageTier, BestEffortStopsAtOnceWithWhatHasArrived) {
  Rig rig("best", "best_effort");
  const auto p = prompt(41);
  rig.store(p, 10);
  rig.dc.on_arrival(RequestId(1), p);
  rig.clock = 2500;  // two ACKs seen
  EXPECT_TRUE(rig.dc.prefetch_ready(RequestId(1)));
  EXPECT_EQ(rig.dc.tree().host_pages(), Pages(4));
  EXPECT_EQ(rig.st().held_pages(), Pages(0));
  EXPECT_EQ(rig.dc.host_tier()->pool().used_pages(), Pages(4));  // the other six were released
  EXPECT_EQ(rig.dc.tree().peek_prefix(p).host_matched, Tokens(16));
  rig.dc.verify();
}

TEST(StorageTier, TimeoutStopsAtTheDeadlineUnderASlowBatch) {
  Rig rig("timeout", "timeout");
  rig.slow_batch = 2;  // storage.read.slow on the third batch: 1'000'000 ns late
  rig.slow_ns = 1'000'000;
  const auto p = prompt(41);
  rig.store(p, 10);
  rig.dc.on_arrival(RequestId(1), p);
  rig.clock = 2000;
  EXPECT_FALSE(rig.dc.prefetch_ready(RequestId(1)));  // deadline 2500 not reached, reads not done
  rig.clock = 2500;
  EXPECT_TRUE(rig.dc.prefetch_ready(RequestId(1)));   // timed out: the two leading ACKs count
  EXPECT_EQ(rig.dc.tree().peek_prefix(p).host_matched, Tokens(16));
  rig.dc.verify();
}

TEST(StorageTier, WaitCompleteWaitsForASlowBatch) {
  Rig rig("slow-wait", "wait_complete");
  rig.slow_batch = 2;
  rig.slow_ns = 1'000'000;
  const auto p = prompt(41);
  rig.store(p, 10);
  rig.dc.on_arrival(RequestId(1), p);
  rig.clock = 900'000;
  EXPECT_FALSE(rig.dc.prefetch_ready(RequestId(1)));
  rig.clock = 1'005'000;  // the slow batch delays the ones queued behind it
  EXPECT_TRUE(rig.dc.prefetch_ready(RequestId(1)));
  EXPECT_EQ(rig.dc.tree().peek_prefix(p).host_matched, Tokens(40));
}

TEST(StorageTier, FailedCorruptAndShortObjectsAreMissesNeverData) {
  for (const char* fp : {"storage.read.fail", "storage.object.corrupt", "storage.read.short"}) {
    SCOPED_TRACE(fp);
    Rig rig(std::string("miss-") + fp, "wait_complete");
    rig.failpoints = {std::string(fp) + "@1:1"};  // batch 1, its second page (page 3)
    const auto p = prompt(41);
    rig.store(p, 10);
    rig.dc.on_arrival(RequestId(1), p);
    rig.clock = 1'000'000;
    EXPECT_TRUE(rig.dc.prefetch_ready(RequestId(1)));
    // Pages 0..2 are intact; page 3 failed, so nothing after it is used either.
    EXPECT_EQ(rig.dc.tree().peek_prefix(p).host_matched, Tokens(12));
    EXPECT_EQ(rig.st().stats().failed_pages, 1u);  // batch 1's second page (later batches were read whole)
    EXPECT_EQ(rig.dc.host_tier()->pool().used_pages(), Pages(3));
    rig.dc.verify();
    // A damaged object stays a miss: the next query stops at it.
    rig.dc.on_arrival(RequestId(2), p);
    if (std::string(fp) == "storage.read.fail") {
      EXPECT_TRUE(rig.st().prefetching(RequestId(2)));  // an I/O error leaves the object intact
    } else {
      rig.clock = 2'000'000;
      rig.dc.prefetch_ready(RequestId(2));
      EXPECT_EQ(rig.dc.tree().peek_prefix(p).host_matched, Tokens(12));
    }
  }
}

TEST(StorageTier, BatchesOf128PagesEachGiveOneAck) {
  Rig rig("big", "wait_complete", 128);
  const auto p = prompt(4 * 60 + 1);
  rig.store(p, 60);
  rig.dc.on_arrival(RequestId(1), p);
  EXPECT_EQ(rig.st().next_ack_ns(), 1000u);  // one batch for 60 pages
  rig.clock = 1000;
  EXPECT_TRUE(rig.dc.prefetch_ready(RequestId(1)));
  EXPECT_EQ(rig.dc.tree().host_pages(), Pages(60));
}

TEST(StorageTier, AbortMidPrefetchReleasesEverything) {
  Rig rig("abort", "wait_complete");
  const auto p = prompt(41);
  rig.store(p, 10);
  rig.dc.on_arrival(RequestId(1), p);
  rig.clock = 2500;
  rig.st().abort(RequestId(1));
  EXPECT_FALSE(rig.st().prefetching(RequestId(1)));
  EXPECT_EQ(rig.st().held_pages(), Pages(0));
  EXPECT_EQ(rig.dc.host_tier()->pool().used_pages(), Pages(0));
  EXPECT_EQ(rig.dc.tree().host_pages(), Pages(0));
  EXPECT_EQ(rig.st().stats().aborted, 1u);
  rig.dc.verify();
  EXPECT_TRUE(rig.dc.prefetch_ready(RequestId(1)));  // nothing left to wait for
}

TEST(StorageTier, AbortMidLoadReleasesEverythingAndKeepsTheLoadedPagesCached) {
  Rig rig("abort-load", "wait_complete");
  const auto p = prompt(41);
  rig.store(p, 10);
  rig.dc.on_arrival(RequestId(1), p);
  rig.clock = 1'000'000;
  ASSERT_TRUE(rig.dc.prefetch_ready(RequestId(1)));
  const std::uint64_t before = rig.clock;
  auto r = rig.dc.reserve(RequestId(1), p, Tokens(60));  // 40 loaded + 5 private pages
  ASSERT_TRUE(r.has_value());
  EXPECT_FALSE(r->load_events.empty());
  EXPECT_FALSE(r->load_events.back().query());  // the load is in flight
  EXPECT_EQ(rig.dc.reserved_pages(), Pages(5));
  rig.dc.abort(RequestId(1), *r);
  EXPECT_GT(rig.clock, before);                    // waited for the copies
  EXPECT_EQ(rig.dc.reserved_pages(), Pages(0));   // private pages freed
  EXPECT_EQ(rig.dc.pool().used_pages(), Pages(10));  // the loaded prefix stays cached
  EXPECT_EQ(rig.dc.tree().protected_pages(), Pages(0));  // nothing locked
  rig.dc.verify();
  auto m = rig.dc.tree().peek_prefix(p);
  EXPECT_EQ(m.matched, Tokens(40));
  for (std::size_t i = 0; i < m.device_pages.size(); ++i) EXPECT_EQ(*rig.device.layer_block(m.device_pages[i], 0), 1000 + i);
}

TEST(StorageTier, AbortOfAWaitingRequestStopsItsPrefetch) {
  Rig rig("abort-waiting", "wait_complete");
  const auto p = prompt(41);
  rig.store(p, 10);
  rig.dc.on_arrival(RequestId(1), p);
  rig.dc.abort_waiting(RequestId(1));
  EXPECT_EQ(rig.dc.host_tier()->pool().used_pages(), Pages(0));
  EXPECT_EQ(rig.dc.tree().host_pages(), Pages(0));
  rig.dc.verify();
}

// One rank standing for its whole pipeline: MIN over itself; PP0 or a later stage.
class OneStage final : public CrossStageAgreement {
 public:
  explicit OneStage(bool decides) : decides_(decides) {}
  std::string_view name() const override { return "one-stage"; }
  void min(std::vector<std::uint64_t>& v) override { mins.push_back(v); }
  bool decides() const override { return decides_; }
  void min_begin(std::vector<std::uint64_t>& v) override { mins.push_back(v); }
  void min_end() override {}
  std::vector<std::vector<std::uint64_t>> mins;  // what was agreed, per end of step

 private:
  bool decides_;
};

TEST(StorageTier, AcrossStagesPp0DecidesTheStopAndItsAckCount) {
  Rig rig("pp0", "best_effort");
  OneStage pp0(/*decides=*/true);
  rig.st().set_cross_stage(&pp0);
  const auto p = prompt(41);
  rig.store(p, 10);
  rig.dc.on_arrival(RequestId(1), p);
  EXPECT_TRUE(rig.st().prefetching(RequestId(1)));
  EXPECT_FALSE(rig.dc.prefetch_ready(RequestId(1)));  // its hit is agreed at the end of the step
  rig.st().end_of_step();
  ASSERT_EQ(pp0.mins.size(), 2u);
  EXPECT_EQ(pp0.mins[0], (std::vector<std::uint64_t>{10}));  // the storage hit, for every stage's MIN
  EXPECT_EQ(pp0.mins[1], (std::vector<std::uint64_t>{1}));   // the host allocation succeeded here
  rig.clock = 2500;  // two ACKs (4 pages) seen
  EXPECT_FALSE(rig.dc.prefetch_ready(RequestId(1)));  // stops at the end of this step
  EXPECT_EQ(rig.st().take_decisions(), (std::vector<std::pair<std::uint64_t, std::uint64_t>>{{1, 2}}));
  rig.st().end_of_step();
  EXPECT_EQ(pp0.mins[2], (std::vector<std::uint64_t>{4}));  // completed pages of those two ACKs
  EXPECT_TRUE(rig.dc.prefetch_ready(RequestId(1)));
  EXPECT_EQ(rig.dc.tree().peek_prefix(p).host_matched, Tokens(16));
  rig.dc.verify();
}

// The first article's example: PP0 consumed ACK(4) and stopped; PP1 already holds ACK(6) but uses 4 pages.
TEST(StorageTier, AcrossStagesALaterStageFollowsPp0EvenWithNewerAcks) {
  Rig rig("pp1", "wait_complete");
  OneStage pp1(/*decides=*/false);
  rig.st().set_cross_stage(&pp1);
  const auto p = prompt(41);
  rig.store(p, 10);
  rig.dc.on_arrival(RequestId(1), p);
  rig.st().end_of_step();
  rig.clock = 3500;  // this stage has seen three ACKs (6 pages)
  EXPECT_FALSE(rig.dc.prefetch_ready(RequestId(1)));  // no decision from PP0 yet: it does not stop by itself
  rig.st().set_decisions({{1, 2}});                     // PP0 stopped after two ACKs (4 pages)
  EXPECT_FALSE(rig.dc.prefetch_ready(RequestId(1)));
  EXPECT_EQ(rig.st().take_decisions(), (std::vector<std::pair<std::uint64_t, std::uint64_t>>{{1, 2}}));  // relayed on
  rig.st().end_of_step();
  EXPECT_EQ(pp1.mins.back(), (std::vector<std::uint64_t>{4}));
  EXPECT_TRUE(rig.dc.prefetch_ready(RequestId(1)));
  EXPECT_EQ(rig.dc.tree().peek_prefix(p).host_matched, Tokens(16));  // 4 pages, not 6
  EXPECT_EQ(rig.dc.host_tier()->pool().used_pages(), Pages(4));    // the rest released
  rig.dc.verify();
}

TEST(StorageTier, BelowTheThresholdNothingIsRead) {
  Rig rig("threshold", "wait_complete");
  const auto p = prompt(41);
  rig.store(p, 1);  // one page in storage: 4 tokens < threshold 8
  rig.dc.on_arrival(RequestId(1), p);
  EXPECT_FALSE(rig.st().prefetching(RequestId(1)));
  EXPECT_EQ(rig.st().stats().prefetches, 0u);
}

TEST(StorageTier, PublishedBackupsAreWrittenThroughAndReadBackExactly) {
  Rig rig("through", "wait_complete");
  const auto p = prompt(33);
  // A request computes 8 pages; its backup is published after the copy, then written to storage.
  auto r = rig.dc.reserve(RequestId(1), p, Tokens(33));
  ASSERT_TRUE(r.has_value());
  for (std::size_t i = 0; i < 8; ++i) *rig.device.layer_block(r->pages[i], 0) = 500 + i;
  rig.dc.commit(RequestId(1), *r, p);
  EXPECT_EQ(rig.st().stats().written_pages, 0u);
  rig.clock = 1'000'000;
  rig.dc.host_tier()->writing_check();
  // Published now; the objects land at the write's tick, 1,000 ns later (storage_writer.hpp).
  auto chain = page_hash_chain(p, kPage);
  EXPECT_EQ(rig.st().stats().written_pages, 0u);
  EXPECT_EQ(rig.st().writes_in_flight(), 1u);
  rig.clock = 1'000'999;
  rig.st().settle_writes();
  EXPECT_FALSE(rig.st().storage().exists(storage_key(chain[0], "_test"))) << "a write in flight is not in the store";
  rig.clock = 1'001'000;
  rig.dc.on_arrival(RequestId(2), p);  // a hit query looks at the store: what is due lands first
  EXPECT_EQ(rig.st().stats().written_pages, 8u);
  EXPECT_EQ(rig.st().writes_in_flight(), 0u);
  // The object holds the page's KV as it was on the device.
  std::vector<std::uint8_t> buf(rig.host.layer_block_bytes() * rig.host.layers());
  ASSERT_EQ(rig.st().storage().get(storage_key(chain[5], "_test"), buf), StorageMiss::None);
  std::uint64_t w0 = 0;
  std::memcpy(&w0, buf.data(), 8);
  EXPECT_EQ(w0, 505u);
}

TEST(StorageTier, WriteBackBacksUpOnEvictionAndKeepsHostOnlyNodes) {
  Rig rig("wb", "wait_complete", 2, "write_back", Pages(10));
  const auto a = prompt(33, 1), b = prompt(33, 1000);
  auto ra = rig.dc.reserve(RequestId(1), a, Tokens(32));
  ASSERT_TRUE(ra.has_value());
  rig.dc.commit(RequestId(1), *ra, std::span<const TokenId>(a).first(32));
  EXPECT_EQ(rig.dc.tree().host_pages(), Pages(0));  // no backup on insert
  auto rb = rig.dc.reserve(RequestId(2), b, Tokens(32));  // needs 8 of 10 pages: evicts a
  ASSERT_TRUE(rb.has_value());
  EXPECT_EQ(rig.dc.tree().host_pages(), Pages(8));  // a was written back before it was dropped
  rig.st().flush_writes();
  EXPECT_EQ(rig.st().stats().written_pages, 8u);     // ... and through to storage
  auto m = rig.dc.tree().peek_prefix(a);
  EXPECT_EQ(m.matched, Tokens(0));
  EXPECT_EQ(m.host_matched, Tokens(32));
  rig.dc.verify();
}

}  // namespace
}  // namespace kvgrid::cache
