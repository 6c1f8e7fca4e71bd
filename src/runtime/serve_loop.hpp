// One rank's serving loop as a pipeline of named phases (the step DESIGN §7 describes). run_serve
// (serve.hpp) builds a ServeLoop and runs it; every step goes through these phases in order, each
// a method defined in its own file under src/runtime/phases/:
//
//   faults        debug knobs and the step's failpoints (rank.stall, device.page.corrupt)
//   receive       the step's inputs: PP0's leader draws arrivals and aborts (P/D: exchanges control
//                 records with the other group's leader, and the drafts' verified counts come back
//                 from the last stage), its stage gets them by broadcast, later stages with the
//                 previous stage's activation; then arrivals enqueued, aborts released, relayed draft
//                 counts applied, the agreed load-back outcomes (protocol.load_back) taken
//   cache_events  the relayed cache decisions later stages follow (prefetch stops, admissions) and
//                 the agreed write ACKs (protocol.pp_sync)
//   schedule      this rank's batch, its fresh pages prepared, new load-backs entered for agreement,
//                 P/D decode's admissions answered; the batch checked against the previous stage's
//                 activation (a shape mismatch stops the run) and against the stage peers'
//   gather        CP sharding: the layer gather of the prefixes read for the first time
//                 (restore(l) → gather(l) → attention(l), modelled per layer)
//   forward       the model (and the draft) over this rank's layers, heads and query tokens, one stage
//                 all-reduce of the partial checksums, the modelled clock through the layer pipeline
//   verify        the chain values for the next stage; the last stage checks the oracle and verifies
//                 the draft rounds
//   send          the step message to the next stage, the end-of-step agreements (backups' and
//                 prefetches' publication, restore and load-back outcomes), P/D prefill's suffixes
//   complete      the batch's requests advanced, finished ones committed and recorded
//   report        timeline records, P/D decode's answers and the drafts' backward message, periodic
//                 and online consensus checks, the progress row and the trace's flush
//
// State that lives across steps is the loop's members; what one step computes travels in its
// `Step`. `finish` gathers the run's totals after the last step.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cache/device_cache.hpp"
#include "cache/kv_pool.hpp"
#include "protocols/consensus_check.hpp"
#include "protocols/layer_gather.hpp"
#include "runtime/load_check.hpp"
#include "runtime/model.hpp"
#include "runtime/pd.hpp"
#include "runtime/pd_decode.hpp"
#include "runtime/rank_stack.hpp"
#include "runtime/scheduler.hpp"
#include "runtime/serve.hpp"
#include "runtime/step_message.hpp"

namespace kvgrid {

class ServeLoop {
 public:
  ServeLoop(const ExperimentConfig& exp, const RankGrid& grid, FailpointRegistry& faults, DecisionLog& log, TraceWriter* trace,
            bool print, std::unique_ptr<ServeWorkload> workload);
  ServeResult run();

 private:
  // What one step computes, phase to phase.
  struct Step {
    std::int64_t index = 0;
    StepMessage in, out;
    std::vector<BatchEntry> batch;
    std::vector<PdRecord> decode_answers;  // P/D decode: this step's admissions answered
    std::uint32_t write_acks = 0;
    std::vector<std::uint64_t> layer_ready;  // modelled: when each local layer's restores (and gather) are done
    std::uint64_t start_ns = 0;              // modelled clock when the forward starts
    std::vector<std::pair<std::uint64_t, std::uint64_t>> accepts;  // drafts verified at this step
    std::size_t rounds_started = 0;
  };

  // The phases (src/runtime/phases/<name>.cpp).
  void faults(Step& s);
  void receive(Step& s);
  void cache_events(Step& s);
  void schedule(Step& s);
  void gather(Step& s);
  void forward(Step& s);
  void verify(Step& s);
  void send(Step& s);
  void complete(Step& s);
  void report(Step& s);
  void finish(std::int64_t steps);

