// The periodic cross-rank check shared by the serving loops: every rank verifies its cache and
// all ranks exchange (tree digest, decision-log digest and length, verify failures) in one
// non-blocking all-gather through the wait primitive.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/decision_log.hpp"
#include "core/topology.hpp"

namespace kvgrid {

struct CheckOutcome {
  std::int64_t verify_failures = 0;   // summed over the world
  std::vector<int> tree_differs;      // ranks whose tree digest differs from world rank 0's
  std::vector<int> decisions_differ;  // ranks whose decision log differs from world rank 0's
  bool agree() const { return tree_differs.empty() && decisions_differ.empty(); }
};

CheckOutcome cross_check(const RankGrid& grid, std::uint64_t tree_digest, const DecisionLog& log,
                         std::int64_t local_failures, std::int64_t step);
std::string rank_list(const std::vector<int>& ranks);

// Every rank learns whether any rank failed a start-up step (empty `local_error`: this rank did
// not), so that no rank walks on into a collective alone; then all throw InputError. Rank 0's
// own message wins; otherwise the lowest failing rank is named. Collective over `comm`.
void agree_or_throw(MPI_Comm comm, const std::string& local_error);

}  // namespace kvgrid
