// kvgrid workload EXP [--export FILE]: an experiment's requests without running it (no MPI) — a
// summary, and with --export the requests as a Mooncake JSONL trace (runtime/workload_export.hpp).
#include <cmath>
#include <cstdio>
#include <iostream>

#include "app/commands.hpp"
#include "app/output_file.hpp"
#include "core/check.hpp"
#include "runtime/experiment.hpp"
#include "runtime/workload_export.hpp"

namespace kvgrid::app {

int cmd_workload(const WorkloadArgs& args) {
  try {
    if (!(args.service_ms >= 0.0) || !std::isfinite(args.service_ms))
      throw InputError("--service-ms must be a finite number >= 0 (got " + std::to_string(args.service_ms) + ")");
    const ExperimentConfig exp = load_experiment(args.experiment, args.sets, args.seed);
    const auto ns = static_cast<std::uint64_t>(std::llround(args.service_ms * 1e6));
    const WorkloadExport w = export_workload(exp, ns);
    const double reused = w.blocks ? 100.0 * static_cast<double>(w.blocks - w.distinct_blocks) / static_cast<double>(w.blocks) : 0.0;
    char line[320];
    std::snprintf(line, sizeof(line),
                  "# workload %s (%s, seed %llu): %llu requests, %llu prompt tokens, %llu output tokens, last arrival "
                  "%.3f s; %llu blocks of 512 tokens, %llu distinct (%.1f%% of block references repeat an earlier prefix)\n",
                  args.experiment.c_str(), exp.workload.kind.c_str(), static_cast<unsigned long long>(exp.engine.seed),
                  static_cast<unsigned long long>(w.requests), static_cast<unsigned long long>(w.prompt_tokens),
                  static_cast<unsigned long long>(w.output_tokens), static_cast<double>(w.last_arrival_ns) / 1e9,
                  static_cast<unsigned long long>(w.blocks), static_cast<unsigned long long>(w.distinct_blocks), reused);
    std::cout << line;
    if (exp.workload.kind != "mooncake")
      std::cout << "# closed loop: a follow-up arrives when its predecessor finishes, taken as " << args.service_ms
                << " ms after it arrived (--service-ms)\n";
    if (!args.output.empty()) std::cout << "# wrote " << write_whole_file(args.output, w.jsonl) << " (Mooncake JSONL)\n";
    return 0;
  } catch (const InputError& e) {
    std::cerr << "kvgrid workload: error: " << e.what() << "\n";
    return 2;
  }
}

}  // namespace kvgrid::app
