#include "runtime/tree_run.hpp"

#include <chrono>
#include <csignal>
#include <cstdio>
#include <deque>
#include <thread>

#include "cache/device_cache.hpp"
#include "core/check.hpp"
#include "core/log.hpp"
#include "core/wait.hpp"
#include "runtime/rank_check.hpp"
#include "runtime/workload.hpp"

namespace kvgrid {

namespace {

using Clock = std::chrono::steady_clock;

struct Held {
  cache::Admission admission;
  std::uint64_t request = 0;
  std::int64_t release_step = 0;
};

// Leader → group broadcast of one step's requests (size, then payload).
std::vector<Request> receive_step(const RankGrid& grid, TreeWorkload* gen, std::int64_t step) {
  std::vector<std::uint32_t> buf;
  if (gen) buf = encode_requests(gen->next_step());
  std::uint64_t n = buf.size();
  MPI_Request req;
  const std::string what = "Ibcast of step " + std::to_string(step) + " requests over the group";
  KVGRID_MPI_CHECK(MPI_Ibcast(&n, 1, MPI_UINT64_T, 0, grid.group(), &req));
  wait_mpi(&req, what + " (size)");
  buf.resize(n);
  KVGRID_MPI_CHECK(MPI_Ibcast(buf.data(), static_cast<int>(n), MPI_UINT32_T, 0, grid.group(), &req));
  wait_mpi(&req, what);
  return decode_requests(buf);
}


}  // namespace

TreeRunResult run_tree_workload(const ExperimentConfig& exp, const RankGrid& grid, FailpointRegistry& faults,
                                DecisionLog& log, TraceWriter* trace, bool print) {
  const auto start = Clock::now();
  auto wall_ns = [&] {
    return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count());
  };
  const bool leader = grid.coord().tp == 0 && grid.coord().cp == 0 && grid.coord().pp == 0;
  std::unique_ptr<TreeWorkload> gen;
  if (leader) gen = std::make_unique<TreeWorkload>(exp.workload.tree, static_cast<std::uint64_t>(exp.workload.vocab), exp.engine.seed);
  cache::DeviceCache dc({exp.cache.page_size, exp.cache.device_pages}, log);
  Rng plant_rng = rank_stream(exp.engine.seed, grid.world_rank()).fork("debug.plant");

  TreeRunResult res;
  std::deque<Held> held;
  std::int64_t local_failures = 0, requests = 0, admitted = 0, matched = 0, prompt = 0;
  std::int64_t window_req = 0, window_admit = 0, window_matched = 0, window_prompt = 0, window_evicted = 0;

  auto emit = [&](std::int64_t step, std::uint64_t request, const char* op, std::int64_t a0, std::int64_t a1,
                  std::int64_t a2, std::int32_t status) {
    if (trace) trace->event(static_cast<std::uint64_t>(step), wall_ns(), 0, request, op, a0, a1, a2, status);
  };
  auto flush = [&] {
    if (trace) trace->flush_all(log, faults);
  };
  auto check = [&](std::int64_t step, bool last) {
    CheckOutcome c = periodic_check(grid, dc, log, local_failures, 0, step, res, print, last);
    emit(step, 0, "check", static_cast<std::int64_t>(c.tree_differs.size()),
         static_cast<std::int64_t>(c.decisions_differ.size()), c.verify_failures, c.agree() ? 0 : 1);
  };

