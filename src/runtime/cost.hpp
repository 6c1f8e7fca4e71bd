// Modelled time (DESIGN §2 "Time"): what a step costs on the modelled hardware. The constants are
// in CostConfig ([cost] in the experiment); their defaults and where they come from are in
// cost.cpp. They are never tuned per figure.
#pragma once

#include <cstddef>
#include <cstdint>

#include "runtime/experiment.hpp"

namespace kvgrid {

struct StepWork {
  std::uint64_t prefill_tokens = 0;
  std::uint64_t attention_pairs = 0;  // (query, context) token pairs of prefill chunks
  std::uint64_t decode_tokens = 0;
  void add(std::size_t start, std::size_t end, bool prefill) {
    if (!prefill) {
      ++decode_tokens;
      return;
    }
    prefill_tokens += end - start;
    // Query q sees q + 1 context tokens: sum over q in [start, end) of (q + 1).
    attention_pairs += (static_cast<std::uint64_t>(end - start) * (start + end + 1)) / 2;
  }
};

// Modelled nanoseconds of one step on one rank holding `layers` layers, at the given TP and CP.
std::uint64_t compute_ns(const CostConfig& c, const StepWork& w, std::size_t layers, int tp, int cp);

}  // namespace kvgrid
