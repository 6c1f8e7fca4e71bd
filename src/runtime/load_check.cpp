#include "runtime/load_check.hpp"

#include "core/check.hpp"

namespace kvgrid {

LoadCheckStep::LoadCheckStep(const RankGrid& grid, Scheduler& sched, cache::DeviceCache& dc, cache::KvPool& pool,
                             cache::KvPool* draft_pool, Emit emit)
    : sched_(sched), dc_(dc), pool_(pool), draft_pool_(draft_pool), emit_(std::move(emit)), agreement_(grid) {}

void LoadCheckStep::decide(std::int64_t step) {
  for (const auto& o : agreement_.decided()) {
    ServeRequest* r = sched_.find_running(o.id);
    if (r == nullptr) continue;  // aborted meanwhile (every rank at the same step): nothing to decide
    KVGRID_CHECK(r->awaiting_restore, "step ", step, ": load-back outcome of request ", o.id, " which is not waiting for one");
    const std::int64_t loaded = r->res.host_loaded.value();
    if (o.ok) {
      dc_.confirm_restore(o.id, r->res, r->tokens, /*ok=*/true);
    } else {
      const auto pages = dc_.drop_restore(o.id, r->res, r->tokens);
      pool_.reset(pages);  // they will hold the recomputed positions
      if (draft_pool_) draft_pool_->reset(pages);
      ++failed_;
      recomputed_ += loaded;
      emit_(step, o.id.value(), "load_fail", loaded, r->res.matched.value(), 0, 1);
    }
    sched_.restore_decided(*r);
  }
}

void LoadCheckStep::admitted(std::int64_t step) {
  for (ServeRequest* r : sched_.admitted()) {
    if (!r->awaiting_restore) continue;
    // A copy's failure is reported with its event; the request's first read still waits for each
    // layer's copy to land (the forward's per-layer waits, modelled and real).
    const bool ok = cache::DeviceCache::restore_intact(r->res);
    if (!ok) emit_(step, r->spec.id.value(), "load_broken", r->res.host_loaded.value(), 0, 0, 1);  // this rank's copies
    agreement_.add(r->spec.id, 0, ok);
  }
}

}  // namespace kvgrid
