// The synthetic model against the oracle, on an in-process simulation of a TP×CP×PP grid: every
// rank has its own pool; partial checksums are summed over each stage and chained stage to stage,
// as the serving loop does with MPI. The sum must not depend on the split, a cached prefix must be
// read from pages, and a corrupt page must be caught.
#include <gtest/gtest.h>

#include <memory>
#include <tuple>

#include "core/rng.hpp"
#include "kokkos_env.hpp"
#include "runtime/experiment.hpp"
#include "runtime/model.hpp"

namespace kvgrid {
namespace {

[[maybe_unused]] const bool kokkos_ready = (testing::ensure_kokkos(), true);

constexpr std::int64_t kPage = 16;

struct SimRank {
  GridCoord coord;
  std::unique_ptr<cache::KvPool> pool;
  std::unique_ptr<SyntheticModel> model;
};

struct SimGrid {
  ExperimentConfig exp;
  GridShape shape;
  std::vector<SimRank> ranks;
  std::unique_ptr<Oracle> oracle;

  SimGrid(int tp, int cp, int pp, const std::string& attention, const std::string& payload, const std::string& split) {
    exp = parse_experiment("", "sim",
                           {"topology.tp=" + std::to_string(tp), "topology.cp=" + std::to_string(cp),
                            "topology.pp=" + std::to_string(pp), "model.layers=5", "model.kv_heads=4",
                            "model.head_dim=3", "model.attention=" + attention, "model.cp_split=" + split,
                            "engine.payload=" + payload});
    shape = exp.topology.groups[0].shape;
    for (int r = 0; r < shape.size(); ++r) {
      SimRank sr;
      sr.coord = layout_coord(exp.topology, r);
      auto geo = ModelGeometry::for_rank(exp, sr.coord, shape);
      sr.pool = std::make_unique<cache::KvPool>(cache::KvPoolConfig{Pages(32), Tokens(kPage), geo.layer_begin,
                                                                    geo.local_layers(), geo.kv_heads, geo.head_dim,
                                                                    cache::parse_payload(payload)});
      sr.model = std::make_unique<SyntheticModel>(geo, *sr.pool, Tokens(kPage));
      if (r == 0) oracle = std::make_unique<Oracle>(geo);
      ranks.push_back(std::move(sr));
    }
  }

