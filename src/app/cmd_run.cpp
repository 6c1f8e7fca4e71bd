// `kvgrid run`: one process per rank under mpirun / srun.
#include <mpi.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <ctime>
#include <iostream>
#include <sstream>
#include <thread>

#include "app/commands.hpp"
#include "app/mpi_main.hpp"
#include "cache/redis_storage.hpp"
#include "core/build_info.hpp"
#include "core/check.hpp"
#include "core/hash.hpp"
#include "core/decision_log.hpp"
#include "core/failpoint.hpp"
#include "core/log.hpp"
#include "core/schedule.hpp"
#include "core/topology.hpp"
#include "core/wait.hpp"
#include "runtime/experiment.hpp"
#include "runtime/rank_check.hpp"
#include "runtime/run_dir.hpp"
#include "runtime/serve.hpp"
#include "runtime/trace.hpp"
#include "runtime/tree_run.hpp"

namespace kvgrid::app {

std::string version_string() {
  return std::string("kvgrid ") + build::version() + " (git " + build::git_revision() + ")";
}

namespace {

// One line that reruns this run (same experiment, seed, overrides, rank count): decisions repeat.
std::uint64_t g_run_seed = 0;  // the run's seed, for the failure line

std::string reproduce_line(const RunOptions& opt, std::uint64_t seed, int world_size) {
  std::string line = "mpirun -np " + std::to_string(world_size) + " build/kvgrid run " + opt.experiment + " --seed " +
                     std::to_string(seed);
  for (const auto& s : opt.sets) line += " --set '" + s + "'";
  if (opt.strict) line += " --strict";
  if (opt.schedule) line += " --schedule '" + *opt.schedule + "'";
  return line;
}


std::string utc_now() {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// What the header says of a Redis store: reproducible only when the server is empty at the start
// and never evicts (a private server from jobs/redis.sh, used by this run alone) — and then only
// the store: a run whose copies land in real time is not reproducible anyway (print_header).
std::string redis_line(const std::string& url, bool real_time) {
  const auto p = cache::RedisStorage::probe(url);
  if (p.private_and_keeps())
    return real_time ? "# storage: the Redis server is empty at the start and never evicts (maxmemory 0)\n"
                     : "# storage: the Redis server is empty at the start and never evicts (maxmemory 0): reproducible "
                       "while no other job uses it\n";
  std::string why;
  if (!p.reachable) why = "unreachable at the start (" + p.error + ")";
  else if (p.keys != 0) why = std::to_string(p.keys) + " keys already in its database: other jobs' objects";
  else if (!p.maxmemory) why = "its eviction policy is unknown (CONFIG refused)";
  else why = "maxmemory " + std::to_string(*p.maxmemory) + " bytes, policy " + p.policy + ": it may evict or refuse writes";
  return "# not reproducible: shared store (a Redis server: " + why + ")\n";
}

void print_header(const ExperimentConfig& exp, const RankGrid& grid, const std::string& dir, bool verbose) {
  if (grid.world_rank() != 0) return;  // (rank 0 prints it; the Redis probe is one connection)
  std::ostringstream os;
  os << "# " << version_string() << "\n";
  os << "# experiment " << exp.name << " (" << exp.source << ")\n";
  os << "# seed " << exp.engine.seed << "\n";
  os << "# engine: transfer " << exp.engine.transfer;
  if (exp.engine.transfer == "cuda") os << " (copies: " << exp.engine.cuda_copy << ")";
  os << ", collectives " << exp.engine.collectives << ", decode " << exp.engine.decode << "\n";
  os << "# topology " << exp.topology.str() << ", world " << grid.world_size() << " ranks\n";
  os << "# workload " << exp.workload.kind;
  if (exp.workload.kind == "tree") os << ": " << exp.workload.tree.steps << " steps x " << exp.workload.tree.requests_per_step << " requests";
  os << "; cache: page_size " << exp.cache.page_size << " tokens, device_pages " << exp.cache.device_pages << "\n";
  if (exp.workload.kind != "tree") {
    os << "# model: " << exp.model.layers << " layers, " << exp.model.kv_heads << " KV heads x " << exp.model.head_dim
       << " dims, attention " << exp.model.attention << ", CP query split " << exp.model.cp_split << "; payload "
       << exp.engine.payload << (exp.engine.strict ? ", strict oracle" : "") << "\n";
    if (exp.model.draft.enabled()) {
      const auto& d = exp.model.draft;
      os << "# draft: " << d.layers << " layers on the last stage, " << d.kv_heads << " KV heads x " << d.head_dim << " dims ("
         << d.dtype << "), " << d.steps << " tokens per round, accept_prob " << d.accept_prob << "; draft state " << d.mode << "\n";
    }
    os << "# scheduler: chunked prefill " << exp.engine.chunk_size << " tokens/step, max_running " << exp.engine.max_running
       << ", decode " << exp.engine.decode << "\n# tiers: device " << exp.cache.device_pages << " pages";
    if (exp.cache.host_pages.value() > 0) os << ", host " << exp.cache.host_pages << " pages (" << exp.cache.write_policy << ")";
    if (exp.cache.storage != "none")
      os << ", storage " << exp.cache.storage << (exp.cache.storage == "redis" ? " at " + exp.cache.storage_url : std::string())
         << " (prefetch " << exp.cache.prefetch_policy << ")";
    os << "; transfer engine " << exp.engine.transfer << "; CP pages " << exp.cache.cp_sharding;
    if (exp.cache.cp_sharding != "replicated")
      os << " (gather slots of " << exp.cache.gather_pages << " pages, overlap " << (exp.cache.gather_overlap ? "on" : "off") << ")";
    os << "\n# protocols: tp_sync " << exp.protocol.tp_sync << ", pp_sync " << exp.protocol.pp_sync << ", prefetch_consensus "
       << exp.protocol.prefetch_consensus << ", load_back " << exp.protocol.load_back << ", layer_gather "
       << exp.protocol.layer_gather << ", online consensus check " << exp.protocol.consensus_check
       << " (+ periodic digest check, offline kvgrid check)";
    if (exp.topology.groups.size() == 2)
      os << "; P/D " << exp.protocol.pd << " (suffix link " << exp.cost.pd_link_gb_s << " GB/s, " << exp.cost.pd_latency_us
         << " us)";
    os << "\n";
  }
  const std::string where = exp.cache.storage == "redis" ? exp.cache.storage_url : exp.cache.storage_dir;
  // (the transfer engine exists with the host tier: no host tier, no copies)
  const bool real_time = exp.workload.kind != "tree" && exp.cache.host_pages.value() > 0 && exp.engine.transfer != "simulated";
  if (exp.cache.storage != "none" && exp.cache.storage_key_scheme == "unified")
    os << "# storage objects: unified keys in " << where << (exp.cache.storage == "redis" ? "" : "/unified")
       << (exp.cache.host_layout == "page_unified" ? "; host pages in object order (cache.host_layout = page_unified)" : "")
       << "\n";
  if (exp.cache.storage_shared)  // other jobs' objects appear while this one runs
    os << "# not reproducible: shared store (cache.storage_shared: other jobs read and write " << where << " at the same time)\n";
  else if (exp.cache.storage == "redis")  // a server other jobs may use, evicting by its own policy
    os << redis_line(exp.cache.storage_url, real_time);
  // Real copies land when they land: every rank still takes the same decisions (the protocols),
  // but a rerun of the same seed may take others (the simulated engine's completions are drawn).
  if (real_time)
    os << "# not reproducible: engine.transfer = " << exp.engine.transfer
       << " (copies land in real time: the ranks agree on every decision, a rerun of the seed may decide otherwise)\n";
  if (!exp.workload.route_dir.empty())
    os << "# bucket: prompts of " << exp.workload.route_min_prompt << " to "
       << (exp.workload.route_max_prompt > 0 ? std::to_string(exp.workload.route_max_prompt - 1) : std::string("any"))
       << " tokens (the others: another job over " << exp.workload.route_dir << ")\n";
  os << "# faults:";
  if (exp.faults.empty()) os << " none";
  for (const auto& f : exp.faults) os << " " << f.name << "(p=" << f.probability << ")";
  os << "\n# watchdog deadline " << exp.engine.deadline_s << " s\n";
  os << "# output " << dir;
  if (verbose) {  // -v: every key as the run uses it (it is in the trace's /meta/config either way)
    os << "\n# effective configuration:";
    std::istringstream cfg(exp.effective_toml);
    for (std::string line; std::getline(cfg, line);) os << "\n#" << (line.empty() ? "" : "   " + line);
  } else {
    os << " (full configuration: -v, or the trace's /meta/config)";
  }
  log0(os.str());
}

// Joins a barrier over `comm` (every rank joins once its trace is flushed) and aborts the job
// when it completes or after `grace_s` seconds, whichever is first: ranks that never join (busy,
// or stuck outside a watchdog wait) are killed where they are, not inside a flush.
[[noreturn]] void abort_when_all_flushed(MPI_Comm comm, double grace_s) {
  MPI_Request req = MPI_REQUEST_NULL;
  if (MPI_Ibarrier(comm, &req) == MPI_SUCCESS) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(grace_s);
    for (int done = 0; !done && std::chrono::steady_clock::now() < until;) {
      if (MPI_Test(&req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) break;
      if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();
}

// After a run with --schedule: each flip the run applied, where it was, and the choice points met.
void report_choices(MPI_Comm world, const ChoiceSource& c) {
  set_choice_source(nullptr);
  for (const auto& r : c.records())
    if (r.answer != r.default_answer)
      log_all("schedule: point " + std::to_string(r.index) + " at step " + std::to_string(r.step) + ": " + r.what + ": " + r.said);
  std::uint64_t mine[2] = {c.size(), c.applied()}, all[2] = {0, 0};
  KVGRID_MPI_CHECK(MPI_Reduce(mine, all, 2, MPI_UINT64_T, MPI_SUM, 0, world));
  log0("# schedule: " + std::to_string(all[0]) + " choice points over all ranks, " + std::to_string(all[1]) +
       " flips applied");
}

// The experiment as this run uses it (file, --set, --seed, --strict, -q), checked against the world.
ExperimentConfig load_run_experiment(const RunOptions& opt, int world_size) {
  std::vector<std::string> sets = opt.sets;
  if (opt.strict) sets.push_back("engine.strict=true");
  ExperimentConfig e = load_experiment(opt.experiment, sets, opt.seed);
  e.validate_for_world(world_size);
  e.output.quiet = opt.quiet;
  return e;
}

// --schedule: every copy completion a rank observes answered by the schedule (kvgrid explore).
std::optional<ChoiceSource> schedule_choices(const RunOptions& opt, const ExperimentConfig& exp, int world_rank) {
  if (!opt.schedule) return std::nullopt;
  const Schedule sched = Schedule::parse(*opt.schedule);
  if (exp.engine.transfer != "simulated")
    throw InputError("--schedule needs engine.transfer = \"simulated\" (its completions are the choices), not \"" +
                     exp.engine.transfer + "\"");
  return ChoiceSource(sched.for_rank(world_rank));
}

RunMeta run_meta(const ExperimentConfig& exp, int world_size) {
  RunMeta meta;
  meta.experiment = exp.name;
  meta.source = exp.source;
  meta.config_toml = exp.effective_toml;
  meta.topology = exp.topology.str();
  meta.workload = exp.workload.kind;
  meta.page_size = exp.cache.page_size.value();
  meta.started = utc_now();
  meta.seed = static_cast<std::int64_t>(exp.engine.seed);
  meta.world_size = world_size;
  return meta;
}

// What this rank decided and which faults fired, into its trace file now (a deadline or an error
// is about to end the job).
void flush_what_was_decided(TraceWriter& trace, DecisionLog& log, FailpointRegistry& faults) {
  trace.decisions(log.take_new());
  trace.faults(faults.take_new());
  trace.flush();
}

void print_spec_line(const ServeResult& r) {
  char line[200];
  std::snprintf(line, sizeof(line),
                "# speculative decoding: %lld rounds, %lld of %lld proposed tokens accepted, acceptance length %.3f, "
                "%lld draft checksum mismatches",
                static_cast<long long>(r.spec_rounds), static_cast<long long>(r.spec_accepted),
                static_cast<long long>(r.spec_proposed),
                static_cast<double>(r.spec_accepted + r.spec_rounds) / static_cast<double>(r.spec_rounds),
                static_cast<long long>(r.draft_mismatches));
  log0(line);
}

// The loop the workload asks for (the tree workload's, or the serving loop), summarised.
RunSummary run_loop(const ExperimentConfig& exp, RankGrid& grid, FailpointRegistry& faults, DecisionLog& log,
                    TraceWriter* trace, std::unique_ptr<ServeWorkload> workload) {
  RunSummary s;
  auto summarize = [&](LoopResult& r) {  // what both loops report
    s.steps = r.steps;
    s.checks = r.checks;
    s.verify_failures = r.verify_failures;
    s.tree_divergences = r.tree_divergences;
    s.decision_divergences = r.decision_divergences;
    s.wall_s = r.wall_s;
    s.ranks = std::move(r.all);
  };
  if (exp.workload.kind == "tree") {
    TreeRunResult r = run_tree_workload(exp, grid, faults, log, trace, /*print=*/true);
    summarize(r);
    return s;
  }
  ServeResult r = run_serve(exp, grid, faults, log, trace, /*print=*/true, std::move(workload));
  summarize(r);
  s.oracle_mismatches = r.oracle_mismatches;
  s.requests = r.requests;
  s.finished = r.finished;
  s.failed = r.failed;
  if (exp.model.draft.enabled() && grid.world_rank() == 0 && r.spec_rounds > 0) print_spec_line(r);
  return s;
}

// Rank 0's closing lines: steps, requests, the decision digest and whether every rank (of each
// group) agrees, the oracle, verify and divergence counts, the trace, the verdict (and, failed,
// the seed and a command that reproduces the run).
void print_verdict(const RunOptions& opt, const ExperimentConfig& exp, const std::string& dir, const RunSummary& s, bool ok,
                   int world_size) {
  const auto& rows = s.ranks;
  bool logs_agree = true;
  for (const auto& r : rows) {  // against the first rank of its group (P/D groups decide differently)
    const auto& first = rows[static_cast<std::size_t>(layout_coord(exp.topology, r.rank).group_base)];
    logs_agree = logs_agree && r.decision_digest == first.decision_digest && r.decisions == first.decisions;
  }
  std::ostringstream os;
  char digest[32];
  std::snprintf(digest, sizeof(digest), "0x%016llx", static_cast<unsigned long long>(rows[0].decision_digest));
  // Times as the progress rows print them: wall seconds to 0.01 s, modelled ms to 0.001 ms.
  char wall[32], model[32];
  std::snprintf(wall, sizeof(wall), "%.2f", s.wall_s);
  std::snprintf(model, sizeof(model), "%.3f", static_cast<double>(rows.back().model_ns) / 1e6);
  os << "# steps " << s.steps;
  if (exp.engine.decode == "fused") os << " (" << rows[0].fused_steps << " fused)";
  os << ", checks " << s.checks << " (every " << exp.engine.check_every << " steps and at the end), wall " << wall << " s\n";
  if (s.oracle_mismatches >= 0) {
    const char* why = exp.topology.groups.size() > 1 ? " failed (aborted, broken transfer or restore)" : " failed (aborted)";
    os << "# requests " << s.finished << " finished" << (s.failed ? ", " + std::to_string(s.failed) + why : "")
       << " of " << s.requests << ", modelled time " << model << " ms\n";
  }
  os << "# decision log: " << rows[0].decisions << " decisions per rank, digest " << digest
     << (logs_agree ? (exp.topology.groups.size() > 1 ? " on every rank of group 0 (each group agrees)" : " on every rank")
                    : " on rank 0 (ranks differ)")
     << "\n";
  if (s.oracle_mismatches >= 0) {
    os << "# oracle mismatches: " << s.oracle_mismatches << (s.oracle_mismatches ? " FAILED" : " OK");
    std::int64_t on_thread = 0;
    for (const auto& r : rows) on_thread += r.oracle_thread_chunks;
    if (exp.engine.helper_thread) os << " (" << on_thread << " long chunks checked on the helper thread)";
    os << "\n";
  }
  if (rows[0].hybrid)
    os << "# hybrid (rank 0): SWA tombstones made " << rows[0].swa_tombstones_made << ", healed " << rows[0].swa_tombstones_healed
       << "; MAMBA states copied " << rows[0].mamba_states_copied << ", saved " << rows[0].mamba_states_saved << "\n";
  os << "# verify failures: " << s.verify_failures << (s.verify_failures ? " FAILED" : " OK") << "\n";
  const std::int64_t div = s.tree_divergences + s.decision_divergences;
  os << "# rank divergences: " << div << (div ? " FAILED" : " OK") << " (tree digests " << s.tree_divergences
     << ", decision logs " << s.decision_divergences << ")\n";
  os << "# trace " << dir << "/run.h5\n";
  os << "# verdict: " << s.verdict;
  if (!ok) os << "\n# seed " << exp.engine.seed << "; reproduce: " << reproduce_line(opt, exp.engine.seed, world_size);
  log0(os.str());
}

int run_body(const RunOptions& opt, int world_rank, int world_size) {
  // The same file may be unreadable on some nodes only: agree before the first collective.
  ExperimentConfig exp = on_every_rank(MPI_COMM_WORLD, [&] { return load_run_experiment(opt, world_size); });
  std::optional<ChoiceSource> choices =
      on_every_rank(MPI_COMM_WORLD, [&] { return schedule_choices(opt, exp, world_rank); });
  if (choices) set_choice_source(&*choices);
  set_wait_deadline(std::chrono::duration<double>(exp.engine.deadline_s));
  set_debug_checks(exp.engine.debug_checks);
  RankGrid grid(exp.topology, MPI_COMM_WORLD);
  // The serving workload (a trace file, perhaps) is read before anything is written.
  std::unique_ptr<ServeWorkload> workload = on_every_rank(grid.world(), [&]() -> std::unique_ptr<ServeWorkload> {
    if (exp.workload.kind == "tree" || !grid.is_first_stage() || !grid.is_stage_leader()) return nullptr;
    return make_serve_workload(exp.workload, exp.engine.seed);
  });
  g_run_seed = exp.engine.seed;
  const std::string dir = prepare_run_dir(opt.out, exp.output.dir, exp.name, exp.engine.seed, grid.world());
  if (exp.cache.storage != "none" && exp.cache.storage_dir.empty()) exp.cache.storage_dir = dir + "/storage";
  exp.cache.storage_job = hash_string(std::filesystem::absolute(dir).string());  // names this run in its objects

  FailpointRegistry faults(exp.engine.seed, world_rank);
  for (const auto& f : exp.faults) faults.configure(f);
  DecisionLog log;
  const RunMeta meta = run_meta(exp, world_size);
  std::unique_ptr<TraceWriter> trace =
      on_every_rank(grid.world(), [&] { return std::make_unique<TraceWriter>(dir, grid, meta); });
  print_header(exp, grid, dir, opt.verbose);
  if (choices) log0("# schedule '" + *opt.schedule + "' (controlled engine: copy completions are choices; kvgrid explore)");

  // A passed deadline: report, keep what the trace has, stop the whole job with exit 1. In a hang
  // most ranks pass their deadlines within moments of each other, and MPI_Abort from the first
  // would kill the others in the middle of their own flush, leaving an HDF5 file that cannot be
  // read (found by the combination sweep at 8 ranks). So a rank that has flushed waits, a bounded
  // grace, until every rank has (a barrier of its own communicator), then aborts.
  MPI_Comm flushed_comm = MPI_COMM_NULL;
  KVGRID_MPI_CHECK(MPI_Comm_dup(grid.world(), &flushed_comm));
  set_watchdog_handler([&, flushed_comm](const WatchdogReport& r) {
    log_all(r.message() + "\n  " + log.recent_text());
    try {
      flush_what_was_decided(*trace, log, faults);
    } catch (const std::exception& e) {
      log_all(std::string("trace flush failed: ") + e.what());
    }
    abort_when_all_flushed(flushed_comm, std::min(exp.engine.deadline_s, 5.0));
  });

  RunSummary s;
  try {
    s = run_loop(exp, grid, faults, log, trace.get(), std::move(workload));
  } catch (const std::exception&) {
    // Keep what this rank decided before the error; the caller aborts the job (or, for an input
    // error, waits a few seconds for the others: the handler must not outlive this frame).
    set_watchdog_handler({});
    try {
      flush_what_was_decided(*trace, log, faults);
    } catch (...) {
    }
    throw;
  }
  trace.reset();  // close the rank file before rank 0 declares the run complete
  if (choices) report_choices(grid.world(), *choices);
  MPI_Request req;
  KVGRID_MPI_CHECK(MPI_Ibarrier(grid.world(), &req));
  wait_mpi(&req, "Ibarrier before the summary");

  const bool ok = s.verify_failures == 0 && s.tree_divergences == 0 && s.decision_divergences == 0 &&
                  s.oracle_mismatches <= 0;
  if (world_rank == 0) {
    s.verdict = ok ? "OK" : "FAILED";
    TraceWriter::write_summary(dir, s);
    print_verdict(opt, exp, dir, s, ok, world_size);
  }
  set_watchdog_handler({});
  MPI_Comm_free(&flushed_comm);
  return ok ? 0 : 1;
}

}  // namespace

int cmd_run(const RunOptions& opt, int argc, char** argv) {
  if (opt.list_keys) {
    if (opt.keys_template.empty()) {
      std::cout << schema_help(opt.keys_json ? "json" : "text");
      return 0;
    }
    // A new file only: an existing experiment is never overwritten.
    std::error_code ec;
    if (std::filesystem::exists(opt.keys_template, ec)) {
      std::cerr << "kvgrid run: error: --template " << opt.keys_template << ": exists (not overwritten)\n";
      return 2;
    }
    std::ofstream f(opt.keys_template);
    f << schema_help("template");
    if (!f) {
      std::cerr << "kvgrid run: error: --template " << opt.keys_template << ": cannot write (" << std::strerror(errno) << ")\n";
      return 2;
    }
    std::cout << "# wrote " << opt.keys_template << "\n";
    return 0;
  }
  if (opt.print_world_size) {  // no MPI: used by jobs/run.sh to choose -np
    try {
      std::cout << load_experiment(opt.experiment, opt.sets, opt.seed).topology.world_size() << "\n";
      return 0;
    } catch (const InputError& e) {
      std::cerr << "kvgrid run: error: " << e.what() << "\n";
      return 2;
    }
  }
  return run_under_mpi(
      argc, argv, "run", [&](int world_rank, int world_size) { return run_body(opt, world_rank, world_size); },
      [&](const RunFailure& e) {
        int world_size = 1;
        MPI_Comm_size(MPI_COMM_WORLD, &world_size);
        return std::string("FAILED: ") + e.what() + "\n# seed " + std::to_string(g_run_seed) +
               "; reproduce: " + reproduce_line(opt, g_run_seed, world_size);
      });
}

}  // namespace kvgrid::app
