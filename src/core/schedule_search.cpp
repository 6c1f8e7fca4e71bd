#include "core/schedule_search.hpp"

#include "core/check.hpp"

namespace kvgrid {

ScheduleSearch::ScheduleSearch(int bound) : bound_(bound) {
  KVGRID_CHECK(bound >= 0, "a negative bound");
  queue_.push_back(Schedule{});
  generated_.insert(Schedule{});
}

std::optional<Schedule> ScheduleSearch::next() {
  if (queue_.empty()) return std::nullopt;
  Schedule s = std::move(queue_.front());
  queue_.pop_front();
  return s;
}

Schedule applied_flips(const Schedule& s, const ScheduleOutcome& o) {
  Schedule applied;
  for (const auto& p : s.flips)
    if (p.rank >= 0 && static_cast<std::size_t>(p.rank) < o.ranks.size() &&
        p.index < o.ranks[static_cast<std::size_t>(p.rank)].size())
      applied.flips.push_back(p);
  return applied;
}

void ScheduleSearch::record(const Schedule& s, const ScheduleOutcome& o, std::uint64_t digest) {
  ++stats_.explored;
  std::uint64_t points = 0;
  for (const auto& r : o.ranks) points += r.size();
  stats_.max_points = std::max(stats_.max_points, points);
  if (applied_flips(s, o) != s) {  // the run of a smaller schedule, already run or queued
    ++stats_.redundant;
    return;
  }
  stats_.outcomes.insert(digest);
  if (o.violation) {
    ++stats_.violations;
    violations_.push_back(s);
    return;  // its extensions add flips to a run that already fails
  }
  if (static_cast<int>(s.size()) >= bound_) return;
  for (std::size_t rank = 0; rank < o.ranks.size(); ++rank)
    for (const auto& c : o.ranks[rank]) {
      const SchedulePoint p{static_cast<int>(rank), c.index};
      if (s.contains(p)) continue;
      ++stats_.unreduced;
      if (c.dominated) {
        ++stats_.dominated;
        continue;
      }
      Schedule child = s.with(p);
      if (!generated_.insert(child).second) {
        ++stats_.duplicates;
        continue;
      }
      queue_.push_back(std::move(child));
    }
}

}  // namespace kvgrid
