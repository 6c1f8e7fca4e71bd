// `kvgrid report`: a run's outcome and counters, read only from its trace, as text or JSON.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "runtime/trace_reader.hpp"

namespace kvgrid {

// The JSON report's schema version (docs: tests/cli/report.schema.json): bumped when a field
// changes meaning. 2: digests as hex strings; `hit_rate` by tier replaces `device_hit_rate`;
// SGLang bench_serving names beside kvgrid's; `schema_version`, `kvgrid_version`.
inline constexpr int kReportSchemaVersion = 2;

nlohmann::json report_json(const RunTrace& run);
std::string report_text(const RunTrace& run);

}  // namespace kvgrid
