// protocol.pp_sync under MPI: the host tier across pipeline stages (TP × PP, seeds looped inside
// one mpirun) with slow, skewed copies and delayed stage messages stays in agreement — zero
// divergences, zero oracle mismatches — and the stages consume the same write ACKs at the same
// steps. (The buggy variant stops the run with a shape mismatch on one stage only, which would
// leave the others waiting: it is caught end to end by the CLI sweep test, one mpirun per seed.)
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>

#include "core/check.hpp"
#include "core/decision_log.hpp"
#include "core/failpoint.hpp"
#include "layouts.hpp"
#include "mpi_util.hpp"
#include "serve_util.hpp"
#include "runtime/experiment.hpp"
#include "runtime/serve.hpp"

namespace kvgrid {
namespace {

// experiments/pp_sync.toml (TP2 × PP2, host and storage tiers, slow copies skewed across stages),
// laid out for this world.
ExperimentConfig pp_tiers(std::int64_t seed, const std::string& dir, std::vector<std::string> extra) {
  const int n = testing::world_size();
  const int tp = n >= 8 ? 2 : 1;  // PP 2 at 2 ranks, PP 4 at 4 and 8
  std::vector<std::string> sets = {"topology.tp=" + std::to_string(tp), "topology.pp=" + std::to_string(n / tp),
                                   "engine.deadline_s=60", "cache.storage_dir=" + dir + "/" + std::to_string(seed)};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return load_experiment(std::string(KVGRID_SOURCE_DIR) + "/experiments/pp_sync.toml", sets, seed);
}

using testing::serve;

TEST(PpSync, HostTierAcrossStagesAgreesOverManySeedsAndFaults) {
  if (testing::world_size() < 2) GTEST_SKIP() << "needs PP >= 2";
  const std::string base = testing::shared_temp_dir("pp-sync");
  auto last = [](const std::string& fp) {
    return "faults." + fp + ".ranks=[" + std::to_string(testing::world_size() - 1) + "]";  // the last stage
  };
  const std::vector<std::vector<std::string>> cases = {
      {},
      {"faults.transfer.delay.probability=0.5", "faults.transfer.delay.delay_us=3000"},
      {"faults.p2p.delay.probability=0.3", "faults.p2p.delay.delay_us=2000"},
      {"faults.storage.read.slow.probability=0.5", "faults.storage.read.slow.delay_ms=1"},
      {"faults.storage.read.fail.probability=0.3"},
      // Failures on one stage only: agreed across stages (published at the end of the step with
      // the MIN over every stage; admissions decided by PP0's stage and followed).
      {"faults.host.alloc.fail.probability=0.3", last("host.alloc.fail")},
      {"faults.transfer.fail.probability=0.3", last("transfer.fail")},
      {"faults.device.alloc.fail.probability=0.3", last("device.alloc.fail")},
      {"faults.device.alloc.fail.probability=0.3", "faults.device.alloc.fail.ranks=[0]"},
      {"faults.storage.object.corrupt.probability=0.3", last("storage.object.corrupt")},
      {"faults.storage.read.short.probability=0.3", last("storage.read.short")},
      {"faults.storage.write.fail.probability=0.3", last("storage.write.fail")},
      // write_back across stages: a victim's backup is published with its outcome agreed over
      // every stage (deciding it inside the eviction, per stage, diverged under these faults).
      {"faults.host.alloc.fail.probability=0.3", last("host.alloc.fail"), "cache.write_policy=write_back"},
      {"faults.transfer.fail.probability=0.3", last("transfer.fail"), "cache.write_policy=write_back"},
      // (Both on every rank: at 8 ranks a backup lands only where no rank failed, so low rates.)
      {"faults.host.alloc.fail.probability=0.05", "faults.transfer.fail.probability=0.05", "cache.write_policy=write_back"},
  };
  // A few seeds per case in the test suite (PP 2 at 2 ranks: 2; PP 4 at 4 and 8 ranks,
  // oversubscribed here: 1), each case at one world size (testing::suite_share) —
  // jobs/mpi_seeds.sh runs 50 (KVGRID_SEEDS) of every case at every size.
  const int seeds = testing::suite_seeds(testing::world_size() <= 2 ? 2 : 1);
  int run = 0;
  for (std::size_t ci = 0; ci < cases.size(); ++ci) {
    if (!testing::suite_share(ci)) continue;  // (suite time: each case at one world size)
    const auto& c = cases[ci];
    std::int64_t h2d = 0, read = 0;
    const double t0 = MPI_Wtime();
    std::uint64_t fired = 0;
    for (std::int64_t seed = 500; seed < 500 + seeds; ++seed) {
      SCOPED_TRACE((c.empty() ? std::string("no faults") : c.front()) + " seed " + std::to_string(seed));
      DecisionLog log;
      auto r = serve(pp_tiers(seed, base + "/" + std::to_string(run++), c), log);
      ASSERT_EQ(r.finished, 64);
      ASSERT_EQ(r.oracle_mismatches, 0);
      ASSERT_EQ(r.divergences(), 0);  // tree digests and decision logs equal across stages too
      ASSERT_EQ(r.verify_failures, 0);
      h2d += r.mine.h2d_pages;
      read += r.mine.storage_read_pages;
      fired += r.mine.faults_fired;
    }
    std::uint64_t total = 0;
    MPI_Allreduce(&fired, &total, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
    if (!c.empty()) {
      EXPECT_GT(total, 0u) << c.front() << " never fired";
    }
    EXPECT_GT(h2d, 0) << "no load-back happened: the case does not exercise the host tier";
    EXPECT_GT(read, 0) << "no prefetch read anything: the case does not exercise storage";
    if (testing::world_rank() == 0)
      std::printf("[ pp_sync ] %s: %d seeds agreed, %lld pages loaded back and %lld read from storage on rank 0, %llu faults "
                  "fired (%.1f s)\n",
                  c.empty() ? "no faults" : c.front().c_str(), seeds, static_cast<long long>(h2d), static_cast<long long>(read),
                  static_cast<unsigned long long>(total), MPI_Wtime() - t0);
  }
  testing::remove_shared(base);
}

TEST(PpSync, SameSeedSameDecisionsAcrossStages) {
  if (testing::world_size() < 2) GTEST_SKIP() << "needs PP >= 2";
  const std::string base = testing::shared_temp_dir("pp-sync-repeat");
  std::uint64_t d[2];
  for (int i = 0; i < 2; ++i) {
    DecisionLog log;
    serve(pp_tiers(77, base + "/" + std::to_string(i), {"faults.p2p.delay.probability=0.3"}), log);
    d[i] = log.running_digest();
  }
  EXPECT_EQ(d[0], d[1]);
  testing::remove_shared(base);
}

}  // namespace
}  // namespace kvgrid

namespace kvgrid {
namespace {

// The serving loop's own gsp workload, TP × PP for this world; the online checker on.
ExperimentConfig planted(std::int64_t rank, std::int64_t step, std::int64_t interval, const std::string& kind = "extra",
                         std::int64_t stage = -1) {
  const int n = testing::world_size();
  const int tp = n >= 4 ? 2 : 1;
  return parse_experiment("", "consensus-test",
                          {"topology.tp=" + std::to_string(tp), "topology.pp=" + std::to_string(n / tp), "model.layers=4",
                           "model.kv_heads=2", "model.head_dim=2", "cache.page_size=4", "workload.kind=gsp",
                           "workload.gsp.groups=4", "workload.gsp.prompts_per_group=4", "workload.gsp.system_prompt_len=64",
                           "workload.gsp.question_len=8", "workload.gsp.output_len=8", "engine.chunk_size=32",
                           "protocol.consensus_check=on", "protocol.consensus_interval=" + std::to_string(interval),
                           "debug.plant_divergence_rank=" + std::to_string(rank),
                           "debug.plant_divergence_step=" + std::to_string(step), "debug.plant_divergence_kind=" + kind,
                           "debug.plant_divergence_stage=" + std::to_string(stage)},
                          3);
}

TEST(ConsensusCheck, APlantedDivergenceStopsTheRunWithinOneInterval) {
  if (testing::world_size() < 2) GTEST_SKIP() << "needs peers";
  for (const std::int64_t interval : {1, 4, 16}) {
    const std::int64_t at = 10, rank = testing::world_size() - 1;
    SCOPED_TRACE("interval " + std::to_string(interval));
    DecisionLog log;
    std::string description;
    bool stopped = false;
    std::uint64_t stopped_at = 0;
    try {
      serve(planted(rank, at, interval), log);
    } catch (const DivergenceFound& e) {
      stopped = true;
      description = e.description;
      stopped_at = log.step();
    }
    ASSERT_TRUE(stopped) << "every rank stops together";
    EXPECT_LT(stopped_at, static_cast<std::uint64_t>(at + interval + 1));  // the first check after the plant
    // One rank reports; the description names the planted entry and its class.
    int reported = description.empty() ? 0 : 1, reporters = 0;
    MPI_Allreduce(&reported, &reporters, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    EXPECT_EQ(reporters, 1);
    if (!description.empty()) {
      EXPECT_NE(description.find("Found rank divergence"), std::string::npos) << description;
      EXPECT_NE(description.find("step " + std::to_string(at) + ": planted(" + std::to_string(at) + ")"), std::string::npos)
          << description;
      EXPECT_NE(description.find("rank " + std::to_string(rank) + " ("), std::string::npos) << description;
      EXPECT_NE(description.find("different call order"), std::string::npos) << description;
    }
  }
}

// Each class the checker distinguishes, planted with equal log lengths on every rank (only the
// digests tell), in a TP group (the last rank differs from its stage peer) and across PP stages
// (a whole stage differs, its own peers agreeing): stopped at the first check after the plant,
// with the planted entry and its class named by one rank.
TEST(ConsensusCheck, EveryDivergenceClassWithEqualLogLengthsIsFoundOnline) {
  const int n = testing::world_size();
  if (n < 2) GTEST_SKIP() << "needs peers";
  const int tp = n >= 4 ? 2 : 1, pp = n / tp;
  struct Case {
    std::string kind, why, entry;
  };
  const std::vector<Case> cases{{"order", "different call order", "planted_"},
                                {"arguments", "different arguments", "planted(10, "},
                                {"results", "same arguments, different results", "planted(10) -> ("}};
  for (const bool across : {false, true}) {
    if (!across && tp < 2) continue;  // no TP peer in this world
    for (const auto& c : cases) {
      SCOPED_TRACE(c.kind + (across ? " across stages" : " in a TP group"));
      const std::int64_t at = 10, interval = 4;
      const auto exp = across ? planted(-1, at, interval, c.kind, pp - 1) : planted(n - 1, at, interval, c.kind);
      DecisionLog log;
      std::string description;
      bool stopped = false;
      try {
        serve(exp, log);
      } catch (const DivergenceFound& e) {
        stopped = true;
        description = e.description;
      }
      ASSERT_TRUE(stopped);
      EXPECT_LT(log.step(), static_cast<std::uint64_t>(at + interval + 1));
      // Every rank's log has the same length: only the digests differ.
      std::uint64_t len[2] = {log.size(), ~log.size()};
      MPI_Allreduce(MPI_IN_PLACE, len, 2, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
      EXPECT_EQ(len[0], ~len[1]) << "log lengths differ";
      int reported = description.empty() ? 0 : 1, reporters = 0;
      MPI_Allreduce(&reported, &reporters, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
      EXPECT_EQ(reporters, 1);
      if (!description.empty()) {
        EXPECT_NE(description.find(c.why), std::string::npos) << description;
        EXPECT_NE(description.find("(step 10): "), std::string::npos) << description;
        EXPECT_NE(description.find(c.entry), std::string::npos) << description;
        // Across stages the pair is one TP position of stage 0 and the last stage; in a TP group,
        // the last rank and its stage peer.
        const int b = across ? (pp - 1) * tp : n - 1;
        EXPECT_NE(description.find(" vs rank " + std::to_string(b) + " ("), std::string::npos) << description;
      }
    }
  }
}

TEST(ConsensusCheck, AgreeingRanksPassEveryCheckAndPruneTheirHistory) {
  DecisionLog log;
  auto r = serve(planted(-1, 0, 4), log);
  EXPECT_EQ(r.divergences(), 0);
  EXPECT_EQ(r.oracle_mismatches, 0);
  EXPECT_GT(log.size(), 50u);
  EXPECT_EQ(log.history_base(), log.size());  // the last check agreed on everything: nothing kept
}

}  // namespace
}  // namespace kvgrid
