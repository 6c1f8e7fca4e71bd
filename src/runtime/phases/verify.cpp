// Phase `verify`: every batch entry's chain value for the next stage (this stage's layers chained
// onto what it received); on the last stage the oracle's check and the draft rounds.
//
// Speculative decoding: each request that yields a token at this step starts a draft round of up
// to `steps` tokens (fewer near its end). Every stage knows which do; the last stage verifies them
// — accepted only if the draft's checksum over the pages it read matches its oracle and the seeded
// Bernoulli draws succeed — and the counts apply at the next step.
#include "core/check.hpp"
#include "core/log.hpp"
#include "runtime/serve_loop.hpp"
#include "runtime/spec_decode.hpp"

namespace kvgrid {

void ServeLoop::verify(Step& s) {
  for (std::size_t i = 0; i < s.batch.size(); ++i) {
    auto& e = s.batch[i];
    const std::uint64_t a_in = first_stage_ ? chain_seed(e.req->spec.id, e.start, e.end) : s.in.entries[i].value;
    const std::uint64_t a_out = chain(a_in, std::span<const std::uint64_t>(partials_).subspan(i * L_, L_));
    s.out.entries.push_back({e.req->spec.id.value(), e.start, e.end, a_out});
    if (e.prefill) e.req->forward_ns += clock_ - s.start_ns;  // the step, its restore and gather waits included
    if (draft_round_size(exp_.model.draft, e) > 0) ++s.rounds_started;
    if (draft_model_) verify_draft(s, i);
    if (checker_) check_oracle(s, i);
  }
}

void ServeLoop::verify_draft(Step& s, std::size_t i) {
  auto& e = s.batch[i];
  const std::int64_t k = draft_round_size(exp_.model.draft, e);
  const std::uint64_t got = chain(chain_seed(e.req->spec.id, e.start, e.end, /*draft=*/true),
                                  std::span<const std::uint64_t>(partials_).subspan(s.batch.size() * L_ + i * Ld_, Ld_));
  const bool intact = got == draft_oracle_->expected(e.req->draft_oracle, e.req->spec.id, e.req->tokens, e.start, e.end);
  if (!intact) {
    ++e.req->draft_mismatches;
    emit(s.index, e.req->spec.id.value(), "draft_mismatch", static_cast<std::int64_t>(e.start), static_cast<std::int64_t>(e.end), 0, 0);
  }
  if (k <= 0) return;
  const std::uint32_t a =
      draft_accepted(exp_.engine.seed, e.req->spec.id, e.req->generated + 1, k, exp_.model.draft.accept_prob, intact);
  ++e.req->spec_rounds;
  e.req->spec_proposed += static_cast<std::uint32_t>(k);
  e.req->spec_accepted += a;
  s.accepts.push_back({e.req->spec.id.value(), a});
  emit(s.index, e.req->spec.id.value(), "draft_round", k, a, intact ? 1 : 0, 0);
}

void ServeLoop::check_oracle(Step& s, std::size_t i) {
  auto& e = s.batch[i];
  const std::uint64_t want = oracle_.expected(e.req->oracle, e.req->spec.id, e.req->tokens, e.start, e.end);
  if (want == s.out.entries[i].value) return;
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
