// How an experiment names its storage objects: the `unified` key scheme's namespace and each
// rank's objects (cache/unified_kv.hpp), checked for every rank of every group when the
// experiment loads, so a layout that does not align with the grid never starts.
#pragma once

#include <string>

#include "cache/unified_kv.hpp"
#include "runtime/experiment.hpp"
#include "runtime/model.hpp"

namespace kvgrid {

// The namespace of this experiment's unified objects (model, dtype, page size, replication,
// grid, tenant).
cache::KvNamespace storage_namespace(const ExperimentConfig& exp);
// A rank's unified objects (throws InputError when the rank does not align).
cache::UnifiedPlan unified_plan(const ExperimentConfig& exp, const ModelGeometry& geo);
// cache.storage_key_scheme and its keys against the rest of the experiment: InputError naming
// `src`, the keys and the numbers (the first rank of a group that does not align, and why).
void check_storage_keys(const ExperimentConfig& exp, const std::string& src);

}  // namespace kvgrid
