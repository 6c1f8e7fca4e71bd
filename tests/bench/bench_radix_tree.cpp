// Radix tree benchmarks (Google Benchmark), each next to its baseline: a memcmp over the same
// token bytes. Targets and measured figures are in the README's performance section.
//
//   match:  a cached 131,072-token prompt, page size 64, built from 64 inserts of 2,048 tokens with
//           a sibling branch every 16 pages, so the match crosses 128 nodes
//   insert: a new 131,072-token prompt sharing its first half with the cached one
//   evict:  1,000 single-page leaves
#include <benchmark/benchmark.h>

#include <cstring>
#include <vector>

#include "cache/device_pool.hpp"
#include "cache/radix_tree.hpp"
#include "core/rng.hpp"

namespace kvgrid::cache {
namespace {

constexpr std::int64_t kPage = 64;
constexpr std::size_t kPrompt = 131072;

std::vector<TokenId> random_tokens(Rng& rng, std::size_t n) {
  std::vector<TokenId> t(n);
  for (auto& x : t) x = static_cast<TokenId>(rng.below(128000));
  return t;
}

std::vector<PageId> pages_for(std::size_t tokens, std::uint32_t first) {
  std::vector<PageId> p(tokens / kPage);
  for (std::size_t i = 0; i < p.size(); ++i) p[i] = PageId(first + static_cast<std::uint32_t>(i));
  return p;
}

struct Fixture {
  RadixTree tree{TreeConfig{Tokens(kPage)}};
  std::vector<TokenId> prompt;
  std::vector<TreeNode*> locked;
  Fixture() {
    Rng rng(1);
    prompt = random_tokens(rng, kPrompt);
    const auto all = pages_for(kPrompt, 1);
    for (std::size_t k = 1; k <= 64; ++k) {
      const std::size_t n = 2048 * k;
      tree.insert(std::span<const TokenId>(prompt).first(n), std::span<const PageId>(all).first(n / kPage));
    }
    std::uint32_t next_page = static_cast<std::uint32_t>(all.size()) + 1;
    for (std::size_t j = 1; j < 128; ++j) {  // a sibling branch after every 16 pages
      std::vector<TokenId> branch(prompt.begin(), prompt.begin() + static_cast<std::ptrdiff_t>(j * 16 * kPage));
      auto extra = random_tokens(rng, kPage);
      branch.insert(branch.end(), extra.begin(), extra.end());
      auto pg = pages_for(branch.size(), 1);
      pg.back() = PageId(next_page++);
      auto r = tree.insert(branch, pg);
      locked.push_back(r.last_node);
    }
  }
};

void BM_MatchPrefix131k(benchmark::State& state) {
  Fixture f;
  std::vector<TokenId> query = f.prompt;
  query.push_back(7);  // so the whole cached prompt may be reused (prompt - 1 rule)
  MatchResult m;
  for (auto _ : state) {
    m = f.tree.match_prefix(query);
    benchmark::DoNotOptimize(m.device_pages.data());
  }
  if (m.matched.value() != static_cast<std::int64_t>(kPrompt)) state.SkipWithError("match is too short");
  std::size_t nodes = 0;
  for (const TreeNode* n = m.last_node; n && n->parent; n = n->parent) ++nodes;
  state.counters["path_nodes"] = static_cast<double>(nodes);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * kPrompt * sizeof(TokenId)));
}
BENCHMARK(BM_MatchPrefix131k)->Unit(benchmark::kMicrosecond);

void BM_Memcmp131k(benchmark::State& state) {
  Rng rng(1);
  auto a = random_tokens(rng, kPrompt);
  auto b = a;
  for (auto _ : state) {
    benchmark::DoNotOptimize(a.data());
    benchmark::DoNotOptimize(b.data());
    int r = std::memcmp(a.data(), b.data(), kPrompt * sizeof(TokenId));
    benchmark::DoNotOptimize(r);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * kPrompt * sizeof(TokenId)));
}
BENCHMARK(BM_Memcmp131k)->Unit(benchmark::kMicrosecond);

void BM_InsertHalfShared131k(benchmark::State& state) {
  Fixture f;
  // Protect the cached prompt and its branches so that only the new suffix is evicted again.
  auto whole = f.tree.match_prefix([&] { auto q = f.prompt; q.push_back(7); return q; }());
  f.tree.lock(whole.last_node);
  for (auto* n : f.locked) f.tree.lock(n);
  Rng rng(2);
  std::vector<TokenId> q(f.prompt.begin(), f.prompt.begin() + kPrompt / 2);
  auto fresh = random_tokens(rng, kPrompt / 2);
  q.insert(q.end(), fresh.begin(), fresh.end());
  const auto pages = pages_for(kPrompt, 1000000);
  for (auto _ : state) {
    auto r = f.tree.insert(q, pages);
    benchmark::DoNotOptimize(r.last_node);
    state.PauseTiming();
    if (r.prefix_len.value() != static_cast<std::int64_t>(kPrompt / 2)) state.SkipWithError("unexpected prefix");
    f.tree.evict(Pages(kPrompt / 2 / kPage));
    state.ResumeTiming();
  }
}
BENCHMARK(BM_InsertHalfShared131k)->Unit(benchmark::kMicrosecond);

void BM_Evict1000Leaves(benchmark::State& state) {
  Rng rng(3);
  std::vector<std::vector<TokenId>> leaves;
  for (int i = 0; i < 1000; ++i) leaves.push_back(random_tokens(rng, kPage));
  RadixTree tree{TreeConfig{Tokens(kPage)}};
  for (auto _ : state) {
    state.PauseTiming();
    for (std::size_t i = 0; i < leaves.size(); ++i)
      tree.insert(leaves[i], std::vector<PageId>{PageId(static_cast<std::uint32_t>(i + 1))});
    state.ResumeTiming();
    auto freed = tree.evict(Pages(1000));
    benchmark::DoNotOptimize(freed.data());
    if (freed.size() != 1000) state.SkipWithError("not every leaf was evicted");
  }
}
BENCHMARK(BM_Evict1000Leaves)->Unit(benchmark::kMicrosecond);

void BM_Memcmp1000Pages(benchmark::State& state) {
  Rng rng(3);
  auto a = random_tokens(rng, 1000 * kPage);
  auto b = a;
  for (auto _ : state) {
    benchmark::DoNotOptimize(a.data());
    int r = std::memcmp(a.data(), b.data(), a.size() * sizeof(TokenId));
    benchmark::DoNotOptimize(r);
  }
}
BENCHMARK(BM_Memcmp1000Pages)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace kvgrid::cache

BENCHMARK_MAIN();
