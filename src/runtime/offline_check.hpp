// `kvgrid check`: finds the first unequal decision between ranks that must agree.
//
// Compared pairs: TP/CP peers of each stage (each against the stage's first rank) and the same
// TP/CP position across stages (each against stage 0). Logs are compared on their common prefix
// (the MIN of their lengths, as the online checker does); for a run that ended cleanly a length
// difference is a divergence too. The first divergence is the one with the smallest (step, seq);
// its class is "call order" (different decision names), "arguments" or "results".
#pragma once

#include <optional>
#include <string>

#include "runtime/trace_reader.hpp"

namespace kvgrid {

struct Divergence {
  int rank_a = 0, rank_b = 0;
  std::uint64_t seq = 0, step = 0;
  std::string kind;  // "call order", "arguments", "results", "log length"
  std::string side_a, side_b;
  std::string coords_a, coords_b;  // "rank 3 (group 0, pp 0, cp 1, tp 1)"
  std::string describe() const;
};

struct CheckReport {
  int pairs = 0;
  int missing_ranks = 0;
  std::uint64_t compared_entries = 0;
  std::optional<Divergence> first;
};

CheckReport check_run(const RunTrace& run);

}  // namespace kvgrid
