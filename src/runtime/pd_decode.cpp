#include "runtime/pd_decode.hpp"

#include <mpi.h>

#include <algorithm>
#include <string>

#include "core/agree.hpp"
#include "core/check.hpp"
#include "core/wait.hpp"

namespace kvgrid {

PdDecodeStep::PdDecodeStep(Context ctx)
    : PdStep(ctx.pd), exp_(ctx.exp), grid_(ctx.grid), pd_(ctx.pd), sched_(ctx.sched), dc_(ctx.dc), clock_(ctx.clock),
      res_(ctx.res), hooks_(std::move(ctx.hooks)), restores_(ctx.grid),
      announcer_(ctx.grid.is_first_stage() && ctx.grid.is_stage_leader()) {
}

bool PdDecodeStep::leader_receives_inputs(ServeStep& s) {
  if (!announcer_) return false;
  s.in = pd_.recv_control(s.index);  // the arrivals, the suffixes sent, the prefill's clock and stop
  return true;
}

void PdDecodeStep::message(ServeStep& s) {
  // PP0's answers, relayed to later stages (which compare theirs).
  if (grid_.is_first_stage()) s.out.pd.insert(s.out.pd.end(), s.decode_answers.begin(), s.decode_answers.end());
}

void PdDecodeStep::finished(ServeRequest& r) {
  if (announcer_) to_peer_.push_back({kPdFinished, r.spec.id.value(), clock_});
}

void PdDecodeStep::after_step(ServeStep& /*s*/) {
  if (announcer_) pd_.send_answers(clock_, sched_.idle(), to_peer_);
}

void PdDecodeStep::fail(std::int64_t step, RequestId id, std::int32_t reason, const char* op, std::int64_t a0) {
  auto gone = sched_.abort(id);
  KVGRID_CHECK(gone != nullptr, "step ", step, ": failed request ", id, " is not on decode");
  ++res_.failed;
  hooks_.emit(step, id.value(), op, a0, reason == 1 ? gone->res.host_loaded.value() : gone->res.matched.value(), 0, 1);
  if (announcer_ && reason != 1) to_peer_.push_back({kPdFinished, id.value(), clock_});  // (prefill aborted it itself)
  hooks_.record_failed(*gone, reason);
}

void PdDecodeStep::kv_complete(std::int64_t step, const protocols::RestoreAgreement::Outcome& o) {
  ServeRequest* r = sched_.find_running(o.id);
  KVGRID_CHECK(r != nullptr && r->awaiting_kv, "step ", step, ": restore outcome of request ", o.id, " which is not waiting");
  dc_.confirm_restore(o.id, r->res, r->tokens, o.ok);
  if (o.ok) {
    sched_.kv_arrived(o.id, o.ready_ns, hooks_.wall_ns());
    return;
  }
  ++pd_.stats().restore_failed;
  fail(step, o.id, 3, "pd_restore_fail", r->res.host_loaded.value());  // never decoded, its restore never published
}

void PdDecodeStep::records(std::int64_t step, const std::vector<PdRecord>& in) {
  for (const auto& o : restores_.decided()) kv_complete(step, o);  // PP > 1: the previous step's
  for (const auto& [kind, id, value] : in) {
    if (kind == kPdAdmitted) continue;  // PP0's answers of this step, compared in admissions()
    if (kind == kPdAbort) {             // mid-transfer or still waiting: prefill will never send it
      if (ServeRequest* w = sched_.find_running(RequestId(id))) pd_.cancel_receive(*w);
      fail(step, RequestId(id), 1, "abort", 0);
      continue;
    }
    ServeRequest* r = sched_.find_running(RequestId(id));
    KVGRID_CHECK(r != nullptr && r->awaiting_kv, "step ", step, ": a transfer for request ", id, " which is not waiting for one");
    pd_.finish_receive(*r);
    if (kind == kPdBroken) {
      ++pd_.stats().failed;
      fail(step, RequestId(id), 2, "pd_fail", static_cast<std::int64_t>(value));  // value: the first broken layer
      continue;
    }
    KVGRID_CHECK(kind == kPdSent, "P/D record of kind ", kind, " from the prefill leader");
    std::uint64_t ready = value;  // the transfer's modelled end, then this rank's restores
    auto landed = [&](const std::vector<transfer::Event>& evs) {
      for (const auto& ev : evs) {
        ev.synchronize();
        ready = std::max(ready, ev.complete_ns());
      }
    };
    landed(r->res.load_events);
    if (r->res.hybrid) landed(r->res.hybrid->state_events);
    const bool ok = cache::DeviceCache::restore_intact(r->res);
    clock_ = std::max(clock_, ready);
    if (auto* h = dc_.hybrid()) h->suffix_received(r->res, Tokens(static_cast<std::int64_t>(r->prompt_len())));
    const std::int64_t dpl = r->res.matched.value();
    res_.pd_received_tokens += static_cast<std::int64_t>(r->prompt_len()) - dpl;
    hooks_.emit(step, id, "pd_recv", static_cast<std::int64_t>(r->prompt_len()) - dpl, dpl, static_cast<std::int64_t>(ready),
                ok ? 0 : 1);  // 1: this rank's restore broke
    if (r->res.restore_pending())
      restores_.add(RequestId(id), ready, ok);
    else  // nothing restored: nothing to agree
      sched_.kv_arrived(RequestId(id), ready, hooks_.wall_ns());
  }
  for (const auto& o : restores_.decided()) kv_complete(step, o);  // PP = 1: this step's
}

std::vector<PdRecord> PdDecodeStep::admissions(std::int64_t step, const std::vector<PdRecord>& in) {
  std::vector<PdRecord> answers;
  const auto& admitted = sched_.admitted();
  const int pp = grid_.coord().pp;
  if (!admitted.empty()) {  // (after the pool's reset: the receives land in these pages)
    // decode_prefix_len: page-aligned by construction, the same on every rank of the stage (its
    // decisions are agreed); checked, since the suffix's receives depend on it.
    std::vector<std::uint64_t> lens;
    for (const auto* r : admitted) {
      KVGRID_CHECK(r->res.matched.value() % exp_.cache.page_size.value() == 0, "decode_prefix_len is not page-aligned");
      lens.push_back(static_cast<std::uint64_t>(r->res.matched.value()));
    }
    if (!all_equal(grid_.stage(), lens, "all-reduce of decode_prefix_len at step " + std::to_string(step)))
      throw RunFailure("decode ranks of stage " + std::to_string(pp) + " disagree on decode_prefix_len at step " +
                       std::to_string(step) + ": their cache decisions diverged");
    if (auto* h = dc_.hybrid())  // the SWA pages of the prompt's tail window, which prefill sends
      for (auto* r : admitted)
        KVGRID_CHECK(h->expect_suffix(r->spec.id, r->res, Tokens(static_cast<std::int64_t>(r->prompt_len()))),
                     "step ", step, ": no SWA pages for request ", r->spec.id, "'s tail window (its admission budget holds them)");
    answers = pd_.post_receives(admitted);
    for (const auto* r : admitted)
      hooks_.emit(step, r->spec.id.value(), "pd_admit", r->res.matched.value(), r->res.host_loaded.value(),
                  static_cast<std::int64_t>(r->prompt_len()), 0);
    if (announcer_) to_peer_.insert(to_peer_.end(), answers.begin(), answers.end());
  }
  if (!grid_.is_first_stage()) {  // decode_prefix_len is PP0's answer: every stage must agree
    std::vector<PdRecord> theirs;
    for (const auto& t : in)
      if (t[0] == kPdAdmitted) theirs.push_back(t);
    if (theirs != answers)
      throw RunFailure("decode stage " + std::to_string(pp) +
                       " admitted other requests or decode_prefix_len than stage 0 at step " + std::to_string(step) +
                       ": their cache decisions diverged");
  }
  return answers;
}

}  // namespace kvgrid
