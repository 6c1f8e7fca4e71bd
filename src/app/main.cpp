// kvgrid — research testbed for the cache protocols of parallel LLM serving.
//
//   kvgrid run EXPERIMENT.toml [--out DIR] [--seed N] [--set key=value]...   (under mpirun)
//   kvgrid report RUN [--json]
//   kvgrid check RUN
//   kvgrid timeline RUN -o run.json [--from S --to S --every N --wall]
//   kvgrid workload EXPERIMENT.toml [--export FILE] [--seed N] [--set key=value]...
//   kvgrid store DIR --limit-mb N [--dry-run]
//   kvgrid help [COMMAND]
//
// Exit codes: 0 success, 1 FAILED verdict (or a watchdog / internal error), 2 bad input.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdlib>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <string>
#include <vector>
#include <iostream>

#include "app/commands.hpp"

int main(int argc, char** argv) {
  // Live and network-filesystem runs must be readable while they are written (DESIGN §6).
  setenv("HDF5_USE_FILE_LOCKING", "FALSE", 0);
#ifdef __GLIBC__
  // Prompts, step messages and a chunk's scratch are often megabytes: above glibc's mmap threshold
  // each would be mapped afresh and page-faulted in at every step. Kept on the heap, reused.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // (glibc's largest)
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
#endif

  CLI::App app{"kvgrid: cache protocols of parallel LLM serving, one MPI rank per GPU rank"};
  app.require_subcommand(1);
  app.set_version_flag("--version", kvgrid::app::version_string());

  kvgrid::app::RunOptions run;
  auto* run_cmd = app.add_subcommand("run", "run an experiment (start it with mpirun -np <ranks>)");
  run_cmd->add_option("experiment", run.experiment, "experiment file (TOML)");
  run_cmd->add_option("--out", run.out, "run directory (default results/<experiment>/<seed>-<time>/)");
  run_cmd->add_option("--seed", run.seed, "run seed (overrides engine.seed)")->check(CLI::NonNegativeNumber);
  run_cmd->add_option("--set", run.sets, "override a key: section.key=value (repeatable; one pair each)")
      ->allow_extra_args(false);  // `--set k=v EXPERIMENT`: the experiment is not a second pair
  run_cmd->add_flag("--keys", run.list_keys,
                    "list every experiment key with its type, range, default and meaning, then exit");
  run_cmd->add_flag("--json", run.keys_json, "with --keys: as JSON");
  run_cmd->add_option("--template", run.keys_template,
                      "with --keys: write a commented experiment file with every key at its default to FILE");
  run_cmd->add_flag("--world-size", run.print_world_size, "print the number of ranks the experiment needs, then exit");
  run_cmd->add_flag("--strict", run.strict, "an oracle mismatch stops the run at once (engine.strict = true)");
  run_cmd->add_flag("-v,--verbose", run.verbose, "print the full effective configuration in the header");
  run_cmd->add_flag("-q,--quiet", run.quiet, "no progress rows (the header and the verdict only)");
  run_cmd->add_option("--schedule", run.schedule,
                      "controlled engine: answer the copy completions named rank:index,... the other way (as kvgrid "
                      "explore prints them; '' = every default)");

  kvgrid::app::ExploreOptions explore;
  auto* explore_cmd = app.add_subcommand(
      "explore", "run an experiment under every schedule of its copy completions within a bound (start it with mpirun)");
  explore_cmd->add_option("experiment", explore.experiment, "experiment file (TOML)")->required();
  explore_cmd->add_option("--bound", explore.bound, "non-default choices per schedule (default 1)")->check(CLI::Range(0, 8));
  explore_cmd->add_option("--budget", explore.budget_s, "stop after this many seconds (the result says incomplete)")
      ->check(CLI::NonNegativeNumber);
  explore_cmd->add_option("--seed", explore.seed, "run seed (overrides engine.seed)")->check(CLI::NonNegativeNumber);
  explore_cmd->add_option("--set", explore.sets, "override a key: section.key=value (repeatable)")->allow_extra_args(false);
  explore_cmd->add_option("--out", explore.out, "directory for the runs' storage (default results/explore/<experiment>)");
  explore_cmd->add_option("--deadline", explore.deadline_s,
                          "seconds a rank may wait before its schedule counts as a hang (default 5)")
      ->check(CLI::PositiveNumber);
  explore_cmd->add_flag("--keep-going", explore.keep_going, "explore every schedule within the bound after a violation");
  explore_cmd->add_flag("--no-shrink", explore.no_shrink, "print the first violating schedule as found");

  std::string report_run;
  bool report_as_json = false;
  auto* report_cmd = app.add_subcommand("report", "summarise a run from its trace");
  report_cmd->add_option("run", report_run, "run directory or its run.h5")->required();
  report_cmd->add_flag("--json", report_as_json, "print JSON instead of text");

  std::string check_run;
  auto* check_cmd = app.add_subcommand("check", "find the first decision on which ranks that must agree differ");
  check_cmd->add_option("run", check_run, "run directory or its run.h5")->required();

  kvgrid::app::TimelineArgs timeline;
  auto* timeline_cmd = app.add_subcommand(
      "timeline", "export the run as Chrome/Perfetto trace events (JSON; open in ui.perfetto.dev): step and phase slices, "
                  "batches, copies, request spans, counters");
  timeline_cmd->add_option("run", timeline.run, "run directory or its run.h5")->required();
  timeline_cmd->add_option("-o,--output", timeline.output, "write to FILE (whole or not at all) instead of stdout");
  timeline_cmd->add_option("--from", timeline.from, "first step to include");
  timeline_cmd->add_option("--to", timeline.to, "last step to include");
  timeline_cmd->add_option("--every", timeline.every, "keep every N-th step's step slices and counters (sampling)");
  timeline_cmd->add_flag("--wall", timeline.wall, "add each rank's steps and phases in wall-clock time");

  kvgrid::app::WorkloadArgs workload;
  auto* workload_cmd = app.add_subcommand(
      "workload", "summarise an experiment's requests without running it; --export writes them as a Mooncake JSONL trace");
  workload_cmd->add_option("experiment", workload.experiment, "experiment file (TOML)")->required();
  workload_cmd->add_option("--export", workload.output, "write the requests to FILE as Mooncake JSONL (timestamp ms, "
                                                        "input_length, output_length, hash_ids of 512-token blocks)");
  workload_cmd->add_option("--seed", workload.seed, "run seed (overrides engine.seed)")->check(CLI::NonNegativeNumber);
  workload_cmd->add_option("--set", workload.sets, "override a key: section.key=value (repeatable)")->allow_extra_args(false);
  workload_cmd->add_option("--service-ms", workload.service_ms,
                           "closed-loop workloads (gsp turns, multiturn): a follow-up arrives this long after its "
                           "predecessor arrived (default 1000)");

  kvgrid::app::StoreArgs store;
  auto* store_cmd = app.add_subcommand(
      "store", "sweep a unified storage directory down to a size: least recently read or written objects first");
  store_cmd->add_option("dir", store.dir, "storage directory (cache.storage_dir) or its unified/ subdirectory")->required();
  store_cmd->add_option("--limit-mb", store.limit_mb, "keep at most this many MiB of objects")->required()->check(CLI::NonNegativeNumber);
  store_cmd->add_flag("--dry-run", store.dry_run, "count what would be removed, remove nothing");

  // `kvgrid help [COMMAND]`, and an unknown command named as such (not "argument not expected").
  const std::vector<std::string> commands = {"run", "explore", "report", "check", "timeline", "workload", "store", "help"};
  if (argc >= 2 && argv[1][0] != '-' && std::find(commands.begin(), commands.end(), argv[1]) == commands.end()) {
    std::cerr << "kvgrid: unknown command '" << argv[1] << "' (commands: run, explore, report, check, timeline, workload, store, help; see kvgrid --help)\n";
    return 2;
  }
  if (argc >= 2 && std::string(argv[1]) == "help") {
    if (argc == 2) {
      std::cout << app.help();
      return 0;
    }
    for (auto* sub : {run_cmd, explore_cmd, report_cmd, check_cmd, timeline_cmd, workload_cmd, store_cmd})
      if (sub->get_name() == argv[2]) {
        std::cout << sub->help();
        return 0;
      }
    std::cerr << "kvgrid help: unknown command '" << argv[2] << "' (commands: run, explore, report, check, timeline, workload, store)\n";
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  }
  if (*run_cmd) {
    if (run.experiment.empty() && (!run.list_keys || run.print_world_size)) {
      std::cerr << "kvgrid run: error: an experiment file is required (see kvgrid run --help)\n";
      return 2;
    }
    return kvgrid::app::cmd_run(run, argc, argv);
  }
  if (*explore_cmd) return kvgrid::app::cmd_explore(explore, argc, argv);
  if (*report_cmd) return kvgrid::app::cmd_report(report_run, report_as_json);
  if (*check_cmd) return kvgrid::app::cmd_check(check_run);
  if (*timeline_cmd) return kvgrid::app::cmd_timeline(timeline);
  if (*workload_cmd) return kvgrid::app::cmd_workload(workload);
  if (*store_cmd) return kvgrid::app::cmd_store(store);
  return 2;
}
