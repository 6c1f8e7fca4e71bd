#include "protocols/consensus_check.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <utility>
#include <vector>

#include "core/agree.hpp"
#include "core/check.hpp"
#include "core/wait.hpp"

namespace kvgrid::protocols {

namespace {

std::uint64_t reduce(MPI_Comm g, std::uint64_t v, MPI_Op op, const std::string& what) {
  agree(g, std::span<std::uint64_t>(&v, 1), op, what);
  return v;
}

// Do all ranks of `g` have the same digest after the first `len` decisions?
bool equal_at(MPI_Comm g, const DecisionLog& log, std::uint64_t len, const std::string& what) {
  const std::uint64_t d = log.digest_at(len);
  return all_equal(g, std::span<const std::uint64_t>(&d, 1), what);
}

// One rank's view of the first unequal entry, exchanged in the group.
struct Wire {
  char name[32];
  std::uint64_t seq, step, args_digest, result_digest, digest_after;
  std::int64_t args[3], results[2];
  std::int32_t n_args, n_results, world_rank, group, pp, cp, tp;
};

DecisionRecord record_of(const Wire& w) {
  DecisionRecord r;
  r.seq = w.seq;
  r.step = w.step;
  r.name = std::string(w.name, strnlen(w.name, sizeof(w.name)));
  r.args_digest = w.args_digest;
  r.result_digest = w.result_digest;
  r.n_args = static_cast<std::uint8_t>(w.n_args);
  r.n_results = static_cast<std::uint8_t>(w.n_results);
  std::copy(w.args, w.args + 3, r.args);
  std::copy(w.results, w.results + 2, r.results);
  return r;
}

std::string coords(const Wire& w) {
  return "rank " + std::to_string(w.world_rank) + " (group " + std::to_string(w.group) + ", pp " + std::to_string(w.pp) +
         ", cp " + std::to_string(w.cp) + ", tp " + std::to_string(w.tp) + ")";
}

// This rank's view: entry `e` (none: the log ends before it) and where the rank sits.
Wire wire_of(const DecisionRecord* e, std::uint64_t digest_after, const RankGrid& grid) {
  Wire w{};
  w.digest_after = digest_after;
  if (e) {
    std::snprintf(w.name, sizeof(w.name), "%s", e->name.c_str());
    w.seq = e->seq;
    w.step = e->step;
    w.args_digest = e->args_digest;
    w.result_digest = e->result_digest;
    std::copy(e->args, e->args + 3, w.args);
    std::copy(e->results, e->results + 2, w.results);
    w.n_args = e->n_args;
    w.n_results = e->n_results;
  }
  w.world_rank = grid.world_rank();
  w.group = grid.coord().group;
  w.pp = grid.coord().pp;
  w.cp = grid.coord().cp;
  w.tp = grid.coord().tp;
  return w;
}

// Every rank's view, and the first group rank whose `digest_after` differs from the group's first.
std::pair<std::vector<Wire>, std::size_t> exchange(MPI_Comm g, const Wire& mine, const std::string& what) {
  int size = 1;
  KVGRID_MPI_CHECK(MPI_Comm_size(g, &size));
  std::vector<Wire> all(static_cast<std::size_t>(size));
  MPI_Request req;
  KVGRID_MPI_CHECK(MPI_Iallgather(&mine, sizeof(Wire), MPI_BYTE, all.data(), sizeof(Wire), MPI_BYTE, g, &req));
  wait_mpi(&req, what);
  std::size_t b = 1;
  while (b < all.size() && all[b].digest_after == all[0].digest_after) ++b;
  KVGRID_CHECK(b < all.size(), "consensus check: the group disagrees but no rank differs from its first");
  return {std::move(all), b};
}

}  // namespace

ConsensusChecker::ConsensusChecker(const RankGrid& grid, DecisionLog& log) : grid_(grid), log_(log) {
  KVGRID_CHECK(log_.size() == 0, "the consensus checker must start with an empty log");
  log_.keep_history(true);
}

std::optional<ConsensusChecker::Found> ConsensusChecker::check_group(MPI_Comm g, std::uint64_t kind,
                                                                     std::uint64_t& agreed_len, const std::string& what) {
  int size = 1, me = 0;
  KVGRID_MPI_CHECK(MPI_Comm_size(g, &size));
  KVGRID_MPI_CHECK(MPI_Comm_rank(g, &me));
  agreed_len = log_.size();
  if (size == 1) return std::nullopt;
  const std::uint64_t len = reduce(g, log_.size(), MPI_MIN, "consensus check: MIN of log lengths (" + what + ")");
  agreed_len = len;
  if (equal_at(g, log_, len, "consensus check: digests (" + what + ")")) {
    // Every rank checks at the end of the same step, so equal logs have equal lengths: a rank with
    // more decisions took one its peers did not (yet).
    if (reduce(g, log_.size(), MPI_MAX, "consensus check: MAX of log lengths (" + what + ")") == len) return std::nullopt;
    return length_divergence(g, kind, len, what);
  }
  // Equal at the largest pruned point of the group (every rank agreed up to there before), unequal
  // at len: halve until adjacent.
  std::uint64_t lo = reduce(g, log_.history_base(), MPI_MAX, "consensus check: history bases (" + what + ")"), hi = len;
  while (hi - lo > 1) {
    const std::uint64_t mid = lo + (hi - lo) / 2;
    (equal_at(g, log_, mid, "consensus check: bisection (" + what + ")") ? lo : hi) = mid;
  }
  agreed_len = lo;
  // Exchange entry hi - 1 and the digest after it; the group's first rank is the reference.
  const auto [all, b] = exchange(g, wire_of(&log_.entry(hi - 1), log_.digest_at(hi), grid_),
                                 "consensus check: the first unequal entry (" + what + ")");
  const Wire& a = all[0];
  Found f;
  f.seq = hi - 1;
  f.step = std::min(a.step, all[b].step);
  f.b_rank = static_cast<std::uint64_t>(all[b].world_rank);
  f.kind = kind;
  if (me == 0) {
    const DecisionRecord ra = record_of(a), rb = record_of(all[b]);
    f.text = describe_divergence(coords(a), coords(all[b]), a.world_rank, all[b].world_rank, f.seq, f.step,
                                 divergence_kind(ra, rb), ra.side_text(), rb.side_text());
  }
  return f;
}

std::optional<ConsensusChecker::Found> ConsensusChecker::length_divergence(MPI_Comm g, std::uint64_t kind,
                                                                           std::uint64_t len, const std::string& what) {
  int me = 0;
  KVGRID_MPI_CHECK(MPI_Comm_rank(g, &me));
  // Here `digest_after` says "has an entry `len`".
  const bool has = log_.size() > len;
  const auto [all, b] = exchange(g, wire_of(has ? &log_.entry(len) : nullptr, has ? 1 : 0, grid_),
                                 "consensus check: the entry after the common prefix (" + what + ")");
  const Wire& a = all[0];
  auto side = [&](const Wire& w) {
    return w.digest_after ? record_of(w).side_text()
                          : "(end of log after " + std::to_string(len) + " entries)";
  };
  Found f;
  f.seq = len;
  f.step = a.digest_after ? a.step : all[b].step;
  f.b_rank = static_cast<std::uint64_t>(all[b].world_rank);
  f.kind = kind;
  if (me == 0)
    f.text = describe_divergence(coords(a), coords(all[b]), a.world_rank, all[b].world_rank, f.seq, f.step, "log length",
                                 side(a), side(all[b]));
  return f;
}

std::optional<std::string> ConsensusChecker::check(std::int64_t step) {
  ++checks_;
  const std::string at = "step " + std::to_string(step);
  // Fast path: every rank of a group (one TP×CP×PP grid) checks at the end of the same step and
  // must hold the same log, so one MIN of [length, ~length, digest, ~digest] over the group says
  // whether all are equal. Only a disagreement pays for the per-pair search below.
  {
    const std::uint64_t n = log_.size(), d = log_.digest_at(n);
    const std::uint64_t mine[2] = {n, d};
    std::uint64_t ok = all_equal(grid_.group(), mine, "consensus check: lengths and digests, " + at) ? 1 : 0;
    int group_size = 1;
    KVGRID_MPI_CHECK(MPI_Comm_size(grid_.group(), &group_size));
    if (group_size < grid_.world_size()) ok = reduce(grid_.world(), ok, MPI_MIN, "consensus check: groups' verdicts, " + at);
    if (ok) {
      log_.prune_before(n);
      return std::nullopt;
    }
  }
  std::uint64_t len_stage = 0, len_pp = 0;
  auto stage = check_group(grid_.stage(), 0, len_stage, "stage peers, " + at);
  auto across = check_group(grid_.pp(), 1, len_pp, "across stages, " + at);
  const std::uint64_t any = reduce(grid_.world(), stage || across ? 1 : 0, MPI_MAX, "consensus check: verdict, " + at);
  if (!any) {
    log_.prune_before(std::min(len_stage, len_pp));
    return std::nullopt;
  }
  // Each group's first rank offers its finding; the smallest key reports.
  constexpr int kWords = 4;
  auto key_of = [](const std::optional<Found>& f) {
    std::array<std::uint64_t, kWords> k;
    k.fill(~0ULL);
    if (f && !f->text.empty()) k = {f->step, f->seq, f->b_rank, f->kind};
    return k;
  };
  const auto ks = key_of(stage), ka = key_of(across);
  const auto mine = std::min(ks, ka);
  std::vector<std::uint64_t> keys(kWords * static_cast<std::size_t>(grid_.world_size()));
  MPI_Request req;
  KVGRID_MPI_CHECK(MPI_Iallgather(mine.data(), kWords, MPI_UINT64_T, keys.data(), kWords, MPI_UINT64_T, grid_.world(), &req));
  wait_mpi(&req, "consensus check: earliest divergence, " + at);
  std::size_t best = 0;
  for (std::size_t r = 1; r < static_cast<std::size_t>(grid_.world_size()); ++r)
    if (std::lexicographical_compare(&keys[kWords * r], &keys[kWords * r + kWords], &keys[kWords * best],
                                     &keys[kWords * best + kWords]))
      best = r;
  if (static_cast<int>(best) != grid_.world_rank()) return std::string();
  return ks <= ka ? stage->text : across->text;
}

}  // namespace kvgrid::protocols
