// `kvgrid timeline`: a run's trace as Chrome/Perfetto trace events (the JSON object format:
// {"traceEvents": [...]}, times in microseconds of the modelled clock).
//
//   pid = world rank ("rank R (pp P, cp C, tp T)"); tid 0 = the scheduler loop, 1 = device→host
//   copies, 2 = host→device copies, 3 = storage reads;
//   copies are slices from their modelled start to end (simulated engine; real copies have no
//   modelled times and are left out); consumed write ACKs, finishes, aborts, checks, stalls and
//   faults are instants on tid 0; each stage-to-stage step message (activation, arrivals and the
//   pp_sync counts) is a flow arrow from the sender's "pp_send" to the receiver's "pp_recv".
#pragma once

#include <nlohmann/json.hpp>

#include "runtime/trace_reader.hpp"

namespace kvgrid {

nlohmann::json timeline_json(const RunTrace& run);

}  // namespace kvgrid
