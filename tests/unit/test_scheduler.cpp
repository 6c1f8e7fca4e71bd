// The per-rank scheduler on a hand-computed workload: chunked prefill makes a prefix shareable
// before its request finishes, decode produces the outputs, finished requests commit their KV.
#include <gtest/gtest.h>

#include "cache/device_cache.hpp"
#include "core/check.hpp"
#include "runtime/scheduler.hpp"
#include "runtime/serve_workload.hpp"

namespace kvgrid {
namespace {

RequestSpec spec(std::uint64_t id, std::vector<TokenId> prompt, std::uint32_t out) {
  RequestSpec s;
  s.id = RequestId(id);
  s.prompt = std::move(prompt);
  s.output_len = out;
  return s;
}

TEST(Scheduler, HandComputedChunkedPrefillSharesThePrefixEarly) {
  set_debug_checks(true);
  DecisionLog log;
  cache::DeviceCache dc({Tokens(4), Pages(16)}, log);
  Scheduler s({/*chunk_size=*/8, /*max_running=*/4, /*vocab=*/100}, dc);
  std::vector<TokenId> p0 = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  std::vector<TokenId> p1 = {1, 2, 3, 4, 5, 6, 7, 8, 20, 21, 22};
  s.enqueue(spec(0, p0, 3), 0);
  s.enqueue(spec(1, p1, 2), 0);

  // Step 0: R0 takes the whole 8-token budget; R1 waits.
  auto b0 = s.schedule(0);
  ASSERT_EQ(b0.size(), 1u);
  EXPECT_EQ(b0[0].start, 0u);
  EXPECT_EQ(b0[0].end, 8u);
  EXPECT_TRUE(s.complete_step(b0, 1, 0).empty());
  EXPECT_EQ(dc.tree().total_pages(), Pages(2));  // R0's first two pages are shareable already

  // Step 1: R0 finishes its prefill [8, 10); R1 is admitted with 8 cached tokens and computes [8, 11).
  auto b1 = s.schedule(1);
  ASSERT_EQ(b1.size(), 2u);
  EXPECT_EQ(b1[0].start, 8u);
  EXPECT_EQ(b1[0].end, 10u);
  EXPECT_EQ(b1[1].start, 8u);
  EXPECT_EQ(b1[1].end, 11u);
  EXPECT_EQ(b1[1].req->res.matched, Tokens(8));
  EXPECT_EQ(b1[1].req->res.fresh, Pages(1));  // 11 + 2 - 1 = 12 positions = 3 pages, 2 from the tree
  EXPECT_TRUE(s.complete_step(b1, 2, 0).empty());

  // Step 2: both decode one position; R1 (2 outputs) finishes and commits [0, 12).
  auto b2 = s.schedule(2);
  ASSERT_EQ(b2.size(), 2u);
  EXPECT_FALSE(b2[0].prefill);
  EXPECT_EQ(b2[1].start, 11u);
  EXPECT_EQ(b2[1].end, 12u);
  auto done2 = s.complete_step(b2, 3, 0);
  ASSERT_EQ(done2.size(), 1u);
  EXPECT_EQ(done2[0]->spec.id, RequestId(1));
  EXPECT_EQ(done2[0]->tokens.size(), 12u);
  EXPECT_EQ(std::vector<TokenId>(done2[0]->tokens.begin() + 11, done2[0]->tokens.end()), model_output(p1, 1, 100));

  // Step 3: R0 decodes its last position and commits [0, 12) on its own branch.
  auto b3 = s.schedule(3);
  ASSERT_EQ(b3.size(), 1u);
  auto done3 = s.complete_step(b3, 4, 0);
  ASSERT_EQ(done3.size(), 1u);
  EXPECT_EQ(done3[0]->res.matched, Tokens(0));
  EXPECT_EQ(std::vector<TokenId>(done3[0]->tokens.begin() + 10, done3[0]->tokens.end()), model_output(p0, 2, 100));
  EXPECT_TRUE(s.idle());
  EXPECT_EQ(dc.tree().total_pages(), Pages(4));  // 2 shared + 1 per branch
  EXPECT_EQ(dc.reserved_pages(), Pages(0));
  EXPECT_EQ(dc.pool().used_pages(), Pages(4));
  dc.verify();
}

TEST(Scheduler, HeadOfLineWaitsForPagesAndNothingLeaks) {
  set_debug_checks(true);
  DecisionLog log;
  cache::DeviceCache dc({Tokens(4), Pages(5)}, log);
  Scheduler s({64, 8, 100}, dc);
  s.enqueue(spec(0, std::vector<TokenId>(14, 3), 4), 0);  // 17 positions: 5 pages, the whole pool
  s.enqueue(spec(1, std::vector<TokenId>(6, 9), 1), 0);   // must wait
  auto b = s.schedule(0);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(s.waiting(), 1u);
  std::size_t finished = 0;
  for (int step = 1; !s.idle() && step < 50; ++step) {
    finished += s.complete_step(b, static_cast<std::uint64_t>(step), 0).size();
    b = s.schedule(static_cast<std::uint64_t>(step));
  }
  EXPECT_EQ(finished, 2u);
  EXPECT_EQ(dc.reserved_pages(), Pages(0));
  dc.verify();
}

TEST(Scheduler, ShardedAdmissionKeepsEachBatchsGatherInOneSlot) {
  // CP sharding over 2 owners, page 4, gather slot of 4 pages: a batch's cached prefixes
  // (N·⌈pages/N⌉ each) must fit one slot. A 16-token prefix (4 pages) fills it.
  set_debug_checks(true);
  DecisionLog log;
  cache::DeviceCache dc({Tokens(4), Pages(32), /*shards=*/2}, log);
  Scheduler s({/*chunk_size=*/64, /*max_running=*/8, /*vocab=*/100, /*gather_pages=*/4, /*shards=*/2}, dc);
  std::vector<TokenId> prefix(24);
  for (std::size_t i = 0; i < prefix.size(); ++i) prefix[i] = static_cast<TokenId>(i + 1);
  auto with = [&](std::size_t n, std::vector<TokenId> tail) {
    std::vector<TokenId> p(prefix.begin(), prefix.begin() + static_cast<std::ptrdiff_t>(n));
    p.insert(p.end(), tail.begin(), tail.end());
    return p;
  };
  s.enqueue(spec(0, with(24, {90}), 1), 0);  // computes and commits the 24-token prefix
  auto b0 = s.schedule(0);
  ASSERT_EQ(b0.size(), 1u);
  ASSERT_EQ(s.complete_step(b0, 1, 0).size(), 1u);
  ASSERT_EQ(dc.tree().total_pages(), Pages(6));

  s.enqueue(spec(1, with(16, {50, 51}), 1), 0);
  s.enqueue(spec(2, with(16, {60, 61}), 1), 0);
  auto b1 = s.schedule(1);
  ASSERT_EQ(b1.size(), 1u) << "the second request's prefix would overflow the batch's gather slot";
  EXPECT_EQ(b1[0].req->spec.id, RequestId(1));
  EXPECT_EQ(b1[0].req->res.matched, Tokens(16));
  s.complete_step(b1, 2, 0);
  auto b2 = s.schedule(2);  // a new batch, a new slot
  ASSERT_EQ(b2.size(), 1u);
  EXPECT_EQ(b2[0].req->spec.id, RequestId(2));
  EXPECT_EQ(b2[0].req->res.matched, Tokens(16));
  s.complete_step(b2, 3, 0);

  // A 24-token hit (6 pages) alone exceeds the slot: it reuses what fits (4 pages) and computes the rest.
  s.enqueue(spec(3, with(24, {70, 71}), 1), 0);
  auto b3 = s.schedule(3);
  ASSERT_EQ(b3.size(), 1u);
  EXPECT_EQ(b3[0].req->res.matched, Tokens(16));
  EXPECT_EQ(b3[0].start, 16u);
  // Its fresh pages continue the owner cycle after the 4 reused pages: owners 0, 1, 0 ...
  const auto& pages = b3[0].req->res.pages;
  for (std::size_t k = 0; k < pages.size(); ++k) EXPECT_EQ(pages[k].value() % 2, k % 2) << "position " << k;
  s.complete_step(b3, 4, 0);
  dc.verify();
}

TEST(Scheduler, ARequestThatCanNeverFitFailsTheRunInsteadOfWaitingForever) {
  DecisionLog log;
  cache::DeviceCache dc({Tokens(4), Pages(3)}, log);  // 12 tokens
  Scheduler s({/*chunk_size=*/64, /*max_running=*/8, /*vocab=*/100}, dc);
  s.enqueue(spec(0, std::vector<TokenId>(13, 7), 2), 0);  // 14 positions: 4 pages
  try {
    s.schedule(0);
    FAIL() << "admitted a request larger than the pool";
  } catch (const RunFailure& e) {
    EXPECT_NE(std::string(e.what()).find("request 0 needs 4 device pages (14 tokens) but the device pool holds 3"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace kvgrid
