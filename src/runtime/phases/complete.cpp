// Phase `complete`: the batch's requests advance (the last prefill chunk yields the first token, a
// decode step one more); finished ones commit their KV to the tree and are counted and recorded
// (in a P/D world by decode, which also tells prefill so that its clients go on).
#include <algorithm>

#include "core/hash.hpp"
#include "runtime/request_rows.hpp"
#include "runtime/serve_loop.hpp"

namespace kvgrid {

void ServeLoop::complete(Step& s) {
  // The wall clock is read for a first token only (its ttft_wall_ns): a decode step reads none.
  const bool first_token = std::any_of(s.batch.begin(), s.batch.end(),
                                       [](const BatchEntry& e) { return e.prefill && e.end >= e.req->prompt_len(); });
  for (auto& r : sched_.complete_step(s.batch, clock_, first_token ? wall_ns() : 0)) {
    ++res_.finished;
    res_.prompt_tokens += static_cast<std::int64_t>(r->prompt_len());
    res_.cached_tokens += r->res.matched.value();
    res_.host_tokens += r->res.host_loaded.value();
    res_.storage_tokens += r->res.storage_loaded.value();
    if (workload_ && !client_finish_elsewhere_) workload_->finished(r->spec.id, clock_);  // P/D: when decode finished it
    for (auto& p : plugins_) p->finished(*r);  // P/D decode tells prefill; the draft rounds counted
    emit(s.index, r->spec.id.value(), "finish", static_cast<std::int64_t>(r->prompt_len()), r->res.matched.value(),
         r->spec.output_len, r->oracle_ok ? 0 : 1);
    if (checker_ && trace_ && records_requests_)  // P/D: decode records the requests
      trace_->request(finished_row(*r, prompt_from_peer_));
  }
}

}  // namespace kvgrid
