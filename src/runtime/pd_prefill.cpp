#include "runtime/pd_prefill.hpp"

#include <algorithm>

namespace kvgrid {

PdPrefillStep::PdPrefillStep(Context ctx)
    : PdStep(ctx.pd), grid_(ctx.grid), sched_(ctx.sched), clock_(ctx.clock), workload_(ctx.workload), emit_(std::move(ctx.emit)) {}

void PdPrefillStep::leader_before_arrivals(ServeStep& s) {
  if (s.index == 0) return;
  // Decode's answers to the previous step: bootstraps (relayed to the group, each with its
  // pd.transfer.fail draw), finished requests (the clients go on), idle.
  const auto d = link_.receive_answers(s.index, clock_, s.in.pd, [this](RequestId id, std::uint64_t at) { workload_->finished(id, at); });
  decode_clock_ = d.clock_ns;
  decode_idle_ = d.idle;
}

std::uint64_t PdPrefillStep::idle_until(std::uint64_t next_arrival, std::uint64_t clock) const {
  // Not past decode's clock while decode is busy: its requests finish, and closed-loop clients
  // come back, before that arrival.
  return decode_idle_ ? next_arrival : std::max(clock, std::min(next_arrival, decode_clock_));
}

void PdPrefillStep::leader_after_arrivals(ServeStep& s, std::vector<RequestSpec>& specs) {
  // Decode gets the requests as they are; prefill computes their prompts and first tokens.
  StepMessage& in = s.in;
  in.pd_stop = in.exhausted && specs.empty() && sched_.idle() && decode_idle_ && to_peer_.empty() ? 1 : 0;
  link_.send_requests(in, to_peer_);
  for (auto& sp : specs) sp.output_len = 1;
  if (!specs.empty()) in.specs = encode_specs(specs);
}

void PdPrefillStep::end_of_step(ServeStep& s) {
  const bool announcer = grid_.is_stage_leader() && grid_.is_first_stage();
  auto sent = link_.send_suffixes(s.batch, clock_, s.index, announcer);
  for (const auto& t : sent)
    emit_(s.index, t[1], t[0] == kPdSent ? "pd_send" : "pd_broken", static_cast<std::int64_t>(t[2]), 0, 0, t[0] == kPdSent ? 0 : 1);
  if (announcer) to_peer_.insert(to_peer_.end(), sent.begin(), sent.end());
}

}  // namespace kvgrid
