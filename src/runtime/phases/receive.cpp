// Phase `receive`: the step's inputs reach every rank, and the loop applies them.
//
// PP0's leader draws the arrivals up to its modelled clock (jumping to the next arrival when idle)
// and the client aborts (request.abort). Plug-ins come first (runtime/step_plugin.hpp): the whole
// input may come from elsewhere (P/D decode: from prefill), or answers and verified drafts come
// back from the previous step (P/D prefill: decode's answers; speculative decoding at PP > 1: the
// last stage's counts), and a plug-in may pass the arrivals on (P/D prefill: to decode). PP0's
// stage gets the inputs by broadcast; later stages receive them from the previous stage, with its
// activation and the decisions they follow.
#include "core/check.hpp"
#include "runtime/serve_loop.hpp"

namespace kvgrid {

void ServeLoop::receive(Step& s) {
  const std::int64_t step = s.index;
  auto what = [step] { return "step " + std::to_string(step) + " inputs"; };  // (for the messages of a failed exchange)
  if (first_stage_ && leader_) {
    bool received = false;
    for (auto& p : plugins_) received = received || p->leader_receives_inputs(s);
    if (!received) leader_inputs(s);
  }
  if (first_stage_) {
    for (auto& p : plugins_) p->first_stage_inputs(s);
    if (stage_size_ > 1) s.in = bcast_step(s.in, leader_, grid_.stage(), what() + " over stage 0");
    clock_ = std::max(clock_, s.in.clock_ns);
  } else {
    const int from = grid_.coord().pp - 1;
    s.in = recv_step(grid_.pp_prev(), grid_.pp(), what() + " from stage " + std::to_string(from));
    clock_ = std::max(clock_, s.in.clock_ns + static_cast<std::uint64_t>(exp_.cost.pp_link_ns));
    emit(step, 0, "pp_recv", from, static_cast<std::int64_t>(s.in.clock_ns), s.in.write_acks, 0);
  }
  total_known_ = s.in.total;
  apply_inputs(s);
}

void ServeLoop::leader_inputs(Step& s) {
  const std::int64_t step = s.index;
  StepMessage& in = s.in;
  for (auto& p : plugins_) p->leader_before_arrivals(s);
  if (sched_.idle()) {
    // Nothing known to arrive: a workload that waits on another job (buckets) blocks until it knows.
    if (!workload_->exhausted() && !workload_->next_arrival_ns()) workload_->wait_for_arrival(clock_);
    // Idle: jump ahead to the next arrival (as far as the plug-ins let it: P/D prefill not past a
    // busy decode's clock).
    if (auto next = workload_->next_arrival_ns(); next && *next > clock_) {
      std::uint64_t to = *next;
      for (const auto& p : plugins_) to = p->idle_until(to, clock_);
      clock_ = to;
    }
  }
  if (faults_.evaluate("request.abort", static_cast<std::uint64_t>(step))) {
    auto ids = sched_.ids();
    if (!ids.empty()) in.aborts.push_back(ids[abort_rng_.below(ids.size())].value());
  }
  auto specs = workload_->arrivals(clock_);
  in.sessions = encode_session_events(workload_->take_session_events());
  in.clock_ns = clock_;
  in.exhausted = workload_->exhausted() ? 1 : 0;
  in.total = workload_->total_requests();
  // As words only where something reads them: the stage's other ranks, the next stage, a plug-in.
  // A leader alone keeps them whole (own_specs): the encoding copies every prompt token once more.
  bool encode = stage_size_ > 1 || !last_stage_;
  for (const auto& p : plugins_) encode = encode || p->reads_encoded_arrivals();
  if (!specs.empty() && encode) in.specs = encode_specs(specs);
  for (auto& p : plugins_) p->leader_after_arrivals(s, specs);
  s.own_specs = std::move(specs);  // (after the plug-ins' changes: what in.specs encodes, where encoded)
}

void ServeLoop::apply_inputs(Step& s) {
  const std::int64_t step = s.index;
  const StepMessage& in = s.in;
  // The step's records (P/D prefill: which requests decode bootstrapped; decode: the suffixes
  // prefill sent at the previous step — receives, restores and their agreed outcome — broken
  // transfers, aborts).
  for (auto& p : plugins_) p->before_enqueue(s);
  // Session opens and closes (PP0's leader's, in order), then the arrivals: each arrival carries
  // its session's generation from this rank's cache (the same on every rank: the same events in
  // the same order).
  for (const SessionEvent& e : decode_session_events(in.sessions)) dc_.session_event(e.kind == SessionEvent::Open, e.session);
  if (!in.specs.empty() || !s.own_specs.empty()) {
    for (auto& sp : s.own_specs.empty() ? decode_specs(in.specs) : std::move(s.own_specs)) {
      sp.session_gen = dc_.session_arrival(sp.id, sp.session);
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
    for (auto& p : plugins_) p->aborted(RequestId(a));
    ++res_.failed;
    if (workload_) workload_->finished(r->spec.id, clock_);  // the client goes on (closed loop)
    ++(prefetching ? res_.aborted_prefetching : loading ? res_.aborted_loading : res_.aborted_other);
    // a2: 1 mid-prefetch, 2 mid-load-back
    emit(step, a, "abort", static_cast<std::int64_t>(r->computed), r->res.host_loaded.value(), prefetching ? 1 : loading ? 2 : 0, 1);
    record_failed(*r, 1);  // aborted
  }
  // The decisions of the previous step that apply now: the drafts' accepted tokens (speculative
  // decoding), the load-backs' agreed outcomes (protocol.load_back: intact, computed on; broken,
  // recomputed).
  for (auto& p : plugins_) p->after_aborts(s);
}

}  // namespace kvgrid
