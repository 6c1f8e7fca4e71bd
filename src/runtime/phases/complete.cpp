// Phase `complete`: the batch's requests advance (the last prefill chunk yields the first token, a
// decode step one more); finished ones commit their KV to the tree and are counted and recorded
// (in a P/D world by decode, which also tells prefill so that its clients go on).
#include "core/hash.hpp"
#include "runtime/request_rows.hpp"
#include "runtime/serve_loop.hpp"

namespace kvgrid {

void ServeLoop::complete(Step& s) {
  for (auto& r : sched_.complete_step(s.batch, clock_, wall_ns())) {
    ++res_.finished;
    res_.prompt_tokens += static_cast<std::int64_t>(r->prompt_len());
    res_.cached_tokens += r->res.matched.value();
    res_.host_tokens += r->res.host_loaded.value();
    res_.storage_tokens += r->res.storage_loaded.value();
    if (workload_ && role_ == PdRole::None) workload_->finished(r->spec.id, clock_);  // P/D: when decode finished it
    if (role_ == PdRole::Decode && leader_ && first_stage_) pd_to_peer_.push_back({kPdFinished, r->spec.id.value(), clock_});
    res_.spec_rounds += r->spec_rounds;
    res_.spec_proposed += r->spec_proposed;
    res_.spec_accepted += r->spec_accepted;
    res_.draft_mismatches += r->draft_mismatches;
    if (stack_.has_draft) res_.spec_digest += mix64(hash_combine(hash_combine(r->spec.id.value(), r->spec_rounds), r->spec_accepted));
    emit(s.index, r->spec.id.value(), "finish", static_cast<std::int64_t>(r->prompt_len()), r->res.matched.value(),
         r->spec.output_len, r->oracle_ok ? 0 : 1);
    if (checker_ && trace_ && role_ != PdRole::Prefill)  // P/D: decode records the requests
      trace_->request(finished_row(*r, role_ == PdRole::Decode));
  }
}

}  // namespace kvgrid
