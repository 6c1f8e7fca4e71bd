// Phase `send`: the step message to the next stage — the inputs relayed, the chain values, this
// step's write-ACK count and the decisions later stages follow (prefetch stops, admissions, P/D
// decode's answers) — then the end-of-step agreements across stages, after the message went out
// and in the same order on every rank: the consumed backups' publication, the prefetch decisions,
// P/D decode's restore outcomes, the load-back outcomes. P/D prefill sends the suffixes of the
// prompts whose prefill ended now, before their pages can be released.
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
  out.write_acks = s.write_acks;
  if (auto* st = dc_.storage_tier()) out.stops = st->take_decisions();
  if (stack_.relay_admissions) out.admits = first_stage_ ? dc_.take_admissions() : s.in.admits;
  out.accepts = s.in.accepts;
  out.pd = s.in.pd;
  if (role_ == PdRole::Decode && first_stage_) out.pd.insert(out.pd.end(), s.decode_answers.begin(), s.decode_answers.end());
  out.pd_stop = s.in.pd_stop;
  if (!last_stage_) {
    if (auto hit = faults_.evaluate("p2p.delay", static_cast<std::uint64_t>(step))) {
      out.clock_ns += static_cast<std::uint64_t>(hit->param("delay_us") * 1e3);  // the next stage sees it later
      emit(step, 0, "p2p_delay", static_cast<std::int64_t>(hit->param("delay_us")), 0, 0, 0);
    }
    sender_.send(out, grid_.pp_next(), grid_.pp());
    emit(step, 0, "pp_send", grid_.coord().pp, static_cast<std::int64_t>(out.clock_ns), out.write_acks, 0);
  }
  if (auto* host = dc_.host_tier()) host->end_of_step();
  if (auto* st = dc_.storage_tier()) st->end_of_step();
  if (decode_step_) decode_step_->end_of_step();
  if (load_check_) load_check_->end_of_step();
  accepts_next_ = std::move(s.accepts);
  expect_back_ = s.rounds_started > 0;
  KVGRID_CHECK(!stack_.has_draft || accepts_next_.size() == s.rounds_started, "draft rounds: ", accepts_next_.size(),
               " verified of ", s.rounds_started);
  if (role_ == PdRole::Prefill) {
    const bool announcer = leader_ && first_stage_;
    auto sent = pd_.send_suffixes(s.batch, clock_, step, announcer);
    for (const auto& t : sent)
      emit(step, t[1], t[0] == kPdSent ? "pd_send" : "pd_broken", static_cast<std::int64_t>(t[2]), 0, 0, t[0] == kPdSent ? 0 : 1);
    if (announcer) pd_to_peer_.insert(pd_to_peer_.end(), sent.begin(), sent.end());
  }
}

}  // namespace kvgrid
