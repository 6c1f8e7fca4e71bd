// The prefill group's part of each serving step in a P/D world (the protocol: runtime/pd.hpp).
//   PP0's leader, receiving the step's inputs: decode's answers to the previous step first
//     (bootstraps relayed to the group, finished requests handed to the clients, decode's clock
//     and whether it is idle); an idle prefill jumps ahead to the next arrival, but not past a busy
//     decode's clock; the arrivals go to decode as they are, while prefill computes only their
//     prompts and first tokens; the stop is relayed once nothing is left on either side;
//   every prefill rank: the group's relayed records (which requests decode bootstrapped), aborted
//     requests forgotten, and after the step's message the suffixes of the prompts whose prefill
//     ended now sent to decode (PP0's leader announces them, or their broken transfers).
// Prefill records no request rows: decode does.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "runtime/pd_step.hpp"

namespace kvgrid {

class PdPrefillStep : public PdStep {
 public:
  using Emit = EmitFn;
  struct Context {
    const RankGrid& grid;
    PdLink& pd;
    Scheduler& sched;
    std::uint64_t& clock;
    ServeWorkload* workload;  // PP0's leader only
    Emit emit;
  };
  explicit PdPrefillStep(Context ctx);

  void leader_before_arrivals(ServeStep& s) override;
  std::uint64_t idle_until(std::uint64_t next_arrival, std::uint64_t clock) const override;
  void leader_after_arrivals(ServeStep& s, std::vector<RequestSpec>& specs) override;
  bool reads_encoded_arrivals() const override { return true; }  // (decode gets them as words)
  void before_enqueue(ServeStep& s) override { link_.on_prefill_records(s.in.pd); }
  void aborted(RequestId id) override { link_.forget(id); }
  void end_of_step(ServeStep& s) override;
  bool records_requests() const override { return false; }

 private:
  const RankGrid& grid_;
  Scheduler& sched_;
  std::uint64_t& clock_;
  ServeWorkload* workload_;
  Emit emit_;
  std::vector<PdRecord> to_peer_;  // PP0's leader: records for decode's next message
  bool decode_idle_ = false;       // PP0's leader: decode's last answer
  std::uint64_t decode_clock_ = 0; // and decode's clock then
};

}  // namespace kvgrid
