// Hybrid models (full + SWA + MAMBA layers, two sidecars) through the unified tree core under
// MPI, at every layout of the world (tests/mpi/layouts.hpp): the pattern puts different layer
// kinds on different PP stages (PP2: full + SWA, then full + MAMBA), CP is replicated. Oracle OK,
// zero divergences and verify failures, every request finished, prefixes reused and SWA
// tombstones made, in both payloads. (The buggy protocol.component_boundary = local_components
// stops a PP run with a shape mismatch on one stage, which would leave the others waiting: the
// CLI test `hybrid_grids` catches it, one mpirun per seed.)
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/decision_log.hpp"
#include "layouts.hpp"
#include "mpi_util.hpp"
#include "serve_util.hpp"
#include "runtime/experiment.hpp"

namespace kvgrid {
namespace {

ExperimentConfig hybrid(const testing::Layout& l, const std::string& payload, std::int64_t seed) {
  const std::string toml =
      "[[model.sidecar]]\nname = \"indexer\"\nsource = \"full\"\nwords = 2\n"
      "[[model.sidecar]]\nname = \"compressor\"\nsource = \"swa\"\nwords = 1\n";
  std::vector<std::string> sets = l.sets();
  for (const char* s : {"model.layers=8", "model.kv_heads=4", "model.head_dim=4",
                        "model.layer_types=full,swa,full,swa,full,mamba,full,mamba", "model.swa_window=10",
                        "model.mamba_chunk=4", "model.mamba_state=3", "cache.page_size=4", "cache.device_pages=256",
                        "cache.swa_pages=64", "cache.mamba_slots=24", "workload.kind=gsp", "workload.gsp.groups=3",
                        "workload.gsp.prompts_per_group=3", "workload.gsp.system_prompt_len=40", "workload.gsp.question_len=8",
                        "workload.gsp.output_len=6", "workload.gsp.turns=2", "engine.chunk_size=16", "engine.check_every=5",
                        "engine.debug_checks=true"})
    sets.push_back(s);
  sets.push_back("engine.payload=" + payload);
  return parse_experiment(toml, "hybrid-test", sets, seed);
}

TEST(Hybrid, OracleOkAndRanksAgreeAtEveryLayout) {
  for (const auto& l : testing::every_layout(testing::world_size()))
    for (const char* payload : {"digest", "full"}) {
      SCOPED_TRACE(l.str() + " " + payload);
      DecisionLog log;
      auto r = testing::serve(hybrid(l, payload, 5), log);
      EXPECT_EQ(r.oracle_mismatches, 0);
      EXPECT_EQ(r.divergences(), 0);
      EXPECT_EQ(r.verify_failures, 0);
      EXPECT_EQ(r.finished, 18);
      EXPECT_GT(r.cached_tokens, 0) << "prefixes reused";
      EXPECT_EQ(r.mine.hybrid, 1);
      EXPECT_GT(r.mine.swa_tombstones_made, 0);
      if (testing::world_rank() == 0) {
        for (const auto& row : r.all) {
          EXPECT_EQ(row.decision_digest, r.all[0].decision_digest) << "rank " << row.rank;
          EXPECT_EQ(row.tree_digest, r.all[0].tree_digest) << "rank " << row.rank << ": every stage keeps every component";
        }
      }
    }
}

}  // namespace
}  // namespace kvgrid
