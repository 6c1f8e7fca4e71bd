// The hybrid synthetic model (full attention + sliding-window attention + recurrent layers)
// against its oracle, which computes every layer from the tokens alone: chunked prefill with
// chunks smaller and larger than the window, at TP 1 and 2, in both payloads; and every way its
// data can be wrong or misplaced — an in-window SWA page poisoned, the window read by the FULL
// index space or from FULL-layer KV, a reused MAMBA state with one word flipped or taken one
// page too shallow — is a mismatch, while poisoning what lies outside every window is not.
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <tuple>

#include "core/check.hpp"
#include "core/rng.hpp"
#include "kernels/kv_math.hpp"
#include "kokkos_env.hpp"
#include "runtime/experiment.hpp"
#include "runtime/model.hpp"

namespace kvgrid {
namespace {

[[maybe_unused]] const bool kokkos_ready = (testing::ensure_kokkos(), true);

constexpr std::int64_t kPage = 4;
constexpr std::int64_t kWindow = 10;  // not a page multiple
constexpr std::int64_t kChunk = 4;    // MAMBA checkpoint grid: every page

// A TP group of ranks, each with a FULL pool, an SWA pool and a state pool; chunks are summed
// over the ranks and chained, as the serving loop does.
struct HybridRig {
  ExperimentConfig exp;
  struct Rank {
    std::unique_ptr<cache::KvPool> full, swa;
    std::unique_ptr<cache::StatePool> states;
    std::unique_ptr<SyntheticModel> model;
  };
  std::vector<Rank> ranks;
  std::unique_ptr<Oracle> oracle;

  // Sidecars: an indexer following FULL (2 words per token) and a compressor following SWA (1).
  std::vector<std::unique_ptr<cache::unified::PayloadSidecar>> sidecar_store;

  HybridRig(int tp, const std::string& payload, const std::string& types = "full,swa,mamba,swa,full", bool sidecars = false) {
    const std::string toml = sidecars ? "[[model.sidecar]]\nname = \"indexer\"\nsource = \"full\"\nwords = 2\n"
                                        "[[model.sidecar]]\nname = \"compressor\"\nsource = \"swa\"\nwords = 1\n"
                                      : "";
    exp = parse_experiment(toml, "hybrid",
                           {"topology.tp=" + std::to_string(tp), "model.layers=5", "model.kv_heads=4", "model.head_dim=3",
                            "model.layer_types=" + types, "model.swa_window=" + std::to_string(kWindow),
                            "model.mamba_chunk=" + std::to_string(kChunk), "model.mamba_state=3",
                            "cache.page_size=" + std::to_string(kPage), "engine.payload=" + payload, "workload.kind=gsp"});
    const GridShape shape = exp.topology.groups[0].shape;
    for (int r = 0; r < shape.size(); ++r) {
      const auto geo = ModelGeometry::for_rank(exp, layout_coord(exp.topology, r), shape);
      Rank k;
      k.full = std::make_unique<cache::KvPool>(cache::KvPoolConfig{Pages(64), Tokens(kPage), geo.layer_id(LayerKind::Full, 0),
                                                                   geo.local_of(LayerKind::Full), geo.kv_heads, geo.head_dim,
                                                                   cache::parse_payload(payload)});
      k.swa = std::make_unique<cache::KvPool>(cache::KvPoolConfig{Pages(64), Tokens(kPage), geo.layer_id(LayerKind::Swa, 0),
                                                                  geo.local_of(LayerKind::Swa), geo.kv_heads,
                                                                  payload == "full" ? geo.head_dim : 1, cache::Payload::Full});
      k.states = std::make_unique<cache::StatePool>(16, geo.local_of(LayerKind::Mamba) * geo.kv_heads.size() * geo.mamba_state);
      k.model = std::make_unique<SyntheticModel>(geo, *k.full, Tokens(kPage));
      k.model->attach_hybrid(k.swa.get(), k.states.get());
      if (sidecars) {  // per rank: each holds the stage's sidecars whole
        std::vector<cache::unified::PayloadSidecar*> sc;
        for (const auto& spec : exp.model.sidecars) {
          sidecar_store.push_back(std::make_unique<cache::unified::PayloadSidecar>(
              spec.name, cache::unified::ComponentId(spec.source == LayerKind::Swa ? 1 : 0),
              static_cast<std::size_t>(spec.words * kPage), 64));
          sc.push_back(sidecar_store.back().get());
        }
        k.model->attach_sidecars(sc, exp.model.sidecars);
      }
      if (r == 0) oracle = std::make_unique<Oracle>(geo, Tokens(kPage));
      ranks.push_back(std::move(k));
    }
  }

