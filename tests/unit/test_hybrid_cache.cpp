// The hybrid device tier (cache/hybrid_cache.hpp) under pool pressure: a small scheduler drives
// requests that share prefixes through reserve → prepare → advance → insert → commit (or abort)
// over tiny FULL, SWA and MAMBA pools, with the tree's and every pool's invariants verified after
// every call — the checkpoint slot's eviction must never take what an insert just made, and no
// page or slot may leak or be freed twice. Randomized over pools, windows and chunks (seed
// printed; KVGRID_TEST_SEED overrides).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "cache/device_cache.hpp"
#include "core/check.hpp"
#include "core/rng.hpp"

namespace kvgrid::cache {
namespace {

std::uint64_t seed_or(std::uint64_t fallback) {
  if (const char* s = std::getenv("KVGRID_TEST_SEED")) return std::strtoull(s, nullptr, 10);
  return fallback;
}

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
