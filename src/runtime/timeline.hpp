// `kvgrid timeline`: a run's trace as Chrome/Perfetto trace events (the JSON object format:
// {"traceEvents": [...]}, times in microseconds of the modelled clock), for ui.perfetto.dev or
// chrome://tracing.
//
// One process per rank, "rank R (pp P, cp C, tp T)", with the threads
//   steps        a slice per step (modelled start to end) holding its phases' slices (the phases
//                of runtime/serve_loop.hpp that moved the modelled clock: receive's wait for the
//                previous stage, gather, forward, ...); the step's batch in its args
//   prefill      a slice over the step's forward phase when its batch holds prefill chunks
//   decode       the same for decode entries
//   events       instants: consumed write ACKs, finishes, aborts, checks, stalls, faults, ...; each
//                stage-to-stage step message is a flow arrow from "pp_send" to "pp_recv"
//   d2h, h2d, storage reads, layer gathers   copies as slices from their modelled start to end
//                (simulated engine; real copies have no modelled times and are left out)
// and counters: device pages in use, host pages in use, requests waiting and running.
// One "requests" process holds an async span per request: arrival to finish, with its queued,
// prefill and decode parts. With `wall`, every rank has a second process, "rank R wall clock",
// with the same step and phase slices in wall time (every phase, since each takes wall time).
//
// Large runs: `from`/`to` keep the steps in that window (and the requests that overlap it in
// modelled time); `every` keeps every N-th step's step, phase, batch and counter records.
#pragma once

#include <cstdint>
#include <optional>

#include <nlohmann/json.hpp>

#include "runtime/trace_reader.hpp"

namespace kvgrid {

struct TimelineOptions {
  std::optional<std::uint64_t> from, to;  // step window, inclusive
  std::uint64_t every = 1;                // keep every N-th step's slices and counters
  bool wall = false;                      // add the wall-clock track set
};

nlohmann::json timeline_json(const RunTrace& run, const TimelineOptions& opt = {});

}  // namespace kvgrid
