// After the last step: the sends drained, cross-stage publications finished, and the run's totals —
// oracle mismatches over the world, P/D's and speculative decoding's counts shared from the ranks
// that hold them, this rank's summary row — gathered.
#include "core/agree.hpp"
#include "core/check.hpp"
#include "core/log.hpp"
#include "core/wait.hpp"
#include "runtime/rank_check.hpp"
#include "runtime/serve_loop.hpp"

namespace kvgrid {

void ServeLoop::finish(std::int64_t steps) {
  for (const auto& p : plugins_)
    KVGRID_CHECK(p->pending() == 0, "the run stopped with ", p->pending(), " outcomes still being agreed (restores or load-backs)");
  sender_.drain(true);
  for (auto& p : plugins_) p->drain();
  if (auto* st = dc_.storage_tier()) st->flush_writes();  // backups still in flight land (storage_writer.hpp)
  if (auto* acks = dc_.write_acks()) acks->finish_cross_stage();
  res_.steps = steps;
  res_.model_ns = clock_;

  res_.oracle_mismatches = agree_sum(grid_.world(), local_mismatches_, "all-reduce of oracle mismatches");
  const std::int64_t local_finished = res_.finished;
  // The plug-ins' world totals: the last stage's draft counts; P/D's (decode's view of the requests).
  for (auto& p : plugins_) p->totals(res_);

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
  m.kv_digest = pool_.content_digest();
  m.fused_steps = fused_steps_;
  m.oracle_thread_chunks = oracle_lane_ ? oracle_lane_->posted() : 0;
  if (const auto* lg = stack_.gather.get()) {
    m.gather_bytes = static_cast<std::int64_t>(lg->stats().bytes);
    m.gather_ns = static_cast<std::int64_t>(gather_ns_);
  }
  for (const auto& p : plugins_) p->summary(m);  // P/D's and the load-backs' counters
  add_tier_stats(m, dc_);
  finish_summary(grid_, res_);
  // Unified keys: after every rank's last write (the gather above), the store is brought within
  // its capacity for whoever uses it next.
  if (exp_.cache.storage_key_scheme == "unified" && grid_.world_rank() == 0 && dc_.storage_tier()) {
    const auto r = dc_.storage_tier()->sweep_store();
    if (r.removed > 0)
      log0("# storage: swept " + std::to_string(r.removed) + " of " + std::to_string(r.objects) +
           " objects (least recently read first) to keep " + exp_.cache.storage_dir + "/unified within cache.storage_capacity_mb = " +
           std::to_string(exp_.cache.storage_capacity_mb));
  }
  res_.wall_s = static_cast<double>(wall_ns()) / 1e9;
}

}  // namespace kvgrid
