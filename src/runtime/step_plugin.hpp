// What one serving step computes (ServeStep), and the interface through which the parts of the
// step that only some runs have plug into the loop's phases (StepPlugin): P/D prefill
// (runtime/pd_prefill.hpp), P/D decode (runtime/pd_decode.hpp), speculative decoding
// (runtime/spec_decode.hpp) and load-backs whose outcome is agreed (runtime/load_check.hpp).
//
// The loop (runtime/serve_loop.hpp) calls every plug-in's hook at its place in the phase, in the
// order the plug-ins were registered — the same on every rank, so that the collectives some hooks
// run match. A hook a plug-in does not override does nothing.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "runtime/cost.hpp"
#include "runtime/pd.hpp"
#include "runtime/scheduler.hpp"
#include "runtime/serve.hpp"
#include "runtime/serve_workload.hpp"
#include "runtime/step_message.hpp"
#include "runtime/trace.hpp"

namespace kvgrid {

// How a plug-in records a trace event: (step, request, op, a0, a1, a2, status), as the loop's own.
using EmitFn = std::function<void(std::int64_t step, std::uint64_t request, const char* op, std::int64_t a0, std::int64_t a1,
                                  std::int64_t a2, std::int32_t status)>;

// What one step computes, phase to phase.
struct ServeStep {
  std::int64_t index = 0;
  StepMessage in, out;
  std::vector<BatchEntry> batch;
  std::vector<PdRecord> decode_answers;  // P/D decode: this step's admissions answered
  std::uint32_t write_acks = 0;
  std::vector<std::uint64_t> layer_ready;  // modelled: when each local layer's restores (and gather) are done
  std::uint64_t start_ns = 0;              // modelled clock when the forward starts
  std::vector<std::pair<std::uint64_t, std::uint64_t>> accepts;  // drafts verified at this step
  std::size_t rounds_started = 0;
  // PP0's leader: the arrivals it encoded into `in.specs`, kept whole so that it need not decode
  // its own message (empty elsewhere, and when the inputs came from a plug-in).
  std::vector<RequestSpec> own_specs;
};

class StepPlugin {
 public:
  virtual ~StepPlugin() = default;

  // --- receive, PP0's stage leader -------------------------------------------------------------
  // The step's inputs come whole from elsewhere (P/D decode: from prefill): true, and `s.in` holds them.
  virtual bool leader_receives_inputs(ServeStep& /*s*/) { return false; }
  // Before the arrivals are drawn: what comes back from the previous step (decode's answers, the
  // drafts the last stage verified).
  virtual void leader_before_arrivals(ServeStep& /*s*/) {}
  // An idle leader jumps ahead to the next arrival: how far it may go.
  virtual std::uint64_t idle_until(std::uint64_t next_arrival, std::uint64_t /*clock*/) const { return next_arrival; }
  // The arrivals drawn and `s.in` filled: a plug-in may pass them on or change them.
  virtual void leader_after_arrivals(ServeStep& /*s*/, std::vector<RequestSpec>& /*specs*/) {}
  // Whether leader_after_arrivals reads the arrivals as the step message's words (`s.in.specs`):
  // a leader that sends them nowhere else does not encode them.
  virtual bool reads_encoded_arrivals() const { return false; }

  // --- receive, every rank ---------------------------------------------------------------------
  // PP0's stage, before the stage broadcast.
  virtual void first_stage_inputs(ServeStep& /*s*/) {}
  // The step's records, before its arrivals enter the queue.
  virtual void before_enqueue(ServeStep& /*s*/) {}
  virtual void aborted(RequestId /*id*/) {}
  // After the aborts: the decisions relayed from the previous step.
  virtual void after_aborts(ServeStep& /*s*/) {}

  // --- schedule (after the batch and its fresh pages) ------------------------------------------
  virtual void scheduled(ServeStep& /*s*/) {}

  // --- forward -----------------------------------------------------------------------------------
  // Words each batch entry adds to the stage all-reduce of the partial checksums.
  virtual std::size_t partials_per_entry() const { return 0; }
  virtual void forward_entry(ServeStep& /*s*/, std::size_t /*i*/, std::span<std::uint64_t> /*partials*/) {}
  // Modelled time the plug-in's work adds to the step.
  virtual std::uint64_t forward_ns(const ServeStep& /*s*/, const StepWork& /*work*/) const { return 0; }

  // --- verify (each entry, after its chain value) ------------------------------------------------
  virtual void verify_entry(ServeStep& /*s*/, std::size_t /*i*/, std::span<const std::uint64_t> /*partials*/) {}

  // --- send ----------------------------------------------------------------------------------------
  // Before the step message goes out.
  virtual void message(ServeStep& /*s*/) {}
  // After it went out: end-of-step agreements and transfers.
  virtual void end_of_step(ServeStep& /*s*/) {}

  // --- complete ------------------------------------------------------------------------------------
  virtual void finished(ServeRequest& /*r*/) {}
  // This plug-in tells the clients when their requests finished (P/D), not the loop.
  virtual bool owns_client_finish() const { return false; }
  // This rank's group records no request rows (P/D prefill: decode does).
  virtual bool records_requests() const { return true; }
  // The prompt tokens this rank did not hold came from a peer (P/D decode): its request rows say so.
  virtual bool prompt_from_peer() const { return false; }

  // --- report --------------------------------------------------------------------------------------
  // Whether the run is done (P/D: prefill's stop, relayed); nullopt: the loop's own rule.
  virtual std::optional<bool> done(const ServeStep& /*s*/) const { return std::nullopt; }
  // After the step, when the run goes on.
  virtual void after_step(ServeStep& /*s*/) {}

  // --- engine.decode = fused ------------------------------------------------------------------
  // Nothing for its hooks to do at a step with no arrival, admission or finish (then a fused span
  // may skip them: runtime/fused_decode.cpp). A plug-in that acts every step says false.
  virtual bool quiet() const { return false; }

  // --- finish --------------------------------------------------------------------------------------
  // Outcomes still being agreed when the run stopped (must be none).
  virtual std::size_t pending() const { return 0; }
  virtual void drain() {}
  // The run's totals, collective over the world where the plug-in exists on every rank.
  virtual void totals(ServeResult& /*res*/) {}
  virtual void summary(RankSummaryRow& /*m*/) const {}
};

}  // namespace kvgrid
