#include "runtime/serve.hpp"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <deque>
#include <memory>
#include <thread>

#include "cache/device_cache.hpp"
#include "cache/kv_pool.hpp"
#include "core/check.hpp"
#include "core/hash.hpp"
#include "core/log.hpp"
#include "core/wait.hpp"
#include "runtime/cost.hpp"
#include "runtime/load_check.hpp"
#include "runtime/model.hpp"
#include "runtime/pd.hpp"
#include "runtime/pd_decode.hpp"
#include "runtime/rank_check.hpp"
#include "runtime/rank_stack.hpp"
#include "runtime/request_rows.hpp"
#include "runtime/scheduler.hpp"
#include "runtime/serve_workload.hpp"
#include "runtime/spec_decode.hpp"
#include "runtime/step_message.hpp"
#include "protocols/consensus_check.hpp"
#include "protocols/cp_sharding.hpp"
#include "protocols/layer_gather.hpp"
#include "protocols/pp_sync.hpp"
#include "transfer/transfer_engine.hpp"

namespace kvgrid {

namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

ServeResult run_serve(const ExperimentConfig& exp, const RankGrid& grid, FailpointRegistry& faults, DecisionLog& log,
                      TraceWriter* trace, bool print, std::unique_ptr<ServeWorkload> workload) {
  const auto wall_start = Clock::now();
  auto wall_ns = [&] {
    return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - wall_start).count());
  };
  const auto& c = grid.coord();
  const auto& shape = grid.shape();
  const bool first_stage = grid.is_first_stage(), last_stage = grid.is_last_stage();
  const bool leader = grid.is_stage_leader();
  const bool checker = last_stage && leader;  // runs the oracle and records requests
  int stage_size = 1;
  KVGRID_MPI_CHECK(MPI_Comm_size(grid.stage(), &stage_size));

  // ---- this rank's stack ----
  RankStack stack(exp, grid, faults, log);
  const ModelGeometry& geo = stack.geo;
  const Pages capacity = stack.capacity;
  cache::KvPool& pool = *stack.pool;
  cache::DeviceCache& dc = *stack.dc;
  std::uint64_t& clock = stack.clock;  // modelled ns
  protocols::LayerGather* gather = stack.gather.get();
  const double kv_bytes_scale = stack.kv_bytes_scale;
  const bool relay_admissions = stack.relay_admissions;
  const protocols::ShardGroup& shard = *stack.shard;
  SyntheticModel model(geo, pool, exp.cache.page_size);
  Oracle oracle(geo, exp.cache.page_size);
  // Speculative decoding ([model.draft]): every stage schedules the accepted draft tokens; the
  // last stage runs the draft, checks its checksum against its oracle and draws the acceptance.
  const auto& dcfg = exp.model.draft;
  const bool spec = dcfg.enabled();
  std::unique_ptr<SyntheticModel> draft_model;
  std::unique_ptr<Oracle> draft_oracle;
  if (stack.has_draft) {
    draft_model = std::make_unique<SyntheticModel>(stack.draft_geo, *stack.draft_pool, exp.cache.page_size);
    draft_oracle = std::make_unique<Oracle>(stack.draft_geo, exp.cache.page_size);
  }
  const std::size_t Ld = stack.has_draft ? stack.draft_geo.local_layers() : 0;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> accepts_next;  // verified at this step, applied at the next
  bool expect_back = false;  // PP0 (PP > 1): the previous step had draft rounds, their results come back
  Sender back_sender;        // the last stage's leader → PP0's leader
  auto pp_sync = protocols::make_pp_sync(exp.protocol.pp_sync);
  std::unique_ptr<protocols::ConsensusChecker> online;
  if (exp.protocol.consensus_check == "on") online = std::make_unique<protocols::ConsensusChecker>(grid, log);
  // P/D (runtime/pd.hpp): this rank's group prefills or decodes; the leaders exchange control messages.
  PdLink pd(exp, grid, pool, faults, kv_bytes_scale);
  const PdRole role = pd.role();
  SchedulerConfig scfg;
  scfg.chunk_size = exp.engine.chunk_size;
  scfg.max_running = exp.engine.max_running;
  scfg.vocab = static_cast<std::uint64_t>(exp.workload.vocab);
  scfg.gather_pages = shard.size > 1 ? exp.cache.gather_pages.value() : 0;
  scfg.shards = shard.size;
  scfg.receive_prompt = role == PdRole::Decode;
  scfg.reuse = exp.protocol.pd == "decode_reuse";
  if (role == PdRole::Prefill) scfg.admit_gate = [&pd](RequestId id) { return pd.bootstrapped(id); };
  Scheduler sched(scfg, dc);
  std::vector<PdRecord> pd_to_peer;  // leaders: records for the other group's next message
  bool decode_idle = false;                              // prefill leader: decode's last answer
  std::uint64_t decode_clock = 0;                        // prefill leader: decode's clock then
  // Only PP0's leader owns the workload (P/D: the prefill group's); a bad trace must still stop
  // every rank, not hang them.
  std::string workload_error;
  if (first_stage && leader && !workload && role != PdRole::Decode) {
    try {
      workload = make_serve_workload(exp.workload, exp.engine.seed);
    } catch (const InputError& e) {
      workload_error = e.what();
    }
  }
  agree_or_throw(grid.world(), workload_error);
  Rng corrupt_rng = rank_stream(exp.engine.seed, grid.world_rank()).fork("device.page.corrupt.target");
  Rng abort_rng = rank_stream(exp.engine.seed, grid.world_rank()).fork("request.abort.target");
  Sender sender;

  ServeResult res;
  std::int64_t local_failures = 0, local_mismatches = 0;
  std::uint64_t total_known = workload ? workload->total_requests() : 0;
  const std::size_t L = geo.local_layers();
  std::vector<std::uint64_t> partials;
  std::uint64_t gather_ns = 0;  // modelled time of this rank's layer gathers

  auto emit = [&](std::int64_t step, std::uint64_t request, const char* op, std::int64_t a0, std::int64_t a1, std::int64_t a2,
                  std::int32_t status) {
    if (trace) trace->event(static_cast<std::uint64_t>(step), wall_ns(), clock, request, op, a0, a1, a2, status);
  };
  // A request that failed (1: aborted, 2: its P/D transfer broke, 3: its P/D restore broke): its
  // row, tokens counted nowhere.
  auto record_failed = [&](const ServeRequest& r, std::int32_t reason) {
    if (checker && trace && role != PdRole::Prefill) trace->request(failed_row(r, reason, clock));  // P/D: decode records
  };
  auto flush = [&] {
    if (trace) trace->flush_all(log, faults);
  };
  std::unique_ptr<LoadCheckStep> load_check;  // load-backs that can fail (protocol.load_back)
  if (stack.private_loads) load_check = std::make_unique<LoadCheckStep>(grid, sched, dc, pool, stack.draft_pool.get(), emit);
  std::unique_ptr<PdDecodeStep> decode_step;  // P/D decode (runtime/pd_decode.hpp)
  if (role == PdRole::Decode)
    decode_step = std::make_unique<PdDecodeStep>(PdDecodeStep::Context{
        .exp = exp, .grid = grid, .pd = pd, .sched = sched, .dc = dc, .clock = clock, .res = res, .to_peer = pd_to_peer,
        .hooks = {emit, record_failed, wall_ns}});
  auto check = [&](std::int64_t step) {
    CheckOutcome co = periodic_check(grid, dc, log, local_failures, step, res, print);
    emit(step, 0, "check", static_cast<std::int64_t>(co.tree_differs.size()), static_cast<std::int64_t>(co.decisions_differ.size()),
         co.verify_failures, co.agree() ? 0 : 1);
  };

  if (print) log0("#  step  finished/total  waiting running   hit%    pages  model_ms  wall_s");
  bool done = false;
  std::int64_t step = 0;
  for (; !done; ++step) {
    log.set_step(static_cast<std::uint64_t>(step));
    if (grid.world_rank() == exp.debug.kill_rank && step == exp.debug.kill_at_step) std::raise(SIGKILL);
    if (grid.world_rank() == exp.debug.plant_divergence_rank && step == exp.debug.plant_divergence_step) {
      KVGRID_CONSENSUS(log, "planted", {step}, {});  // testing: a decision no peer takes
      emit(step, 0, "planted", step, 0, 0, 1);
    }
    if (auto hit = faults.evaluate("rank.stall", static_cast<std::uint64_t>(step))) {
      emit(step, 0, "stall", static_cast<std::int64_t>(hit->param("duration_ms")), 0, 0, 0);
      flush();
      std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(hit->param("duration_ms")));
    }
    if (auto hit = faults.evaluate("device.page.corrupt", static_cast<std::uint64_t>(step))) {
      auto cached = dc.cached_pages();
      std::erase_if(cached, [&pool](PageId q) { return !pool.owns(q); });  // sharded: only this rank's pages
      if (!cached.empty()) {
        const PageId victim = cached[corrupt_rng.below(cached.size())];
        for (int b = 0; b < static_cast<int>(hit->param("bits")); ++b) pool.corrupt(victim, corrupt_rng);
        emit(step, 0, "corrupt", victim.value(), 0, 0, 0);
      }
    }

    // 1. inputs: PP0's leader draws the arrivals and broadcasts them over its stage; later stages
    //    receive them from their PP peer together with the previous stage's activation.
    StepMessage in;
    const std::string what = "step " + std::to_string(step) + " inputs";
    if (first_stage && leader && role == PdRole::Decode) {
      in = pd.recv_control(step);  // the arrivals, the suffixes sent, the prefill's clock and stop
    } else if (first_stage) {
      if (leader) {
        if (role == PdRole::Prefill && step > 0) {
          // Decode's answers to the previous step: bootstraps (relayed to the group, each with
          // its pd.transfer.fail draw), finished requests (the clients go on), idle.
          const auto d = pd.receive_answers(step, clock, in.pd,
                                            [&](RequestId id, std::uint64_t at) { workload->finished(id, at); });
          decode_clock = d.clock_ns;
          decode_idle = d.idle;
        }
        if (expect_back && shape.pp > 1) {
          // The last stage verified the previous step's drafts: their accepted counts decide this
          // step's decode lengths (a real pipeline waits for its sampled tokens the same way).
          StepMessage back = recv_step(shape.pp - 1, grid.pp(), what + ": drafts verified by the last stage", kTagBackward);
          in.accepts = std::move(back.accepts);
          clock = std::max(clock, back.clock_ns + static_cast<std::uint64_t>(exp.cost.pp_link_ns));
        }
        if (sched.idle()) {
          // Idle: jump ahead to the next arrival — in P/D not past decode's clock while decode is
          // busy (its requests finish, and closed-loop clients come back, before that arrival).
          if (auto next = workload->next_arrival_ns(); next && *next > clock)
            clock = role == PdRole::Prefill && !decode_idle ? std::max(clock, std::min(*next, decode_clock)) : *next;
        }
        if (faults.evaluate("request.abort", static_cast<std::uint64_t>(step))) {
          auto ids = sched.ids();
          if (!ids.empty()) in.aborts.push_back(ids[abort_rng.below(ids.size())].value());
        }
        auto specs = workload->arrivals(clock);
        in.clock_ns = clock;
        in.exhausted = workload->exhausted() ? 1 : 0;
        in.total = workload->total_requests();
        if (!specs.empty()) in.specs = encode_specs(specs);
        if (role == PdRole::Prefill) {
          // Decode gets the requests as they are; prefill computes their prompts and first tokens.
          in.pd_stop = in.exhausted && specs.empty() && sched.idle() && decode_idle && pd_to_peer.empty() ? 1 : 0;
          pd.send_requests(in, pd_to_peer);
          for (auto& sp : specs) sp.output_len = 1;
          if (!specs.empty()) in.specs = encode_specs(specs);
        }
      }
    }
    if (first_stage) {
      if (shape.pp == 1) in.accepts = accepts_next;  // every rank of the one stage verified them
      if (stage_size > 1) in = bcast_step(in, leader, grid.stage(), what + " over stage 0");
      clock = std::max(clock, in.clock_ns);
    } else {
      in = recv_step(grid.pp_prev(), grid.pp(), what + " from stage " + std::to_string(c.pp - 1));
      clock = std::max(clock, in.clock_ns + static_cast<std::uint64_t>(exp.cost.pp_link_ns));
    }
    if (!first_stage) emit(step, 0, "pp_recv", c.pp - 1, static_cast<std::int64_t>(in.clock_ns), in.write_acks, 0);
    const bool exhausted = in.exhausted != 0;
    total_known = in.total;
    if (role == PdRole::Prefill) pd.on_prefill_records(in.pd);
    // Decode: the suffixes the prefill ranks sent at the previous step (receives, restores and
    // their agreed outcome), broken transfers, aborts.
    if (decode_step) decode_step->records(step, in.pd);
    if (!in.specs.empty()) {
      for (auto& sp : decode_specs(in.specs)) {
        ++res.requests;
        sched.enqueue(std::move(sp), wall_ns());
      }
    }
    // Aborted requests (chosen by PP0's leader from requests every rank holds): every rank of
    // every stage releases them at this same step.
    for (const auto a : in.aborts) {
      const bool prefetching = dc.storage_tier() && dc.storage_tier()->prefetching(RequestId(a));
      const ServeRequest* running = sched.find_running(RequestId(a));
      const bool loading = running && running->awaiting_restore;  // its load-back still being agreed
      auto r = sched.abort(RequestId(a));
      KVGRID_CHECK(r != nullptr, "aborted request ", a, " is not here");
      if (role == PdRole::Prefill) pd.forget(RequestId(a));
      ++res.failed;
      if (workload) workload->finished(r->spec.id, clock);  // the client goes on (closed loop)
      ++(prefetching ? res.aborted_prefetching : loading ? res.aborted_loading : res.aborted_other);
      // a2: 1 mid-prefetch, 2 mid-load-back
      emit(step, a, "abort", static_cast<std::int64_t>(r->computed), r->res.host_loaded.value(), prefetching ? 1 : loading ? 2 : 0, 1);
      record_failed(*r, 1);  // aborted
    }

    // Accepted draft tokens of the previous step's rounds (every stage, same order).
    if (stack.has_draft && shape.pp > 1)
      KVGRID_CHECK(in.accepts == accepts_next, "step ", step, ": the accepted drafts relayed from PP0 differ from this stage's");
    for (const auto& [id, n] : in.accepts) sched.accept_draft(RequestId(id), static_cast<std::uint32_t>(n));
    // The previous step's load-backs, agreed (intact: computed on; broken: recomputed).
    if (load_check) load_check->decide(step);

    // 2. this rank's own decisions; first the agreed write ACKs (every rank, every round): PP0's
    //    stage agrees, later stages follow the count relayed with the inputs (protocol.pp_sync).
    if (auto* st = dc.storage_tier(); st && !first_stage) st->set_decisions(in.stops);
    if (relay_admissions && !first_stage) dc.follow_admissions(in.admits);
    std::uint32_t write_acks = 0;
    if (auto* host = dc.host_tier()) {
      write_acks = static_cast<std::uint32_t>(
          pp_sync->write_acks(*host, first_stage ? std::nullopt : std::optional<std::uint64_t>(in.write_acks)));
      host->consume_writes(write_acks);
    }
    auto batch = sched.schedule(clock);
    pool.reset(sched.fresh_pages());
    if (stack.draft_pool) stack.draft_pool->reset(sched.fresh_pages());
    if (load_check) load_check->admitted(step);  // their outcome is agreed before anyone reads them
    // Decode: this step's admissions answered (decode_prefix_len agreed, receives posted);
    // relayed to later stages, which compare.
    const std::vector<PdRecord> decode_answers = decode_step ? decode_step->admissions(step, in.pd) : std::vector<PdRecord>{};

    // 3. the previous stage's activation must describe the same batch.
    if (!first_stage) {
      const std::size_t n = std::max(in.entries.size(), batch.size());
      for (std::size_t i = 0; i < n; ++i) {
        const bool have_in = i < in.entries.size(), have_mine = i < batch.size();
        const auto id = have_in ? in.entries[i].id : batch[i].req->spec.id.value();
        const auto theirs = have_in ? in.entries[i].end - in.entries[i].start : 0;
        const auto mine = have_mine ? batch[i].end - batch[i].start : 0;
        if (!have_in || !have_mine || in.entries[i].id != batch[i].req->spec.id.value() ||
            in.entries[i].start != batch[i].start || in.entries[i].end != batch[i].end) {
          const std::string m = "shape mismatch at step " + std::to_string(step) + " on stage " + std::to_string(c.pp) +
                                ": request " + std::to_string(id) + ": stage " + std::to_string(c.pp - 1) + " sent " +
                                std::to_string(theirs) + " tokens, this stage scheduled " + std::to_string(mine) +
                                (have_mine && have_in && in.entries[i].id != batch[i].req->spec.id.value()
                                     ? " (for request " + std::to_string(batch[i].req->spec.id.value()) + ")"
                                     : "");
          emit(step, id, "shape_mismatch", static_cast<std::int64_t>(theirs), static_cast<std::int64_t>(mine), 0, 1);
          throw RunFailure(m);
        }
      }
    }

    // Nothing to compute but backups in flight (pages locked by them may be what admission waits
    // for): this rank's clock moves on to the oldest one's completion, as a real rank would wait.
    if (batch.empty()) {
      if (const auto* host = dc.host_tier(); host && host->pending_writes() > 0) clock = std::max(clock, host->oldest_write_ns());
      if (const auto* st = dc.storage_tier(); st && st->next_ack_ns() > 0) clock = std::max(clock, st->next_ack_ns());
    }

    // 4. forward this rank's layers, heads and query tokens; one stage all-reduce per step.
    //    Pages loaded back from the host are read layer by layer, each after its own copy
    //    completed. Modelled time pipelines the layers: layer l starts when layer l-1's compute
    //    and layer l's copies (of every request in the batch) are done.
    std::vector<std::uint64_t> layer_ready(L, 0);
    for (auto& e : batch)
      for (std::size_t i = 0; i < e.req->res.load_events.size(); ++i)
        layer_ready[i % L] = std::max(layer_ready[i % L], e.req->res.load_events[i].complete_ns());
    const std::uint64_t step_start = clock;
    // TP/CP peers must have scheduled the same batch: check it (one small all-reduce) before the
    // all-reduce of the partials, whose element count depends on it.
    if (stage_size > 1) {
      std::uint64_t shape_digest = hash_combine(0x73746167ULL, batch.size());
      for (const auto& e : batch) shape_digest = hash_combine(hash_combine(hash_combine(shape_digest, e.req->spec.id.value()), e.start), e.end);
      std::uint64_t mine[2] = {shape_digest, ~shape_digest}, maxed[2] = {0, 0};
      MPI_Request req;
      KVGRID_MPI_CHECK(MPI_Iallreduce(mine, maxed, 2, MPI_UINT64_T, MPI_MAX, grid.stage(), &req));
      wait_mpi(&req, "Iallreduce of the batch shape at step " + std::to_string(step));
      if (maxed[0] != shape_digest || maxed[1] != ~shape_digest) {
        emit(step, 0, "stage_mismatch", static_cast<std::int64_t>(batch.size()), 0, 0, 1);
        flush();
        throw RunFailure("stage peers scheduled different batches at step " + std::to_string(step) + " on stage " +
                         std::to_string(c.pp) + " (this rank: " + std::to_string(batch.size()) +
                         " requests): their cache decisions diverged");
      }
    }
    partials.assign(batch.size() * (L + Ld), 0);  // target layers, then (last stage) the draft's
    // CP sharding: the cached prefixes of requests computed here for the first time are read
    // through the layer gather (restore(l) → gather(l) → attention(l)). Modelled: layer l's gather
    // starts when its restores and the previous layer's gather are done, and attention on layer l
    // waits for it; the next layer's gather overlaps this layer's attention.
    if (gather) {
      std::vector<protocols::GatherItem> items;
      std::vector<ServeRequest*> primed;
      for (auto& e : batch)
        if (!e.req->model.primed && e.start > 0) {
          model.prime_for_gather(e.req->model);
          // (P/D decode: the whole received prompt, its last page partial)
          const std::size_t ps = static_cast<std::size_t>(exp.cache.page_size.value()), n = (e.start + ps - 1) / ps;
          items.push_back({std::span<const PageId>(e.req->res.pages).first(n), e.req->model.run, e.start % ps});
          primed.push_back(e.req);
        }
      if (!items.empty()) {
        auto wait_layer = [&primed, L](std::size_t l) {
          for (auto* r : primed)
            for (std::size_t k = l; k < r->res.load_events.size(); k += L) r->res.load_events[k].synchronize();
        };
        const std::uint64_t bytes = gather->run(items, wait_layer);
        const auto g_ns = static_cast<std::uint64_t>(exp.cost.gather_latency_us * 1e3 +
                                                     static_cast<double>(bytes) * kv_bytes_scale / exp.cost.gather_gb_s);
        std::uint64_t prev = clock;
        const std::uint64_t first = std::max(clock, layer_ready[0]);
        for (std::size_t l = 0; l < L; ++l) {
          prev = std::max(prev, layer_ready[l]) + g_ns;
          layer_ready[l] = prev;
        }
        gather_ns += g_ns * L;
        // Like a copy: modelled start of layer 0's gather, end of the last layer's, bytes per layer.
        emit(step, static_cast<std::uint64_t>(items.size()), "gather", static_cast<std::int64_t>(first),
             static_cast<std::int64_t>(prev), static_cast<std::int64_t>(bytes), 0);
      }
    }
    StepWork work;
    for (std::size_t i = 0; i < batch.size(); ++i) {
      auto& e = batch[i];
      auto& events = e.req->res.load_events;  // load_back: one event per (node, local layer)
      auto wait_layer = [&events, L](std::size_t l) {
        for (std::size_t k = l; k < events.size(); k += L) events[k].synchronize();
      };
      model.forward(e.req->model, e.req->tokens, e.start, e.end, e.req->res.pages,
                    std::span<std::uint64_t>(partials).subspan(i * L, L),
                    events.empty() ? std::function<void(std::size_t)>{} : std::function<void(std::size_t)>(wait_layer));
      for (auto& ev : events) ev.synchronize();  // (all were, unless the request had no cached prefix to read)
      events.clear();
      if (draft_model)  // the draft reads its own pages (restored with the target's, or not)
        draft_model->forward(e.req->draft, e.req->tokens, e.start, e.end, e.req->res.pages,
                             std::span<std::uint64_t>(partials).subspan(batch.size() * L + i * Ld, Ld));
      work.add(e.start, e.end, e.prefill);
    }
    if (stage_size > 1 && !batch.empty()) {
      MPI_Request req;
      KVGRID_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, partials.data(), static_cast<int>(partials.size()), MPI_UINT64_T,
                                      MPI_SUM, grid.stage(), &req));
      wait_mpi(&req, "Iallreduce of attention checksums at step " + std::to_string(step));
    }
    const std::uint64_t compute = compute_ns(exp.cost, work, L, shape.tp, shape.cp);
    // The draft runs after the target's last layer.
    const std::uint64_t draft_ns = draft_model ? draft_step_ns(exp.cost, dcfg, work, batch, Ld, shape.tp, shape.cp) : 0;
    const std::uint64_t step_ns =
        compute + draft_ns + (stage_size > 1 && !batch.empty() ? static_cast<std::uint64_t>(exp.cost.allreduce_ns) : 0);
    clock = step_start;  // the copies' completion times enter through the layer pipeline instead
    for (std::size_t l = 0; l < L; ++l)
      clock = std::max(clock, layer_ready[l]) + (compute * (l + 1) / L - compute * l / L);
    clock += step_ns - compute;

    // 5. chain and pass on, or check against the oracle on the last stage.
    StepMessage out;
    out.clock_ns = clock;
    out.exhausted = in.exhausted;
    out.total = in.total;
    out.specs = std::move(in.specs);
    out.aborts = in.aborts;
    out.write_acks = write_acks;
    if (auto* st = dc.storage_tier()) out.stops = st->take_decisions();
    if (relay_admissions) out.admits = first_stage ? dc.take_admissions() : in.admits;
    out.accepts = in.accepts;
    out.pd = in.pd;
    if (role == PdRole::Decode && first_stage) out.pd.insert(out.pd.end(), decode_answers.begin(), decode_answers.end());
    out.pd_stop = in.pd_stop;
    // Speculative decoding: each request that yields a token at this step starts a draft round of
    // up to `steps` tokens (fewer near its end). Every stage knows which do; the last stage verifies
    // them — accepted only if the draft's checksum over the pages it read matches its oracle and
    // the seeded Bernoulli draws succeed — and the counts apply at the next step.
    std::vector<std::pair<std::uint64_t, std::uint64_t>> accepts_out;
    std::size_t rounds_started = 0;
    for (std::size_t i = 0; i < batch.size(); ++i) {
      auto& e = batch[i];
      const std::uint64_t a_in = first_stage ? chain_seed(e.req->spec.id, e.start, e.end) : in.entries[i].value;
      const std::uint64_t a_out = chain(a_in, std::span<const std::uint64_t>(partials).subspan(i * L, L));
      out.entries.push_back({e.req->spec.id.value(), e.start, e.end, a_out});
      if (e.prefill) e.req->forward_ns += clock - step_start;  // the step, its restore and gather waits included
      const std::int64_t k = draft_round_size(dcfg, e);
      if (k > 0) ++rounds_started;
      if (draft_model) {
        const std::uint64_t got = chain(chain_seed(e.req->spec.id, e.start, e.end, /*draft=*/true),
                                        std::span<const std::uint64_t>(partials).subspan(batch.size() * L + i * Ld, Ld));
        const bool intact = got == draft_oracle->expected(e.req->draft_oracle, e.req->spec.id, e.req->tokens, e.start, e.end);
        if (!intact) {
          ++e.req->draft_mismatches;
          emit(step, e.req->spec.id.value(), "draft_mismatch", static_cast<std::int64_t>(e.start), static_cast<std::int64_t>(e.end),
               0, 0);
        }
        if (k > 0) {
          const std::uint32_t a =
              draft_accepted(exp.engine.seed, e.req->spec.id, e.req->generated + 1, k, dcfg.accept_prob, intact);
          ++e.req->spec_rounds;
          e.req->spec_proposed += static_cast<std::uint32_t>(k);
          e.req->spec_accepted += a;
          accepts_out.push_back({e.req->spec.id.value(), a});
          emit(step, e.req->spec.id.value(), "draft_round", k, a, intact ? 1 : 0, 0);
        }
      }
      if (checker) {
        const std::uint64_t want = oracle.expected(e.req->oracle, e.req->spec.id, e.req->tokens, e.start, e.end);
        if (want != a_out) {
          ++local_mismatches;
          e.req->oracle_ok = false;
          emit(step, e.req->spec.id.value(), "oracle_mismatch", static_cast<std::int64_t>(e.start), static_cast<std::int64_t>(e.end), 0, 1);
          log_all("oracle mismatch at step " + std::to_string(step) + ": request " + std::to_string(e.req->spec.id.value()) +
                  " positions [" + std::to_string(e.start) + ", " + std::to_string(e.end) + ")");
          if (exp.engine.strict) {
            flush();
            throw RunFailure("oracle mismatch with --strict: request " + std::to_string(e.req->spec.id.value()) +
                             " at step " + std::to_string(step));
          }
        }
      }
    }
    if (!last_stage) {
      if (auto hit = faults.evaluate("p2p.delay", static_cast<std::uint64_t>(step))) {
        out.clock_ns += static_cast<std::uint64_t>(hit->param("delay_us") * 1e3);  // the next stage sees it later
        emit(step, 0, "p2p_delay", static_cast<std::int64_t>(hit->param("delay_us")), 0, 0, 0);
      }
      sender.send(out, grid.pp_next(), grid.pp());
      emit(step, 0, "pp_send", c.pp, static_cast<std::int64_t>(out.clock_ns), out.write_acks, 0);
    }
    // Across stages, after the message went out: publish the consumed backups, then the prefetch
    // decisions, then the restores' outcomes (the same order on every rank).
    if (auto* host = dc.host_tier()) host->end_of_step();
    if (auto* st = dc.storage_tier()) st->end_of_step();
    if (decode_step) decode_step->end_of_step();
    if (load_check) load_check->end_of_step();
    accepts_next = std::move(accepts_out);
    expect_back = rounds_started > 0;
    KVGRID_CHECK(!stack.has_draft || accepts_next.size() == rounds_started, "draft rounds: ", accepts_next.size(), " verified of ",
                 rounds_started);

    // P/D prefill: the suffixes of the prompts whose prefill ended now go to the decode peers
    // before their pages can be released.
    if (role == PdRole::Prefill) {
      auto sent = pd.send_suffixes(batch, clock, step, leader && first_stage);
      for (const auto& t : sent)
        emit(step, t[1], t[0] == kPdSent ? "pd_send" : "pd_broken", static_cast<std::int64_t>(t[2]), 0, 0, t[0] == kPdSent ? 0 : 1);
      if (leader && first_stage) pd_to_peer.insert(pd_to_peer.end(), sent.begin(), sent.end());
    }

    // 6. advance requests; finished ones commit their KV.
    for (auto& r : sched.complete_step(batch, clock, wall_ns())) {
      ++res.finished;
      res.prompt_tokens += static_cast<std::int64_t>(r->prompt_len());
      res.cached_tokens += r->res.matched.value();
      if (workload && role == PdRole::None) workload->finished(r->spec.id, clock);  // P/D: when decode finished it
      if (role == PdRole::Decode && leader && first_stage) pd_to_peer.push_back({kPdFinished, r->spec.id.value(), clock});
      res.spec_rounds += r->spec_rounds;
      res.spec_proposed += r->spec_proposed;
      res.spec_accepted += r->spec_accepted;
      res.draft_mismatches += r->draft_mismatches;
      if (stack.has_draft) res.spec_digest += mix64(hash_combine(hash_combine(r->spec.id.value(), r->spec_rounds), r->spec_accepted));
      emit(step, r->spec.id.value(), "finish", static_cast<std::int64_t>(r->prompt_len()), r->res.matched.value(),
           r->spec.output_len, r->oracle_ok ? 0 : 1);
      if (checker && trace && role != PdRole::Prefill)  // P/D: decode records the requests
        trace->request(finished_row(*r, role == PdRole::Decode));
    }

    // Timeline events: copies (modelled start, end, bytes), ACKs consumed, at this step.
    if (trace)
      for (const auto& t : dc.take_transfers())
        emit(step, t.id, t.kind, static_cast<std::int64_t>(t.start_ns), static_cast<std::int64_t>(t.end_ns),
             static_cast<std::int64_t>(t.bytes), 0);
    done = role == PdRole::None ? exhausted && sched.idle() : in.pd_stop != 0;
    if (role == PdRole::Decode && leader && first_stage && !done) pd.send_answers(clock, sched.idle(), pd_to_peer);
    if (stack.has_draft && shape.pp > 1 && leader && expect_back && !done) {
      StepMessage back;
      back.clock_ns = clock;
      back.accepts = accepts_next;
      back_sender.send(back, 0, grid.pp(), kTagBackward);
    }
    if (trace) trace->set_completed_step(static_cast<std::uint64_t>(step));
    if ((step + 1) % exp.engine.check_every == 0 || done) check(step);
    if (online && ((step + 1) % exp.protocol.consensus_interval == 0 || done)) {
      if (auto found = online->check(step)) {
        emit(step, 0, "divergence", 0, 0, 0, 1);
        flush();  // every rank's log up to here, for `kvgrid check`
        if (!found->empty()) log_all(*found);
        // Nobody stops (MPI_Abort) before the reporting rank has printed.
        MPI_Request req;
        KVGRID_MPI_CHECK(MPI_Ibarrier(grid.world(), &req));
        wait_mpi(&req, "Ibarrier after the consensus check's report");
        throw DivergenceFound("the online consensus checker found a rank divergence at step " + std::to_string(step) +
                                  (found->empty() ? " (reported by another rank)" : " (above)"),
                              *found);
      }
    }
    if (print && ((step + 1) % exp.output.report_every == 0 || done)) {
      char row[200];
      std::snprintf(row, sizeof(row), "%7lld %7lld/%-7llu %7zu %7zu %6.2f %8lld %9.3f %7.2f", static_cast<long long>(step + 1),
                    static_cast<long long>(res.finished), static_cast<unsigned long long>(total_known), sched.waiting(),
                    sched.running(),
                    res.prompt_tokens ? 100.0 * static_cast<double>(res.cached_tokens) / static_cast<double>(res.prompt_tokens) : 0.0,
                    static_cast<long long>(dc.pool().used_pages().value()), static_cast<double>(clock) / 1e6,
                    static_cast<double>(wall_ns()) / 1e9);
      log0(row);
    }
    if ((step + 1) % exp.output.flush_every == 0 || done) flush();
  }
  KVGRID_CHECK(!decode_step || decode_step->restores_pending() == 0, "the run stopped with restore outcomes still being agreed");
  KVGRID_CHECK(!load_check || load_check->pending() == 0, "the run stopped with load-back outcomes still being agreed");
  sender.drain(true);
  back_sender.drain(true);
  pd.drain();
  if (auto* host = dc.host_tier()) host->finish_cross_stage();
  res.steps = step;
  res.model_ns = clock;

  std::int64_t mism = local_mismatches;
  MPI_Request req;
  KVGRID_MPI_CHECK(MPI_Iallreduce(&local_mismatches, &mism, 1, MPI_INT64_T, MPI_SUM, grid.world(), &req));
  wait_mpi(&req, "Iallreduce of oracle mismatches");
  res.oracle_mismatches = mism;
  const std::int64_t local_finished = res.finished;
  if (role != PdRole::None) {  // the first prefill rank's and the first decode rank's counts, on every rank
    const auto t = pd.world_totals(res.pd_received_tokens, res.finished, res.failed);
    res.pd_sent_tokens = t.sent_tokens;
    res.pd_received_tokens = t.received_tokens;
    res.pd_failed = t.failed;
    res.pd_restore_failed = t.restore_failed;
    res.finished = t.finished_requests;  // decode's: the requests it decoded, and those it failed
    res.failed = t.failed_requests;
  }
  if (spec) share_spec_counts(grid, res);  // the last stage's counts, on every rank

  auto& m = res.mine;
  m = rank_summary(grid, dc, log, faults, local_failures);
  m.requests = res.requests;
  m.admitted = local_finished;
  m.matched_tokens = res.cached_tokens;
  m.prompt_tokens = res.prompt_tokens;
  m.oracle_mismatches = local_mismatches;
  m.model_ns = static_cast<std::int64_t>(clock);
  m.device_high_water = 0;  // pages one rank's device pool held at most (sharded: the fullest owner)
  for (std::uint32_t r = 0; r < dc.pool().shards(); ++r)
    m.device_high_water = std::max(m.device_high_water, dc.pool().high_water(r).value());
  m.device_pool_pages = capacity.value();
  if (gather) {
    m.gather_bytes = static_cast<std::int64_t>(gather->stats().bytes);
    m.gather_ns = static_cast<std::int64_t>(gather_ns);
  }
  m.pd_sent_tokens = pd.stats().sent_tokens;
  m.pd_sent_bytes = pd.stats().sent_bytes;
  m.pd_broken = pd.stats().broken;
  m.pd_failed = pd.stats().failed;
  m.pd_restore_failed = pd.stats().restore_failed;
  if (load_check) {
    m.load_failed = load_check->failed_requests();
    m.load_recomputed_tokens = load_check->recomputed_tokens();
  }
  add_tier_stats(m, dc);
  finish_summary(grid, res);
  res.wall_s = static_cast<double>(wall_ns()) / 1e9;
  return res;
}

}  // namespace kvgrid
