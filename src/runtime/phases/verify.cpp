// Phase `verify`: every batch entry's chain value for the next stage (this stage's layers chained
// onto what it received); the plug-ins' checks (speculative decoding: each request that yields a
// token starts a draft round, which the last stage verifies — runtime/spec_decode.hpp); on the
// last stage the oracle's check.
#include "core/check.hpp"
#include "core/log.hpp"
#include "runtime/serve_loop.hpp"

namespace kvgrid {

void ServeLoop::verify(Step& s) {
  for (std::size_t i = 0; i < s.batch.size(); ++i) {
    auto& e = s.batch[i];
    const std::uint64_t a_in = first_stage_ ? chain_seed(e.req->spec.id, e.start, e.end) : s.in.entries[i].value;
    const std::uint64_t a_out = chain(a_in, std::span<const std::uint64_t>(partials_).subspan(i * L_, L_));
    s.out.entries.push_back({e.req->spec.id.value(), e.start, e.end, a_out});
    if (e.prefill) e.req->forward_ns += clock_ - s.start_ns;  // the step, its restore and gather waits included
    for (std::size_t k = 0; k < plugins_.size(); ++k) plugins_[k]->verify_entry(s, i, plugin_partials(k, i, s.batch.size()));
    if (checker_) check_oracle(s, i);
  }
  KVGRID_CHECK(!oracle_lane_ || oracle_lane_->empty(), "step ", s.index, " left oracle values untaken on the helper thread");
}

void ServeLoop::check_oracle(Step& s, std::size_t i) {
  auto& e = s.batch[i];
  const auto posted = oracle_lane_ ? oracle_lane_->take(i) : std::nullopt;  // (engine.helper_thread)
  const std::uint64_t want = posted ? *posted : oracle_.expected(e.req->oracle, e.req->spec.id, e.req->tokens, e.start, e.end);
  if (want != s.out.entries[i].value) oracle_mismatch(s, i);
}

void ServeLoop::oracle_mismatch(Step& s, std::size_t i) {
  auto& e = s.batch[i];
  ++local_mismatches_;
  e.req->oracle_ok = false;
  emit(s.index, e.req->spec.id.value(), "oracle_mismatch", static_cast<std::int64_t>(e.start), static_cast<std::int64_t>(e.end), 0, 1);
  // The first few are printed, the rest counted (the footer and the trace's events have them all).
  constexpr std::int64_t kPrinted = 5;
  if (local_mismatches_ <= kPrinted)
    log_all("oracle mismatch at step " + std::to_string(s.index) + ": request " + std::to_string(e.req->spec.id.value()) +
            " positions [" + std::to_string(e.start) + ", " + std::to_string(e.end) + ")" +
            (local_mismatches_ == kPrinted ? " (further mismatches are counted, not printed: see the footer and the "
                                             "trace's oracle_mismatch events)"
                                           : ""));
  if (exp_.engine.strict) {
    flush();
    throw RunFailure("oracle mismatch with --strict: request " + std::to_string(e.req->spec.id.value()) + " at step " +
                     std::to_string(s.index));
  }
}

}  // namespace kvgrid