  // Parts of the phases.
  void leader_inputs(Step& s);             // receive: PP0's leader draws and exchanges the inputs
  void apply_inputs(Step& s);              // receive: arrivals, aborts, accepted drafts, load outcomes
  void check_activation(const Step& s);    // schedule: the previous stage's activation describes this batch
  void check_stage_batch(const Step& s);   // schedule: the stage peers scheduled the same batch
  void verify_draft(Step& s, std::size_t i);  // verify: the draft round of batch entry i
  void check_oracle(Step& s, std::size_t i);  // verify: the last stage's oracle for batch entry i
  void progress_row(std::int64_t step);

  // Trace hooks.
  std::uint64_t wall_ns() const;
  void emit(std::int64_t step, std::uint64_t request, const char* op, std::int64_t a0, std::int64_t a1, std::int64_t a2,
            std::int32_t status);
  void record_failed(const ServeRequest& r, std::int32_t reason);  // 1 aborted, 2 broken P/D transfer, 3 broken restore
  void flush();
  static SchedulerConfig scheduler_config(const ExperimentConfig& exp, const RankStack& stack, PdLink& pd);

  const ExperimentConfig& exp_;
  const RankGrid& grid_;
  FailpointRegistry& faults_;
  DecisionLog& log_;
  TraceWriter* trace_;
  const bool print_;
  std::unique_ptr<ServeWorkload> workload_;  // PP0's leader only (P/D: the prefill group's)
  const std::chrono::steady_clock::time_point wall_start_;
  const bool first_stage_, last_stage_, leader_, checker_;  // checker: runs the oracle, records requests
  int stage_size_ = 1;

  // This rank's stack and model.
  RankStack stack_;
  cache::KvPool& pool_;
  cache::DeviceCache& dc_;
  std::uint64_t& clock_;  // modelled ns
  const std::size_t L_;   // local layers
  SyntheticModel model_;
  Oracle oracle_;
  // Speculative decoding ([model.draft]): every stage schedules the accepted draft tokens; the last
  // stage runs the draft, checks it against its oracle and draws the acceptance.
  std::unique_ptr<SyntheticModel> draft_model_;
  std::unique_ptr<Oracle> draft_oracle_;
  const std::size_t Ld_;  // the draft's layers here (last stage)
  std::vector<std::pair<std::uint64_t, std::uint64_t>> accepts_next_;  // verified at a step, applied at the next
  bool expect_back_ = false;  // PP0 (PP > 1): the previous step had draft rounds, their counts come back
  Sender back_sender_;        // the last stage's leader → PP0's leader
  // Protocols of the loop.
  std::unique_ptr<protocols::ConsensusChecker> online_;
  // P/D (runtime/pd.hpp): this rank's group prefills or decodes; the leaders exchange control records.
  PdLink pd_;
  const PdRole role_;
  Scheduler sched_;
  std::vector<PdRecord> pd_to_peer_;  // leaders: records for the other group's next message
  bool decode_idle_ = false;          // prefill leader: decode's last answer
  std::uint64_t decode_clock_ = 0;    // prefill leader: decode's clock then
  std::unique_ptr<LoadCheckStep> load_check_;  // load-backs that can fail (protocol.load_back)
  std::unique_ptr<PdDecodeStep> decode_step_;  // P/D decode (runtime/pd_decode.hpp)
  Rng corrupt_rng_, abort_rng_;
  Sender sender_;

  ServeResult res_;
  std::int64_t local_failures_ = 0, local_mismatches_ = 0;
  std::uint64_t total_known_ = 0;
  std::vector<std::uint64_t> partials_;  // [batch entry][local layer], then the draft's
  std::uint64_t gather_ns_ = 0;          // modelled time of this rank's layer gathers
  bool done_ = false;
  double last_row_s_ = -1e9;  // wall seconds of the last progress row (rows are throttled)
};

}  // namespace kvgrid
