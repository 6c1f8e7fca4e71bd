// Phase `send`: the step message to the next stage — the inputs relayed, the chain values, this
// step's write-ACK count and the decisions later stages follow (prefetch stops, admissions, P/D
// decode's answers, the drafts' accepted counts) — then the end-of-step agreements across stages,
// after the message went out and in the same order on every rank: the consumed backups'
// publication, the prefetch decisions, then the plug-ins' (the load-back outcomes, P/D decode's
// restore outcomes; P/D prefill sends the suffixes of the prompts whose prefill ended now, before
// their pages can be released).
#include "core/check.hpp"
#include "runtime/serve_loop.hpp"

namespace kvgrid {

void ServeLoop::send(Step& s) {
  const std::int64_t step = s.index;
  StepMessage& out = s.out;
  out.clock_ns = clock_;
  out.exhausted = s.in.exhausted;
  out.total = s.in.total;
  out.specs = std::move(s.in.specs);
  out.aborts = s.in.aborts;
  out.sessions = s.in.sessions;
  out.write_acks = s.write_acks;
  if (auto* st = dc_.storage_tier()) out.stops = st->take_decisions();
  if (stack_.relay_admissions) out.admits = first_stage_ ? dc_.take_admissions() : s.in.admits;
  out.pd = s.in.pd;
  out.pd_stop = s.in.pd_stop;
  for (auto& p : plugins_) p->message(s);  // the drafts' accepted counts, P/D decode's answers
  if (!last_stage_) {
    if (auto hit = faults_.evaluate("p2p.delay", static_cast<std::uint64_t>(step))) {
      out.clock_ns += static_cast<std::uint64_t>(hit->param("delay_us") * 1e3);  // the next stage sees it later
      emit(step, 0, "p2p_delay", static_cast<std::int64_t>(hit->param("delay_us")), 0, 0, 0);
    }
    sender_.send(out, grid_.pp_next(), grid_.pp());
    emit(step, 0, "pp_send", grid_.coord().pp, static_cast<std::int64_t>(out.clock_ns), out.write_acks, 0);
  }
  if (auto* acks = dc_.write_acks()) acks->end_of_step();
  if (auto* st = dc_.storage_tier()) st->end_of_step();
  // The plug-ins' end of step: the drafts verified now apply at the next step, the load-backs' and
  // P/D restores' pipelined agreements, P/D prefill's suffixes.
  for (auto& p : plugins_) p->end_of_step(s);
}

}  // namespace kvgrid
