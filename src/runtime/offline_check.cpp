#include "runtime/offline_check.hpp"

#include <algorithm>
#include <sstream>

namespace kvgrid {

namespace {
std::string side(const DecisionRow& r) {
  std::ostringstream os;
  os << "decision " << r.seq << ", step " << r.step << ": " << read_fixed(r.name, sizeof(r.name)) << "(";
  for (int i = 0; i < r.n_args && i < 3; ++i) os << (i ? ", " : "") << r.args[i];
  os << ") -> (";
  for (int i = 0; i < r.n_results && i < 2; ++i) os << (i ? ", " : "") << r.results[i];
  os << ")  [args 0x" << std::hex << r.args_digest << ", results 0x" << r.result_digest << "]";
  return os.str();
}

std::string coords(const RankTrace& r) {
  return "rank " + std::to_string(r.world_rank) + " (group " + std::to_string(r.group) + ", pp " + std::to_string(r.pp) +
         ", cp " + std::to_string(r.cp) + ", tp " + std::to_string(r.tp) + ")";
}

std::optional<Divergence> compare(const RankTrace& a, const RankTrace& b, bool complete, std::uint64_t& entries) {
  const auto& x = a.decisions;
  const auto& y = b.decisions;
  const std::size_t n = std::min(x.size(), y.size());
  entries += n;
  for (std::size_t i = 0; i < n; ++i) {
    const auto& p = x[i];
    const auto& q = y[i];
    std::string kind;
    if (read_fixed(p.name, sizeof(p.name)) != read_fixed(q.name, sizeof(q.name))) kind = "call order";
    else if (p.args_digest != q.args_digest) kind = "arguments";
    else if (p.result_digest != q.result_digest) kind = "results";
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

std::string Divergence::kind_explained() const {
  if (kind == "call order") return "different call order (the ranks took different decisions before)";
  if (kind == "arguments") return "different arguments (an earlier state mismatch)";
  if (kind == "results") return "same arguments, different results (the operation itself)";
  return "one log is longer (the ranks took a different number of decisions)";
}

std::string Divergence::describe() const {
  std::ostringstream os;
  os << "Found rank divergence: " << coords_a << " vs " << coords_b << " at decision " << seq << " (step " << step
     << "): " << kind_explained() << "\n#   rank " << rank_a << ": " << side_a << "\n#   rank " << rank_b << ": " << side_b;
  return os.str();
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
