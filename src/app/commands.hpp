// The CLI's commands; each returns the process exit code.
#pragma once

#include <cstdint>
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
};

std::string version_string();
int cmd_run(const RunOptions& opt, int argc, char** argv);
int cmd_report(const std::string& run, bool json);
int cmd_check(const std::string& run);
int cmd_timeline(const std::string& run);

}  // namespace kvgrid::app
