// Core: typed ids, RNG streams, hashing, decision log, failpoints, topology layout arithmetic.
#include <gtest/gtest.h>

#include <set>
#include <type_traits>

#include "core/check.hpp"
#include "core/decision_log.hpp"
#include "core/failpoint.hpp"
#include "core/fast_mod.hpp"
#include "core/ids.hpp"
#include "core/rng.hpp"
#include "core/topology.hpp"

namespace kvgrid {
namespace {

TEST(Ids, DoNotConvertAcrossKindsOrToIntegers) {
  static_assert(!std::is_convertible_v<PageId, LayerId>);
  static_assert(!std::is_convertible_v<std::uint32_t, PageId>);
  static_assert(!std::is_convertible_v<PageId, std::uint32_t>);
  static_assert(!std::is_convertible_v<Tokens, Pages>);
  static_assert(!std::is_constructible_v<Tokens, Pages>);
  EXPECT_EQ((Tokens(5) + Tokens(7)).value(), 12);
  EXPECT_EQ((Pages(5) - Pages(7)).value(), -2);
  EXPECT_LT(PageId(1), PageId(2));
}

TEST(Rng, SameSeedSameStreamAndRankStreamsDiffer) {
  Rng a(42), b(42), c(43);
  for (int i = 0; i < 100; ++i) {
    auto x = a.next_u64();
    EXPECT_EQ(x, b.next_u64());
  }
  EXPECT_NE(Rng(42).next_u64(), c.next_u64());
  EXPECT_EQ(rank_stream(42, 3).seed(), 42u ^ 3u);
  EXPECT_NE(rank_stream(42, 0).next_u64(), rank_stream(42, 1).next_u64());
  // Forked streams are independent of draws made on the parent.
  Rng p(7);
  Rng f1 = p.fork("x");
  p.next_u64();
  Rng f2 = p.fork("x");
  EXPECT_EQ(f1.next_u64(), f2.next_u64());
  EXPECT_NE(Rng(7).fork("x").next_u64(), Rng(7).fork("y").next_u64());
}

TEST(Rng, BoundedDrawsStayInRange) {
  Rng r(1);
  std::set<std::int64_t> seen;
  for (int i = 0; i < 2000; ++i) {
    auto v = r.between(-2, 2);
    ASSERT_GE(v, -2);
    ASSERT_LE(v, 2);
    seen.insert(v);
    auto u = r.uniform();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
  }
  EXPECT_EQ(seen.size(), 5u);
  EXPECT_FALSE(Rng(1).bernoulli(0.0));
}

TEST(FastMod64, EqualsTheRemainderOperatorForEveryKindOfDivisor) {
  // Differential against `%`: edge divisors (1, powers of two and their neighbours, the largest),
  // vocabularies, random divisors of every width; edge dividends and random ones.
  std::vector<std::uint64_t> divisors = {1, 2, 3, 5, 7, 10, 1000, 32000, 50257, 128256, 151936, 0xffffffffULL,
                                         0x100000000ULL, 0x8000000000000000ULL, 0x8000000000000001ULL,
                                         0xfffffffffffffffeULL, 0xffffffffffffffffULL};
  for (unsigned b = 1; b < 64; ++b)
    for (std::int64_t k : {-1, 0, 1}) divisors.push_back((std::uint64_t{1} << b) + static_cast<std::uint64_t>(k));
  const std::uint64_t seed = 20261207;
  Rng r(seed);
  for (int i = 0; i < 200; ++i) divisors.push_back(r.next_u64() >> r.below(64));
  for (std::uint64_t d : divisors) {
    if (d == 0) continue;
    const FastMod64 f(d);
    std::vector<std::uint64_t> xs = {0, 1, d - 1, d, d + 1, 2 * d - 1, ~std::uint64_t{0}, ~std::uint64_t{0} - 1,
                                     std::uint64_t{1} << 63, (~std::uint64_t{0} / d) * d, (~std::uint64_t{0} / d) * d - 1};
    for (int j = 0; j < 2000; ++j) xs.push_back(r.next_u64() >> (j % 3 == 0 ? r.below(64) : 0));
    for (std::uint64_t x : xs) {
      ASSERT_EQ(f.mod(x), x % d) << "x " << x << " d " << d << " (seed " << seed << ")";
      ASSERT_EQ(f.quotient(x), x / d) << "x " << x << " d " << d << " (seed " << seed << ")";
    }
  }
}

TEST(DecisionLog, RunningDigestIsOrderSensitiveAndRecentIsBounded) {
  DecisionLog a, b;
  a.record("x", {1}, {2});
  a.record("y", {3}, {4});
  b.record("y", {3}, {4});
  b.record("x", {1}, {2});
  EXPECT_NE(a.running_digest(), b.running_digest());
  DecisionLog c;
  c.record("x", {1}, {2});
  c.record("y", {3}, {4});
  EXPECT_EQ(a.running_digest(), c.running_digest());
  for (int i = 0; i < 20; ++i) c.record("z", {i, 7}, {0});
  EXPECT_EQ(c.size(), 22u);
  EXPECT_EQ(c.recent().size(), 8u);
  EXPECT_EQ(c.recent().back().args[0], 19);
  EXPECT_EQ(c.recent().back().text(), "z(19, 7) -> (0)");
  EXPECT_EQ(c.take_new().size(), 22u);
  EXPECT_TRUE(c.take_new().empty());
  EXPECT_NE(c.recent_text().find("z"), std::string::npos);
}

TEST(Failpoints, ProbabilityRanksAndStartStepAreHonoured) {
  FailpointRegistry reg(5, /*world_rank=*/2);
  EXPECT_FALSE(reg.evaluate("rank.stall", 0).has_value());  // not configured: never fires
  reg.configure({"rank.stall", 1.0, {}, 3, {}});
  EXPECT_FALSE(reg.evaluate("rank.stall", 2).has_value());
  auto hit = reg.evaluate("rank.stall", 3);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->param("duration_ms"), 1000.0);  // catalogue default
  auto fired = reg.take_new();
  ASSERT_EQ(fired.size(), 1u);
  EXPECT_EQ(fired[0].step, 3u);
  EXPECT_EQ(fired[0].name, "rank.stall");
  EXPECT_EQ(fired[0].params, "duration_ms=1000");

