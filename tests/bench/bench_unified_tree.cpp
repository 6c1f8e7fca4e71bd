// Unified tree core benchmarks (Google Benchmark): the core with FULL, SWA and MAMBA next to the
// core with FULL alone and next to a memcmp of the same token bytes (the baselines the targets of
// "Unified radix cache I" name). Figures and ratios are in docs/performance.md.
//
//   match / insert: a cached 131,072-token prompt (page 64, built from 64 inserts of 2,048 tokens:
//     a 64-node path), matched whole; a new prompt sharing its first half inserted (and evicted
//     again outside the timing). Hybrid: SWA window 4,096 tokens, MAMBA states every 2,048 tokens.
//   conversation: the article's tree-core shape — 200 rounds, each adding 100 input and 100
//     output tokens; per round one match of the round's prompt and one insert of prompt + output
//     below the matched node, offering that round's own pages (page 4, window 1,024 tokens, a
//     MAMBA state at every turn's end: chunk 100). Timed as rounds 1-25 and 176-200, each next to
//     a memcmp of those rounds' prompts.
#include <benchmark/benchmark.h>

#include <cstring>
#include <memory>
#include <vector>

#include "cache/unified_components.hpp"
#include "cache/unified_tree.hpp"
#include "core/rng.hpp"

namespace kvgrid::cache::unified {
namespace {

constexpr std::int64_t kPage = 64;
constexpr std::size_t kPrompt = 131072;

std::vector<TokenId> random_tokens(Rng& rng, std::size_t n) {
  std::vector<TokenId> t(n);
  for (auto& x : t) x = static_cast<TokenId>(rng.below(128000));
  return t;
}

std::vector<Slot> slots(std::size_t n, std::uint32_t first) {
  std::vector<Slot> s(n);
  for (std::size_t i = 0; i < n; ++i) s[i] = Slot(first + static_cast<std::uint32_t>(i));
  return s;
}

// A tree with FULL alone or FULL + SWA + MAMBA, and the values one insert of `tokens` carries.
struct Tree {
  UnifiedTree tree;
  bool hybrid;
  std::uint32_t next_state = 1;
  Tree(std::int64_t page, bool hybrid_, std::int64_t window, std::int64_t chunk) : tree(Tokens(page)), hybrid(hybrid_) {
    tree.add_component(std::make_unique<FullComponent>());
    if (!hybrid) return;
    tree.add_component(std::make_unique<SwaComponent>(Tokens(window)));
    tree.add_component(std::make_unique<MambaComponent>(Tokens(chunk)));
  }
  // FULL and SWA pages numbered from `first` (their own index spaces) for tokens [from, end) —
  // what the caller holds of its own (the serving loop offers its pages from where its shared
  // prefix ends) — and a state at the key's end.
  InsertResult insert(std::span<const TokenId> tokens, std::uint32_t first, std::size_t from = 0, Node* below = nullptr) {
    const std::size_t p = static_cast<std::size_t>(tree.page_size().value()), pages = (tokens.size() - from) / p;
    const Tokens at(static_cast<std::int64_t>(from));
    std::vector<InsertValue> v{InsertValue::pages(slots(pages, first), at)};
    if (hybrid) {
      v.push_back(InsertValue::pages(slots(pages, first), at));
      v.push_back(InsertValue::state(Slot(next_state++), Tokens(static_cast<std::int64_t>(tokens.size()))));
    }
    return below ? tree.insert_below(below, tokens, v) : tree.insert(tokens, v);
  }
};

struct Cached {
  Tree t;
  std::vector<TokenId> prompt;
  explicit Cached(bool hybrid) : t(kPage, hybrid, 4096, 2048) {
    Rng rng(1);
    prompt = random_tokens(rng, kPrompt);
    for (std::size_t k = 1; k <= 64; ++k) t.insert(std::span<const TokenId>(prompt).first(2048 * k), 1);
  }
};

void match_131k(benchmark::State& state, bool hybrid) {
  Cached c(hybrid);
  std::vector<TokenId> query = c.prompt;
  query.push_back(7);  // the whole cached prompt may be reused (prompt - 1 rule)
  MatchResult m;
  for (auto _ : state) {
    m = c.t.tree.match_prefix(query);
    benchmark::DoNotOptimize(m.last_node);
  }
  if (m.matched.value() != static_cast<std::int64_t>(kPrompt)) state.SkipWithError("match is too short");
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * kPrompt * sizeof(TokenId)));
}
void BM_UnifiedFullMatch131k(benchmark::State& s) { match_131k(s, false); }
void BM_UnifiedHybridMatch131k(benchmark::State& s) { match_131k(s, true); }
BENCHMARK(BM_UnifiedFullMatch131k)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_UnifiedHybridMatch131k)->Unit(benchmark::kMicrosecond);

