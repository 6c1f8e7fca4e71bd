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
// `Step`. `finish` gathers the run's totals after the last step. The parts of the step that only
// some runs have — P/D prefill and decode, speculative decoding, load-backs whose outcome is
// agreed — are plug-ins (runtime/step_plugin.hpp) whose hooks the phases call at their places.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "cache/device_cache.hpp"
#include "cache/kv_pool.hpp"
#include "protocols/consensus_check.hpp"
#include "protocols/layer_gather.hpp"
#include "runtime/model.hpp"
#include "runtime/oracle_lane.hpp"
#include "runtime/pd.hpp"
#include "runtime/rank_stack.hpp"
#include "runtime/scheduler.hpp"
#include "runtime/serve.hpp"
#include "runtime/step_message.hpp"
#include "runtime/step_plugin.hpp"
#include "runtime/trace.hpp"

namespace kvgrid {

class ServeLoop {
 public:
  ServeLoop(const ExperimentConfig& exp, const RankGrid& grid, FailpointRegistry& faults, DecisionLog& log, TraceWriter* trace,
            bool print, std::unique_ptr<ServeWorkload> workload);
  ServeResult run();

 private:
  using Step = ServeStep;  // what one step computes, phase to phase (runtime/step_plugin.hpp)

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
  // engine.decode = fused (runtime/fused_decode.cpp): runs the quiet decode steps from `step` on
  // and returns the first step it did not run (`step` itself when that one is not quiet).
  std::int64_t fuse(std::int64_t step);
  bool quiet_step(std::int64_t step) const;
  std::int64_t next_periodic(std::int64_t step) const;  // the first step from `step` on with a check, row or flush
  bool arrival_due(std::optional<std::uint64_t> at) const;  // an arrival at `at` is due by the modelled clock

  // Parts of the phases.
  void leader_inputs(Step& s);             // receive: PP0's leader draws and exchanges the inputs
  void apply_inputs(Step& s);              // receive: arrivals, aborts, accepted drafts, load outcomes
  void check_activation(const Step& s);    // schedule: the previous stage's activation describes this batch
  void check_stage_batch(const Step& s);   // schedule: the stage peers scheduled the same batch
  void check_oracle(Step& s, std::size_t i);  // verify: the last stage's oracle for batch entry i
  void oracle_mismatch(Step& s, std::size_t i);  // ... which disagreed: counted, printed, --strict stops
  void progress_row(std::int64_t step, bool last);
  StepRow step_row(StepRow row, const Step& s) const;  // the trace's row of a finished step

  // Trace hooks.
  std::uint64_t wall_ns() const;
  void emit(std::int64_t step, std::uint64_t request, const char* op, std::int64_t a0, std::int64_t a1, std::int64_t a2,
            std::int32_t status);
  void record_failed(const ServeRequest& r, std::int32_t reason);  // 1 aborted, 2 broken P/D transfer, 3 broken restore
  void flush();
  static SchedulerConfig scheduler_config(const ExperimentConfig& exp, const RankStack& stack, PdLink& pd);
  void add_plugins();
  // Plug-in k's partial checksums of batch entry i (n entries in the batch).
  std::span<std::uint64_t> plugin_partials(std::size_t k, std::size_t i, std::size_t n);

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
  // Protocols of the loop.
  std::unique_ptr<protocols::ConsensusChecker> online_;
  // P/D (runtime/pd.hpp): the link between the groups (every rank has one; a single-group world's
  // carries nothing).
  PdLink pd_;
  Scheduler sched_;
  // The parts of the step only some runs have, in the order their hooks run (the same on every
  // rank): speculative decoding, checked load-backs, this group's P/D role (step_plugin.hpp).
  std::vector<std::unique_ptr<StepPlugin>> plugins_;
  bool client_finish_elsewhere_ = false;  // a plug-in tells the clients (P/D)
  bool records_requests_ = true;          // this group writes the request rows
  bool prompt_from_peer_ = false;         // its rows' prompts came partly from a peer (P/D decode)
  Rng corrupt_rng_, abort_rng_;
  Sender sender_;

  ServeResult res_;
  std::int64_t local_failures_ = 0, local_mismatches_ = 0;
  std::int64_t wrong_ = 0;  // the world's oracle mismatches at the last periodic check (progress rows)
  std::uint64_t total_known_ = 0;
  std::vector<std::uint64_t> partials_;  // [batch entry][local layer], then each plug-in's [batch entry][word]
  std::uint64_t gather_ns_ = 0;          // modelled time of this rank's layer gathers
  bool done_ = false;
  bool rows_ = false;     // the trace's steps table gets a row per step (output.steps)
  bool fused_ = false;    // engine.decode = fused
  Step fused_step_;       // (reused by every fused step: no allocation per token)
  std::int64_t fused_steps_ = 0;
  double last_row_s_ = -1e9;  // wall seconds of the last progress row (rows are throttled)
  std::string last_row_;      // its counts
  // engine.helper_thread: long chunks' oracle values on the helper thread (runtime/oracle_lane.hpp).
  // Last: destroyed first, so its worker stops before the requests it reads go.
  std::unique_ptr<OracleLane> oracle_lane_;
};

}  // namespace kvgrid
