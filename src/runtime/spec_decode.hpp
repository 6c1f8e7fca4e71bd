// Speculative decoding in the serving loop ([model.draft]): its plug-in (SpecDecodeStep) and its
// per-round arithmetic — how many tokens a request's draft proposes after this step's token, how
// many of them the target accepts, and what the draft's work adds to the step's modelled time. The
// draft's KV and its movement through the tiers are in cache/draft_state.hpp.
//
// Every stage schedules the accepted draft tokens; the last stage runs the draft over its own
// pages, checks it against the draft's oracle and draws the acceptance. The accepted counts of a
// step apply at the next one: at PP = 1 every rank verified them itself; at PP > 1 the last stage's
// leader sends them back to PP0's leader (the "backward" message), and they travel forward with
// the next step's inputs, every later stage comparing them with what it verified.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "protocols/layer_gather.hpp"
#include "runtime/cost.hpp"
#include "runtime/experiment.hpp"
#include "runtime/scheduler.hpp"
#include "runtime/model.hpp"
#include "runtime/serve.hpp"
#include "runtime/step_plugin.hpp"

namespace kvgrid {

// Tokens proposed in the round this entry starts: up to `steps`, fewer near the request's end
// (the round's verify step adds one more token); 0 when the entry yields no token or no draft runs.
std::int64_t draft_round_size(const DraftConfig& d, const BatchEntry& e);

// Accepted tokens of a round of `k` proposals after the request's `generated`-th token: the
// leading successes of seeded Bernoulli draws (a pure function of seed, request and position, the
// same on every rank and replay) — none when the draft read the wrong KV (`intact` false).
std::uint32_t draft_accepted(std::uint64_t seed, RequestId id, std::uint32_t generated, std::int64_t k, double accept_prob,
                             bool intact);

// The draft's modelled time in a step: its `draft_layers` over the step's tokens (the first
// proposal), then steps - 1 more draft decode passes when a round starts.
std::uint64_t draft_step_ns(const CostConfig& c, const DraftConfig& d, const StepWork& work, std::span<const BatchEntry> batch,
                            std::size_t draft_layers, int tp, int cp);

// After the loop, collective over the world: the last stage's round counts and digest (the
// largest, as the other stages count none) into every rank's result.
void share_spec_counts(const RankGrid& grid, ServeResult& res);

// The plug-in, on every rank of a run with a draft model.
class SpecDecodeStep : public StepPlugin {
 public:
  using Emit = EmitFn;
  struct Context {
    const ExperimentConfig& exp;
    const RankGrid& grid;
    Scheduler& sched;
    std::uint64_t& clock;
    ServeResult& res;
    // The draft's geometry and pool on this rank (the last stage), else null.
    const ModelGeometry* draft_geo;
    cache::KvPool* draft_pool;
    // A hybrid draft's SWA pool and states (null: none of that kind), indexed like the target's.
    cache::KvPool* draft_swa_pool = nullptr;
    cache::StatePool* draft_states = nullptr;
    // CP-sharded pools: the draft's layer gather (null: not sharded, or not the last stage), and
    // what a digest byte stands for in modelled time.
    protocols::LayerGather* draft_gather = nullptr;
    double kv_bytes_scale = 1.0;
    Emit emit;
  };
  explicit SpecDecodeStep(Context ctx);

  void leader_before_arrivals(ServeStep& s) override;
  // PP > 1, PP0's leader: the last stage's counts of the previous step's rounds, once per step —
  // before the arrivals are drawn, or (P/D decode, whose inputs come whole from prefill) with the
  // first stage's inputs.
  void receive_back(ServeStep& s);
  void first_stage_inputs(ServeStep& s) override;
  void after_aborts(ServeStep& s) override;
  void scheduled(ServeStep& s) override;
  std::size_t partials_per_entry() const override { return Ld_; }
  void forward_entry(ServeStep& s, std::size_t i, std::span<std::uint64_t> partials) override;
  // CP-sharded pools, before the draft's first entry: the draft's own layer gather of the cached
  // prefixes of the batch's requests computed here for the first time (the target's gather phase
  // already waited for their restores, whose joined events cover the draft's copies).
  void gather_draft(ServeStep& s);
  std::uint64_t forward_ns(const ServeStep& s, const StepWork& work) const override;
  void verify_entry(ServeStep& s, std::size_t i, std::span<const std::uint64_t> partials) override;
  void message(ServeStep& s) override;
  void end_of_step(ServeStep& s) override;
  void finished(ServeRequest& r) override;
  void after_step(ServeStep& s) override;
  void drain() override { back_sender_.drain(true); }
  void totals(ServeResult& res) override { share_spec_counts(grid_, res); }

 private:
  const ExperimentConfig& exp_;
  const RankGrid& grid_;
  Scheduler& sched_;
  std::uint64_t& clock_;
  ServeResult& res_;
  cache::KvPool* draft_pool_;
  protocols::LayerGather* draft_gather_;
  double kv_bytes_scale_;
  std::uint64_t gather_ns_ = 0;  // this step's draft gather, modelled
  Emit emit_;
  const std::size_t Ld_;  // the draft's layers here (last stage; 0 elsewhere)
  std::unique_ptr<SyntheticModel> model_;
  std::unique_ptr<Oracle> oracle_;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> accepts_next_;  // verified at a step, applied at the next
  bool expect_back_ = false;  // PP0 (PP > 1): the previous step had draft rounds, their counts come back
  bool back_received_ = false;  // ... and this step's leader has them
  Sender back_sender_;        // the last stage's leader → PP0's leader
};

}  // namespace kvgrid
