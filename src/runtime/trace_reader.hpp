// Reads a run's trace (run.h5 and the rank files it links to) for `report` and `check`. Works on
// an aborted run: missing /summary means "did not end cleanly"; a rank file that was never
// written or cannot be read is reported as missing, not as an error.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/h5util.hpp"
#include "runtime/trace.hpp"

namespace kvgrid {

struct RankTrace {
  int world_rank = 0;
  bool present = false;
  int group = 0, tp = 0, cp = 0, pp = 0;
  std::optional<std::uint64_t> completed_step;  // every decision of steps <= this one is in the file
  std::uint64_t events = 0;
  std::vector<EventRow> event_rows;
  std::vector<DecisionRow> decisions;
  std::vector<FaultRow> faults;
  std::vector<RequestRow> requests;
  std::vector<StepRow> steps;  // serving loop only
  std::map<std::string, std::uint64_t> ops;  // event counts by op
};

struct RunTrace {
  std::string run_file;  // path of run.h5
  std::shared_ptr<TraceStrings> strings = std::make_shared<TraceStrings>();  // the rows' strings
  std::map<std::string, h5::AttrValue> meta;
  std::optional<std::map<std::string, h5::AttrValue>> summary;  // absent: not a clean end
  std::vector<RankSummaryRow> summary_ranks;
  std::vector<RankTrace> ranks;

  std::string meta_string(const std::string& k) const;
  std::int64_t meta_int(const std::string& k) const;
};

// `run` is a run directory or its run.h5. Throws InputError when it is not a readable kvgrid run.
RunTrace read_run(const std::string& run);

}  // namespace kvgrid
