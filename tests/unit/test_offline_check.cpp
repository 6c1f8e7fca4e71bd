// kvgrid check on hand-made traces: each class of divergence is found and named, between TP/CP
// peers of a stage and between stages, and an aborted run is compared on common prefixes only.
#include <gtest/gtest.h>

#include "runtime/offline_check.hpp"

namespace kvgrid {
namespace {

TraceStrings names;  // the rows' names

DecisionRow row(std::uint64_t seq, std::uint64_t step, const std::string& name, std::int64_t arg, std::int64_t result) {
  DecisionRow r;
  r.seq = seq;
  r.step = step;
  r.name = names.intern(name);
  r.args[0] = arg;
  r.results[0] = result;
  r.n_args = r.n_results = 1;
  r.args_digest = static_cast<std::uint64_t>(arg) * 31 + 7;
  r.result_digest = static_cast<std::uint64_t>(result) * 17 + 3;
  return r;
}

// TP2 × PP2: ranks 0, 1 (stage 0), 2, 3 (stage 1), all with the same 4-entry log.
RunTrace make_run(bool complete) {
  RunTrace t;
  if (complete) t.summary = std::map<std::string, h5::AttrValue>{{"verdict", std::string("OK")}};
  for (int r = 0; r < 4; ++r) {
    RankTrace rt;
    rt.world_rank = r;
    rt.present = true;
    rt.tp = r % 2;
    rt.pp = r / 2;
    rt.decisions = {row(0, 0, "match_prefix", 10, 0), row(1, 0, "admit", 10, 1), row(2, 1, "match_prefix", 11, 16),
                    row(3, 1, "admit", 11, 1)};
    t.ranks.push_back(rt);
  }
  return t;
}

TEST(OfflineCheck, EqualLogsAreOk) {
  auto rep = check_run(make_run(true));
  EXPECT_FALSE(rep.first.has_value());
  EXPECT_EQ(rep.pairs, 4);  // stage peers: 1 vs 0, 3 vs 2; across stages: 2 vs 0, 3 vs 1
  EXPECT_EQ(rep.compared_entries, 16u);
}

TEST(OfflineCheck, SameArgumentsDifferentResultsIsTheOperationItself) {
  auto t = make_run(true);
  t.ranks[1].decisions[2] = row(2, 1, "match_prefix", 11, 8);  // TP peer matched less
  auto rep = check_run(t);
  ASSERT_TRUE(rep.first.has_value());
  EXPECT_EQ(rep.first->kind, "results");
  EXPECT_EQ(rep.first->rank_a, 0);
  EXPECT_EQ(rep.first->rank_b, 1);
  EXPECT_EQ(rep.first->seq, 2u);
  const auto text = rep.first->describe();
  EXPECT_NE(text.find("Found rank divergence: rank 0 (group 0, pp 0, cp 0, tp 0) vs rank 1 (group 0, pp 0, cp 0, tp 1)"),
            std::string::npos) << text;
  EXPECT_NE(text.find("match_prefix(11) -> (16)"), std::string::npos) << text;
  EXPECT_NE(text.find("match_prefix(11) -> (8)"), std::string::npos) << text;
  EXPECT_NE(text.find("the operation itself"), std::string::npos) << text;
}

TEST(OfflineCheck, DifferentArgumentsPointAtAnEarlierStateMismatch) {
  auto t = make_run(true);
  t.ranks[2].decisions[3] = row(3, 1, "admit", 12, 1);  // stage 1 admitted another request
  auto rep = check_run(t);
  ASSERT_TRUE(rep.first.has_value());
  EXPECT_EQ(rep.first->kind, "arguments");
  EXPECT_EQ(rep.first->rank_a, 0);  // compared with the same position on stage 0
  EXPECT_EQ(rep.first->rank_b, 2);
  EXPECT_NE(rep.first->describe().find("earlier state mismatch"), std::string::npos);
}

TEST(OfflineCheck, DifferentNamesAreADifferentCallOrder) {
  auto t = make_run(true);
  t.ranks[3].decisions[1] = row(1, 0, "evict", 4, 4);
  auto rep = check_run(t);
  ASSERT_TRUE(rep.first.has_value());
  EXPECT_EQ(rep.first->kind, "call order");
  EXPECT_EQ(rep.first->rank_a, 2);  // its stage peer is compared first (rank 1, across stages, differs too)
  EXPECT_EQ(rep.first->rank_b, 3);
}

TEST(OfflineCheck, TheEarliestStepWinsAcrossPairs) {
  auto t = make_run(true);
  t.ranks[3].decisions[3] = row(3, 1, "admit", 11, 0);   // step 1
  t.ranks[1].decisions[1] = row(1, 0, "admit", 10, 0);   // step 0: first
  auto rep = check_run(t);
  ASSERT_TRUE(rep.first.has_value());
  EXPECT_EQ(rep.first->step, 0u);
  EXPECT_EQ(rep.first->rank_b, 1);
}

TEST(OfflineCheck, LengthsCountOnlyForACompleteRun) {
  auto aborted = make_run(false);
  aborted.ranks[2].decisions.resize(2);  // flushed less before the abort
  EXPECT_FALSE(check_run(aborted).first.has_value());
  auto complete = make_run(true);
  complete.ranks[2].decisions.resize(2);
  auto rep = check_run(complete);
  ASSERT_TRUE(rep.first.has_value());
  EXPECT_EQ(rep.first->kind, "log length");
  EXPECT_EQ(rep.first->seq, 2u);
}

TEST(OfflineCheck, MissingRankFilesAreCountedNotCompared) {
  auto t = make_run(false);
  t.ranks[1].present = false;
  auto rep = check_run(t);
  EXPECT_EQ(rep.missing_ranks, 1);
  EXPECT_FALSE(rep.first.has_value());
}

}  // namespace
}  // namespace kvgrid
