#include "runtime/offline_check.hpp"

#include <algorithm>
#include <span>
#include <sstream>

namespace kvgrid {

namespace {
DecisionRecord record_of(const DecisionRow& r) {
  DecisionRecord d;
  d.seq = r.seq;
  d.step = r.step;
  d.name = r.name;
  d.args_digest = r.args_digest;
  d.result_digest = r.result_digest;
  d.n_args = static_cast<std::uint8_t>(std::min<int>(r.n_args, 3));
  d.n_results = static_cast<std::uint8_t>(std::min<int>(r.n_results, 2));
  for (int i = 0; i < 3; ++i) d.args[i] = r.args[i];
  for (int i = 0; i < 2; ++i) d.results[i] = r.results[i];
  return d;
}
std::string side(const DecisionRow& r) { return record_of(r).side_text(); }

std::string coords(const RankTrace& r) {
  return "rank " + std::to_string(r.world_rank) + " (group " + std::to_string(r.group) + ", pp " + std::to_string(r.pp) +
         ", cp " + std::to_string(r.cp) + ", tp " + std::to_string(r.tp) + ")";
}

std::optional<Divergence> compare(const RankTrace& a, const RankTrace& b, bool complete, std::uint64_t& entries) {
  std::span<const DecisionRow> x = a.decisions, y = b.decisions;
  // An unfinished run: each rank's file holds every decision up to the step it last completed;
  // up to the smaller of the two the logs must match entry for entry, lengths included.
  if (!complete && a.completed_step && b.completed_step) {
    const std::uint64_t upto = std::min(*a.completed_step, *b.completed_step);
    auto cut = [upto](std::span<const DecisionRow> v) {
      std::size_t k = 0;
      while (k < v.size() && v[k].step <= upto) ++k;
      return v.first(k);
    };
    x = cut(x);
    y = cut(y);
    complete = true;
  }
  const std::size_t n = std::min(x.size(), y.size());
  entries += n;
  for (std::size_t i = 0; i < n; ++i) {
    const auto& p = x[i];
    const auto& q = y[i];
    const std::string kind = divergence_kind(record_of(p), record_of(q));
    if (!kind.empty())
      return Divergence{a.world_rank, b.world_rank, p.seq, std::min(p.step, q.step), kind, side(p), side(q), coords(a), coords(b)};
  }
  if (complete && x.size() != y.size()) {
    const auto& longer = x.size() > y.size() ? x : y;
    Divergence d{a.world_rank, b.world_rank, n, longer[n].step, "log length", "", "", coords(a), coords(b)};
    d.side_a = x.size() > n ? side(x[n]) : "(end of log after " + std::to_string(x.size()) + " entries)";
    d.side_b = y.size() > n ? side(y[n]) : "(end of log after " + std::to_string(y.size()) + " entries)";
    return d;
  }
  return std::nullopt;
}
}  // namespace

std::string Divergence::describe() const {
  return describe_divergence(coords_a, coords_b, rank_a, rank_b, seq, step, kind, side_a, side_b);
}

CheckReport check_run(const RunTrace& run) {
  CheckReport rep;
  const bool complete = run.summary.has_value();
  auto find = [&](int group, int pp, int cp, int tp) -> const RankTrace* {
    for (const auto& r : run.ranks)
      if (r.present && r.group == group && r.pp == pp && r.cp == cp && r.tp == tp) return &r;
    return nullptr;
  };
  for (const auto& r : run.ranks) {
    if (!r.present) {
      ++rep.missing_ranks;
      continue;
    }
    std::vector<const RankTrace*> refs;
    if (r.tp != 0 || r.cp != 0) refs.push_back(find(r.group, r.pp, 0, 0));  // stage peers
    if (r.pp != 0) refs.push_back(find(r.group, 0, r.cp, r.tp));           // same position, stage 0
    for (const RankTrace* ref : refs) {
      if (!ref) continue;
      ++rep.pairs;
      auto d = compare(*ref, r, complete, rep.compared_entries);
      if (d && (!rep.first || std::make_pair(d->step, d->seq) < std::make_pair(rep.first->step, rep.first->seq)))
        rep.first = d;
    }
  }
  return rep;
}

}  // namespace kvgrid
