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
// publish) and `report` (nothing due) do nothing, and `gather` (no copy to wait for: a request's
// load-backs landed at its first step) only notes the clock. A span of quiet steps then runs, per
// step, what `forward` and `verify` compute for the one token, through the model's decode span
// (SyntheticModel::begin_decode_span: the same layer outputs in O(layers) words, the span's KV
// written in one launch at its end — nothing reads the pool inside a span), the clock advanced by
// the step's compute (forward's layer pipeline with every layer ready), the chain value and the
// oracle's check of that token, then the scheduler's step completion and the trace's step row —
// the calls `step` makes. What cannot be known ahead refuses `fused` at load time with the
// reason (fused_decode_refusal in runtime/experiment.cpp): more than one rank, a draft, a hybrid
// model, storage, failpoints, the threaded engine, the online checker, debug knobs.
//
// The trace differs only in wall time: a fused step's row has the span's start as its wall start
// and no per-phase wall times (its wall columns are 0 whatever output.steps says).
#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <string_view>

#include "core/check.hpp"
#include "core/schedule.hpp"
#include "runtime/cost.hpp"
#include "runtime/serve_loop.hpp"

namespace kvgrid {

static_assert(std::string_view(kStepPhases[5]) == "forward");

std::int64_t ServeLoop::next_periodic(std::int64_t step) const {
  std::int64_t first = std::numeric_limits<std::int64_t>::max();
  for (const std::int64_t every : {exp_.engine.check_every, exp_.output.report_every, exp_.output.flush_every}) {
    const std::int64_t r = (step + 1) % every;  // step s is periodic when (s + 1) % every == 0
    first = std::min(first, r == 0 ? step : step + (every - r));
  }
  return first;
}

bool ServeLoop::arrival_due(std::optional<std::uint64_t> at) const { return at && *at <= clock_; }

bool ServeLoop::quiet_step(std::int64_t step) const {
  if (next_periodic(step) == step) return false;
  if (!workload_ || workload_->has_session_events()) return false;
  if (arrival_due(workload_->next_arrival_ns())) return false;
  if (const auto* acks = dc_.write_acks(); acks && acks->unpublished() > 0) return false;
  for (const auto& p : plugins_)
    if (!p->quiet()) return false;
  return true;
}

std::int64_t ServeLoop::fuse(std::int64_t step) {
  if (choice_source() != nullptr || !quiet_step(step)) return step;
  auto e = sched_.quiet_decode();
  if (!e) return step;
  KVGRID_CHECK(plugins_.empty() && stage_size_ == 1 && first_stage_ && last_stage_,
               "a fused span with plug-ins or stage peers (fused_decode_refusal lets none through)");
  ServeRequest& r = *e->req;
  Step& s = fused_step_;
  s.batch.assign(1, *e);
  s.out.entries.assign(1, {});
  partials_.assign(L_, 0);
  StepWork one_token;
  one_token.add(0, 1, /*prefill=*/false);
  const std::uint64_t step_ns = compute_ns(exp_.cost, one_token, L_, grid_.shape().tp, grid_.shape().cp);
  const std::uint64_t span_wall = rows_ ? wall_ns() : 0;
  // What the span's steps do not change is read once: its first periodic step and the next
  // arrival's time (a quiet step draws nothing from the workload). Session events, unpublished
  // ACKs and the plug-ins' state hold for the whole span once they hold for its first step.
  const std::int64_t periodic = next_periodic(step);
  const auto arrival = workload_->next_arrival_ns();
  model_.begin_decode_span(r.model, r.res.pages);
  do {
    KVGRID_CHECK(e->req == &r && e->end == e->start + 1 && r.model.hashed == e->start && r.res.load_events.empty() &&
                     !r.res.hybrid,
                 "fused step ", step, " is not the next one-token decode step of request ", r.spec.id);
    log_.set_step(static_cast<std::uint64_t>(step));
    s.index = step;
    s.batch[0] = *e;
    StepRow row;
    row.step = static_cast<std::uint64_t>(step);
    row.model_start_ns = clock_;
    row.wall_start_ns = span_wall;
    s.start_ns = clock_;                       // gather
    model_.decode_token(r.tokens, partials_);  // forward
    clock_ += step_ns;
    const std::uint64_t a = chain(chain_seed(r.spec.id, e->start, e->end), partials_);  // verify
    s.out.entries[0] = {r.spec.id.value(), e->start, e->end, a};
    if (checker_ && oracle_.expected(r.oracle, r.spec.id, r.tokens, e->start, e->end) != a)
      oracle_mismatch(s, 0);  // (reads no pool or fold: the span's KV may wait for its end)
    const auto finished = sched_.complete_step(s.batch, clock_, 0);  // complete (no first token)
    KVGRID_CHECK(finished.empty(), "fused step ", step, " finished a request (quiet_decode lets none finish)");
    ++fused_steps_;
    if (trace_) {
      trace_->set_completed_step(static_cast<std::uint64_t>(step));
      if (rows_) {
        row.phase_model_ns[5] = clock_ - row.model_start_ns;  // kStepPhases[5]: the forward moved the clock
        trace_->step(step_row(row, s));
      }
    }
    ++step;
  } while (step < periodic && !arrival_due(arrival) && (e = sched_.quiet_decode()));
  model_.end_decode_span();
  return step;
}

}  // namespace kvgrid
