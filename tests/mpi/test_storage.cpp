// The three tiers under MPI (PP = 1): storage prefetch and write-through with every stop and write
// policy, every transfer/storage/allocation failpoint over many seeds (zero divergences, zero
// oracle mismatches, every request finished), the per_rank variant caught, reproducibility.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

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

// TP2 × CP (rest of the world); a multi-turn history, all clients per round (round barrier), that
// outgrows the device tier and then the host tier, so later rounds find their history in storage.
ExperimentConfig tiers(std::int64_t seed, const std::string& dir, std::vector<std::string> extra) {
  const int n = testing::world_size();
  const int tp = n >= 2 ? 2 : 1;
  std::vector<std::string> sets = {"topology.tp=" + std::to_string(tp), "topology.cp=" + std::to_string(n / tp),
                                   "model.layers=2", "model.kv_heads=2", "model.head_dim=2", "cache.page_size=8",
                                   "cache.device_pages=48", "cache.host_pages=80", "cache.storage=file",
                                   "cache.storage_dir=" + dir, "cache.prefetch_threshold=16",
                                   "cache.prefetch_policy=wait_complete", "cache.load_back_threshold=8",
                                   "workload.kind=multiturn", "workload.multiturn.clients=8",
                                   "workload.multiturn.rounds=3", "workload.multiturn.request_length=96",
                                   "workload.multiturn.output_length=8", "workload.multiturn.sub_question_length=16",
                                   "workload.multiturn.max_in_flight=4", "workload.multiturn.round_barrier=true",
                                   "engine.chunk_size=128", "engine.check_every=4", "engine.payload=full",
                                   // slow links: ACKs arrive many steps later, at different steps per rank
                                   "cost.host_link_gb_s=0.002", "cost.storage_gb_s=0.002"};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return parse_experiment("", "tiers-test", sets, seed);
}

using testing::serve;

// Seeds per case: 3 in the test suite (2 at 8 ranks); jobs/mpi_seeds.sh sweeps more (KVGRID_SEEDS).
int seeds() { return testing::suite_seeds(testing::world_size() <= 2 ? 3 : testing::world_size() <= 4 ? 2 : 1); }

void expect_clean(const ServeResult& r) {
  EXPECT_EQ(r.finished, 24);
  EXPECT_EQ(r.oracle_mismatches, 0);  // no failed or partial read ever became cached KV
  EXPECT_EQ(r.divergences(), 0);
  EXPECT_EQ(r.verify_failures, 0);
}

TEST(Storage, EveryPolicyIsCorrectAndRanksAgree) {
  const std::string base = testing::shared_temp_dir("storage-policies");
  for (const char* write : {"write_through", "write_through_selective", "write_back"}) {
    for (const char* stop : {"best_effort", "wait_complete", "timeout"}) {
      // (suite time: one seed at 8 ranks)
      for (std::int64_t seed = 1; seed <= (testing::world_size() > 4 && testing::in_suite() ? 1 : 2); ++seed) {
        SCOPED_TRACE(std::string(write) + " / " + stop + " seed " + std::to_string(seed));
        const std::string dir = base + "/" + write + "-" + stop + "-" + std::to_string(seed);
        DecisionLog log;
        auto r = serve(tiers(seed, dir,
                             {std::string("cache.write_policy=") + write, std::string("cache.prefetch_policy=") + stop,
                              "cache.write_through_threshold=1"}),
                       log);
        expect_clean(r);
        if (std::string(write) != "write_through_selective") {
          EXPECT_GT(r.mine.storage_write_pages, 0);
        }
        if (std::string(stop) == "wait_complete" && std::string(write) == "write_through") {
          EXPECT_GT(r.mine.storage_read_pages, 0);  // the late rounds read their history back
        }
      }
    }
  }
  testing::remove_shared(base);
}

