// The synthetic model against the oracle, on an in-process simulation of a TP×CP×PP grid: every
// rank has its own pool; partial checksums are summed over each stage and chained stage to stage,
// as the serving loop does with MPI. The sum must not depend on the split, a cached prefix must be
// read from pages, and a corrupt page must be caught.
#include <gtest/gtest.h>

#include <memory>
#include <tuple>

#include "core/check.hpp"
#include "core/rng.hpp"
#include "kernels/kv_math.hpp"
#include "kokkos_env.hpp"
#include "runtime/experiment.hpp"
#include "runtime/model.hpp"
#include "test_seed.hpp"

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

  SimGrid(int tp, int cp, int pp, const std::string& attention, const std::string& payload, const std::string& split,
          int head_dim = 3) {
    exp = parse_experiment("", "sim",
                           {"topology.tp=" + std::to_string(tp), "topology.cp=" + std::to_string(cp),
                            "topology.pp=" + std::to_string(pp), "model.layers=5", "model.kv_heads=4",
                            "model.head_dim=" + std::to_string(head_dim), "model.attention=" + attention,
                            "model.cp_split=" + split,
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
      if (r == 0) oracle = std::make_unique<Oracle>(geo, Tokens(kPage));
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

  // With the prompt's prefix marks (RequestSpec::prefix_marks, here every 12 tokens) the chain starts
  // from the mark at 24, not from the first token: the same checksum. A wrong mark feeds the new
  // tokens' features, so it is caught.
  std::vector<std::uint64_t> marks;
  std::uint64_t ph = kernels::kPrefixSeed;
  for (std::size_t q = 0; q < b.size(); ++q)
    if (ph = kernels::prefix_hash_step(ph, b[q]); (q + 1) % 12 == 0) marks.push_back(ph);
  for (const bool wrong : {false, true}) {
    std::vector<ModelRequestState> sm(g.ranks.size());
    for (auto& s : sm) {
      s.marks = marks;
      s.mark_stride = 12;
      if (wrong) s.marks[1] ^= 1;  // (the mark at 24, the one the chain starts from)
    }
    const std::uint64_t got = g.forward(sm, RequestId(2), b, 32, 52, pages_b);
    EXPECT_EQ(got == want_b, !wrong) << (wrong ? "a wrong prefix mark went unnoticed" : "marks changed the checksum");
  }

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


// ---- misplaced values: the right KV at the wrong place is an oracle mismatch ----------------
//
// Request B reads a 3-page cached prefix that was written directly into the pool (what a restore
// or a gather would have put there), then computes [48, 60). Each case plants one misplacement —
// every value in it is a correct value of this prefix, only at the wrong coordinates.
enum class Misplace { None, SwapPages, ReversePages, SwapSlots, WrongLayerBlock, WrongHeadBlock, OtherLayerPage, SwapKV };

class Misplacement : public ::testing::TestWithParam<std::tuple<std::string, Misplace>> {};

TEST_P(Misplacement, IsAnOracleMismatch) {
  const auto& [payload, what] = GetParam();
  if (what == Misplace::SwapKV && payload == "digest") GTEST_SKIP() << "a digest page holds no element vectors";
  SimGrid g(1, 1, 1, "mha", payload, "interleave", /*head_dim=*/4);  // 4 heads, 5 layers on one rank
  cache::KvPool& pool = *g.ranks[0].pool;
  Rng rng(4242);
  std::vector<TokenId> b(60);
  for (auto& t : b) t = static_cast<TokenId>(rng.below(1000));
  const std::vector<PageId> table = {PageId(7), PageId(3), PageId(12), PageId(20)};  // 3 prefix pages + 1 for the chunk
  // The prefix's KV, as it should be: token t at (table[t / page], t % page).
  std::vector<std::uint32_t> page, slot;
  std::vector<std::uint64_t> F;
  std::uint64_t ph = kernels::kPrefixSeed;
  for (std::size_t t = 0; t < 48; ++t) {
    ph = kernels::prefix_hash_step(ph, b[t]);
    page.push_back(table[t / kPage].value());
    slot.push_back(static_cast<std::uint32_t>(t % kPage));
    F.push_back(kernels::token_feature(ph));
  }
  if (what == Misplace::SwapSlots) std::swap(slot[16 + 3], slot[16 + 9]);  // two tokens of page 1 trade slots
  pool.write(page, slot, F);
  auto block = [&](PageId p, std::size_t l) { return pool.layer_block(p, l); };
  const std::size_t words = pool.layer_block_bytes() / sizeof(std::uint64_t), per_head = words / pool.heads();
  std::vector<PageId> read = table;
  switch (what) {
    case Misplace::SwapPages: std::swap(read[0], read[1]); break;
    case Misplace::ReversePages: std::reverse(read.begin(), read.begin() + 3); break;
    case Misplace::WrongLayerBlock:  // page 1's layer 2 holds its layer 3 (the neighbouring layer)
      std::copy(block(table[1], 3), block(table[1], 3) + words, block(table[1], 2));
      break;
    case Misplace::WrongHeadBlock:  // page 2, layer 0: heads 1 and 2 trade places
      std::swap_ranges(block(table[2], 0) + per_head, block(table[2], 0) + 2 * per_head, block(table[2], 0) + 2 * per_head);
      break;
    case Misplace::OtherLayerPage:  // page 0's layer 1 holds page 1's layer 1 (same prefix, same layer, another page)
      std::copy(block(table[1], 1), block(table[1], 1) + words, block(table[0], 1));
      break;
    case Misplace::SwapKV: {  // page 0, layer 4, head 3, slot 5: K (elements 0-1) and V (2-3) trade places
      std::uint64_t* v = block(table[0], 4) + 3 * per_head + 5 * 4;
      std::swap_ranges(v, v + 2, v + 2);
      break;
    }
    default: break;
  }
  std::vector<ModelRequestState> st(1);
  OracleRequestState o;
  const std::uint64_t want = g.oracle->expected(o, RequestId(9), b, 48, 60);
  const std::uint64_t got = g.forward(st, RequestId(9), b, 48, 60, read);
  if (what == Misplace::None) EXPECT_EQ(got, want) << "the hand-written prefix itself is wrong";
  else EXPECT_NE(got, want) << "a misplaced value went unnoticed";
}

std::string misplacement_name(const ::testing::TestParamInfo<std::tuple<std::string, Misplace>>& i) {
  static const char* names[] = {"None",      "SwapPages",       "ReversePages",   "SwapSlots",
                                "WrongLayerBlock", "WrongHeadBlock", "OtherLayerPage", "SwapKV"};
  return std::get<0>(i.param) + "_" + names[static_cast<int>(std::get<1>(i.param))];
}

INSTANTIATE_TEST_SUITE_P(EveryCase, Misplacement,
                         ::testing::Combine(::testing::Values("full", "digest"),
                                            ::testing::Values(Misplace::None, Misplace::SwapPages, Misplace::ReversePages,
                                                              Misplace::SwapSlots, Misplace::WrongLayerBlock,
                                                              Misplace::WrongHeadBlock, Misplace::OtherLayerPage,
                                                              Misplace::SwapKV)),
                         misplacement_name);

// A freed page is poisoned: the bytes of the prefix it held are gone, so a read before a copy
// into it lands is a mismatch even when the copy would have brought back the very same KV.
TEST(Poison, FreedPagesNoLongerHoldTheirOldKv) {
  const bool was = debug_checks_enabled();
  set_debug_checks(true);  // full pages are poisoned only with debug checks on (tests)
  for (const char* payload : {"full", "digest"}) {
    SimGrid g(1, 1, 1, "mha", payload, "interleave");
    cache::KvPool& pool = *g.ranks[0].pool;
    std::vector<TokenId> a(40);
    Rng rng(5);
    for (auto& t : a) t = static_cast<TokenId>(rng.below(1000));
    const std::vector<PageId> table = {PageId(4), PageId(5), PageId(6)};
    std::vector<ModelRequestState> sa(1);
    OracleRequestState oa;
    ASSERT_EQ(g.forward(sa, RequestId(1), a, 0, 40, table), g.oracle->expected(oa, RequestId(1), a, 0, 40));
    // A second request reads the prefix back: right. After poisoning page 5 (it was freed), wrong.
    std::vector<ModelRequestState> sb(1);
    OracleRequestState ob;
    const std::uint64_t want = g.oracle->expected(ob, RequestId(2), a, 32, 40);
    EXPECT_EQ(g.forward(sb, RequestId(2), a, 32, 40, table), want) << payload;
    pool.poison(std::vector<PageId>{PageId(5)});
    std::vector<ModelRequestState> sc(1);
    EXPECT_NE(g.forward(sc, RequestId(2), a, 32, 40, table), want) << payload;
  }
  set_debug_checks(was);
}

// engine.decode = fused: a decode span (begin_decode_span, decode_token, end_decode_span) gives
// every token's layer outputs exactly as forward() of that one position does, leaves the same
// prefix hash and running fold, and the same pool words once the span ended — digest payload (the
// O(layers) path, its KV written at the span's end) and full payload (forward per token), MHA and
// MLA, on every rank of a TP×PP grid, over random prompts and spans of random lengths.
TEST(DecodeSpan, SameOutputsFoldsAndKvAsForwardPerToken) {
  const std::uint64_t seed = testing::seed_or(20261207);
  std::printf("# seed %llu (KVGRID_TEST_SEED)\n", static_cast<unsigned long long>(seed));
  Rng rng(seed);
  for (const char* payload : {"digest", "full"})
    for (const char* attention : {"mha", "mla"})
      for (const auto& [tp, pp] : {std::pair{1, 1}, std::pair{2, 2}}) {
        SimGrid a(tp, 1, pp, attention, payload, "interleave"), b(tp, 1, pp, attention, payload, "interleave");
        const std::size_t prompt = 17 + rng.below(40), decode = 30 + rng.below(30);
        std::vector<TokenId> tokens(prompt);
        for (auto& t : tokens) t = static_cast<TokenId>(rng.below(1000));
        const auto pages = page_range(3, (prompt + decode + kPage - 1) / kPage);
        std::vector<ModelRequestState> sa(a.ranks.size()), sb(b.ranks.size());
        a.forward(sa, RequestId(1), tokens, 0, prompt, pages);
        b.forward(sb, RequestId(1), tokens, 0, prompt, pages);
        OracleRequestState o;
        std::size_t pos = prompt;
        while (pos < prompt + decode) {
          const std::size_t span = std::min<std::size_t>(1 + rng.below(12), prompt + decode - pos);
          for (std::size_t r = 0; r < b.ranks.size(); ++r) b.ranks[r].model->begin_decode_span(sb[r], pages);
          for (std::size_t i = 0; i < span; ++i, ++pos) {
            tokens.push_back(static_cast<TokenId>(rng.below(1000)));
            std::uint64_t chained = chain_seed(RequestId(1), pos, pos + 1);
            for (int stage = 0; stage < pp; ++stage) {
              std::vector<std::uint64_t> sum;
              for (std::size_t r = 0; r < a.ranks.size(); ++r) {
                if (a.ranks[r].coord.pp != stage) continue;
                const std::size_t L = a.ranks[r].model->geometry().local_layers();
                std::vector<std::uint64_t> want(L), got(L);
                a.ranks[r].model->forward(sa[r], tokens, pos, pos + 1, pages, want);
                b.ranks[r].model->decode_token(tokens, got);
                ASSERT_EQ(got, want) << payload << " " << attention << " tp" << tp << " pp" << pp << " rank " << r
                                     << " position " << pos;
                EXPECT_EQ(sb[r].ph, sa[r].ph);
                EXPECT_EQ(sb[r].hashed, pos + 1);
                if (sum.empty()) sum.assign(L, 0);
                for (std::size_t l = 0; l < L; ++l) sum[l] += got[l];
              }
              chained = chain(chained, sum);
            }
            EXPECT_EQ(chained, a.oracle->expected(o, RequestId(1), tokens, pos, pos + 1)) << "position " << pos;
          }
          for (std::size_t r = 0; r < b.ranks.size(); ++r) {
            b.ranks[r].model->end_decode_span();
            EXPECT_EQ(sb[r].run, sa[r].run) << payload << " rank " << r << " after the span ending at " << pos;
            EXPECT_EQ(b.ranks[r].pool->content_digest(), a.ranks[r].pool->content_digest())
                << payload << " rank " << r << " after the span ending at " << pos;
          }
        }
      }
}

TEST(DecodeSpan, OneAtATimeOnlyAfterTheRequestComputedHereAndTokensOnlyInsideOne) {
  SimGrid g(1, 1, 1, "mha", "digest", "interleave");
  SyntheticModel& m = *g.ranks[0].model;
  const auto pages = page_range(1, 2);
  ModelRequestState fresh;
  EXPECT_THROW(m.begin_decode_span(fresh, pages), InternalError);  // (nothing computed yet: no fold to continue)
  std::vector<TokenId> tokens(20, 7);
  std::vector<ModelRequestState> st(1);
  g.forward(st, RequestId(1), tokens, 0, 20, pages);
  tokens.push_back(8);
  std::vector<std::uint64_t> out(m.geometry().local_layers());
  EXPECT_THROW(m.decode_token(tokens, out), InternalError);  // (no span open)
  m.begin_decode_span(st[0], pages);
  EXPECT_THROW(m.begin_decode_span(st[0], pages), InternalError);
  m.end_decode_span();
  EXPECT_THROW(m.end_decode_span(), InternalError);
}

}  // namespace
}  // namespace kvgrid
