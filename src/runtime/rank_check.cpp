#include "runtime/rank_check.hpp"

#include <climits>
#include <cstdint>

#include "core/agree.hpp"
#include "core/check.hpp"
#include "core/log.hpp"
#include "core/wait.hpp"

namespace kvgrid {

CheckOutcome cross_check(const RankGrid& grid, std::uint64_t tree_digest, const DecisionLog& log,
                         std::int64_t local_failures, std::int64_t local_mismatches, std::int64_t step) {
  constexpr int kWords = 5;
  std::uint64_t mine[kWords] = {tree_digest, log.running_digest(), log.size(), static_cast<std::uint64_t>(local_failures),
                                static_cast<std::uint64_t>(local_mismatches)};
  std::vector<std::uint64_t> all(kWords * static_cast<std::size_t>(grid.world_size()));
  MPI_Request req;
  KVGRID_MPI_CHECK(MPI_Iallgather(mine, kWords, MPI_UINT64_T, all.data(), kWords, MPI_UINT64_T, grid.world(), &req));
  wait_mpi(&req, "Iallgather of tree and decision digests at step " + std::to_string(step));
  CheckOutcome out;
  for (int r = 0; r < grid.world_size(); ++r) {
    // Every rank of a group takes the same decisions (P/D: the two groups take different ones).
    const auto base = static_cast<std::size_t>(layout_coord(grid.spec(), r).group_base);
    const std::uint64_t* row = &all[kWords * static_cast<std::size_t>(r)];
    const std::uint64_t* first = &all[kWords * base];
    out.verify_failures += static_cast<std::int64_t>(row[3]);
    out.oracle_mismatches += static_cast<std::int64_t>(row[4]);
    if (row[0] != first[0]) out.tree_differs.push_back(r);
    if (row[1] != first[1] || row[2] != first[2]) out.decisions_differ.push_back(r);
  }
  return out;
}

void agree_or_throw(MPI_Comm comm, const std::string& local_error) {
  int me = 0;
  KVGRID_MPI_CHECK(MPI_Comm_rank(comm, &me));
  const std::uint64_t none = INT32_MAX;
  const std::uint64_t first = agree_min(comm, local_error.empty() ? none : static_cast<std::uint64_t>(me), "all-reduce of start-up errors");
  if (first == none) return;
  if (!local_error.empty() && static_cast<std::uint64_t>(me) == first) throw InputError(local_error);
  throw InputError("rank " + std::to_string(first) + " failed to start (see its message on stderr)");
}

RankSummaryRow rank_summary(const RankGrid& grid, const cache::DeviceCache& dc, const DecisionLog& log,
                            const FailpointRegistry& faults, std::int64_t local_failures) {
  RankSummaryRow m;
  m.rank = grid.world_rank();
  m.group = grid.coord().group;
  m.tp = grid.coord().tp;
  m.cp = grid.coord().cp;
  m.pp = grid.coord().pp;
  m.verify_failures = static_cast<std::int32_t>(local_failures);
  m.tree_digest = dc.digest();
  m.decision_digest = log.running_digest();
  m.decisions = log.size();
  m.faults_fired = faults.fired_count();
  m.tree_pages = dc.tree().total_pages().value();
  m.tree_nodes = static_cast<std::int64_t>(dc.tree().node_count());
  return m;
}

void add_tier_stats(RankSummaryRow& m, const cache::DeviceCache& dc) {
  if (const auto* h = dc.hybrid()) {
    const auto& c = h->counters();
    m.hybrid = 1;
    m.swa_tombstones_made = c.tombstones_made;
    m.swa_tombstones_healed = c.tombstones_healed;
    m.swa_freed_pages = c.swa_freed;
    m.swa_windows_released = c.windows_released;
    m.mamba_states_copied = c.states_copied;
    m.mamba_states_saved = c.states_saved;
    m.swa_waits = c.swa_waits;
    m.full_alone_tokens = c.full_alone_tokens;
    m.swa_cost_tokens = c.swa_cost_tokens;
    m.mamba_cost_tokens = c.mamba_cost_tokens;
    // (agreed inside the admission at one stage: the same on every rank of it; across stages the
    // load-back plug-in counted them)
    m.load_failed += c.load_failed;
    m.load_recomputed_tokens += c.load_recomputed_tokens;
    m.tree_pages = h->tree().held_slots(cache::unified::ComponentId(0));
    m.tree_nodes = static_cast<std::int64_t>(h->tree().node_count());
    const auto& ss = h->tree().session_stats();
    m.sessions_opened = ss.opened;
    m.sessions_closed = ss.closed;
    m.session_registered = ss.registered;
    m.session_stale_finishes = ss.stale_finishes + ss.closed_finishes;
    m.forced_referenced_tokens = ss.forced_tokens.at(0);
    m.forced_referenced_host_tokens = ss.forced_host_tokens.at(0);
    m.recency_inversion_tokens = ss.recency_inversion_tokens;
  }
  if (const auto* hs = dc.host_stats()) {
    const auto& h = *hs;
    m.d2h_pages = static_cast<std::int64_t>(h.d2h_pages);
    m.h2d_pages = static_cast<std::int64_t>(h.h2d_pages);
    m.d2h_bytes = static_cast<std::int64_t>(h.d2h_bytes);
    m.h2d_bytes = static_cast<std::int64_t>(h.h2d_bytes);
    m.d2h_ns = static_cast<std::int64_t>(h.d2h_ns);
    m.h2d_ns = static_cast<std::int64_t>(h.h2d_ns);
  }
  if (const auto* st = dc.storage_tier()) {
    const auto& t = st->stats();
    m.storage_read_pages = static_cast<std::int64_t>(t.read_pages);
    m.storage_write_pages = static_cast<std::int64_t>(t.written_pages);
    m.storage_objects_written = static_cast<std::int64_t>(t.objects_written);
    const auto fs = st->storage().stats();
    m.storage_objects_read = static_cast<std::int64_t>(fs.hits);
    m.storage_objects_other_jobs = static_cast<std::int64_t>(fs.other_job_hits);
    if (const std::size_t per = st->site().objects_per_item())
      m.storage_tokens_other_jobs = static_cast<std::int64_t>(fs.other_job_hits / per) * st->site().page_size().value();
    m.storage_objects_swept = static_cast<std::int64_t>(t.swept);
    m.storage_connection_errors = static_cast<std::int64_t>(fs.connection_errors);
    m.storage_failed_pages = static_cast<std::int64_t>(t.failed_pages + t.write_failed);
    m.storage_read_bytes = static_cast<std::int64_t>(t.read_bytes);
    m.storage_write_bytes = static_cast<std::int64_t>(t.written_bytes);
    m.storage_read_ns = static_cast<std::int64_t>(t.read_ns);
  }
}

void finish_summary(const RankGrid& grid, LoopResult& res) {
  if (grid.world_rank() == 0) res.all.resize(static_cast<std::size_t>(grid.world_size()));
  MPI_Request req;
  KVGRID_MPI_CHECK(MPI_Igather(&res.mine, sizeof(RankSummaryRow), MPI_BYTE, res.all.data(), sizeof(RankSummaryRow),
                               MPI_BYTE, 0, grid.world(), &req));
  wait_mpi(&req, "Igather of rank summaries");
}

CheckOutcome periodic_check(const RankGrid& grid, const cache::DeviceCache& dc, const DecisionLog& log,
                            std::int64_t& local_failures, std::int64_t local_mismatches, std::int64_t step, LoopResult& res,
                            bool print, bool last) {
  try {
    dc.verify(last ? cache::VerifyDepth::Full : cache::VerifyDepth::Rolling);
  } catch (const InternalError& e) {
    ++local_failures;
    log_all("verify failed at step " + std::to_string(step) + ": " + e.what());
  }
  CheckOutcome c = cross_check(grid, dc.digest(), log, local_failures, local_mismatches, step);
  ++res.checks;
  res.verify_failures = c.verify_failures;
  if (!c.tree_differs.empty()) ++res.tree_divergences;
  if (!c.decisions_differ.empty()) ++res.decision_divergences;
  if (print && !c.tree_differs.empty())
    log0("# step " + std::to_string(step) + ": tree digests differ from their group's first rank's on ranks" + rank_list(c.tree_differs));
  if (print && !c.decisions_differ.empty())
    log0("# step " + std::to_string(step) + ": decision logs differ from their group's first rank's on ranks" + rank_list(c.decisions_differ));
  return c;
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += " " + std::to_string(r);
  return s;
}

bool planted_rank(const ExperimentConfig& exp, const RankGrid& grid) {
  return grid.world_rank() == exp.debug.plant_divergence_rank ||
         (exp.debug.plant_divergence_stage >= 0 && grid.coord().pp == exp.debug.plant_divergence_stage);
}

bool plant_divergence(const ExperimentConfig& exp, const RankGrid& grid, DecisionLog& log, std::int64_t step) {
  const auto& d = exp.debug;
  if ((d.plant_divergence_rank < 0 && d.plant_divergence_stage < 0) || step != d.plant_divergence_step) return false;
  const bool me = planted_rank(exp, grid);
  const std::string& kind = d.plant_divergence_kind;
  if (kind == "extra") {
    if (me) KVGRID_CONSENSUS(log, "planted", {step}, {});  // a decision no peer takes
  } else if (kind == "order") {
    const char* first = me ? "planted_b" : "planted_a";
    const char* second = me ? "planted_a" : "planted_b";
    KVGRID_CONSENSUS(log, first, {step}, {});
    KVGRID_CONSENSUS(log, second, {step}, {});
  } else if (kind == "arguments") {
    KVGRID_CONSENSUS(log, "planted", {step, me ? 1 : 0}, {});
  } else {
    KVGRID_CHECK(kind == "results", "unknown debug.plant_divergence_kind '", kind, "'");
    KVGRID_CONSENSUS(log, "planted", {step}, {me ? 1 : 0});
  }
  return me;
}

}  // namespace kvgrid