  // A request's tables: FULL pages, SWA pages, its state slot and its checkpoint slot.
  struct Req {
    RequestId id;
    std::vector<PageId> full;
    std::vector<std::uint32_t> swa;
    std::uint32_t state = 0, ckpt = 0;
    std::vector<ModelRequestState> st;
    OracleRequestState o;
  };
  Req request(std::uint32_t id, std::uint32_t full0, std::uint32_t swa0, std::size_t pages, std::uint32_t state,
              std::uint32_t ckpt = 0) {
    Req q;
    q.id = RequestId(id);
    for (std::size_t i = 0; i < pages; ++i) {
      q.full.push_back(PageId(full0 + static_cast<std::uint32_t>(i)));
      q.swa.push_back(swa0 + static_cast<std::uint32_t>(i));
    }
    q.state = state;
    q.ckpt = ckpt;
    q.st.resize(ranks.size());
    return q;
  }
  // (got, want) for one chunk.
  std::pair<std::uint64_t, std::uint64_t> chunk(Req& q, const std::vector<TokenId>& t, std::size_t start, std::size_t end) {
    std::vector<std::uint64_t> sum;
    for (std::size_t r = 0; r < ranks.size(); ++r) {
      std::vector<std::uint64_t> part(ranks[r].model->geometry().local_layers());
      ranks[r].model->forward(q.st[r], t, start, end, q.full, part, {}, HybridTables{q.swa, q.state, q.ckpt});
      if (sum.empty()) sum.assign(part.size(), 0);
      for (std::size_t l = 0; l < part.size(); ++l) sum[l] += part[l];
    }
    return {chain(chain_seed(q.id, start, end), sum), oracle->expected(q.o, q.id, t, start, end)};
  }
  // Copies a state slot on every rank (the cache's match finalizer copy).
  void copy_state(std::uint32_t src, std::uint32_t dst) {
    for (auto& k : ranks) k.states->copy(src, dst);
  }
  void poison_swa(std::vector<PageId> pages) {
    for (auto& k : ranks) k.swa->poison(pages);
  }
};

std::vector<TokenId> random_tokens(std::size_t n, std::uint64_t seed) {
  Rng rng(seed);
  std::vector<TokenId> t(n);
  for (auto& x : t) x = static_cast<TokenId>(rng.below(5000));
  return t;
}

struct DebugChecks {  // full pages are poisoned only with debug checks on
  bool was = debug_checks_enabled();
  DebugChecks() { set_debug_checks(true); }
  ~DebugChecks() { set_debug_checks(was); }
};

// (tp, payload, chunk tokens)
class HybridChunks : public ::testing::TestWithParam<std::tuple<int, std::string, int>> {};

// Chunked prefill and decode match the oracle; between chunks every SWA page wholly outside all
// windows still to be read is poisoned — and changes nothing.
TEST_P(HybridChunks, MatchTheOracleWhatLiesOutsideTheWindowIsNeverRead) {
  const auto& [tp, payload, step] = GetParam();
  DebugChecks on;
  HybridRig g(tp, payload);
  const auto t = random_tokens(70, 11);
  auto q = g.request(1, 1, 1, 18, 1);
  for (std::size_t start = 0; start < t.size();) {
    const std::size_t end = std::min(t.size(), start + static_cast<std::size_t>(step));
    auto [got, want] = g.chunk(q, t, start, end);
    ASSERT_EQ(got, want) << "chunk [" << start << ", " << end << ")";
    start = end;
    // Queries from `start` on read positions > start - W: pages ending at or before that are dead.
    std::vector<PageId> dead;
    for (std::size_t p = 0; static_cast<std::int64_t>((p + 1) * kPage) <= static_cast<std::int64_t>(start) + 1 - kWindow; ++p)
      dead.push_back(PageId(q.swa[p]));
    g.poison_swa(dead);
  }
}

std::string chunks_name(const ::testing::TestParamInfo<std::tuple<int, std::string, int>>& i) {
  return "tp" + std::to_string(std::get<0>(i.param)) + "_" + std::get<1>(i.param) + "_chunk" + std::to_string(std::get<2>(i.param));
}

INSTANTIATE_TEST_SUITE_P(ChunksAroundTheWindow, HybridChunks,
                         ::testing::Combine(::testing::Values(1, 2), ::testing::Values("digest", "full"),
                                            ::testing::Values(3, 1, 24)),  // < W, decode-like, > W
                         chunks_name);

// One SWA page inside the window of the next chunk, poisoned: a mismatch (the same run without
// the poison matches).
TEST(HybridModel, AnInWindowSwaPagePoisonedIsAMismatch) {
  DebugChecks on;
  const auto t = random_tokens(40, 12);
  for (const char* payload : {"digest", "full"})
    for (bool poison : {false, true}) {
      HybridRig g(1, payload);
      auto q = g.request(1, 1, 1, 10, 1);
      auto first = g.chunk(q, t, 0, 24);
      ASSERT_EQ(first.first, first.second);
      // The next chunk's first query (24) reads positions 15..24: page 4 = [16, 20) is in it.
      if (poison) g.poison_swa({PageId(q.swa[4])});
      auto [got, want] = g.chunk(q, t, 24, 32);
      if (poison) EXPECT_NE(got, want) << payload << ": a poisoned in-window SWA page went unnoticed";
      else EXPECT_EQ(got, want) << payload;
    }
}

// A second request reuses the first one's prefix of 32 tokens — FULL pages, the SWA window's
// pages and the MAMBA state at 32, copied into its own slot — and computes on. Done right, its
// chunk matches the oracle; each fault below is a mismatch.
enum class Reuse { Right, SwaByFullIds, SwaFromFullKv, FlipStateWord, StateOnePageShallower };

class HybridReuse : public ::testing::TestWithParam<std::tuple<std::string, Reuse>> {};

TEST_P(HybridReuse, OnlyTheRightPrefixMatchesTheOracle) {
  const auto& [payload, fault] = GetParam();
  if (fault == Reuse::SwaFromFullKv && payload == "digest") GTEST_SKIP() << "a digest FULL pool has no per-token KV to read";
  HybridRig g(1, payload);
  auto t = random_tokens(48, 14);
  // a: [0, 28) with its checkpoint in slot 4 (the state at 28 stays there), then [28, 32) with
  // its checkpoint in slot 2 (the state at 32).
  auto a = g.request(1, 1, 20, 12, 1, 4);
  auto r1 = g.chunk(a, t, 0, 28);
  ASSERT_EQ(r1.first, r1.second);
  a.ckpt = 2;
  auto r2 = g.chunk(a, t, 28, 32);
  ASSERT_EQ(r2.first, r2.second);
  // b: the same 32 tokens, then its own. FULL: a's pages 1..8, then fresh 30..; SWA: a's pages of
  // the window before 32 (positions 22..31: pages 5..7), fresh 40.. elsewhere; state: a copy.
  for (std::size_t i = 32; i < t.size(); ++i) t[i] = static_cast<TokenId>(t[i] + 1);
  auto b = g.request(2, 30, 40, 12, 3);
  for (std::size_t k = 0; k < 8; ++k) b.full[k] = a.full[k];
  for (std::size_t k = 5; k < 8; ++k) b.swa[k] = a.swa[k];
  std::uint32_t src = 2;
  switch (fault) {
    case Reuse::SwaByFullIds:  // the window's pages looked up by their FULL ids (6..8: SWA pages
      // another request wrote, the same positions of another prompt)
      for (std::size_t k = 5; k < 8; ++k) b.swa[k] = b.full[k].value();
      {
        auto other = g.request(3, 50, 1, 12, 5);
        auto t2 = random_tokens(32, 99);
        g.chunk(other, t2, 0, 32);
      }
      break;
    case Reuse::SwaFromFullKv:  // the window's pages hold FULL-layer KV (layer-0 blocks of the same positions)
      for (auto& k : g.ranks)
        for (std::size_t p = 5; p < 8; ++p)
          for (std::size_t l = 0; l < k.swa->layers(); ++l)
            std::copy_n(k.full->layer_block(b.full[p], 0), k.full->layer_block_bytes() / 8, k.swa->layer_block(PageId(b.swa[p]), l));
      break;
    case Reuse::FlipStateWord:
      for (auto& k : g.ranks) k.states->slot(2)[1] ^= 1ULL << 17;
      break;
    case Reuse::StateOnePageShallower:  // the state at 28, one page (and one grid step) short of 32
      src = 4;
      break;
    default: break;
  }
  g.copy_state(src, b.state);
  auto [got, want] = g.chunk(b, t, 32, 44);
  if (fault == Reuse::Right) EXPECT_EQ(got, want) << payload;
  else EXPECT_NE(got, want) << payload << ": a wrong prefix went unnoticed";
}

std::string reuse_name(const ::testing::TestParamInfo<std::tuple<std::string, Reuse>>& i) {
  static const char* names[] = {"Right", "SwaByFullIds", "SwaFromFullKv", "FlipStateWord", "StateOnePageShallower"};
  return std::get<0>(i.param) + "_" + names[static_cast<int>(std::get<1>(i.param))];
}

INSTANTIATE_TEST_SUITE_P(EveryFault, HybridReuse,
                         ::testing::Combine(::testing::Values("digest", "full"),
                                            ::testing::Values(Reuse::Right, Reuse::SwaByFullIds, Reuse::SwaFromFullKv,
                                                              Reuse::FlipStateWord, Reuse::StateOnePageShallower)),
                         reuse_name);

// Sidecars follow their source's page ids. A request's pages are moved to new ids (a copy of the
// FULL and SWA rows, as a migration or a tier round trip does): with the sidecar entries moved
// along the next chunk matches the oracle; with any sidecar left behind it is a mismatch.
TEST(HybridModel, ASidecarNotMovedWithItsSourceIsAMismatch) {
  const auto t = random_tokens(40, 15);
  for (const char* payload : {"digest", "full"})
    for (int left_behind : {-1, 0, 1}) {  // -1: every sidecar moved; else the one left behind
      HybridRig g(2, payload, "full,swa,mamba,swa,full", /*sidecars=*/true);
      auto q = g.request(1, 1, 1, 10, 1);
      auto r0 = g.chunk(q, t, 0, 24);
      ASSERT_EQ(r0.first, r0.second) << payload << ": sidecars computed right";
      // Move pages 0..5 of both page tables to ids 30.., with their KV.
      for (std::size_t p = 0; p < 6; ++p) {
        const PageId from_f = q.full[p], to_f(30 + static_cast<std::uint32_t>(p));
        const PageId from_s(q.swa[p]), to_s(30 + static_cast<std::uint32_t>(p));
        for (auto& k : g.ranks) {
          for (std::size_t l = 0; l < k.full->layers(); ++l)
            std::copy_n(k.full->layer_block(from_f, l), k.full->layer_block_bytes() / 8, k.full->layer_block(to_f, l));
          for (std::size_t l = 0; l < k.swa->layers(); ++l)
            std::copy_n(k.swa->layer_block(from_s, l), k.swa->layer_block_bytes() / 8, k.swa->layer_block(to_s, l));
        }
        for (std::size_t i = 0; i < g.sidecar_store.size(); ++i) {
          auto& sc = *g.sidecar_store[i];
          const bool swa = g.exp.model.sidecars[i % 2].source == LayerKind::Swa;
          const cache::unified::Slot from(swa ? from_s.value() : from_f.value()), to(30 + static_cast<std::uint32_t>(p));
          if (static_cast<int>(i % 2) == left_behind || !sc.has(from)) continue;
          const auto w = sc.read(from);
          sc.write(to, std::vector<std::uint64_t>(w.begin(), w.end()));
        }
        q.full[p] = to_f;
        q.swa[p] = to_s.value();
      }
      // A fresh request state reads the moved prefix from its pages (as after a hit).
      q.st.assign(q.st.size(), ModelRequestState{});
      g.copy_state(1, 2);
      q.state = 2;
      auto [got, want] = g.chunk(q, t, 24, 32);
      if (left_behind < 0) EXPECT_EQ(got, want) << payload;
      else EXPECT_NE(got, want) << payload << ": sidecar " << left_behind << " left behind went unnoticed";
    }
}

// A full-attention model keeps its layer ids (and so every shipped run's checksums): the k-th
// FULL layer is layer k, and a hybrid model's FULL layers are numbered among themselves.
TEST(HybridModel, LayerIdsPerKind) {
  auto exp = parse_experiment("", "ids", {"model.layers=5", "model.layer_types=full,swa,mamba", "model.swa_window=8", "workload.kind=gsp"});
  const auto geo = ModelGeometry::for_rank(exp, layout_coord(exp.topology, 0), exp.topology.groups[0].shape);
  EXPECT_EQ(geo.local_of(LayerKind::Full), 2u);
  EXPECT_EQ(geo.local_of(LayerKind::Swa), 2u);
  EXPECT_EQ(geo.local_of(LayerKind::Mamba), 1u);
  EXPECT_EQ(geo.layer_id(LayerKind::Full, 1), 1u);
  EXPECT_EQ(geo.layer_id(LayerKind::Swa, 1), kernels::kSwaLayer0 + 1);
  EXPECT_EQ(geo.layer_id(LayerKind::Mamba, 0), kernels::kMambaLayer0);
  auto plain = parse_experiment("", "ids", {"model.layers=5"});
  const auto pg = ModelGeometry::for_rank(plain, layout_coord(plain.topology, 0), plain.topology.groups[0].shape);
  EXPECT_FALSE(pg.hybrid());
  EXPECT_EQ(pg.local_of(LayerKind::Full), 5u);
  EXPECT_EQ(pg.layer_id(LayerKind::Full, 3), 3u);
}

// The recurrence is order-dependent and the state folds into the checksum: two tokens swapped
// give another state.
TEST(HybridModel, MambaStepIsOrderDependent) {
  std::uint64_t a[3] = {1, 2, 3}, b[3] = {1, 2, 3};
  kernels::mamba_step(a, 3, 111, 5, 0);
  kernels::mamba_step(a, 3, 222, 5, 0);
  kernels::mamba_step(b, 3, 222, 5, 0);
  kernels::mamba_step(b, 3, 111, 5, 0);
  EXPECT_NE(kernels::mamba_fold(a, 3), kernels::mamba_fold(b, 3));
}

}  // namespace
}  // namespace kvgrid
