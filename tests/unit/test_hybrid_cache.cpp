// The hybrid device tier (cache/hybrid_cache.hpp) under pool pressure: a small scheduler drives
// requests that share prefixes through reserve → prepare → advance → insert → commit (or abort)
// over tiny FULL, SWA and MAMBA pools, with the tree's and every pool's invariants verified after
// every call — the checkpoint slot's eviction must never take what an insert just made, and no
// page or slot may leak or be freed twice. Randomized over pools, windows and chunks (seed
// printed; KVGRID_TEST_SEED overrides). And P/D decode's receive path by hand (the tail window's
// pages, the received state as the checkpoint, the commit's tombstones).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "cache/device_cache.hpp"
#include "core/check.hpp"
#include "core/rng.hpp"
#include "test_seed.hpp"

namespace kvgrid::cache {
namespace {

using kvgrid::testing::seed_or;

struct Running {
  RequestId id;
  std::vector<TokenId> tokens;  // the whole request (prompt + output), known up front here
  std::size_t prompt = 0, computed = 0;
  Reservation res;
};

TEST(HybridCache, PoolPressureKeepsEveryInvariant) {
  const std::uint64_t seed = seed_or(20261202);
  std::printf("seed %llu (KVGRID_TEST_SEED)\n", static_cast<unsigned long long>(seed));
  const bool was = debug_checks_enabled();
  set_debug_checks(true);  // verify() after every call
  Rng rng(seed);
  std::int64_t admitted = 0, finished = 0, hits = 0;
  for (int trial = 0; trial < 12; ++trial) {
    const std::int64_t p = 4, chunk = 4 + static_cast<std::int64_t>(rng.below(20));
    HybridCacheConfig hc;
    hc.page_size = Tokens(p);
    hc.swa = trial % 3 != 2;
    hc.window = Tokens(1 + static_cast<std::int64_t>(rng.below(12)));
    hc.mamba = trial % 3 != 1;
    hc.mamba_chunk = Tokens(p * (1 + static_cast<std::int64_t>(rng.below(2))));
    hc.mamba_slots = 3 + static_cast<std::int64_t>(rng.below(6));
    hc.chunk_tokens = Tokens(chunk);
    const std::int64_t w = (hc.window.value() + p - 1) / p;
    hc.swa_pages = Pages(2 * w + (chunk + p - 1) / p + 2 + static_cast<std::int64_t>(rng.below(20)));
    DecisionLog log;
    DeviceCache dc(DeviceCacheConfig{Tokens(p), Pages(40 + static_cast<std::int64_t>(rng.below(40))), 1, hc}, log);
    std::vector<std::vector<TokenId>> prefixes(3);
    for (auto& pre : prefixes) {
      pre.resize(8 + rng.below(40));
      for (auto& t : pre) t = static_cast<TokenId>(rng.below(50));
    }
    std::vector<std::unique_ptr<Running>> waiting, running;
    std::uint32_t next = 0;
    for (int step = 0; step < 120; ++step) {
      while (waiting.size() < 4) {  // arrivals: a shared prefix, a suffix, an output
        auto r = std::make_unique<Running>();
        r->id = RequestId(next++);
        r->tokens = prefixes[rng.below(prefixes.size())];
        for (std::size_t i = 0, n = 1 + rng.below(20); i < n; ++i) r->tokens.push_back(static_cast<TokenId>(rng.below(50)));
        r->prompt = r->tokens.size();
        for (std::size_t i = 0, n = 1 + rng.below(6); i < n; ++i) r->tokens.push_back(static_cast<TokenId>(rng.below(50)));
        waiting.push_back(std::move(r));
      }
      while (!waiting.empty() && running.size() < 4) {
        auto& r = *waiting.front();
        const std::size_t kv = r.tokens.size() - 1;
        auto res = dc.reserve(r.id, std::span<const TokenId>(r.tokens).first(r.prompt), Tokens(static_cast<std::int64_t>(kv)));
        if (!res) break;
        r.res = std::move(*res);
        r.computed = static_cast<std::size_t>(r.res.matched.value());
        hits += r.computed > 0;
        ++admitted;
        running.push_back(std::move(waiting.front()));
        waiting.erase(waiting.begin());
      }
      for (auto& rp : running) {
        Running& r = *rp;
        const std::size_t kv = r.tokens.size() - 1;
        if (r.computed >= kv) continue;
        const std::size_t end = r.computed < r.prompt ? std::min(r.prompt, r.computed + static_cast<std::size_t>(chunk)) : r.computed + 1;
        if (!dc.prepare(r.id, r.res, Tokens(static_cast<std::int64_t>(end)))) continue;
        dc.advance(r.res, Tokens(static_cast<std::int64_t>(r.computed)), Tokens(static_cast<std::int64_t>(end)));
        const bool prefill = r.computed < r.prompt;
        r.computed = end;
        if (prefill) dc.insert_computed(r.id, r.res, std::span<const TokenId>(r.tokens).first(end));
      }
      for (auto& rp : running) {
        if (rp->computed < rp->tokens.size() - 1) {
          if (rng.below(40) == 0) {  // a client abort
            dc.abort(rp->id, rp->res);
            rp.reset();
          }
          continue;
        }
        dc.commit(rp->id, rp->res, std::span<const TokenId>(rp->tokens).first(rp->tokens.size() - 1));
        ++finished;
        rp.reset();
      }
      std::erase(running, nullptr);
      dc.verify();
    }
    for (auto& rp : running) dc.abort(rp->id, rp->res);
    dc.verify();
    EXPECT_EQ(dc.reserved_pages().value(), 0) << "trial " << trial;
    EXPECT_EQ(dc.hybrid()->swa_pool().used(), dc.hybrid()->tree().held_slots(unified::ComponentId(hc.swa ? 1 : 0)) * (hc.swa ? 1 : 0))
        << "trial " << trial << ": SWA pages outside the tree after every request left";
  }
  set_debug_checks(was);
  std::printf("admitted %lld, finished %lld, hits %lld\n", static_cast<long long>(admitted), static_cast<long long>(finished),
              static_cast<long long>(hits));
  EXPECT_GT(finished, 100);
  EXPECT_GT(hits, 20) << "the workload must reuse prefixes to test anything";
}

}  // namespace
}  // namespace kvgrid::cache

