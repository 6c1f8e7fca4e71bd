// The decode group's part of each serving step in a P/D world (the protocol: runtime/pd.hpp).
// Every decode rank, in this order each step:
//   records()     the prefill leader's records of the step, relayed to every decode rank:
//                 aborted requests (their posted receives withdrawn), suffixes sent (receives
//                 waited for, restores waited for and their outcome agreed — protocols/pd_restore —
//                 then decoded or failed: reason 3) and broken transfers (failed: reason 2);
//   admissions()  after scheduling: this step's admissions — decode_prefix_len page-aligned and
//                 the same over the stage (and, at later stages, equal to PP0's relayed answers),
//                 the suffix's receives posted; returns the answers (kPdAdmitted);
//   end_of_step() after the step's message went out: the restores' pipelined agreement (PP > 1).
// PP0's leader takes the step's whole input from prefill's control message, and after the step
// answers it (admissions, finished and failed requests, decode's clock and whether it is idle).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "cache/device_cache.hpp"
#include "protocols/pd_restore.hpp"
#include "runtime/pd.hpp"
#include "runtime/pd_step.hpp"
#include "runtime/scheduler.hpp"
#include "runtime/serve.hpp"

namespace kvgrid {

class PdDecodeStep : public PdStep {
 public:
  struct Hooks {
    EmitFn emit;
    std::function<void(const ServeRequest&, std::int32_t reason)> record_failed;  // its request row
    std::function<std::uint64_t()> wall_ns;
  };
  // What the step works on: the serving loop's state (the loop owns it).
  struct Context {
    const ExperimentConfig& exp;
    const RankGrid& grid;
    PdLink& pd;
    Scheduler& sched;
    cache::DeviceCache& dc;
    std::uint64_t& clock;             // this rank's modelled clock
    ServeResult& res;                 // failed and received counts
    Hooks hooks;
  };
  explicit PdDecodeStep(Context ctx);

  void records(std::int64_t step, const std::vector<PdRecord>& in);
  std::vector<PdRecord> admissions(std::int64_t step, const std::vector<PdRecord>& in);

  // The plug-in's hooks (runtime/step_plugin.hpp).
  bool leader_receives_inputs(ServeStep& s) override;
  void before_enqueue(ServeStep& s) override { records(s.index, s.in.pd); }
  void scheduled(ServeStep& s) override { s.decode_answers = admissions(s.index, s.in.pd); }
  void message(ServeStep& s) override;
  void end_of_step(ServeStep& /*s*/) override { restores_.end_of_step(); }
  void finished(ServeRequest& r) override;
  bool prompt_from_peer() const override { return true; }
  void after_step(ServeStep& s) override;
  std::size_t pending() const override { return restores_.pending(); }

 private:
  // The request's KV is complete and its restore's outcome agreed: decode it, or fail it.
  void kv_complete(std::int64_t step, const protocols::RestoreAgreement::Outcome& o);
  // Fails a request decode holds (never decoded): released, counted, reported to prefill.
  void fail(std::int64_t step, RequestId id, std::int32_t reason, const char* op, std::int64_t a0);

  const ExperimentConfig& exp_;
  const RankGrid& grid_;
  PdLink& pd_;
  Scheduler& sched_;
  cache::DeviceCache& dc_;
  std::uint64_t& clock_;
  ServeResult& res_;
  std::vector<PdRecord> to_peer_;  // PP0's leader: records for prefill's next message
  Hooks hooks_;
  protocols::RestoreAgreement restores_;
  bool announcer_;  // PP0's leader: talks to prefill
};

}  // namespace kvgrid
