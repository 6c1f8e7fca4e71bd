// run_serve: one rank's serving loop (runtime/serve_loop.hpp), its set-up and its hooks. The
// phases of a step are in src/runtime/phases/.
#include "runtime/serve.hpp"

#include "core/check.hpp"
#include "core/log.hpp"
#include "runtime/rank_check.hpp"
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
  scfg.reuse = pd_decode_reuse(exp.protocol.pd);
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
      Ld_(stack_.has_draft ? stack_.draft_geo.local_layers() : 0),
      pd_(exp, grid, pool_, faults, stack_.kv_bytes_scale),
      role_(pd_.role()),
      sched_(scheduler_config(exp, stack_, pd_), dc_),
      corrupt_rng_(rank_stream(exp.engine.seed, grid.world_rank()).fork("device.page.corrupt.target")),
      abort_rng_(rank_stream(exp.engine.seed, grid.world_rank()).fork("request.abort.target")) {
  KVGRID_MPI_CHECK(MPI_Comm_size(grid.stage(), &stage_size_));
  if (stack_.has_draft) {
    draft_model_ = std::make_unique<SyntheticModel>(stack_.draft_geo, *stack_.draft_pool, exp.cache.page_size);
    draft_oracle_ = std::make_unique<Oracle>(stack_.draft_geo, exp.cache.page_size);
  }
  if (exp.protocol.consensus_check == "on") online_ = std::make_unique<protocols::ConsensusChecker>(grid, log);
  // Only PP0's leader owns the workload (P/D: the prefill group's); a bad trace must still stop
  // every rank, not hang them.
  std::string workload_error;
  if (first_stage_ && leader_ && !workload_ && role_ != PdRole::Decode) {
    try {
      workload_ = make_serve_workload(exp.workload, exp.engine.seed);
    } catch (const InputError& e) {
      workload_error = e.what();
    }
  }
  agree_or_throw(grid.world(), workload_error);
  total_known_ = workload_ ? workload_->total_requests() : 0;
  auto emit_fn = [this](std::int64_t step, std::uint64_t request, const char* op, std::int64_t a0, std::int64_t a1,
                        std::int64_t a2, std::int32_t status) { emit(step, request, op, a0, a1, a2, status); };
  if (stack_.private_loads)
    load_check_ = std::make_unique<LoadCheckStep>(grid, sched_, dc_, pool_, stack_.draft_pool.get(), emit_fn);
  if (role_ == PdRole::Decode)
    decode_step_ = std::make_unique<PdDecodeStep>(PdDecodeStep::Context{
        .exp = exp, .grid = grid, .pd = pd_, .sched = sched_, .dc = dc_, .clock = clock_, .res = res_, .to_peer = pd_to_peer_,
        .hooks = {emit_fn, [this](const ServeRequest& r, std::int32_t reason) { record_failed(r, reason); },
                  [this] { return wall_ns(); }}});
}

ServeResult ServeLoop::run() {
  if (print_ && !exp_.output.quiet)
    log0("#  step  finished/total  waiting running   dev%  host%  stor%    pages  model_ms  wall_s  done%   eta_s");
  std::int64_t step = 0;
  for (; !done_; ++step) {
    Step s;
    s.index = step;
    log_.set_step(static_cast<std::uint64_t>(step));
    faults(s);
    receive(s);
    cache_events(s);
    schedule(s);
    gather(s);
    forward(s);
    verify(s);
    send(s);
    complete(s);
    report(s);
  }
  finish(step);
  return res_;
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
  if (checker_ && trace_ && role_ != PdRole::Prefill) trace_->request(failed_row(r, reason, clock_));
}

void ServeLoop::flush() {
  if (trace_) trace_->flush_all(log_, faults_);
}

}  // namespace kvgrid
