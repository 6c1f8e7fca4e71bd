// The serving loop (workloads gsp, multiturn, mooncake): requests flow through the TP×CP×PP grid
// and every rank decides with its own scheduler, radix tree and pools, under the synthetic model.
//
// Per step, on every rank:
//   1. arrivals: PP0's stage leader takes the requests that arrived by its modelled clock (jumping
//      the clock to the next arrival when idle), broadcasts them to its stage and forwards them to
//      the next stage's leader, which does the same; the message also says when the workload is
//      exhausted, so every rank stops at the same step;
//   2. its scheduler decides the batch (identically everywhere, from its own state);
//   3. stages after the first receive the previous stage's activation (per-request token counts
//      and chain values) and stop with "shape mismatch" if their own batch differs;
//   4. the model computes this rank's layers, heads and query tokens; one all-reduce over the stage
//      sums the partial checksums (TP and CP) for all requests and layers at once;
//   5. the stage chains its layers and sends the activation on; the last stage's leader compares
//      each chain value with the oracle's;
//   6. the scheduler advances requests; finished ones commit their KV to the tree.
// Every `check_every` steps (and at the end) ranks verify their caches and compare digests.
#pragma once

#include <cstdint>
#include <vector>

#include "core/decision_log.hpp"
#include "core/failpoint.hpp"
#include "core/topology.hpp"
#include "runtime/experiment.hpp"
#include "runtime/trace.hpp"

namespace kvgrid {

struct ServeResult {
  std::int64_t steps = 0, checks = 0, verify_failures = 0;
  std::int64_t tree_divergences = 0, decision_divergences = 0;
  std::int64_t oracle_mismatches = 0;  // world total
  std::int64_t requests = 0, finished = 0;
  std::int64_t prompt_tokens = 0, cached_tokens = 0;
  std::uint64_t model_ns = 0;          // this rank's modelled clock at the end
  double wall_s = 0.0;
  RankSummaryRow mine;
  std::vector<RankSummaryRow> all;     // world rank 0 only
  std::int64_t divergences() const { return tree_divergences + decision_divergences; }
  bool ok() const { return divergences() == 0 && verify_failures == 0 && oracle_mismatches == 0; }
};

// Collective over grid.world(). `trace` may be null. Throws InternalError("shape mismatch ...")
// when a stage's batch differs from the previous stage's, and on --strict oracle mismatches.
ServeResult run_serve(const ExperimentConfig& exp, const RankGrid& grid, FailpointRegistry& faults, DecisionLog& log,
                      TraceWriter* trace, bool print);

}  // namespace kvgrid
