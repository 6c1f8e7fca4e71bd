// The `requests` table rows of the serving loop (runtime/trace.hpp's RequestRow) for a finished
// request and for one that failed.
#pragma once

#include <cstdint>

#include "runtime/scheduler.hpp"
#include "runtime/trace.hpp"

namespace kvgrid {

// `pd_decode`: a P/D decode rank's row (the prompt tokens it did not hold came from prefill).
RequestRow finished_row(const ServeRequest& r, bool pd_decode);
// `reason`: 1 aborted, 2 its P/D transfer broke; `now_ns` is when.
RequestRow failed_row(const ServeRequest& r, std::int32_t reason, std::uint64_t now_ns);

}  // namespace kvgrid
