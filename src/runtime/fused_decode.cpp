// engine.decode = fused: a run of decode steps no cache event can observe, run without the phases
// that cannot act in it.
//
// Invariant: a fused span leaves exactly what `step` leaves — the same decisions at the same step
// numbers (decision log and tree digests), the same KV in the pools (kv_digest), the same modelled
// clock after every step (each request's TTFT and finish time, the steps table's model columns),
// the oracle's check of every token. A step is quiet, and may be fused, when on this one rank
//   * exactly one request runs, in decode, and this step's token does not finish it (a finish
//     commits to the tree and starts backups), and nothing can be admitted (no request waits, or
//     max_running is reached);
//   * no arrival is due by the clock, and no session event is pending;
//   * no write ACK is unpublished (so no copy can land), and every plug-in is quiet (no load-back
//     outcome being agreed);
//   * the step is not one of the periodic check, progress row or trace flush, and no `kvgrid
//     explore` schedule is being followed.
// Then `faults` (no failpoint: refused), `receive` (no input), `cache_events` (no ACK), the
// scheduler's loops (Scheduler::quiet_decode gives the batch), `send` (one rank, nothing to
// publish) and `report` (nothing due) do nothing, and the span runs `gather`, `forward` and
// `verify` over the one-entry batch, the scheduler's step completion and the trace's step row —
// the same calls `step` makes. What cannot be known ahead refuses `fused` at load time with the
// reason (fused_decode_refusal in runtime/experiment.cpp): more than one rank, a draft, a hybrid
// model, storage, failpoints, the threaded engine, the online checker, debug knobs.
//
// The trace differs only in wall time: a fused step's row has the span's start as its wall start
// and no per-phase wall times (its wall columns are 0 whatever output.steps says).
#include <cstdint>
#include <string_view>

#include "core/check.hpp"
#include "core/schedule.hpp"
#include "runtime/serve_loop.hpp"

namespace kvgrid {

static_assert(std::string_view(kStepPhases[5]) == "forward");

bool ServeLoop::quiet_step(std::int64_t step) const {
  const auto next = static_cast<std::uint64_t>(step) + 1;
  const auto due = [next](std::int64_t every) { return next % static_cast<std::uint64_t>(every) == 0; };
  if (due(exp_.engine.check_every) || due(exp_.output.report_every) || due(exp_.output.flush_every)) return false;
  if (!workload_ || workload_->has_session_events()) return false;
  if (const auto at = workload_->next_arrival_ns(); at && *at <= clock_) return false;
  if (const auto* acks = dc_.write_acks(); acks && acks->unpublished() > 0) return false;
  for (const auto& p : plugins_)
    if (!p->quiet()) return false;
  return true;
}

std::int64_t ServeLoop::fuse(std::int64_t step) {
  if (choice_source() != nullptr) return step;
  Step& s = fused_step_;
  std::uint64_t span_wall = 0;
  for (bool first = true;; ++step, first = false) {
    if (!quiet_step(step)) return step;
    const auto e = sched_.quiet_decode();
    if (!e) return step;
    if (first && rows_) span_wall = wall_ns();
    log_.set_step(static_cast<std::uint64_t>(step));
    s.index = step;
    s.batch.assign(1, *e);
    s.out.entries.clear();
    StepRow row;
    row.step = static_cast<std::uint64_t>(step);
    row.model_start_ns = clock_;
    row.wall_start_ns = span_wall;
    gather(s);
    forward(s);
    verify(s);
    const auto finished = sched_.complete_step(s.batch, clock_, 0);  // (no first token)
    KVGRID_CHECK(finished.empty(), "fused step ", step, " finished a request (quiet_decode lets none finish)");
    ++fused_steps_;
    if (!trace_) continue;
    trace_->set_completed_step(static_cast<std::uint64_t>(step));
    if (!rows_) continue;
    row.phase_model_ns[5] = clock_ - row.model_start_ns;  // kStepPhases[5]: the forward moved the clock
    trace_->step(step_row(row, s));
  }
}

}  // namespace kvgrid