  if (print) log0("#  step    reqs   admit  reject    hit%   evicted   pages   nodes");
  for (std::int64_t step = 0; step < exp.workload.tree.steps; ++step) {
    log.set_step(static_cast<std::uint64_t>(step));
    if (grid.world_rank() == exp.debug.kill_rank && step == exp.debug.kill_at_step) std::raise(SIGKILL);
    if (auto hit = faults.evaluate("rank.stall", static_cast<std::uint64_t>(step))) {
      const double ms = hit->param("duration_ms");
      emit(step, 0, "stall", static_cast<std::int64_t>(ms), 0, 0, 0);
      flush();  // a stalled rank may be aborted by its peers' watchdog: keep what it has
      std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms));
    }

    std::vector<Request> reqs = receive_step(grid, gen.get(), step);
    while (!held.empty() && held.front().release_step <= step) {
      dc.release(held.front().admission);
      emit(step, held.front().request, "release", 0, 0, 0, 0);
      held.pop_front();
    }
    for (const auto& r : reqs) {
      cache::Admission a = dc.admit(r.id, r.tokens);
      ++requests;
      ++window_req;
      prompt += a.prompt.value();
      window_prompt += a.prompt.value();
      window_evicted += a.evicted.value();
      if (a.evicted.value() > 0) emit(step, r.id.value(), "evict", a.evicted.value(), 0, 0, 0);
      emit(step, r.id.value(), "admit", a.prompt.value(), a.matched.value(), a.new_pages.value(), a.admitted ? 1 : 0);
      if (!a.admitted) continue;
      ++admitted;
      ++window_admit;
      matched += a.matched.value();
      window_matched += a.matched.value();
      // Requests are held in admission order; equal hold lengths release FIFO, so order is
      // identical on every rank.
      Held h{a, r.id.value(), step + r.hold_steps};
      auto pos = held.end();
      while (pos != held.begin() && std::prev(pos)->release_step > h.release_step) --pos;
      held.insert(pos, h);
    }
    if (exp.debug.plant_divergence_kind != "extra") {
      if (plant_divergence(exp, grid, log, step)) emit(step, ~0ull, "planted", step, 0, 0, 1);
    } else if (planted_rank(exp, grid) && step == exp.debug.plant_divergence_step) {
      // Testing knob: one rank caches a prompt nobody else has.
      std::vector<TokenId> extra(static_cast<std::size_t>(exp.cache.page_size.value() * 2 + 1));
      for (auto& t : extra) t = static_cast<TokenId>(plant_rng.below(static_cast<std::uint64_t>(exp.workload.vocab)));
      cache::Admission a = dc.admit(RequestId(~0ull), extra);
      dc.release(a);
      emit(step, ~0ull, "planted", a.prompt.value(), 0, a.new_pages.value(), a.admitted ? 1 : 0);
    }

    const bool last = step + 1 == exp.workload.tree.steps;
    if ((step + 1) % exp.engine.check_every == 0 || last) check(step, last);
    if (print && ((step + 1) % exp.output.report_every == 0 || last)) {
      char row[160];
      std::snprintf(row, sizeof(row), "%7lld %7lld %7lld %7lld %7.2f %9lld %7lld %7zu", static_cast<long long>(step + 1),
                    static_cast<long long>(window_req), static_cast<long long>(window_admit),
                    static_cast<long long>(window_req - window_admit),
                    window_prompt ? 100.0 * static_cast<double>(window_matched) / static_cast<double>(window_prompt) : 0.0,
                    static_cast<long long>(window_evicted), static_cast<long long>(dc.tree().total_pages().value()),
                    dc.tree().node_count());
      log0(row);
      window_req = window_admit = window_matched = window_prompt = window_evicted = 0;
    }
    if (trace) trace->set_completed_step(static_cast<std::uint64_t>(step));
    if ((step + 1) % exp.output.flush_every == 0 || last) flush();
    res.steps = step + 1;
  }
  while (!held.empty()) {
    dc.release(held.front().admission);
    held.pop_front();
  }
  flush();

  auto& m = res.mine;
  m = rank_summary(grid, dc, log, faults, local_failures);
  m.requests = requests;
  m.admitted = admitted;
  m.matched_tokens = matched;
  m.prompt_tokens = prompt;
  finish_summary(grid, res);
  res.wall_s = std::chrono::duration<double>(Clock::now() - start).count();
  return res;
}

}  // namespace kvgrid
