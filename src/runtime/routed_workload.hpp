// Buckets by context length: one workload served by several jobs at once, each job taking the
// requests whose prompt length falls in its range (workload.route_min_prompt/route_max_prompt) —
// the way production routes a conversation to a short-context deployment first and to a
// long-context one (another parallel layout) once its history has grown. The jobs meet in the
// shared store (cache.storage_shared): the long bucket reads the KV the short bucket wrote as
// unified objects (cache/unified_kv.hpp).
//
// Every job generates the whole workload from the same seed and keeps its bucket's requests.
// A closed-loop follow-up (the next turn) arrives only after its predecessor finished, also when
// another job served the predecessor: the job that finishes a request creates the marker
// `<route_dir>/done-<id>`; a job holding a follow-up of a request routed elsewhere finishes that
// request in its own workload when the marker appears (polled at each step; when nothing else can
// happen, PP0's leader waits for it, up to workload.route_wait_s of wall time, then goes on as if
// it had finished and says so). Runs are not reproducible (the other job's progress decides when
// follow-ups arrive and which objects exist), which the run header says.
#pragma once

#include <memory>

#include "runtime/serve_workload.hpp"

namespace kvgrid {

std::unique_ptr<ServeWorkload> route_by_length(std::unique_ptr<ServeWorkload> all, const WorkloadConfig& cfg);

}  // namespace kvgrid