void insert_131k(benchmark::State& state, bool hybrid) {
  Cached c(hybrid);
  Rng rng(2);
  std::vector<TokenId> q(c.prompt.begin(), c.prompt.begin() + kPrompt / 2);
  auto fresh = random_tokens(rng, kPrompt / 2);
  q.insert(q.end(), fresh.begin(), fresh.end());
  auto whole = c.t.tree.match_prefix([&] { auto x = c.prompt; x.push_back(7); return x; }());
  LockHandle keep = c.t.tree.lock(whole.last_node);  // only the new half is evicted again
  for (auto _ : state) {
    auto r = c.t.insert(q, 1000000);
    benchmark::DoNotOptimize(r.last_node);
    state.PauseTiming();
    if (r.components[0].present.value() != static_cast<std::int64_t>(kPrompt / 2)) state.SkipWithError("unexpected prefix");
    c.t.tree.evict(ComponentId(0), static_cast<std::int64_t>(kPrompt / 2 / kPage));
    state.ResumeTiming();
  }
  c.t.tree.unlock(keep);
}
void BM_UnifiedFullInsertHalfShared131k(benchmark::State& s) { insert_131k(s, false); }
void BM_UnifiedHybridInsertHalfShared131k(benchmark::State& s) { insert_131k(s, true); }
BENCHMARK(BM_UnifiedFullInsertHalfShared131k)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_UnifiedHybridInsertHalfShared131k)->Unit(benchmark::kMicrosecond);

void BM_UnifiedMemcmp131k(benchmark::State& state) {
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
BENCHMARK(BM_UnifiedMemcmp131k)->Unit(benchmark::kMicrosecond);

// The conversation: round r's prompt is the history (200 (r - 1) tokens) + 100 new input tokens;
// after it, 100 output tokens join the history. One iteration = rounds [first, last] on a tree
// that already holds rounds 1 .. first - 1 (built outside the timing).
constexpr int kRounds = 200;
constexpr std::int64_t kConvPage = 4;

void conversation(benchmark::State& state, bool hybrid, int first, int last, bool memcmp_only) {
  Rng rng(3);
  const auto history = random_tokens(rng, static_cast<std::size_t>(kRounds) * 200);
  auto prompt_of = [&](int r) { return std::span<const TokenId>(history).first(static_cast<std::size_t>(200 * r - 100)); };
  auto turn_of = [&](int r) { return std::span<const TokenId>(history).first(static_cast<std::size_t>(200 * r)); };
  const auto copy = history;
  for (auto _ : state) {
    if (memcmp_only) {
      for (int r = first; r <= last; ++r) {
        const auto p = prompt_of(r);
        int c = std::memcmp(p.data(), copy.data(), p.size() * sizeof(TokenId));
        benchmark::DoNotOptimize(c);
      }
      continue;
    }
    state.PauseTiming();
    auto t = std::make_unique<Tree>(kConvPage, hybrid, 1024, 100);
    // Slots are numbered by position, so every round's are fresh; each round offers its own
    // 200 tokens' pages (the history before them is the tree's, matched).
    auto put = [&](int r, Node* below = nullptr) {
      const std::size_t from = static_cast<std::size_t>(200 * (r - 1));
      return t->insert(turn_of(r), 1 + static_cast<std::uint32_t>(from / kConvPage), from, below);
    };
    for (int r = 1; r < first; ++r) put(r);
    state.ResumeTiming();
    for (int r = first; r <= last; ++r) {
      auto m = t->tree.match_prefix(prompt_of(r));
      benchmark::DoNotOptimize(m.last_node);
      // The insert continues below the matched node, as the serving loop's does below its lock.
      if (m.matched.value() != 200 * (r - 1)) state.SkipWithError("the previous turn was not reused");
      auto ins = put(r, m.last_node);
      benchmark::DoNotOptimize(ins.last_node);
    }
    state.PauseTiming();
    t.reset();
    state.ResumeTiming();
  }
  state.counters["rounds"] = last - first + 1;
}
void BM_ConversationFullRounds1to25(benchmark::State& s) { conversation(s, false, 1, 25, false); }
void BM_ConversationHybridRounds1to25(benchmark::State& s) { conversation(s, true, 1, 25, false); }
void BM_ConversationMemcmpRounds1to25(benchmark::State& s) { conversation(s, false, 1, 25, true); }
void BM_ConversationFullRounds176to200(benchmark::State& s) { conversation(s, false, 176, 200, false); }
void BM_ConversationHybridRounds176to200(benchmark::State& s) { conversation(s, true, 176, 200, false); }
void BM_ConversationMemcmpRounds176to200(benchmark::State& s) { conversation(s, false, 176, 200, true); }
BENCHMARK(BM_ConversationFullRounds1to25)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_ConversationHybridRounds1to25)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_ConversationMemcmpRounds1to25)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_ConversationFullRounds176to200)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_ConversationHybridRounds176to200)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_ConversationMemcmpRounds176to200)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace kvgrid::cache::unified

BENCHMARK_MAIN();
