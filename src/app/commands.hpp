// The CLI's commands; each returns the process exit code.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kvgrid::app {

struct RunOptions {
  std::string experiment, out;
  std::int64_t seed = -1;
  std::vector<std::string> sets;
  bool list_keys = false;
  bool keys_json = false;       // --keys --json
  std::string keys_template;    // --keys --template FILE: a commented experiment file
  bool strict = false;
  bool print_world_size = false;
  bool verbose = false, quiet = false;  // -v: the full configuration in the header; -q: no progress rows
  std::optional<std::string> schedule;  // --schedule: the controlled engine's choices (core/schedule.hpp)
};

struct ExploreOptions {
  std::string experiment, out;
  std::int64_t seed = -1;
  std::vector<std::string> sets;
  int bound = 1;            // non-default choices per schedule
  double budget_s = 0;      // 0: no limit
  bool keep_going = false;  // explore every schedule within the bound even after a violation
  bool no_shrink = false;
  double deadline_s = 5;    // a wait longer than this is a hang (the schedule is abandoned)
};
int cmd_explore(const ExploreOptions& opt, int argc, char** argv);

std::string version_string();
int cmd_run(const RunOptions& opt, int argc, char** argv);
int cmd_report(const std::string& run, bool json);
int cmd_check(const std::string& run);
struct TimelineArgs {
  std::string run, output;                // output empty: stdout
  std::optional<std::uint64_t> from, to;  // step window
  std::uint64_t every = 1;
  bool wall = false;
};
int cmd_timeline(const TimelineArgs& args);
struct WorkloadArgs {
  std::string experiment, output;  // output empty: the summary only
  std::vector<std::string> sets;
  std::int64_t seed = -1;
  double service_ms = 1000.0;      // closed-loop workloads: each request's assumed time in service
};
int cmd_workload(const WorkloadArgs& args);
struct StoreArgs {
  std::string dir;
  double limit_mb = 0;
  bool dry_run = false;
};
int cmd_store(const StoreArgs& args);

}  // namespace kvgrid::app
