// Phase `report`: the step's timeline records (copies and ACKs), whether the run is done, the
// plug-ins' after-step messages (P/D decode's answers to prefill, the drafts' verified counts back
// to PP0), the periodic check
// (tree and decision digests, verify()) and the online consensus checker, the progress row and
// the trace's flush.
#include <algorithm>
#include <cstdio>
#include <optional>

#include "core/check.hpp"
#include "core/log.hpp"
#include "core/wait.hpp"
#include "runtime/rank_check.hpp"
#include "runtime/serve_loop.hpp"

namespace kvgrid {

void ServeLoop::report(Step& s) {
  const std::int64_t step = s.index;
  if (trace_)
    for (const auto& t : dc_.take_transfers())
      emit(step, t.id, t.kind, static_cast<std::int64_t>(t.start_ns), static_cast<std::int64_t>(t.end_ns),
           static_cast<std::int64_t>(t.bytes), 0);
  // Done: the workload is exhausted and nothing is queued or running (P/D: prefill's relayed stop).
  std::optional<bool> plugin_done;
  for (const auto& p : plugins_)
    if (auto d = p->done(s)) plugin_done = d;
  done_ = plugin_done ? *plugin_done : s.in.exhausted != 0 && sched_.idle();
  if (!done_)
    for (auto& p : plugins_) p->after_step(s);  // P/D decode's answers, the drafts' counts back to PP0
  if (trace_) trace_->set_completed_step(static_cast<std::uint64_t>(step));
  if ((step + 1) % exp_.engine.check_every == 0 || done_) {
    CheckOutcome co = periodic_check(grid_, dc_, log_, local_failures_, local_mismatches_, step, res_, print_, done_);
    // A store shared with other jobs: its capacity is the store's, kept by one rank of each job.
    if (exp_.cache.storage_shared && grid_.world_rank() == 0 && dc_.storage_tier()) dc_.storage_tier()->sweep_store();
    wrong_ = co.oracle_mismatches;
    emit(step, 0, "check", static_cast<std::int64_t>(co.tree_differs.size()), static_cast<std::int64_t>(co.decisions_differ.size()),
         co.verify_failures, co.agree() ? 0 : 1);
  }
  if (online_ && ((step + 1) % exp_.protocol.consensus_interval == 0 || done_)) {
    if (auto found = online_->check(step)) {
      emit(step, 0, "divergence", 0, 0, 0, 1);
      flush();  // every rank's log up to here, for `kvgrid check`
      if (!found->empty() && print_) log_all(*found);  // (kvgrid explore reports it itself)
      // Nobody stops (MPI_Abort) before the reporting rank has printed.
      MPI_Request req;
      KVGRID_MPI_CHECK(MPI_Ibarrier(grid_.world(), &req));
      wait_mpi(&req, "Ibarrier after the consensus check's report");
      throw DivergenceFound("the online consensus checker found a rank divergence at step " + std::to_string(step) +
                                (found->empty() ? " (reported by another rank)" : " (above)"),
                            *found);
    }
  }
  if (print_ && !exp_.output.quiet && ((step + 1) % exp_.output.report_every == 0 || done_)) {
    // Throttled by wall time (output only: no decision reads it); the last row always.
    const double now_s = static_cast<double>(wall_ns()) / 1e9;
    if (done_ || now_s - last_row_s_ >= exp_.output.report_seconds) {
      progress_row(step, done_);
      last_row_s_ = now_s;
    }
  }
  if ((step + 1) % exp_.output.flush_every == 0 || done_) flush();
}

void ServeLoop::progress_row(std::int64_t step, bool last) {
  // Hit rates by tier over the finished requests' prompt tokens: device = cached - loaded back,
  // host = loaded back - prefetched, storage = prefetched (they add up to the cached share).
  auto pct = [this](std::int64_t x) {
    return res_.prompt_tokens ? 100.0 * static_cast<double>(x) / static_cast<double>(res_.prompt_tokens) : 0.0;
  };
  // Done: finished (and failed) of the requests known so far; ETA: wall time at the rate so far.
  const double wall_s = static_cast<double>(wall_ns()) / 1e9;
  const auto ended = static_cast<double>(res_.finished + res_.failed);
  const double done = total_known_ ? std::min(1.0, ended / static_cast<double>(total_known_)) : 0.0;
  char eta[16] = "      -";
  if (done > 0) std::snprintf(eta, sizeof(eta), "%7.1f", wall_s * (1.0 - done) / done);
  // wrong: the world's oracle mismatches as of the last periodic check (nccl-tests' #wrong).
  // The counts (all but step, wall time and ETA): the last row is left out when they are the row
  // before's (a run's last step usually only finds it done).
  char counts[200];
  std::snprintf(counts, sizeof(counts), "%7lld/%-7llu %7zu %7zu %6.2f %6.2f %6.2f %8lld %6lld %9.3f",
                static_cast<long long>(res_.finished), static_cast<unsigned long long>(total_known_), sched_.waiting(),
                sched_.running(), pct(res_.cached_tokens - res_.host_tokens), pct(res_.host_tokens - res_.storage_tokens),
                pct(res_.storage_tokens), static_cast<long long>(dc_.pool().used_pages().value()),
                static_cast<long long>(wrong_), static_cast<double>(clock_) / 1e6);
  if (last && last_row_ == counts) return;
  last_row_ = counts;
  char row[280];
  std::snprintf(row, sizeof(row), "%7lld %s %7.2f %6.1f %s", static_cast<long long>(step + 1), counts, wall_s, 100.0 * done, eta);
  log0(row);
}

}  // namespace kvgrid
