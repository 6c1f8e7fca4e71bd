// The periodic cross-rank check shared by the serving loops: every rank verifies its cache and
// all ranks exchange (tree digest, decision-log digest and length, verify failures) in one
// non-blocking all-gather through the wait primitive.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cache/device_cache.hpp"
#include "core/decision_log.hpp"
#include "core/failpoint.hpp"
#include "core/topology.hpp"
#include "runtime/experiment.hpp"
#include "runtime/trace.hpp"

namespace kvgrid {

struct CheckOutcome {
  std::int64_t verify_failures = 0;   // summed over the world
  std::int64_t oracle_mismatches = 0; // summed over the world (the checking ranks' counts)
  std::vector<int> tree_differs;      // ranks whose tree digest differs from world rank 0's
  std::vector<int> decisions_differ;  // ranks whose decision log differs from world rank 0's
  bool agree() const { return tree_differs.empty() && decisions_differ.empty(); }
};

CheckOutcome cross_check(const RankGrid& grid, std::uint64_t tree_digest, const DecisionLog& log,
                         std::int64_t local_failures, std::int64_t local_mismatches, std::int64_t step);
std::string rank_list(const std::vector<int>& ranks);

// What every loop reports (the serving loop adds its oracle and request counts).
struct LoopResult {
  std::int64_t steps = 0, checks = 0, verify_failures = 0;
  std::int64_t tree_divergences = 0;      // checks at which some rank's tree digest differed
  std::int64_t decision_divergences = 0;  // checks at which some rank's decision log differed
  double wall_s = 0.0;
  RankSummaryRow mine;
  std::vector<RankSummaryRow> all;        // world rank 0 only
  std::int64_t divergences() const { return tree_divergences + decision_divergences; }
};

// This rank's summary row (cache and log state; the loop adds its request counters), and its
// gathering at world rank 0 into `res.all`. `finish_summary` is collective over grid.world().
RankSummaryRow rank_summary(const RankGrid& grid, const cache::DeviceCache& dc, const DecisionLog& log,
                            const FailpointRegistry& faults, std::int64_t local_failures);
void finish_summary(const RankGrid& grid, LoopResult& res);
// The host and storage tiers' copy counters of this rank (pages, bytes, modelled time).
void add_tier_stats(RankSummaryRow& m, const cache::DeviceCache& dc);

// The periodic check of both loops: verify this rank's cache (a failure is counted in
// `local_failures` and logged, not thrown; a rolling verify but at the run's `last` check),
// cross_check (with this rank's oracle mismatches so far), update `res`, print the ranks that
// differ (rank 0, when `print`). Collective over grid.world().
CheckOutcome periodic_check(const RankGrid& grid, const cache::DeviceCache& dc, const DecisionLog& log,
                            std::int64_t& local_failures, std::int64_t local_mismatches, std::int64_t step, LoopResult& res,
                            bool print, bool last);

// debug.plant_divergence_*: a divergence planted in the decision log at `step`, for testing the
// checkers. The planted ranks are debug.plant_divergence_rank and every rank of
// debug.plant_divergence_stage. Kind "extra": only they record a decision ("planted"; the logs'
// lengths differ). Kinds "order", "arguments", "results": every rank records the same decisions
// and the planted ones differ only in the order of two of them, an argument or a result — equal
// log lengths, so only the digests tell. Returns whether this rank planted.
bool planted_rank(const ExperimentConfig& exp, const RankGrid& grid);
bool plant_divergence(const ExperimentConfig& exp, const RankGrid& grid, DecisionLog& log, std::int64_t step);

// Every rank learns whether any rank failed a start-up step (empty `local_error`: this rank did
// not), so that no rank walks on into a collective alone; then all throw InputError. Rank 0's
// own message wins; otherwise the lowest failing rank is named. Collective over `comm`.
void agree_or_throw(MPI_Comm comm, const std::string& local_error);

}  // namespace kvgrid
