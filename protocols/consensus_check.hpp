// protocol.consensus_check — the online rank consensus checker.
//
// Invariant: ranks that must take the same cache decisions — the TP/CP peers of a stage, and one
// TP/CP position across stages — have equal decision logs. Every `interval` steps, at the end of
// the step, each of the two groups agrees on a common prefix of its logs (MIN of lengths) and
// compares the running digest at that length (MIN and MAX of one word); since every rank checks at
// the end of the same step, a length difference is a divergence too ("log length": one rank took
// a decision its peers did not). When the digests differ, a
// binary search over prefix lengths (one MIN/MAX per halving) finds the first unequal entry, the
// group exchanges that entry and names it with its class (call order / arguments / results),
// exactly as `kvgrid check` would from the traces. One flag over the world then tells every rank;
// the run stops (exit 1) with "Found rank divergence" after every rank flushed its log.
//
// The common case costs one all-reduce of four words per check: every rank of a grid ends the same
// step with the same log, so MIN of [length, ~length, digest, ~digest] over the grid settles it;
// only a disagreement runs the per-group comparison. Off (the default) it costs nothing: the log keeps no history and no collective runs. On, the log
// keeps the records since the last agreed prefix (pruned at every check).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "core/decision_log.hpp"
#include "core/topology.hpp"

namespace kvgrid::protocols {

class ConsensusChecker {
 public:
  // Turns on the log's history. Collective: every rank of the world constructs one.
  ConsensusChecker(const RankGrid& grid, DecisionLog& log);
  // Collective over the world, at the same step on every rank. Returns the divergence's
  // description on the rank that reports it, "" on the others; nullopt when all agree. Of several
  // findings the one `kvgrid check` would print wins: smallest (step, decision), then the pair
  // whose second rank is lowest, stage peers before stages.
  std::optional<std::string> check(std::int64_t step);
  std::uint64_t checks() const { return checks_; }

 private:
  struct Found {
    std::uint64_t step = 0, seq = 0;
    std::uint64_t b_rank = 0;  // world rank of the first rank that differs from the group's first
    std::uint64_t kind = 0;    // 0: stage peers, 1: across stages (the offline checker's pair order)
    std::string text;          // on the group's first rank only: it reports
  };
  std::optional<Found> check_group(MPI_Comm g, std::uint64_t kind, std::uint64_t& agreed_len, const std::string& what);
  std::optional<Found> length_divergence(MPI_Comm g, std::uint64_t kind, std::uint64_t len, const std::string& what);
  const RankGrid& grid_;
  DecisionLog& log_;
  std::uint64_t checks_ = 0;
};

}  // namespace kvgrid::protocols
