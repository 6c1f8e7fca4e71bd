// Relayout between a KV pool's page layout and the unified storage layout (cache/unified_kv.hpp):
// the kernel that packs selected pages into object order on backup and unpacks them on restore.
//
//   pool   (full)  : [row][layer][head][slot][dim]           (kv_kernels.hpp)
//   object (full)  : [layer in chunk][slot][head in group][dim]   — "page-unified-v1": one layer's
//                    values for every token and head of the group together, then the next layer,
//                    so a layer range of a head group is one contiguous span of the object
//   pool / object (digest): [layer][head] / [layer in chunk][head in group] (one fold per page,
//                    layer and head: there is no slot axis)
// A chunk is a range of this pool's local layers × a range of its local heads. The staging buffer
// holds, for each listed row in turn, that row's chunks' objects one after another.
// `kokkos` = false runs the same element mapping as a plain loop: for storage worker threads
// (Kokkos' Serial backend launches only from the scheduler thread).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kernels/kv_kernels.hpp"

namespace kvgrid::kernels {

struct ChunkSpan {
  std::size_t layer0 = 0, layers = 0;  // local layers [layer0, layer0 + layers)
  std::size_t head0 = 0, heads = 0;    // local heads [head0, head0 + heads)
};

// Words of one chunk's object for one page.
std::size_t object_words(const PageLayout& g, bool digest, const ChunkSpan& c);

// staging[i * Σ object_words + offset of chunk j + …] ← pool row rows[i], chunk j.
void pack_objects(const PageLayout& g, bool digest, const std::uint64_t* pool, std::span<const std::uint32_t> rows,
                  std::span<const ChunkSpan> chunks, std::uint64_t* staging, bool kokkos = true);
// The inverse: pool rows ← staging (only the chunks' words of each row are written).
void unpack_objects(const PageLayout& g, bool digest, std::uint64_t* pool, std::span<const std::uint32_t> rows,
                    std::span<const ChunkSpan> chunks, const std::uint64_t* staging, bool kokkos = true);

// page_unified pools (cache.host_layout = page_unified): a row holds the page's chunks' objects one
// after another, so a storage object is the row's words at an offset — no pack on backup, no
// unpack on read. A copy between such a row and a layer-first row ([layer][head][slot][dim]) moves,
// for each local layer, the runs that are contiguous on both sides: `block` is the run's first
// word within the layer-first (page, layer) block, `row` within the page_unified row. The runs are
// ordered by `block`, adjacent runs merged, and cover the block exactly once (else an error: the
// chunks do not tile the layer's heads). One run per chunk and layer in digest mode and with one
// head per group; with larger groups one per (head, slot): the transpose a relayout copy pays.
struct LayerRun {
  std::size_t block = 0, row = 0, words = 0;
};
std::vector<LayerRun> layer_runs(const PageLayout& g, bool digest, std::span<const ChunkSpan> chunks, std::size_t layer);

// Recurrent (MAMBA) states: a state slot is [layer][head][word] over this rank's MAMBA layers and
// heads (cache/state_pool.hpp); a chunk's object is [layer in chunk][head in group][word], the
// chunks of a slot one after another in `staging`. Plain loops: a state is a few words per head.
std::size_t state_object_words(std::size_t words, const ChunkSpan& c);
void pack_state_objects(std::span<const std::uint64_t> slot, std::size_t heads, std::size_t words,
                        std::span<const ChunkSpan> chunks, std::uint64_t* staging);
void unpack_state_objects(std::span<std::uint64_t> slot, std::size_t heads, std::size_t words,
                          std::span<const ChunkSpan> chunks, const std::uint64_t* staging);

}  // namespace kvgrid::kernels
