// The `tree` serving loop: every rank runs its own device cache (radix tree + pool) over the same
// request stream and must reach the same state.
//
// Per step: the group's leader draws the step's requests from the shared workload stream and
// broadcasts them over the group (non-blocking, through the wait primitive); each rank releases
// the requests whose hold expired, then admits the new ones in order. Every `check_every` steps
// and at the end, each rank verifies its cache and all ranks exchange their tree digest and their
// decision log digest: the verdict is OK iff every verify passed and both digests agreed on every
// rank at every check. (A difference that eviction later erases from the tree still shows in the
// decision log.)
#pragma once

#include <cstdint>
#include <vector>

#include "core/decision_log.hpp"
#include "core/failpoint.hpp"
#include "core/topology.hpp"
#include "runtime/experiment.hpp"
#include "runtime/rank_check.hpp"
#include "runtime/trace.hpp"

namespace kvgrid {

struct TreeRunResult : LoopResult {
  bool ok() const { return divergences() == 0 && verify_failures == 0; }
};

// Collective over grid.world(). `trace` may be null (tests). Console output only when `print`.
TreeRunResult run_tree_workload(const ExperimentConfig& exp, const RankGrid& grid, FailpointRegistry& faults,
                                DecisionLog& log, TraceWriter* trace, bool print);

}  // namespace kvgrid
