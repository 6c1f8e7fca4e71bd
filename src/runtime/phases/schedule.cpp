// Phase `schedule`: this rank's batch. The scheduler admits and batches by itself (as every SGLang
// scheduler process does); the fresh pages are prepared for new KV; the plug-ins enter new
// load-backs that must be agreed (protocol.load_back) and answer P/D decode's admissions. Then the checks that
// turn a divergence into a clear stop instead of wrong KV: the previous stage's activation must
// describe this batch (else "shape mismatch", the symptom of SGLang #22607), and the stage's TP/CP
// peers must have scheduled the same batch (one small all-reduce before the partials' all-reduce,
// whose element count depends on it).
#include "core/agree.hpp"
#include "core/check.hpp"
#include "core/hash.hpp"
#include "runtime/serve_loop.hpp"

namespace kvgrid {

void ServeLoop::schedule(Step& s) {
  s.batch = sched_.schedule(clock_);
  pool_.reset(sched_.fresh_pages());
  // The plug-ins' part: the draft's fresh pages; new load-backs entered for agreement (their outcome
  // is agreed before anyone reads them); P/D decode's admissions answered (decode_prefix_len
  // agreed, receives posted; relayed to later stages, which compare).
  for (auto& p : plugins_) p->scheduled(s);
  if (!first_stage_) check_activation(s);
  // Nothing to compute but backups in flight (pages locked by them may be what admission waits
  // for): this rank's clock moves on to the oldest one's completion, as a real rank would wait.
  if (s.batch.empty()) {
    if (const auto* acks = dc_.write_acks(); acks && acks->pending() > 0) clock_ = std::max(clock_, acks->oldest_ns());
    if (const auto* st = dc_.storage_tier(); st && st->next_ack_ns() > 0) clock_ = std::max(clock_, st->next_ack_ns());
  }
  if (stage_size_ > 1) check_stage_batch(s);
}

void ServeLoop::check_activation(const Step& s) {
  const auto& in = s.in.entries;
  const auto& batch = s.batch;
  const int pp = grid_.coord().pp;
  const std::size_t n = std::max(in.size(), batch.size());
  for (std::size_t i = 0; i < n; ++i) {
    const bool have_in = i < in.size(), have_mine = i < batch.size();
    if (have_in && have_mine && in[i].id == batch[i].req->spec.id.value() && in[i].start == batch[i].start &&
        in[i].end == batch[i].end)
      continue;
    const auto id = have_in ? in[i].id : batch[i].req->spec.id.value();
    const auto theirs = have_in ? in[i].end - in[i].start : 0;
    const auto mine = have_mine ? batch[i].end - batch[i].start : 0;
    // The positions too: two stages that reused different prefixes schedule equal counts from
    // different starts.
    auto range = [](auto start, auto end) { return " [" + std::to_string(start) + ", " + std::to_string(end) + ")"; };
    const std::string m = "shape mismatch at step " + std::to_string(s.index) + " on stage " + std::to_string(pp) +
                          ": request " + std::to_string(id) + ": stage " + std::to_string(pp - 1) + " sent " +
                          std::to_string(theirs) + " tokens" + (have_in ? range(in[i].start, in[i].end) : "") +
                          ", this stage scheduled " + std::to_string(mine) +
                          (have_mine ? range(batch[i].start, batch[i].end) : "") +
                          (have_mine && have_in && in[i].id != batch[i].req->spec.id.value()
                               ? " (for request " + std::to_string(batch[i].req->spec.id.value()) + ")"
                               : "");
    emit(s.index, id, "shape_mismatch", static_cast<std::int64_t>(theirs), static_cast<std::int64_t>(mine), 0, 1);
    throw RunFailure(m);
  }
}

void ServeLoop::check_stage_batch(const Step& s) {
  std::uint64_t shape_digest = hash_combine(0x73746167ULL, s.batch.size());
  for (const auto& e : s.batch)
    shape_digest = hash_combine(hash_combine(hash_combine(shape_digest, e.req->spec.id.value()), e.start), e.end);
  if (all_equal(grid_.stage(), std::span<const std::uint64_t>(&shape_digest, 1),
                "all-reduce of the batch shape at step " + std::to_string(s.index)))
    return;
  emit(s.index, 0, "stage_mismatch", static_cast<std::int64_t>(s.batch.size()), 0, 0, 1);
  flush();
  throw RunFailure("stage peers scheduled different batches at step " + std::to_string(s.index) + " on stage " +
                   std::to_string(grid_.coord().pp) + " (this rank: " + std::to_string(s.batch.size()) +
                   " requests): their cache decisions diverged");
}

}  // namespace kvgrid