  FailpointRegistry other(5, 2);
  other.configure({"rank.stall", 1.0, {0, 1}, 0, {}});  // only ranks 0 and 1
  EXPECT_FALSE(other.evaluate("rank.stall", 10).has_value());
  EXPECT_THROW(other.configure({"no.such.point", 1.0, {}, 0, {}}), InternalError);
}

TEST(Failpoints, FiringsAreReproducibleFromTheSeed) {
  auto pattern = [](std::uint64_t seed, int rank) {
    FailpointRegistry reg(seed, rank);
    reg.configure({"rank.stall", 0.3, {}, 0, {{"duration_ms", 1.0}}});
    std::string s;
    for (int i = 0; i < 64; ++i) s += reg.evaluate("rank.stall", static_cast<std::uint64_t>(i)) ? '1' : '0';
    return s;
  };
  EXPECT_EQ(pattern(9, 0), pattern(9, 0));
  EXPECT_NE(pattern(9, 0), pattern(9, 1));
  EXPECT_NE(pattern(9, 0), pattern(10, 0));
}

TEST(TopologyLayout, RankOrderIsTpFastestThenCpThenPp) {
  TopologySpec spec{{{"main", {2, 2, 2}}}};
  EXPECT_EQ(spec.world_size(), 8);
  EXPECT_EQ(layout_rank(spec, 0, 0, 0, 1), 1);
  EXPECT_EQ(layout_rank(spec, 0, 0, 1, 0), 2);
  EXPECT_EQ(layout_rank(spec, 0, 1, 0, 0), 4);
  EXPECT_EQ(layout_rank(spec, 0, 1, 1, 1), 7);
  for (int r = 0; r < 8; ++r) {
    auto c = layout_coord(spec, r);
    EXPECT_EQ(layout_rank(spec, c.group, c.pp, c.cp, c.tp), r);
  }
  EXPECT_EQ(spec.str(), "TP2xCP2xPP2");
}

TEST(TopologyLayout, PrefillGroupTakesTheFirstRanks) {
  TopologySpec spec{{{"prefill", {2, 1, 2}}, {"decode", {1, 2, 1}}}};
  EXPECT_EQ(spec.world_size(), 6);
  auto c = layout_coord(spec, 4);
  EXPECT_EQ(c.group, 1);
  EXPECT_EQ(c.group_base, 4);
  EXPECT_EQ(c.cp, 0);
  EXPECT_EQ(layout_coord(spec, 5).cp, 1);
  EXPECT_EQ(layout_coord(spec, 3).pp, 1);
  EXPECT_EQ(layout_rank(spec, 1, 0, 1, 0), 5);
  EXPECT_THROW(layout_rank(spec, 0, 2, 0, 0), InternalError);
  EXPECT_EQ(spec.str(), "prefill TP2xCP1xPP2 + decode TP1xCP2xPP1");
}

}  // namespace
}  // namespace kvgrid
