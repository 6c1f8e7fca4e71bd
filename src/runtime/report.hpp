// `kvgrid report`: a run's outcome and counters, read only from its trace, as text or JSON.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "runtime/trace_reader.hpp"

namespace kvgrid {

nlohmann::json report_json(const RunTrace& run);
std::string report_text(const RunTrace& run);

}  // namespace kvgrid
