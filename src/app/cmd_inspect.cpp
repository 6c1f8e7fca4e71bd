// report, check and timeline: read-only commands over a finished or aborted run's trace (no MPI).
#include <iostream>

#include "app/commands.hpp"
#include "app/output_file.hpp"
#include "core/check.hpp"
#include "runtime/offline_check.hpp"
#include "runtime/report.hpp"
#include "runtime/timeline.hpp"
#include "runtime/trace_reader.hpp"

namespace kvgrid::app {

int cmd_report(const std::string& run, bool json) {
  try {
    RunTrace t = read_run(run);
    if (json) std::cout << report_json(t).dump(2) << "\n";
    else std::cout << report_text(t);
    return 0;
  } catch (const InputError& e) {
    std::cerr << "kvgrid report: error: " << e.what() << "\n";
    return 2;
  }
}

int cmd_check(const std::string& run) {
  try {
    RunTrace t = read_run(run);
    CheckReport rep = check_run(t);
    std::cout << "# check " << t.run_file << ": " << rep.pairs << " rank pairs, " << rep.compared_entries
              << " decisions compared" << (t.summary ? "" : " (incomplete run: up to the steps both ranks completed)") << "\n";
    if (rep.missing_ranks) std::cout << "# " << rep.missing_ranks << " rank file(s) missing or unreadable\n";
    if (rep.first) {
      std::cout << "# " << rep.first->describe() << "\n# rank divergences: 1 FAILED\n";
      return 1;
    }
    std::cout << "# rank divergences: 0 OK\n";
    return 0;
  } catch (const InputError& e) {
    std::cerr << "kvgrid check: error: " << e.what() << "\n";
    return 2;
  }
}

int cmd_timeline(const TimelineArgs& args) {
  try {
    if (args.from && args.to && *args.from > *args.to)
      throw InputError("--from " + std::to_string(*args.from) + " is after --to " + std::to_string(*args.to));
    if (args.every == 0) throw InputError("--every must be at least 1");
    const TimelineOptions opt{.from = args.from, .to = args.to, .every = args.every, .wall = args.wall};
    const std::string text = timeline_json(read_run(args.run), opt).dump() + "\n";
    if (args.output.empty()) {
      std::cout << text;
      return 0;
    }
    const std::string target = write_whole_file(args.output, text);
    std::cerr << "# timeline: " << target << " (" << text.size() << " bytes; open in ui.perfetto.dev)\n";
    return 0;
  } catch (const InputError& e) {
    std::cerr << "kvgrid timeline: error: " << e.what() << "\n";
    return 2;
  }
}

}  // namespace kvgrid::app
