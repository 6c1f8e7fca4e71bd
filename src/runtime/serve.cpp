// run_serve: one rank's serving loop (runtime/serve_loop.hpp), its set-up and its hooks. The
// phases of a step are in src/runtime/phases/.
#include "runtime/serve.hpp"

#include <algorithm>
#include <iterator>

#include "core/check.hpp"
#include "core/log.hpp"
#include "core/schedule.hpp"
#include "protocols/pd_transfer.hpp"
#include "runtime/load_check.hpp"
#include "runtime/pd_decode.hpp"
#include "runtime/pd_prefill.hpp"
#include "runtime/rank_check.hpp"
#include "runtime/spec_decode.hpp"
#include "runtime/request_rows.hpp"
#include "runtime/serve_loop.hpp"

namespace kvgrid {

ServeResult run_serve(const ExperimentConfig& exp, const RankGrid& grid, FailpointRegistry& faults, DecisionLog& log,
                      TraceWriter* trace, bool print, std::unique_ptr<ServeWorkload> workload) {
  ServeLoop loop(exp, grid, faults, log, trace, print, std::move(workload));
  return loop.run();
}

SchedulerConfig ServeLoop::scheduler_config(const ExperimentConfig& exp, const RankStack& stack, PdLink& pd) {
  SchedulerConfig scfg;
  scfg.chunk_size = exp.engine.chunk_size;
  scfg.max_running = exp.engine.max_running;
  scfg.vocab = static_cast<std::uint64_t>(exp.workload.vocab);
  scfg.gather_pages = stack.shard->size > 1 ? exp.cache.gather_pages.value() : 0;
  scfg.shards = stack.shard->size;
  scfg.receive_prompt = pd.role() == PdRole::Decode;
  scfg.reuse = protocols::pd_decode_reuse(exp.protocol.pd);  // protocols/pd_transfer.hpp
  if (pd.role() == PdRole::Prefill) scfg.admit_gate = [&pd](RequestId id) { return pd.bootstrapped(id); };
  return scfg;
}

ServeLoop::ServeLoop(const ExperimentConfig& exp, const RankGrid& grid, FailpointRegistry& faults, DecisionLog& log,
                     TraceWriter* trace, bool print, std::unique_ptr<ServeWorkload> workload)
    : exp_(exp),
      grid_(grid),
      faults_(faults),
      log_(log),
      trace_(trace),
      print_(print),
      workload_(std::move(workload)),
      wall_start_(std::chrono::steady_clock::now()),
      first_stage_(grid.is_first_stage()),
      last_stage_(grid.is_last_stage()),
      leader_(grid.is_stage_leader()),
      checker_(grid.is_last_stage() && grid.is_stage_leader()),
      stack_(exp, grid, faults, log),
      pool_(*stack_.pool),
      dc_(*stack_.dc),
      clock_(stack_.clock),
      L_(stack_.geo.local_layers()),
      model_(stack_.geo, pool_, exp.cache.page_size),
      oracle_(stack_.geo, exp.cache.page_size),
      pd_(exp, grid, pool_, faults, stack_.kv_bytes_scale),
      sched_(scheduler_config(exp, stack_, pd_), dc_),
      corrupt_rng_(rank_stream(exp.engine.seed, grid.world_rank()).fork("device.page.corrupt.target")),
      abort_rng_(rank_stream(exp.engine.seed, grid.world_rank()).fork("request.abort.target")) {
  KVGRID_MPI_CHECK(MPI_Comm_size(grid.stage(), &stage_size_));
  if (stack_.geo.hybrid()) {
    model_.attach_hybrid(stack_.swa_pool.get(), stack_.states.get());
    std::vector<cache::unified::PayloadSidecar*> sidecars;
    for (std::size_t i = 0; i < stack_.sidecars.size(); ++i) sidecars.push_back(dc_.hybrid()->sidecar(i));
    pd_.attach_hybrid(stack_.swa_pool.get(), stack_.states.get(), sidecars, stack_.sidecars);
    if (!sidecars.empty()) model_.attach_sidecars(std::move(sidecars), stack_.sidecars);
  }
  if (pd_sends_draft(exp))  // (null off the last stage)
    pd_.attach_draft(stack_.draft_pool.get(), stack_.draft_swa_pool.get(), stack_.draft_states.get());
  if (exp.protocol.consensus_check == "on") online_ = std::make_unique<protocols::ConsensusChecker>(grid, log);
  // Only PP0's leader owns the workload (P/D: the prefill group's); a bad trace must still stop
  // every rank, not hang them.
  std::string workload_error;
  if (first_stage_ && leader_ && !workload_ && pd_.role() != PdRole::Decode) {
    try {
      workload_ = make_serve_workload(exp.workload, exp.engine.seed);
    } catch (const InputError& e) {
      workload_error = e.what();
    }
  }
  agree_or_throw(grid.world(), workload_error);
  if (workload_ && exp.engine.helper_thread) workload_->make_ahead();  // (a trace's prompts)
  total_known_ = workload_ ? workload_->total_requests() : 0;
  add_plugins();
  fused_ = exp.engine.decode == "fused";
  if (checker_ && exp.engine.helper_thread) oracle_lane_ = std::make_unique<OracleLane>(oracle_);
  rows_ = trace_ && exp.output.steps != "none";  // (load_experiment refused what it cannot keep: fused_decode_refusal)
}

void ServeLoop::add_plugins() {
  auto emit_fn = [this](std::int64_t step, std::uint64_t request, const char* op, std::int64_t a0, std::int64_t a1,
                        std::int64_t a2, std::int32_t status) { emit(step, request, op, a0, a1, a2, status); };
  if (exp_.model.draft.enabled())
    plugins_.push_back(std::make_unique<SpecDecodeStep>(SpecDecodeStep::Context{
        .exp = exp_, .grid = grid_, .sched = sched_, .clock = clock_, .res = res_,
        .draft_geo = stack_.has_draft ? &stack_.draft_geo : nullptr, .draft_pool = stack_.draft_pool.get(),
        .draft_swa_pool = stack_.draft_swa_pool.get(), .draft_states = stack_.draft_states.get(),
        .draft_gather = stack_.draft_gather.get(), .kv_bytes_scale = stack_.kv_bytes_scale, .emit = emit_fn}));
  if (stack_.private_loads)
    plugins_.push_back(std::make_unique<LoadCheckStep>(grid_, sched_, dc_, pool_, stack_.draft_pool.get(), emit_fn));
  if (pd_.role() == PdRole::Prefill)
    plugins_.push_back(std::make_unique<PdPrefillStep>(PdPrefillStep::Context{
        .grid = grid_, .pd = pd_, .sched = sched_, .clock = clock_, .workload = workload_.get(), .emit = emit_fn}));
  if (pd_.role() == PdRole::Decode)
    plugins_.push_back(std::make_unique<PdDecodeStep>(PdDecodeStep::Context{
        .exp = exp_, .grid = grid_, .pd = pd_, .sched = sched_, .dc = dc_, .clock = clock_, .res = res_,
        .hooks = {emit_fn, [this](const ServeRequest& r, std::int32_t reason) { record_failed(r, reason); },
                  [this] { return wall_ns(); }}}));
  for (const auto& p : plugins_) {
    client_finish_elsewhere_ |= p->owns_client_finish();
    records_requests_ &= p->records_requests();
    prompt_from_peer_ |= p->prompt_from_peer();
  }
}

std::span<std::uint64_t> ServeLoop::plugin_partials(std::size_t k, std::size_t i, std::size_t n) {
  std::size_t off = n * L_;
  for (std::size_t j = 0; j < k; ++j) off += n * plugins_[j]->partials_per_entry();
  const std::size_t w = plugins_[k]->partials_per_entry();
  return std::span<std::uint64_t>(partials_).subspan(off + i * w, w);
}

ServeResult ServeLoop::run() {
  // The phases in step order; their names (kStepPhases) label the trace's steps table.
  using Phase = void (ServeLoop::*)(Step&);
  static constexpr Phase kPhases[] = {&ServeLoop::faults,   &ServeLoop::receive, &ServeLoop::cache_events, &ServeLoop::schedule,
                                      &ServeLoop::gather,   &ServeLoop::forward, &ServeLoop::verify,       &ServeLoop::send,
                                      &ServeLoop::complete, &ServeLoop::report};
  static_assert(std::size(kPhases) == kStepPhaseCount);
  if (print_ && !exp_.output.quiet)
    log0("#  step  finished/total  waiting running   dev%  host%  stor%    pages  wrong  model_ms  wall_s  done%   eta_s");
  std::int64_t step = 0;
  for (; !done_; ++step) {
    if (fused_) step = fuse(step);  // the quiet decode steps from here on, if any; the next one runs whole
    Step s;
    s.index = step;
    log_.set_step(static_cast<std::uint64_t>(step));
    if (ChoiceSource* c = choice_source()) c->set_step(static_cast<std::uint64_t>(step));
    StepRow row;
    row.step = static_cast<std::uint64_t>(step);
    row.model_start_ns = clock_;
    // Wall time per phase only where the trace asks for it (output.steps = timed): a clock read
    // costs about as much as a whole phase of a quiet decode step.
    const bool wall_times = rows_ && exp_.output.steps == "timed";
    row.wall_start_ns = rows_ ? wall_ns() : 0;
    std::uint64_t model_mark = row.model_start_ns, wall_mark = row.wall_start_ns;
    for (std::size_t p = 0; p < kStepPhaseCount; ++p) {
      (this->*kPhases[p])(s);
      if (!rows_) continue;
      const std::uint64_t m = clock_;
      row.phase_model_ns[p] = m > model_mark ? m - model_mark : 0;
      model_mark = std::max(model_mark, m);
      if (!wall_times) continue;
      const std::uint64_t w = wall_ns();
      row.phase_wall_ns[p] = w - wall_mark;
      wall_mark = w;
    }
    if (rows_) trace_->step(step_row(row, s));
  }
  flush();  // the last step's row
  finish(step);
  return res_;
}

StepRow ServeLoop::step_row(StepRow row, const Step& s) const {
  row.batch_requests = static_cast<std::uint32_t>(s.batch.size());
  for (const auto& e : s.batch) (e.prefill ? row.prefill_tokens : row.decode_tokens) += static_cast<std::uint32_t>(e.end - e.start);
  row.waiting = static_cast<std::uint32_t>(sched_.waiting());
  row.running = static_cast<std::uint32_t>(sched_.running());
  row.device_pages_used = dc_.pool().used_pages().value();
  row.host_pages_used = dc_.host_pages_used();
  return row;
}

std::uint64_t ServeLoop::wall_ns() const {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - wall_start_).count());
}

void ServeLoop::emit(std::int64_t step, std::uint64_t request, const char* op, std::int64_t a0, std::int64_t a1,
                     std::int64_t a2, std::int32_t status) {
  if (trace_) trace_->event(static_cast<std::uint64_t>(step), wall_ns(), clock_, request, op, a0, a1, a2, status);
}

void ServeLoop::record_failed(const ServeRequest& r, std::int32_t reason) {
  // its row, tokens counted nowhere; P/D: decode records the requests
  if (checker_ && trace_ && records_requests_) trace_->request(failed_row(r, reason, clock_));
}

void ServeLoop::flush() {
  if (trace_) trace_->flush_all(log_, faults_);
}

}  // namespace kvgrid
