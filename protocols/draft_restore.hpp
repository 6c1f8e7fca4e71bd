// model.draft.mode — speculative decoding's draft state follows the target's KV through the tiers.
//
// Invariant: whenever the target's KV of a prefix is reused (matched on the device, loaded back
// from the host, prefetched from storage), the draft model's KV of that prefix is reused with it,
// intact and at the same positions, so the draft reads what it would have computed itself; its
// proposals are then accepted as often as with HiCache off.
//
//   packed       (correct) the draft's layers ride as extra tail layers of the target's host slots
//                and inside its storage objects (the draft's rows must have the target's shape).
//   sidecar      (correct) a draft host pool of its own layout with the target's slot count, and
//                a second storage object per page; copies use the target's host page ids.
//   target_only  (buggy) only the target's KV moves: a restored page's draft rows are empty, the
//                draft reads a blind prefix — draft checksum mismatches against its oracle and an
//                acceptance length that collapses on every restored history (the first article's
//                Figure 3, "HiCache on, draft state lost").
//   none         no draft model.
//
// The cache (cache/draft_state) implements the three layouts — for hybrid models over each kind the
// draft has: FULL pages, SWA pages and recurrent states (DraftStates), moved by the hybrid host tier
// with the target's copies (cache/hybrid_host_tier.hpp HybridDraftBytes); this module chooses one.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "cache/draft_state.hpp"

namespace kvgrid::protocols {

// The variants, "none" first.
const std::vector<std::string>& draft_modes();
// The layout of a variant; nullopt for "none". Throws InternalError for an unknown variant.
std::optional<cache::DraftLayout> draft_layout(const std::string& variant);

}  // namespace kvgrid::protocols