TEST(Storage, EveryFailpointOverManySeedsKeepsRanksAgreedAndKvCorrect) {
  const std::string base = testing::shared_temp_dir("storage-faults");
  // Asymmetric faults (one rank only) are the ones agreement must absorb.
  const std::vector<std::vector<std::string>> cases = {
      {"faults.storage.read.slow.probability=0.5", "faults.storage.read.slow.delay_ms=2"},
      {"faults.storage.read.fail.probability=0.3", "faults.storage.read.fail.ranks=[1]"},
      {"faults.storage.read.short.probability=0.3", "faults.storage.read.short.ranks=[1]"},
      {"faults.storage.object.corrupt.probability=0.3", "faults.storage.object.corrupt.ranks=[1]"},
      {"faults.storage.write.fail.probability=0.3", "faults.storage.write.fail.ranks=[1]"},
      {"faults.transfer.delay.probability=0.5", "faults.transfer.delay.delay_us=3000"},
      {"faults.transfer.fail.probability=0.2", "faults.transfer.fail.ranks=[1]"},
      {"faults.host.alloc.fail.probability=0.2", "faults.host.alloc.fail.ranks=[1]"},
      {"faults.device.alloc.fail.probability=0.2", "faults.device.alloc.fail.ranks=[1]"},
  };
  const int n = seeds();
  int run = 0;
  for (std::size_t ci = 0; ci < cases.size(); ++ci) {
    if (!testing::suite_share(ci)) continue;  // (suite time: each case at one world size)
    const auto& c = cases[ci];
    std::uint64_t fired = 0;
    for (std::int64_t seed = 200; seed < 200 + n; ++seed) {
      SCOPED_TRACE(c.front() + " seed " + std::to_string(seed));
      const std::string dir = base + "/" + std::to_string(run++);
      std::vector<std::string> extra = c;
      extra.push_back("cache.prefetch_policy=timeout");
      if (testing::world_size() == 1) extra.erase(std::remove_if(extra.begin(), extra.end(), [](const std::string& s) {
                                                     return s.find(".ranks=") != std::string::npos;
                                                   }), extra.end());
      DecisionLog log;
      auto r = serve(tiers(seed, dir, extra), log);
      expect_clean(r);
      fired += r.mine.faults_fired;
    }
    std::uint64_t total = 0;
    MPI_Allreduce(&fired, &total, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
    EXPECT_GT(total, 0u) << c.front() << " never fired: the case tests nothing";
    if (testing::world_rank() == 0)
      std::printf("[ storage faults ] %s: %d seeds clean, fired %llu times\n", c.front().c_str(), n,
                  static_cast<unsigned long long>(total));
  }
  testing::remove_shared(base);
}

TEST(Storage, AbortedRequestsReleaseEverythingMidPrefetchIncluded) {
  const std::string base = testing::shared_temp_dir("storage-abort");
  std::int64_t failed = 0, mid_prefetch = 0;
  for (std::int64_t seed = 400; seed < 400 + seeds(); ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    DecisionLog log;
    // Slow reads keep prefetches in flight long enough to be aborted.
    auto r = serve(tiers(seed, base + "/" + std::to_string(seed),
                         {"faults.request.abort.probability=0.1", "faults.storage.read.slow.probability=0.5",
                          "faults.storage.read.slow.delay_ms=5", "engine.debug_checks=true"}),
                   log);
    EXPECT_EQ(r.finished + r.failed, 24);  // every request ends, one way or the other
    EXPECT_EQ(r.oracle_mismatches, 0);
    EXPECT_EQ(r.divergences(), 0);
    EXPECT_EQ(r.verify_failures, 0);  // (debug checks: verify() after every cache operation)
    failed += r.failed;
    mid_prefetch += r.aborted_prefetching;
  }
  EXPECT_GT(failed, 0);
  EXPECT_GT(mid_prefetch, 0) << "no abort hit a prefetch in flight: the case tests less than it claims";
  if (testing::world_rank() == 0)
    std::printf("[ storage abort ] %lld aborted, %lld of them mid-prefetch\n", static_cast<long long>(failed),
                static_cast<long long>(mid_prefetch));
  testing::remove_shared(base);
}

TEST(Storage, FailedReadsBecomeMissesAndAreRecomputed) {
  const std::string base = testing::shared_temp_dir("storage-misses");
  DecisionLog clean_log, bad_log;
  auto clean = serve(tiers(7, base + "/clean", {}), clean_log);
  auto bad = serve(tiers(7, base + "/bad", {"faults.storage.object.corrupt.probability=1"}), bad_log);
  expect_clean(clean);
  expect_clean(bad);
  EXPECT_GT(clean.mine.storage_read_pages, 0);
  EXPECT_GT(bad.mine.storage_failed_pages, 0);       // every batch had a corrupt object
  EXPECT_LT(bad.cached_tokens, clean.cached_tokens);  // ... so fewer tokens came from the cache
  testing::remove_shared(base);
}

TEST(Storage, SameSeedSameDecisionsWithAllTiers) {
  const std::string base = testing::shared_temp_dir("storage-repeat");
  std::uint64_t d[2];
  for (int i = 0; i < 2; ++i) {
    DecisionLog log;
    serve(tiers(43, base + "/" + std::to_string(i), {"faults.storage.read.fail.probability=0.2"}), log);
    d[i] = log.running_digest();
  }
  EXPECT_EQ(d[0], d[1]);
  testing::remove_shared(base);
}

TEST(Storage, MlaOneWriterPerTpGroupTheOthersRead) {
  if (testing::world_size() < 2) GTEST_SKIP() << "needs TP peers";
  const std::string base = testing::shared_temp_dir("storage-mla");
  DecisionLog log;
  auto r = serve(tiers(9, base + "/run", {"model.attention=mla", "model.kv_heads=4"}), log);
  expect_clean(r);
  RankGrid grid(parse_experiment("", "t", {"topology.tp=2", "topology.cp=" + std::to_string(testing::world_size() / 2)}).topology,
                MPI_COMM_WORLD);
  if (grid.coord().tp == 0) {
    EXPECT_GT(r.mine.storage_write_pages, 0);  // the writer of the replicated latent
  } else {
    EXPECT_EQ(r.mine.storage_write_pages, 0);  // acknowledges only
  }
  EXPECT_GT(r.mine.storage_read_pages, 0);  // everyone reads the writer's objects
  testing::remove_shared(base);
}

TEST(Storage, PerRankAgreementIsCaught) {
  if (testing::world_size() < 2) GTEST_SKIP() << "needs TP peers";
  const std::string base = testing::shared_temp_dir("storage-per-rank");
  int caught = 0;
  const int n = seeds();
  for (std::int64_t seed = 300; seed < 300 + n; ++seed) {
    DecisionLog log;
    bool failed = false;
    try {
      auto r = serve(tiers(seed, base + "/" + std::to_string(seed), {"protocol.tp_sync=per_rank"}), log);
      failed = r.divergences() > 0 || r.oracle_mismatches > 0;
    } catch (const RunFailure&) {
      failed = true;
    }
    caught += failed ? 1 : 0;
  }
  if (testing::world_rank() == 0) std::printf("[ storage ] per_rank caught in %d of %d seeds\n", caught, n);
  EXPECT_GE(caught, (n + 1) / 2);
  testing::remove_shared(base);
}

}  // namespace
}  // namespace kvgrid
