// Hybrid models (FULL + SWA + MAMBA layers, two sidecars) with host and storage tiers, under MPI
// at every layout of the world (tests/mpi/layouts.hpp): multi-turn histories outgrow the device
// and the host (more conversations than fit, a few at a time), so later rounds find their
// history — FULL pages, SWA window pages, MAMBA states, objects per component — only in storage.
// Under every storage failpoint on one rank (and host.alloc.fail, transfer.fail, request.abort),
// and with the threaded engine (reads on worker threads), also under unified keys (objects per
// chunk of each component's namespace, a sidecar's objects in a namespace of their own):
// oracle OK, zero divergences and verify failures, every request finished (aborted ones
// excepted). The buggy protocol.prefetch_consensus = per_rank parts the stages (a shape mismatch
// only the later stage sees, which ends the run): it is caught end to end, in the CLI test
// hybrid_storage (tests/cli/test_cli.py).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "core/decision_log.hpp"
#include "layouts.hpp"
#include "mpi_util.hpp"
#include "runtime/experiment.hpp"
#include "serve_util.hpp"

namespace kvgrid {
namespace {

ExperimentConfig hybrid_storage(const testing::Layout& l, std::int64_t seed, const std::string& dir,
                                std::vector<std::string> extra) {
  const std::string toml = "[[model.sidecar]]\nname = \"indexer\"\nsource = \"full\"\nwords = 2\n"
                           "[[model.sidecar]]\nname = \"compressor\"\nsource = \"swa\"\nwords = 1\n";
  std::vector<std::string> sets = l.sets();
  for (const char* s : {"model.layers=8", "model.kv_heads=2", "model.head_dim=2",
                        "model.layer_types=full,swa,full,mamba,full,swa,full,mamba", "model.swa_window=20",
                        "model.mamba_chunk=8", "model.mamba_state=2", "cache.page_size=8", "cache.device_pages=60",
                        "cache.swa_pages=40", "cache.mamba_slots=16", "cache.host_pages=120", "cache.host_swa_pages=60",
                        "cache.host_mamba_slots=24", "cache.storage=file", "cache.prefetch_threshold=8",
                        "cache.prefetch_policy=wait_complete",
                        "workload.kind=multiturn", "workload.multiturn.clients=8", "workload.multiturn.rounds=3",
                        "workload.multiturn.request_length=96", "workload.multiturn.output_length=8",
                        "workload.multiturn.sub_question_length=24", "workload.multiturn.max_in_flight=2",
                        "engine.chunk_size=64", "engine.check_every=4", "engine.debug_checks=true",
                        // slow copies and reads: ACKs land steps later, at different steps on each rank
                        "cost.host_link_gb_s=0.001", "cost.storage_gb_s=0.002", "cost.storage_latency_us=200"})
    sets.push_back(s);
  sets.push_back("cache.storage_dir=" + dir);
  sets.insert(sets.end(), extra.begin(), extra.end());
  if (testing::world_size() == 1)  // one rank: an asymmetric fault is just a fault
    sets.erase(std::remove_if(sets.begin(), sets.end(), [](const std::string& s) { return s.find(".ranks=") != std::string::npos; }),
               sets.end());
  return parse_experiment(toml, "hybrid-storage-test", sets, seed);
}

TEST(HybridStorage, EveryComponentComesBackFromStorageUnderEveryStorageFailpointAtEveryLayout) {
  const std::string base = testing::shared_temp_dir("hybrid-storage");
  const std::vector<std::vector<std::string>> cases = {
      {},
      {"engine.payload=full", "cache.prefetch_policy=best_effort"},
      {"engine.transfer=threaded"},  // reads on storage worker threads, copies on the engine's
      {"faults.storage.read.fail.probability=0.3", "faults.storage.read.fail.ranks=[1]"},
      {"faults.storage.read.short.probability=0.3", "faults.storage.read.short.ranks=[1]"},
      {"faults.storage.object.corrupt.probability=0.3", "faults.storage.object.corrupt.ranks=[1]"},
      {"faults.storage.write.fail.probability=0.3", "faults.storage.write.fail.ranks=[1]"},
      {"faults.storage.read.slow.probability=0.5", "faults.storage.read.slow.delay_ms=2", "cache.prefetch_policy=timeout"},
      {"faults.host.alloc.fail.probability=0.2", "faults.host.alloc.fail.ranks=[1]"},
      {"faults.transfer.fail.probability=0.2", "faults.transfer.fail.ranks=[1]"},
      {"faults.request.abort.probability=0.05"},
      // unified keys (at the world's first layout: its objects are many small files, slow to create here):
      // objects per chunk of each component's namespace, read on worker threads
      {"cache.storage_key_scheme=unified", "engine.transfer=threaded", "faults.storage.object.corrupt.probability=0.3",
       "faults.storage.object.corrupt.ranks=[1]"},
  };
  std::int64_t storage_tokens = 0, read_pages = 0;
  int run = 0;
  const int seeds = testing::suite_seeds(testing::world_size() <= 2 ? 2 : 1);
  const auto layouts = testing::every_layout(testing::world_size());
  for (std::size_t li = 0; li < layouts.size(); ++li)
    for (std::size_t ci = 0; ci < cases.size(); ++ci)
      for (std::int64_t seed = 1200; seed < 1200 + seeds; ++seed) {
        const auto& l = layouts[li];
        const auto& c = cases[ci];
        // Suite time: each case at one world size (testing::suite_share) and one of its layouts,
        // in turn (jobs/mpi_seeds.sh runs them all); unified keys (many small files, slow to
        // create here) at the first layout only.
        const bool unified = !c.empty() && c.front() == "cache.storage_key_scheme=unified";
        if (testing::in_suite() && (!testing::suite_share(ci) || li != (unified ? 0 : (ci / 3) % layouts.size()))) continue;
        if (unified && li != 0) continue;
        std::string what = l.str() + " seed " + std::to_string(seed);
        for (const auto& s : c) what += " " + s;
        SCOPED_TRACE(what);
        DecisionLog log;
        auto r = testing::serve(hybrid_storage(l, seed, base + "/" + std::to_string(run++), c), log);
        EXPECT_EQ(r.oracle_mismatches, 0);  // every prefetched page, window and state held the right values
        EXPECT_EQ(r.divergences(), 0);
        EXPECT_EQ(r.verify_failures, 0);
        EXPECT_EQ(r.finished + r.failed, 24);
        storage_tokens += r.storage_tokens;
        read_pages += r.mine.storage_read_pages;
      }
  if (testing::world_rank() == 0)
    std::printf("[ hybrid storage ] %zu layouts x %zu cases x %d seeds: %lld prompt tokens from storage, %lld pages read (rank 0)\n",
                testing::every_layout(testing::world_size()).size(), cases.size(), seeds,
                static_cast<long long>(storage_tokens), static_cast<long long>(read_pages));
  EXPECT_GT(storage_tokens, 0) << "the histories came back from storage and were reused";
  testing::remove_shared(base);
}

}  // namespace
}  // namespace kvgrid
