// protocol.load_back under MPI, at every layout (layouts.hpp): host->device load-backs fail
// (transfer.load.fail, drawn per rank and layer copy) — on every rank, or on the last rank only —
// while clients abort requests (request.abort, also mid-load-back): every request ends, the
// failed loads are recomputed (never read), zero oracle mismatches, zero divergences, every
// stage reuses the same prefix (no shape mismatch). The buggy variant `unchecked` is caught.
#include <gtest/gtest.h>

#include <cstdio>

#include "core/decision_log.hpp"
#include "layouts.hpp"
#include "mpi_util.hpp"
#include "serve_util.hpp"
#include "runtime/experiment.hpp"
#include "runtime/serve.hpp"

namespace kvgrid {
namespace {

// A multi-turn history that outgrows the device tier (load-backs from the host every round),
// full payload with debug checks (freed pages poisoned: a read of a failed copy is a mismatch).
ExperimentConfig load_backs(const testing::Layout& lay, std::int64_t seed, std::vector<std::string> extra) {
  std::vector<std::string> sets = lay.sets();
  const std::vector<std::string> base = {
      "model.layers=4", "model.kv_heads=2", "model.head_dim=2", "cache.page_size=8", "cache.device_pages=40",
      "cache.host_pages=400", "cache.load_back_threshold=8", "workload.kind=multiturn", "workload.multiturn.clients=6",
      "workload.multiturn.rounds=3", "workload.multiturn.request_length=64", "workload.multiturn.output_length=6",
      "workload.multiturn.sub_question_length=16", "workload.multiturn.max_in_flight=3",
      "workload.multiturn.round_barrier=true", "engine.chunk_size=96", "engine.check_every=4", "engine.payload=full",
      "engine.debug_checks=true", "engine.deadline_s=60"};
  sets.insert(sets.end(), base.begin(), base.end());
  sets.insert(sets.end(), extra.begin(), extra.end());
  return parse_experiment("", "load-back-test", sets, seed);
}

TEST(LoadBack, FailedLoadBacksAreRecomputedAtEveryLayout) {
  const int n = testing::world_size();
  const std::vector<std::vector<std::string>> cases = {
      {"faults.transfer.load.fail.probability=0.2", "faults.request.abort.probability=0.25"},
      // one rank's copies only: the others' intact loads must not be read either
      {"faults.transfer.load.fail.probability=0.4", "faults.transfer.load.fail.ranks=[" + std::to_string(n - 1) + "]"},
  };
  std::int64_t failed_loads = 0, mid_load_aborts = 0;
  for (const auto& lay : testing::every_layout(n)) {
    for (const auto& c : cases) {
      for (std::int64_t seed = 700; seed < 700 + testing::suite_seeds(3); ++seed) {
        SCOPED_TRACE(lay.str() + " " + c.front() + " seed " + std::to_string(seed));
        DecisionLog log;
        auto r = testing::serve(load_backs(lay, seed, c), log);
        EXPECT_EQ(r.finished + r.failed, 18);  // every request ends, one way or the other
        EXPECT_EQ(r.oracle_mismatches, 0);
        EXPECT_EQ(r.divergences(), 0);
        EXPECT_EQ(r.verify_failures, 0);
        failed_loads += r.mine.load_failed;
        mid_load_aborts += r.aborted_loading;
      }
    }
  }
  // The cases test something: loads failed and were recomputed, and (rank 0) some abort landed
  // while a load-back was still being agreed.
  EXPECT_GT(failed_loads, 0);
  if (testing::world_rank() == 0) {
    EXPECT_GT(mid_load_aborts, 0);
    std::printf("[ load_back ] %zu layouts x %zu cases x %d seeds: %lld failed load-backs recomputed, %lld aborts mid-load (rank 0)\n",
                testing::every_layout(n).size(), cases.size(), testing::suite_seeds(3), static_cast<long long>(failed_loads),
                static_cast<long long>(mid_load_aborts));
  }
}

TEST(LoadBack, UncheckedReadsBrokenCopiesAndIsCaughtByTheOracle) {
  const auto lay = testing::every_layout(testing::world_size()).front();
  DecisionLog log;
  auto r = testing::serve(load_backs(lay, 701, {"faults.transfer.load.fail.probability=0.3", "protocol.load_back=unchecked"}), log);
  EXPECT_GT(r.oracle_mismatches, 0) << "a broken load-back was read and nobody noticed";
}

TEST(LoadBack, WithoutFailuresLoadsArePublishedInTheSameStep) {
  // The failpoint configured with probability 0: loads wait a step for their agreement; not
  // configured: the plain tiers (same step). Both correct, and the plain run reuses no less.
  const auto lay = testing::every_layout(testing::world_size()).front();
  DecisionLog a, b;
  auto plain = testing::serve(load_backs(lay, 702, {}), a);
  auto agreed = testing::serve(load_backs(lay, 702, {"faults.transfer.load.fail.probability=0"}), b);
  EXPECT_EQ(plain.oracle_mismatches, 0);
  EXPECT_EQ(agreed.oracle_mismatches, 0);
  EXPECT_EQ(agreed.mine.load_failed, 0);
  EXPECT_GT(plain.mine.h2d_pages, 0) << "no load-back: the test exercises nothing";
  EXPECT_GT(agreed.mine.h2d_pages, 0);
  EXPECT_NE(a.running_digest(), b.running_digest()) << "the agreed loads should have taken a step longer";
}

}  // namespace
}  // namespace kvgrid
