// protocol.pd — what a P/D decode group receives from prefill for each request.
//
// Invariant: decode holds the request's whole prompt KV before its first decode step, and every
// position it did not receive it holds itself, intact, at the right place (its own prefix cache —
// device, host or storage — matched and, where needed, restored under protocol.pd_restore).
//
//   decode_reuse   (the article's design) decode matches its own tree at admission and answers
//                  prefill with decode_prefix_len (page-aligned, agreed over decode's stage);
//                  prefill sends only the suffix beyond it — the first article's Figure 5: 4K of
//                  a 12K prompt received, 8K reused.
//   full_transfer  (baseline, not a bug) decode reuses nothing and receives every prompt whole —
//                  what the `pd` figure compares decode_reuse against.
// Hybrid models: decode_prefix_len is decode's hybrid match (a boundary every component accepts
// there); FULL layers receive [decode_prefix_len, prompt), SWA layers only the prompt's tail
// window (cache::pd_swa_from), MAMBA layers the state at the prompt's end (docs/hybrid.md).
#pragma once

#include <string>

namespace kvgrid::protocols {

// Whether decode reuses its own cache (decode_reuse) or receives every prompt whole. Throws
// InternalError for a variant the schema does not allow.
bool pd_decode_reuse(const std::string& variant);

}  // namespace kvgrid::protocols
