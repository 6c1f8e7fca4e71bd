// protocol.component_boundary — which components a pipeline stage's tree keeps for a hybrid
// model whose stages hold different layer kinds (one stage only full and SWA layers, another only
// full and MAMBA layers).
//
// Invariant: every stage's tree keeps every component of the whole model — its values, locks,
// tombstones and pool accounting, identical on every stage (logical state) — while only the
// stage holding a kind's layers keeps their bytes (its SWA pool, its states). So every stage
// accepts the same reuse boundary, makes the same tombstones and evictions, and schedules the
// same batch (the stages' tree digests and decision logs agree).
//
//   whole_model       (correct) every component of the model, on every stage.
//   local_components  (buggy) a stage keeps, and votes with, only the components of its own
//                     layers: a stage without SWA layers accepts boundaries whose window is a
//                     tombstone, a stage without MAMBA layers boundaries with no state, so the
//                     stages reuse different prefixes — a shape mismatch or a divergence.
#pragma once

#include <string>
#include <vector>

namespace kvgrid::protocols {

const std::vector<std::string>& component_boundary_variants();

// Whether this stage's tree keeps a component of kind `in_model` (the model has such layers) when
// the stage itself holds `local` layers of it. Throws InternalError for an unknown variant.
bool stage_keeps_component(const std::string& variant, bool in_model, bool local);

}  // namespace kvgrid::protocols