  // One chunk through the pipeline: per stage, sum the partials of its ranks, chain.
  std::uint64_t forward(std::vector<ModelRequestState>& st, RequestId id, const std::vector<TokenId>& tokens,
                        std::size_t start, std::size_t end, const std::vector<PageId>& pages) {
    std::uint64_t a = chain_seed(id, start, end);
    for (int s = 0; s < shape.pp; ++s) {
      std::vector<std::uint64_t> sum;
      for (std::size_t r = 0; r < ranks.size(); ++r) {
        if (ranks[r].coord.pp != s) continue;
        std::vector<std::uint64_t> part(ranks[r].model->geometry().local_layers());
        ranks[r].model->forward(st[r], tokens, start, end, pages, part);
        if (sum.empty()) sum.assign(part.size(), 0);
        for (std::size_t l = 0; l < part.size(); ++l) sum[l] += part[l];
      }
      a = chain(a, sum);
    }
    return a;
  }
};

std::vector<PageId> page_range(std::uint32_t first, std::size_t n) {
  std::vector<PageId> p;
  for (std::size_t i = 0; i < n; ++i) p.push_back(PageId(first + static_cast<std::uint32_t>(i)));
  return p;
}

// (tp, cp, pp, attention, payload, cp_split)
class ModelGrid : public ::testing::TestWithParam<std::tuple<int, int, int, std::string, std::string, std::string>> {};

TEST_P(ModelGrid, ChecksumsMatchTheOracleAndCatchACorruptPage) {
  const auto& [tp, cp, pp, attention, payload, split] = GetParam();
  SimGrid g(tp, cp, pp, attention, payload, split);
  Rng rng(99);
  std::vector<TokenId> a(70);
  for (auto& t : a) t = static_cast<TokenId>(rng.below(1000));

  // Request A computes [0, 70) in chunks 0-16-40-70, then two decode-like single positions.
  std::vector<ModelRequestState> sa(g.ranks.size());
  OracleRequestState oa;
  auto pages_a = page_range(1, 6);
  std::vector<TokenId> a_ext = a;
  a_ext.push_back(5);
  a_ext.push_back(6);
  std::vector<std::pair<std::size_t, std::size_t>> chunks = {{0, 16}, {16, 40}, {40, 70}, {70, 71}, {71, 72}};
  for (auto [s, e] : chunks)
    EXPECT_EQ(g.forward(sa, RequestId(1), a_ext, s, e, pages_a), g.oracle->expected(oa, RequestId(1), a_ext, s, e))
        << "chunk [" << s << ", " << e << ")";

  // Request B shares A's first 32 tokens (2 pages): it reads them from A's pages.
  std::vector<TokenId> b(a.begin(), a.begin() + 32);
  for (int i = 0; i < 20; ++i) b.push_back(static_cast<TokenId>(rng.below(1000)));
  std::vector<PageId> pages_b = {PageId(1), PageId(2), PageId(10), PageId(11)};
  std::vector<ModelRequestState> sb(g.ranks.size());
  OracleRequestState ob;
  ob.hashed = 0;
  const std::uint64_t want_b = g.oracle->expected(ob, RequestId(2), b, 32, 52);
  EXPECT_EQ(g.forward(sb, RequestId(2), b, 32, 52, pages_b), want_b);

  // The same, after flipping a bit of page 2 on the last rank (any rank's page feeds the sum).
  Rng flip(3);
  g.ranks.back().pool->corrupt(PageId(2), flip);
  std::vector<ModelRequestState> sc(g.ranks.size());
  EXPECT_NE(g.forward(sc, RequestId(2), b, 32, 52, pages_b), want_b) << "a corrupt page went unnoticed";

  // And reading the prefix from the wrong pages (another prompt's) is caught too.
  std::vector<ModelRequestState> sd(g.ranks.size());
  std::vector<PageId> wrong = {PageId(3), PageId(4), PageId(10), PageId(11)};
  EXPECT_NE(g.forward(sd, RequestId(2), b, 32, 52, wrong), want_b);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, ModelGrid,
    ::testing::Values(std::make_tuple(1, 1, 1, "mha", "full", "interleave"), std::make_tuple(2, 1, 1, "mha", "full", "interleave"),
                      std::make_tuple(1, 2, 1, "mha", "digest", "interleave"), std::make_tuple(1, 2, 1, "mha", "full", "zigzag"),
                      std::make_tuple(1, 1, 2, "mha", "digest", "interleave"), std::make_tuple(2, 2, 2, "mha", "full", "zigzag"),
                      std::make_tuple(2, 2, 2, "mla", "digest", "interleave"), std::make_tuple(4, 1, 3, "mla", "full", "interleave")));

TEST(ModelGeometry, LayersSplitContiguouslyAndQueriesSplitOverCp) {
  auto exp = parse_experiment("", "g", {"topology.pp=3", "topology.cp=2", "model.layers=8"});
  const auto& s = exp.topology.groups[0].shape;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> slices;
  for (int p = 0; p < 3; ++p) {
    auto g = ModelGeometry::for_rank(exp, GridCoord{0, 0, 0, p, 0}, s);
    slices.push_back({g.layer_begin, g.layer_end});
  }
  EXPECT_EQ(slices, (std::vector<std::pair<std::uint64_t, std::uint64_t>>{{0, 3}, {3, 6}, {6, 8}}));
  ModelGeometry g;
  g.cp_size = 2;
  g.cp_rank = 1;
  EXPECT_FALSE(g.owns_query(10, 10, 18));
  EXPECT_TRUE(g.owns_query(11, 10, 18));
  g.zigzag = true;  // 8 tokens, 4 segments of 2: rank 1 owns segments 1 and 2
  std::vector<bool> owned;
  for (std::size_t q = 10; q < 18; ++q) owned.push_back(g.owns_query(q, 10, 18));
  EXPECT_EQ(owned, (std::vector<bool>{false, false, true, true, true, true, false, false}));
}

}  // namespace
}  // namespace kvgrid
