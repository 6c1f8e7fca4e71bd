// The `unified` storage key scheme (cache.storage_key_scheme = unified): storage objects that any
// deployment of the same model with a compatible layout can read, whatever its TP × PP split.
//
// Each token page is cut on a grid shared by every deployment: layer ranges of
// `layer_partition` layers (0: this rank's own range) × groups of `head_group` KV heads (0: this
// rank's own heads). One object per (page, layer range, head group), named
//
//   {page_hash}_{namespace_digest}_L{first}-{last}[_H{group}]
//
// with model-global layer bounds (inclusive) and the group's index among all KV heads (no `_H`
// for MLA, whose one latent is replicated over TP). The namespace digest — "ukv1-" and the first
// 16 hex digits of SHA-256 over the namespace's fields — covers the model, the logical KV dtype
// (payload and element count), page size, replication mode, the partition grid, the object
// layout and a tenant name, so deployments that differ in any of them never share an object
// (bug catalogue #26). A rank is aligned when its layer slice and its heads are unions of whole
// chunks; one that is not is refused at start-up with the keys and numbers.
//
// Objects are immutable: a page's object has the same bytes whoever writes it, so writers of one
// object only race to rename identical files into place.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "cache/page_hash.hpp"
#include "kernels/relayout.hpp"

namespace kvgrid::cache {

struct KvNamespace {
  static constexpr int kSchemaVersion = 1;
  static constexpr const char* kObjectLayout = "page-unified-v1";
  std::string model_id;             // the model's identity (layers, heads, head dim, attention)
  std::string dtype;                // logical KV element type and payload ("u64-full", "u64-digest")
  std::uint64_t page_size = 0;
  bool rank_replicated = false;     // MLA: one latent for every TP rank
  std::uint64_t total_kv_heads = 0;  // 0 when replicated
  std::uint64_t layer_partition = 0;  // layers per chunk (0: each rank's own range)
  std::uint64_t head_group = 0;       // KV heads per chunk (0 when replicated)
  std::string object_layout = kObjectLayout;
  std::string tenant;               // cache.storage_namespace (tenants never read each other's)
};

// The fields in a fixed order, one "name=value" line each (what the digest hashes; printed by
// `kvgrid inspect`-style tools and tests).
std::string canonical_text(const KvNamespace& ns);
// "ukv1-" + 16 lowercase hex digits.
std::string namespace_digest(const KvNamespace& ns);

// One object of a rank's page: model-global bounds, and where it sits in this rank's pool.
struct UnifiedChunk {
  std::uint64_t layer_first = 0, layer_last = 0;  // inclusive, model-global
  std::optional<std::uint64_t> head_group;        // nullopt: replicated (MLA)
  kernels::ChunkSpan local;                       // this rank's local layers and heads
  std::string suffix;                             // "_{digest}_L{first}-{last}[_H{g}]"
};

struct UnifiedPlan {
  KvNamespace ns;  // with 0-defaults resolved (head_group: the rank's heads)
  std::string digest;
  std::vector<UnifiedChunk> chunks;  // layer-major, head-minor
};

// A rank's objects: its layers [layer_begin, layer_end) of `total_layers`, its KV heads (global
// ids, contiguous). Throws InputError naming the keys and numbers when the rank is not aligned
// with the grid or the grid is invalid.
UnifiedPlan plan_unified_kv(KvNamespace ns, std::uint64_t total_layers, std::uint64_t layer_begin, std::uint64_t layer_end,
                            std::span<const std::uint32_t> heads);

std::string unified_key(const PageDigest& page, const UnifiedChunk& c);

}  // namespace kvgrid::cache
