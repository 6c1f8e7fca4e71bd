// protocol.tp_sync — agreement of ACK consumption inside a stage's TP and CP group.
//
// Invariant: TP/CP peers consume identical ACK prefixes, in the same rounds. Asynchronous
// transfers finish at different times on different ranks; a rank that publishes a backup (or
// frees a loaded page's lock) on its own schedule makes different cache decisions than its peers.
//
//   min_allreduce    (correct) every rank enters an all-reduce(MIN) of its leading ready count
//                    every round, even with an empty queue; host allocations are agreed too
//                    (every rank allocated, or nobody backs up)
//   per_rank         (buggy) each rank consumes what it alone sees finished and trusts its own
//                    allocations: divergent trees (LMCache #1379-style hit-count disagreement)
//   skip_when_empty  (buggy) the collective is skipped when the local queue is empty, and
//                    allocations are not agreed: when one rank's host allocation fails its queue
//                    is empty while its peers' is not, they issue different numbers of collectives
//                    and hang (SGLang #26921 with #28429); the watchdog turns the hang into an
//                    error report
// The collectives run on a duplicate of the stage communicator, so that a rank that skips one
// never matches it against another collective of the stage.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>

#include "cache/agreement.hpp"

namespace kvgrid::protocols {

// Throws InputError for an unknown variant name. `comm`: the stage communicator.
std::unique_ptr<cache::AckAgreement> make_tp_sync(const std::string& variant, MPI_Comm comm);

}  // namespace kvgrid::protocols
