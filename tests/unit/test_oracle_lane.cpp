// engine.helper_thread (runtime/oracle_lane.hpp): the values a lane computes are the oracle's own,
// a short chunk stays with the caller, and a failure on the lane's thread reaches the caller.
#include <gtest/gtest.h>

#include <vector>

#include "core/check.hpp"
#include "core/rng.hpp"
#include "runtime/experiment.hpp"
#include "runtime/model.hpp"
#include "runtime/oracle_lane.hpp"

namespace kvgrid {
namespace {

Oracle make_oracle(std::vector<std::string> sets = {}) {
  sets.insert(sets.end(), {"model.layers=4", "model.kv_heads=2"});
  const auto exp = parse_experiment("", "lane", sets);
  const auto& shape = exp.topology.groups[0].shape;
  return Oracle(ModelGeometry::for_rank(exp, layout_coord(exp.topology, 0), shape), Tokens(64));
}

TEST(OracleLane, ValuesEqualTheOracleInlineChunkByChunk) {
  // Four requests, each in chunks of random length (some short, some long), interleaved as batches
  // of a step; every value taken from the lane equals the value the oracle computes inline on a
  // second copy of the request's state.
  const std::uint64_t seed = 7;
  Rng rng(seed);
  for (const auto& sets : {std::vector<std::string>{}, std::vector<std::string>{"model.layer_types=full,swa,mamba,full", "model.swa_window=100", "workload.kind=gsp"}}) {
    const Oracle oracle = make_oracle(sets);
    OracleLane lane(oracle);
    constexpr std::size_t kReqs = 4;
    std::vector<std::vector<TokenId>> tokens(kReqs);
    std::vector<OracleRequestState> on_lane(kReqs), inline_st(kReqs);
    std::vector<std::size_t> done(kReqs, 0);
    for (auto& t : tokens)
      for (std::size_t i = 0; i < 30000; ++i) t.push_back(static_cast<TokenId>(rng.below(32000)));
    std::int64_t posted = 0;
    for (int step = 0; step < 20; ++step) {
      struct Entry { std::size_t req, start, end; };
      std::vector<Entry> batch;
      for (std::size_t r = 0; r < kReqs; ++r) {
        if (done[r] >= tokens[r].size() || rng.below(3) == 0) continue;
        const std::size_t len = rng.below(2) ? 1 + rng.below(8) : 1 + rng.below(6000);
        const std::size_t end = std::min(tokens[r].size(), done[r] + len);
        batch.push_back({r, done[r], end});
        done[r] = end;
      }
      for (std::size_t i = 0; i < batch.size(); ++i) {
        const auto& e = batch[i];
        const bool long_enough = e.end >= on_lane[e.req].hashed + OracleLane::kMinTokens;
        EXPECT_EQ(lane.post(i, on_lane[e.req], RequestId(e.req), tokens[e.req], e.start, e.end), long_enough);
        posted += long_enough ? 1 : 0;
      }
      for (std::size_t i = 0; i < batch.size(); ++i) {  // verify's order
        const auto& e = batch[i];
        const std::uint64_t want = oracle.expected(inline_st[e.req], RequestId(e.req), tokens[e.req], e.start, e.end);
        const auto got = lane.take(i);
        const std::uint64_t value =
            got ? *got : oracle.expected(on_lane[e.req], RequestId(e.req), tokens[e.req], e.start, e.end);
        ASSERT_EQ(value, want) << "step " << step << " request " << e.req << " [" << e.start << ", " << e.end << ") (seed "
                               << seed << ")";
      }
      EXPECT_TRUE(lane.empty());
      EXPECT_FALSE(lane.take(0).has_value());  // (taken: nothing left under that entry)
    }
    EXPECT_EQ(lane.posted(), posted);
    EXPECT_GT(posted, 3);
  }
}

TEST(OracleLane, AFailureOnTheThreadIsRethrownWhereTheValueIsTaken) {
  const Oracle oracle = make_oracle();
  OracleLane lane(oracle);
  std::vector<TokenId> tokens(10000, 5);
  OracleRequestState st;
  st.hashed = 9000;  // asked for [0, …) after 9,000 positions: the oracle refuses
  st.ph = 1;
  ASSERT_FALSE(lane.post(0, st, RequestId(1), tokens, 0, 10000));  // only 1,000 positions to hash: inline
  OracleRequestState fresh;
  ASSERT_TRUE(lane.post(0, fresh, RequestId(1), tokens, 0, 10000));
  OracleRequestState behind;
  behind.hashed = 100;
  ASSERT_TRUE(lane.post(1, behind, RequestId(2), tokens, 50, 9000));  // start 50 < hashed 100
  EXPECT_TRUE(lane.take(0).has_value());
  EXPECT_THROW(lane.take(1), InternalError);
  EXPECT_TRUE(lane.empty());
}

TEST(OracleLane, StopsWithValuesNotTaken) {
  // A run that stops mid-step (a failure elsewhere) destroys the lane with a job posted: the
  // worker finishes it and exits; nothing hangs.
  const Oracle oracle = make_oracle();
  std::vector<TokenId> tokens(50000, 3);
  OracleRequestState st;
  {
    OracleLane lane(oracle);
    ASSERT_TRUE(lane.post(0, st, RequestId(1), tokens, 0, tokens.size()));
  }
  SUCCEED();
}

}  // namespace
}  // namespace kvgrid
