// Speculative decoding's per-round arithmetic for the serving loop ([model.draft]): how many
// tokens a request's draft proposes after this step's token, how many of them the target accepts,
// and what the draft's work adds to the step's modelled time. The draft's KV and its movement
// through the tiers are in cache/draft_state.hpp.
#pragma once

#include <cstdint>
#include <span>

#include "runtime/cost.hpp"
#include "runtime/experiment.hpp"
#include "runtime/scheduler.hpp"
#include "runtime/serve.hpp"

namespace kvgrid {

// Tokens proposed in the round this entry starts: up to `steps`, fewer near the request's end
// (the round's verify step adds one more token); 0 when the entry yields no token or no draft runs.
std::int64_t draft_round_size(const DraftConfig& d, const BatchEntry& e);

// Accepted tokens of a round of `k` proposals after the request's `generated`-th token: the
// leading successes of seeded Bernoulli draws (a pure function of seed, request and position, the
// same on every rank and replay) — none when the draft read the wrong KV (`intact` false).
std::uint32_t draft_accepted(std::uint64_t seed, RequestId id, std::uint32_t generated, std::int64_t k, double accept_prob,
                             bool intact);

// The draft's modelled time in a step: its `draft_layers` over the step's tokens (the first
// proposal), then steps - 1 more draft decode passes when a round starts.
std::uint64_t draft_step_ns(const CostConfig& c, const DraftConfig& d, const StepWork& work, std::span<const BatchEntry> batch,
                            std::size_t draft_layers, int tp, int cp);

// After the loop, collective over the world: the last stage's round counts and digest (the
// largest, as the other stages count none) into every rank's result.
void share_spec_counts(const RankGrid& grid, ServeResult& res);

}  // namespace kvgrid
