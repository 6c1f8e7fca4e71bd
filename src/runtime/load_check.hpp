// The serving step's part of protocol.load_back (protocols/load_back.hpp) when load-backs can
// fail: every rank of the group, in this order each step —
//   decide()       before scheduling: the agreed outcomes of the load-backs admitted at the
//                  previous step (PP = 1: one MIN over the stage now; PP > 1: the pipelined MIN
//                  over every stage finishes now). Intact: published, the request computes from
//                  its whole reused prefix. Broken on any rank: never published, the request
//                  computes the loaded positions itself (event `load_fail`, its tokens counted).
//                  A request aborted meanwhile is skipped (its abort waited for the copies);
//   admitted()     after scheduling: this step's admissions with a private load-back, each with
//                  "none of my copies failed";
//   end_of_step()  after the step's message went out: PP > 1 starts the agreement.
#pragma once

#include <cstdint>
#include <functional>

#include "cache/device_cache.hpp"
#include "cache/kv_pool.hpp"
#include "protocols/pd_restore.hpp"
#include "runtime/scheduler.hpp"
#include "runtime/step_plugin.hpp"

namespace kvgrid {

class LoadCheckStep : public StepPlugin {
 public:
  using Emit = EmitFn;
  // `draft_pool` may be null. The references must outlive the step.
  LoadCheckStep(const RankGrid& grid, Scheduler& sched, cache::DeviceCache& dc, cache::KvPool& pool, cache::KvPool* draft_pool,
                Emit emit);

  void decide(std::int64_t step);
  void admitted(std::int64_t step);

  // The plug-in's hooks (runtime/step_plugin.hpp).
  void after_aborts(ServeStep& s) override { decide(s.index); }
  void scheduled(ServeStep& s) override { admitted(s.index); }
  void end_of_step(ServeStep& /*s*/) override { agreement_.end_of_step(); }
  std::size_t pending() const override { return agreement_.pending(); }
  bool quiet() const override { return agreement_.pending() == 0; }  // no load-back outcome being agreed
  void summary(RankSummaryRow& m) const override {
    m.load_failed = failed_;
    m.load_recomputed_tokens = recomputed_;
  }
  // Requests whose load-back failed somewhere, and the positions they recomputed (this rank's view,
  // the same on every rank).
  std::int64_t failed_requests() const { return failed_; }
  std::int64_t recomputed_tokens() const { return recomputed_; }

 private:
  Scheduler& sched_;
  cache::DeviceCache& dc_;
  cache::KvPool& pool_;
  cache::KvPool* draft_pool_;
  Emit emit_;
  protocols::RestoreAgreement agreement_;
  std::int64_t failed_ = 0, recomputed_ = 0;
};

}  // namespace kvgrid
