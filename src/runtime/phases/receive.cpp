// Phase `receive`: the step's inputs reach every rank, and the loop applies them.
//
// PP0's leader draws the arrivals up to its modelled clock (jumping to the next arrival when idle)
// and the client aborts (request.abort); in a P/D world it first exchanges the control records
// with the other group's leader (prefill: decode's answers; decode: the whole input comes from
// prefill). At PP > 1 the drafts the last stage verified at the previous step come back first.
// PP0's stage gets the inputs by broadcast; later stages receive them from the previous stage,
// with its activation and the decisions they follow.
#include "core/check.hpp"
#include "runtime/serve_loop.hpp"

namespace kvgrid {

void ServeLoop::receive(Step& s) {
  const std::int64_t step = s.index;
  const std::string what = "step " + std::to_string(step) + " inputs";
  if (first_stage_ && leader_ && role_ == PdRole::Decode) {
    s.in = pd_.recv_control(step);  // the arrivals, the suffixes sent, the prefill's clock and stop
  } else if (first_stage_ && leader_) {
    leader_inputs(s);
  }
  if (first_stage_) {
    if (grid_.shape().pp == 1) s.in.accepts = accepts_next_;  // every rank of the one stage verified them
    if (stage_size_ > 1) s.in = bcast_step(s.in, leader_, grid_.stage(), what + " over stage 0");
    clock_ = std::max(clock_, s.in.clock_ns);
  } else {
    const int from = grid_.coord().pp - 1;
    s.in = recv_step(grid_.pp_prev(), grid_.pp(), what + " from stage " + std::to_string(from));
    clock_ = std::max(clock_, s.in.clock_ns + static_cast<std::uint64_t>(exp_.cost.pp_link_ns));
    emit(step, 0, "pp_recv", from, static_cast<std::int64_t>(s.in.clock_ns), s.in.write_acks, 0);
  }
  total_known_ = s.in.total;
  apply_inputs(s);
}

void ServeLoop::leader_inputs(Step& s) {
  const std::int64_t step = s.index;
  StepMessage& in = s.in;
  if (role_ == PdRole::Prefill && step > 0) {
    // Decode's answers to the previous step: bootstraps (relayed to the group, each with its
    // pd.transfer.fail draw), finished requests (the clients go on), idle.
    const auto d = pd_.receive_answers(step, clock_, in.pd, [this](RequestId id, std::uint64_t at) { workload_->finished(id, at); });
    decode_clock_ = d.clock_ns;
    decode_idle_ = d.idle;
  }
  if (expect_back_ && grid_.shape().pp > 1) {
    // The last stage verified the previous step's drafts: their accepted counts decide this step's
    // decode lengths (a real pipeline waits for its sampled tokens the same way).
    StepMessage back = recv_step(grid_.shape().pp - 1, grid_.pp(),
                                 "step " + std::to_string(step) + " inputs: drafts verified by the last stage", kTagBackward);
    in.accepts = std::move(back.accepts);
    clock_ = std::max(clock_, back.clock_ns + static_cast<std::uint64_t>(exp_.cost.pp_link_ns));
  }
  if (sched_.idle()) {
    // Idle: jump ahead to the next arrival — in P/D not past decode's clock while decode is busy
    // (its requests finish, and closed-loop clients come back, before that arrival).
    if (auto next = workload_->next_arrival_ns(); next && *next > clock_)
      clock_ = role_ == PdRole::Prefill && !decode_idle_ ? std::max(clock_, std::min(*next, decode_clock_)) : *next;
  }
  if (faults_.evaluate("request.abort", static_cast<std::uint64_t>(step))) {
    auto ids = sched_.ids();
    if (!ids.empty()) in.aborts.push_back(ids[abort_rng_.below(ids.size())].value());
  }
  auto specs = workload_->arrivals(clock_);
  in.clock_ns = clock_;
  in.exhausted = workload_->exhausted() ? 1 : 0;
  in.total = workload_->total_requests();
  if (!specs.empty()) in.specs = encode_specs(specs);
  if (role_ == PdRole::Prefill) {
    // Decode gets the requests as they are; prefill computes their prompts and first tokens.
    in.pd_stop = in.exhausted && specs.empty() && sched_.idle() && decode_idle_ && pd_to_peer_.empty() ? 1 : 0;
    pd_.send_requests(in, pd_to_peer_);
    for (auto& sp : specs) sp.output_len = 1;
    if (!specs.empty()) in.specs = encode_specs(specs);
  }
}

void ServeLoop::apply_inputs(Step& s) {
  const std::int64_t step = s.index;
  const StepMessage& in = s.in;
  if (role_ == PdRole::Prefill) pd_.on_prefill_records(in.pd);
  // Decode: the suffixes the prefill ranks sent at the previous step (receives, restores and their
  // agreed outcome), broken transfers, aborts.
  if (decode_step_) decode_step_->records(step, in.pd);
  if (!in.specs.empty()) {
    for (auto& sp : decode_specs(in.specs)) {
      ++res_.requests;
      sched_.enqueue(std::move(sp), wall_ns());
    }
  }
  // Aborted requests (chosen by PP0's leader from requests every rank holds): every rank of every
  // stage releases them at this same step.
  for (const auto a : in.aborts) {
    const bool prefetching = dc_.storage_tier() && dc_.storage_tier()->prefetching(RequestId(a));
    const ServeRequest* running = sched_.find_running(RequestId(a));
    const bool loading = running && running->awaiting_restore;  // its load-back still being agreed
    auto r = sched_.abort(RequestId(a));
    KVGRID_CHECK(r != nullptr, "aborted request ", a, " is not here");
    if (role_ == PdRole::Prefill) pd_.forget(RequestId(a));
    ++res_.failed;
    if (workload_) workload_->finished(r->spec.id, clock_);  // the client goes on (closed loop)
    ++(prefetching ? res_.aborted_prefetching : loading ? res_.aborted_loading : res_.aborted_other);
    // a2: 1 mid-prefetch, 2 mid-load-back
    emit(step, a, "abort", static_cast<std::int64_t>(r->computed), r->res.host_loaded.value(), prefetching ? 1 : loading ? 2 : 0, 1);
    record_failed(*r, 1);  // aborted
  }
  // Accepted draft tokens of the previous step's rounds (every stage, same order).
  if (stack_.has_draft && grid_.shape().pp > 1)
    KVGRID_CHECK(in.accepts == accepts_next_, "step ", step, ": the accepted drafts relayed from PP0 differ from this stage's");
  for (const auto& [id, n] : in.accepts) sched_.accept_draft(RequestId(id), static_cast<std::uint32_t>(n));
  // The previous step's load-backs, agreed (intact: computed on; broken: recomputed).
  if (load_check_) load_check_->decide(step);
}

}  // namespace kvgrid