namespace kvgrid::cache {
namespace {

// P/D decode by hand (page 4, window 10, grid 8): where the received SWA pages start, the pages a
// receive takes, the received state made the checkpoint at a prompt on the grid, and the commit
// leaving [matched, tail) as SWA tombstones while the tail window stays live.
TEST(HybridCache, PdDecodeTakesTheTailWindowAndCheckpointsTheReceivedState) {
  // pd_swa_from: the page holding prompt - W + 1, or the match's end if later.
  EXPECT_EQ(pd_swa_from(Tokens(0), Tokens(24), Tokens(10), Tokens(4)), Tokens(12));  // 24 - 10 + 1 = 15 -> page at 12
  EXPECT_EQ(pd_swa_from(Tokens(0), Tokens(23), Tokens(8), Tokens(4)), Tokens(16));   // 16: reads (15, 23], from 16
  EXPECT_EQ(pd_swa_from(Tokens(16), Tokens(24), Tokens(10), Tokens(4)), Tokens(16));  // the match ends later
  EXPECT_EQ(pd_swa_from(Tokens(0), Tokens(6), Tokens(10), Tokens(4)), Tokens(0));     // a prompt shorter than W
  EXPECT_EQ(pd_swa_from(Tokens(0), Tokens(26), Tokens(8), Tokens(4)), Tokens(16));    // 26 - 8 + 1 = 19 -> 16

  HybridCacheConfig hc;
  hc.page_size = Tokens(4);
  hc.swa = true;
  hc.window = Tokens(10);
  hc.swa_pages = Pages(40);
  hc.mamba = true;
  hc.mamba_chunk = Tokens(8);
  hc.mamba_slots = 8;
  hc.chunk_tokens = Tokens(16);
  DecisionLog log;
  DeviceCache dc(DeviceCacheConfig{Tokens(4), Pages(40), 1, hc}, log);
  std::vector<std::uint32_t> copies;  // (src, dst) of every state copy
  dc.hybrid()->set_copy_state([&](std::uint32_t src, std::uint32_t dst) { copies.insert(copies.end(), {src, dst}); });
  std::vector<TokenId> t(25);
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = static_cast<TokenId>(i + 1);
  const std::span<const TokenId> prompt = std::span<const TokenId>(t).first(24);
  auto r = dc.reserve(RequestId(1), prompt, Tokens(25));  // prompt 24 + the first output token
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->matched, Tokens(0));
  ASSERT_TRUE(dc.hybrid()->expect_suffix(RequestId(1), *r, Tokens(24)));
  const HybridHold& h = *r->hybrid;
  EXPECT_EQ(h.swa.own_from, Tokens(12)) << "pages 3..5 only: positions 12..23";
  ASSERT_EQ(h.swa.own.size(), 3u);
  for (std::size_t pg = 0; pg < 7; ++pg) EXPECT_EQ(h.swa_table[pg] != 0, pg >= 3 && pg < 6) << "SWA page of page " << pg;
  dc.hybrid()->suffix_received(*r, Tokens(24));  // 24 is on the grid of 8: the received state is the checkpoint
  ASSERT_EQ(copies.size(), 2u);
  EXPECT_EQ(copies[0], h.mamba);
  EXPECT_EQ(copies[1], h.mamba_ckpt);
  EXPECT_EQ(h.ckpt_at, Tokens(24));
  dc.hybrid()->verify();
  dc.commit(RequestId(1), *r, t);  // (no decode step here: the partial page 6 is not inserted)
  // The tree: FULL over [0, 24), SWA live only in the window before the end, the state at 24.
  EXPECT_EQ(dc.peek_hit(t), Tokens(24)) << "a later request reuses through the received state and tail window";
  dc.hybrid()->verify();
  EXPECT_EQ(dc.hybrid()->counters().tombstones_made, 3) << "pages 0..2 were never held on decode";
}

}  // namespace
}  // namespace kvgrid::cache
