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
// Hybrid models: the objects of one component kind — FULL pages, SWA window pages, MAMBA states —
// each kind in a namespace of its own (the model's layer kinds in its identity; SWA's and MAMBA's
// own object layouts). Chunks are cut on the same grid of model-global layer ranges and head
// groups as full attention's, and hold only that kind's layers of the range: their spans count
// layers of the kind's own pool (a range without a layer of the kind has no object).
cache::KvNamespace component_namespace(const ExperimentConfig& exp, LayerKind kind);
cache::UnifiedPlan unified_component_plan(const ExperimentConfig& exp, const ModelGeometry& geo, LayerKind kind);
// The draft model's (speculative decoding): a namespace of its own — the draft's identity tied to
// its target's, one layer range (the draft lives on one stage), the target's head grid — so packed
// and sidecar deployments of any compatible layout share the draft's objects. `draft_geo`: the
// last stage's ModelGeometry::draft_for_rank.
cache::KvNamespace draft_storage_namespace(const ExperimentConfig& exp);
cache::UnifiedPlan unified_draft_plan(const ExperimentConfig& exp, const ModelGeometry& draft_geo);
// A hybrid target's draft: one namespace per component kind of the draft (its layer kinds and the
// target's kinds in its identity), the chunks holding that kind's draft layers — as
// unified_component_plan does for the target. A FULL-only draft: its FULL plan is
// unified_draft_plan's (the other kinds have none).
cache::UnifiedPlan unified_draft_component_plan(const ExperimentConfig& exp, const ModelGeometry& draft_geo, LayerKind kind);
// A hybrid model's sidecar ([[model.sidecar]]): its words per source slot are split neither by
// layer nor by head, so each is one object per page in a namespace of its own (the sidecar's name,
// source and width tied to its source's component namespace), replicated (no head group).
cache::UnifiedPlan unified_sidecar_plan(const ExperimentConfig& exp, const SidecarConfig& sidecar);
// cache.storage_key_scheme and its keys against the rest of the experiment: InputError naming
// `src`, the keys and the numbers (the first rank of a group that does not align, and why).
void check_storage_keys(const ExperimentConfig& exp, const std::string& src);

}  // namespace kvgrid
