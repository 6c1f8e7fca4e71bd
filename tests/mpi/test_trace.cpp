// HDF5 trace: every rank writes its file, rank 0 links them; the reader and the offline checker
// see what was written, and the checker finds a planted divergence.
#include <gtest/gtest.h>

#include <filesystem>

#include "core/check.hpp"
#include "core/decision_log.hpp"
#include "core/failpoint.hpp"
#include "mpi_util.hpp"
#include "runtime/experiment.hpp"
#include "runtime/offline_check.hpp"
#include "runtime/trace.hpp"
#include "runtime/trace_reader.hpp"
#include "runtime/tree_run.hpp"

namespace kvgrid {
namespace {

ExperimentConfig traced_experiment(std::vector<std::string> extra = {}) {
  const auto s = testing::shape_for(testing::world_size());
  std::vector<std::string> sets = {"topology.tp=" + std::to_string(s.tp), "topology.cp=" + std::to_string(s.cp),
                                   "topology.pp=" + std::to_string(s.pp), "model.layers=" + std::to_string(s.pp),
                                   "cache.page_size=8", "cache.device_pages=64", "workload.tree.steps=30",
                                   "workload.tree.prompt_tokens_max=120", "workload.tree.prefix_tokens=64",
                                   "output.flush_every=4", "faults.rank.stall.probability=0.2",
                                   "faults.rank.stall.duration_ms=0"};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return parse_experiment("", "trace-test", sets, 3);
}

void traced_run(const ExperimentConfig& e, const std::string& dir, TreeRunResult* out) {
  RankGrid grid(e.topology, MPI_COMM_WORLD);
  FailpointRegistry faults(e.engine.seed, grid.world_rank());
  for (const auto& f : e.faults) faults.configure(f);
  DecisionLog log;
  RunMeta meta;
  meta.experiment = e.name;
  meta.source = e.source;
  meta.config_toml = e.effective_toml;
  meta.topology = e.topology.str();
  meta.started = "now";
  meta.workload = "tree";
  meta.page_size = e.cache.page_size.value();
  meta.seed = 3;
  meta.world_size = grid.world_size();
  {
    TraceWriter trace(dir, grid, meta);
    *out = run_tree_workload(e, grid, faults, log, &trace, false);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST(Trace, RankFilesAreLinkedAndReadBack) {
  const std::string dir = testing::shared_temp_dir("trace");
  ASSERT_FALSE(dir.empty());
  TreeRunResult r;
  traced_run(traced_experiment(), dir, &r);
  if (testing::world_rank() == 0) {
    RunTrace t = read_run(dir);
    EXPECT_FALSE(t.summary.has_value());  // no summary written: looks like an aborted run
    EXPECT_EQ(t.meta_int("world_size"), testing::world_size());
    EXPECT_EQ(t.meta_int("seed"), 3);
    EXPECT_NE(t.meta_string("config").find("[workload]"), std::string::npos);
    ASSERT_EQ(t.ranks.size(), static_cast<std::size_t>(testing::world_size()));
    for (const auto& rt : t.ranks) {
      EXPECT_TRUE(rt.present);
      EXPECT_EQ(rt.decisions.size(), r.all[static_cast<std::size_t>(rt.world_rank)].decisions);
      EXPECT_GT(rt.ops.at("admit"), 0u);
      EXPECT_FALSE(rt.faults.empty());  // rank.stall fired with probability 0.2 over 30 steps
    }
    RunSummary s;
    s.verdict = "OK";
    s.ranks = r.all;
    TraceWriter::write_summary(dir, s);
    RunTrace t2 = read_run(dir + "/run.h5");
    ASSERT_TRUE(t2.summary.has_value());
    EXPECT_EQ(std::get<std::string>(t2.summary->at("verdict")), "OK");
    EXPECT_EQ(t2.summary_ranks.size(), r.all.size());
    CheckReport c = check_run(t2);
    EXPECT_FALSE(c.first.has_value()) << c.first->describe();
    std::filesystem::remove_all(dir);
  }
}

TEST(Trace, OfflineCheckFindsThePlantedDivergence) {
  const int n = testing::world_size();
  if (n < 2) GTEST_SKIP() << "needs two ranks to disagree";
  const std::string dir = testing::shared_temp_dir("trace-div");
  TreeRunResult r;
  traced_run(traced_experiment({"debug.plant_divergence_rank=" + std::to_string(n - 1), "debug.plant_divergence_step=12"}),
             dir, &r);
  if (testing::world_rank() == 0) {
    CheckReport c = check_run(read_run(dir));
    ASSERT_TRUE(c.first.has_value());
    EXPECT_EQ(c.first->rank_b, n - 1);
    EXPECT_EQ(c.first->step, 12u);
    // The planted admission's match_prefix meets the next step's match_prefix on the other ranks.
    EXPECT_EQ(c.first->kind, "arguments");
    std::filesystem::remove_all(dir);
  }
}

TEST(Trace, ExistingRunIsNeverOverwritten) {
  const std::string dir = testing::shared_temp_dir("trace-twice");
  TreeRunResult r;
  auto e = traced_experiment({"workload.tree.steps=2"});
  traced_run(e, dir, &r);
  RankGrid grid(e.topology, MPI_COMM_WORLD);
  RunMeta meta;
  meta.world_size = grid.world_size();
  EXPECT_THROW({ TraceWriter w(dir, grid, meta); }, InputError);
  MPI_Barrier(MPI_COMM_WORLD);
  if (testing::world_rank() == 0) std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kvgrid
