// After the last step: the sends drained, cross-stage publications finished, and the run's totals —
// oracle mismatches over the world, P/D's and speculative decoding's counts shared from the ranks
// that hold them, this rank's summary row — gathered.
#include "core/check.hpp"
#include "core/wait.hpp"
#include "runtime/rank_check.hpp"
#include "runtime/serve_loop.hpp"
#include "runtime/spec_decode.hpp"

namespace kvgrid {

void ServeLoop::finish(std::int64_t steps) {
  KVGRID_CHECK(!decode_step_ || decode_step_->restores_pending() == 0, "the run stopped with restore outcomes still being agreed");
  KVGRID_CHECK(!load_check_ || load_check_->pending() == 0, "the run stopped with load-back outcomes still being agreed");
  sender_.drain(true);
  back_sender_.drain(true);
  pd_.drain();
  if (auto* host = dc_.host_tier()) host->finish_cross_stage();
  res_.steps = steps;
  res_.model_ns = clock_;

  std::int64_t mism = local_mismatches_;
  MPI_Request req;
  KVGRID_MPI_CHECK(MPI_Iallreduce(&local_mismatches_, &mism, 1, MPI_INT64_T, MPI_SUM, grid_.world(), &req));
  wait_mpi(&req, "Iallreduce of oracle mismatches");
  res_.oracle_mismatches = mism;
  const std::int64_t local_finished = res_.finished;
  if (role_ != PdRole::None) {  // the first prefill rank's and the first decode rank's counts, on every rank
    const auto t = pd_.world_totals(res_.pd_received_tokens, res_.finished, res_.failed);
    res_.pd_sent_tokens = t.sent_tokens;
    res_.pd_received_tokens = t.received_tokens;
    res_.pd_failed = t.failed;
    res_.pd_restore_failed = t.restore_failed;
    res_.finished = t.finished_requests;  // decode's: the requests it decoded, and those it failed
    res_.failed = t.failed_requests;
  }
  if (exp_.model.draft.enabled()) share_spec_counts(grid_, res_);  // the last stage's counts, on every rank

  auto& m = res_.mine;
  m = rank_summary(grid_, dc_, log_, faults_, local_failures_);
  m.requests = res_.requests;
  m.admitted = local_finished;
  m.matched_tokens = res_.cached_tokens;
  m.prompt_tokens = res_.prompt_tokens;
  m.oracle_mismatches = local_mismatches_;
  m.model_ns = static_cast<std::int64_t>(clock_);
  m.device_high_water = 0;  // pages one rank's device pool held at most (sharded: the fullest owner)
  for (std::uint32_t r = 0; r < dc_.pool().shards(); ++r)
    m.device_high_water = std::max(m.device_high_water, dc_.pool().high_water(r).value());
  m.device_pool_pages = stack_.capacity.value();
  if (const auto* lg = stack_.gather.get()) {
    m.gather_bytes = static_cast<std::int64_t>(lg->stats().bytes);
    m.gather_ns = static_cast<std::int64_t>(gather_ns_);
  }
  m.pd_sent_tokens = pd_.stats().sent_tokens;
  m.pd_sent_bytes = pd_.stats().sent_bytes;
  m.pd_broken = pd_.stats().broken;
  m.pd_failed = pd_.stats().failed;
  m.pd_restore_failed = pd_.stats().restore_failed;
  if (load_check_) {
    m.load_failed = load_check_->failed_requests();
    m.load_recomputed_tokens = load_check_->recomputed_tokens();
  }
  add_tier_stats(m, dc_);
  finish_summary(grid_, res_);
  res_.wall_s = static_cast<double>(wall_ns()) / 1e9;
}

}  // namespace kvgrid
