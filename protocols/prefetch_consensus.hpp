// protocol.prefetch_consensus — storage prefetch decisions agreed across pipeline stages.
//
// Invariant: every rank serving a request (its stage's TP/CP ranks and every stage) prefetches the
// same range, stops at the same step after the same ACKs, and inserts the same completed length.
//
//   pp_consensus  (correct) the storage hit of a request is the MIN over every rank (its stage,
//                 then across stages at the end of the arrival step); only PP0's stage decides
//                 whether a prefetch stops and after how many ACKs, and the decision travels with
//                 the step's message; the completed length is the MIN over every rank of the
//                 intact pages of those ACKs (each rank first waits for its own copies of them).
//   per_rank      (buggy) every stage decides its own stops from its own ACKs and agrees lengths
//                 only inside the stage: stages whose reads finish at different times insert
//                 different host prefixes (SGLang #22607's L3 half, fixed by #27010).
#pragma once

#include <mpi.h>

#include <memory>
#include <string>

#include "cache/storage_tier.hpp"
#include "core/topology.hpp"

namespace kvgrid::protocols {

// Throws InputError for an unknown variant name.
std::unique_ptr<cache::CrossStageAgreement> make_prefetch_consensus(const std::string& variant, const RankGrid& grid);

// The host tier's publish agreement at PP > 1 (protocol.pp_sync): MIN over the stage and across
// stages for "pp_sync", over the stage only for "independent_polling" (the bug: every stage decides
// for itself).
std::unique_ptr<cache::CrossStageAgreement> make_publish_agreement(const std::string& pp_sync_variant, const RankGrid& grid);

}  // namespace kvgrid::protocols
