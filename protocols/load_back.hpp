// protocol.load_back — a host→device load-back is read only once it landed intact on every rank
// that serves the request (DESIGN §4; the load-back half of the tiers' protocols).
//
// Invariant: no rank reads a loaded page whose copy failed on any rank of the request's group,
// and every rank of every stage reuses the same prefix length — a failed load-back is a miss
// everywhere (its positions are recomputed), never data and never a shape mismatch.
//
// A load's failure is known per rank and per layer copy (failpoint transfer.load.fail), and at
// PP > 1 a later stage loads after PP0 has already fixed its batch, so the outcome cannot be
// agreed inside one step. Design chosen: the request is rolled forward by one step, on every
// stage — a load-back is *private* to its request (the tree nodes stay host-only, the new device
// pages are the request's: DeviceCache::set_private_restores) and the request is not scheduled in
// the step that admitted it; the outcome — MIN over every rank of the group of "none of my copies
// failed" — is read at the start of the next step, before that step's schedule: at PP = 1 one MIN
// over the stage then, at PP > 1 a MIN over every stage started at the end of the admitting step
// (the same pipelined agreement as protocol.pd_restore; PP0 waits at most for the last stage to
// finish that step). Intact: published (confirm_restore) and computed on. Broken anywhere: never
// published; the request keeps the pages and computes those positions itself (reason in the
// trace: `load_fail`). An abort landing meanwhile — the copies still in flight — waits for them
// before it frees anything (DeviceCache::abort).
//
// Hybrid models (one stage, HybridCache::set_agreed_loads): the outcome is agreed inside the
// admission instead — the copies land, one MIN over the stage, a broken load-back taken back whole
// on every rank (the nodes stay host-only, the request computes those positions) — so nothing is
// private; across stages that would make a stage wait for the others inside the step: refused.
//
// When no load can fail (transfer.load.fail not configured) the outcome is known to be intact,
// so loads are published at once and read in the step that loaded them, layer by layer — the
// decisions of such runs are those of the plain tiers.
//
//   agreed     (correct) as above.
//   unchecked  (buggy) published at once and read in the same step, the outcome never looked at:
//              a failed copy leaves its pages poisoned (KvPool::poison) — oracle mismatches (the
//              silent wrong-KV class of TensorRT-LLM #8813 / Dynamo #15079, outside P/D).
#pragma once

#include <string>

namespace kvgrid::protocols {

enum class LoadBack { Agreed, Unchecked };
LoadBack parse_load_back(const std::string& name);  // "agreed" | "unchecked"

// Whether load-backs stay private until their outcome is agreed (DeviceCache::set_private_restores).
inline bool private_load_backs(LoadBack variant, bool loads_can_fail) { return variant == LoadBack::Agreed && loads_can_fail; }

}  // namespace kvgrid::protocols
