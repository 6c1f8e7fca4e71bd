// The enumeration behind `kvgrid explore`: every schedule with at most `bound` non-default choices
// (a delay bound in the sense of CHESS), breadth first — all schedules of k flips before any of
// k + 1 —, so the first violation found has the fewest flips any violation has.
//
// A schedule S is extended by one point p only where p is a choice point the run of S reached,
// answered there by default and not dominated (schedule.hpp): a point a run never reaches cannot
// change it. Schedules are deduplicated as sets, and a run whose schedule names a point it never
// reached (an earlier flip changed the path) is the run of the smaller set it did apply: counted,
// not extended. Pure bookkeeping: the caller runs each schedule and reports what it reached.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/schedule.hpp"

namespace kvgrid {

// What one run reached: every rank's choice points.
struct ScheduleOutcome {
  std::vector<std::vector<ChoiceRecord>> ranks;  // by world rank
  bool violation = false;
  std::string what;  // the violation, or "" for a clean run
};

struct ScheduleSearchStats {
  std::uint64_t explored = 0;         // schedules run
  std::uint64_t redundant = 0;        // runs that did not reach one of their flips (= a smaller schedule's run)
  std::uint64_t unreduced = 0;        // schedules without the reductions (every point of every run below the bound, duplicates included)
  std::uint64_t dominated = 0;        // children not generated because their point was dominated
  std::uint64_t duplicates = 0;       // children generated twice (the same set reached in another order)
  std::uint64_t violations = 0;
  std::uint64_t max_points = 0;       // the most choice points one run met (all ranks)
  std::set<std::uint64_t> outcomes;   // distinct outcomes (the caller's digest of a run)
};

class ScheduleSearch {
 public:
  explicit ScheduleSearch(int bound);
  // The next schedule to run, or nullopt when every one within the bound has been run.
  std::optional<Schedule> next();
  // The outcome of the schedule `next` returned last. `digest`: the run's outcome as the caller
  // tells runs apart (e.g. its decision digests), for the count of distinct outcomes.
  void record(const Schedule& s, const ScheduleOutcome& o, std::uint64_t digest);
  const ScheduleSearchStats& stats() const { return stats_; }
  // Violating schedules in the order found (fewest flips first).
  const std::vector<Schedule>& violations() const { return violations_; }
  int bound() const { return bound_; }

 private:
  int bound_;
  std::deque<Schedule> queue_;
  std::set<Schedule> generated_;
  std::vector<Schedule> violations_;
  ScheduleSearchStats stats_;
};

// The flips of `s` the run reached (its effective schedule).
Schedule applied_flips(const Schedule& s, const ScheduleOutcome& o);

}  // namespace kvgrid
