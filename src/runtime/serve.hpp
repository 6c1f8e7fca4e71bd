// The serving loop (workloads gsp, multiturn, mooncake): requests flow through the TP×CP×PP grid
// and every rank decides with its own scheduler, radix tree and pools, under the synthetic model.
//
// Per step, on every rank:
//   1. arrivals: PP0's stage leader takes the requests that arrived by its modelled clock (jumping
//      the clock to the next arrival when idle) and broadcasts them to its stage; every rank of a
//      stage forwards them to its PP peer in the next stage inside the step's one message, which
//      also carries its activation (per-request token counts and chain values) and says when the
//      workload is exhausted, so every rank stops at the same step;
//   2. its scheduler decides the batch (identically everywhere, from its own state);
//   3. stages after the first compare the activation with their own batch and stop with
//      "shape mismatch" if it differs;
//   4. the model computes this rank's layers, heads and query tokens; one all-reduce over the stage
//      sums the partial checksums (TP and CP) for all requests and layers at once;
//   5. the stage chains its layers and sends the activation on; the last stage's leader compares
//      each chain value with the oracle's;
//   6. the scheduler advances requests; finished ones commit their KV to the tree.
// Every `check_every` steps (and at the end) ranks verify their caches and compare digests.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/decision_log.hpp"
#include "core/failpoint.hpp"
#include "core/topology.hpp"
#include "runtime/experiment.hpp"
#include "runtime/rank_check.hpp"
#include "runtime/serve_workload.hpp"
#include "runtime/trace.hpp"

namespace kvgrid {

struct ServeResult : LoopResult {
  std::int64_t oracle_mismatches = 0;  // world total
  std::int64_t requests = 0, finished = 0, failed = 0;  // failed: aborted (request.abort)
  // this rank: aborts mid-prefetch / mid-load-back (protocol.load_back, its outcome still being agreed) / otherwise
  std::int64_t aborted_prefetching = 0, aborted_loading = 0, aborted_other = 0;
  // Finished requests' prompt tokens, and of them the cached ones — all tiers; of those, loaded
  // back from the host; of those, prefetched from storage (this rank's view).
  std::int64_t prompt_tokens = 0, cached_tokens = 0, host_tokens = 0, storage_tokens = 0;
  std::uint64_t model_ns = 0;          // this rank's modelled clock at the end
  // Speculative decoding over the finished requests (as the last stage verified them; every rank):
  // draft rounds, tokens proposed and accepted, steps whose draft checksum mismatched, and an
  // order-independent digest of (request, rounds, accepted).
  std::int64_t spec_rounds = 0, spec_proposed = 0, spec_accepted = 0, draft_mismatches = 0;
  std::uint64_t spec_digest = 0;
  // P/D (every rank): prompt tokens the prefill ranks sent and the decode ranks received (first
  // rank of each), requests failed by a broken transfer
  std::int64_t pd_sent_tokens = 0, pd_received_tokens = 0, pd_failed = 0, pd_restore_failed = 0;
  bool ok() const { return divergences() == 0 && verify_failures == 0 && oracle_mismatches == 0; }
};

// Collective over grid.world(). `trace` may be null. Throws InternalError("shape mismatch ...")
// when a stage's batch differs from the previous stage's, and on --strict oracle mismatches.
// `workload`: PP0's stage leader's workload, made before the run (so a bad trace is reported
// before anything is written); null elsewhere, or null there to have run_serve make it.
ServeResult run_serve(const ExperimentConfig& exp, const RankGrid& grid, FailpointRegistry& faults, DecisionLog& log,
                      TraceWriter* trace, bool print, std::unique_ptr<ServeWorkload> workload = nullptr);

}  // namespace kvgrid
