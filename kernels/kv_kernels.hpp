// Kokkos kernels over KV page storage (a flat uint64 array). Layout helpers are named after the
// memory layout they implement:
//   full   : [page][layer][head][slot][dim]   (page_size slots of `dims` elements)
//   digest : [page][layer][head]              (one word: the slot-weighted fold of the page's tokens)
// Folds bind every value to its coordinates (kv_math.hpp): elements by w(d), slots by P(s), the
// k-th page of a page table by Q(k) — `first_index` is the page-table index of the first page
// listed, `first_pos` the position of the first token listed.
// Launchers validate their arguments before launching (KVGRID_CHECK). Kernels launch only from
// the scheduler thread (Kokkos' Serial backend is not thread-safe).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace kvgrid::kernels {

struct PageLayout {
  std::size_t pages = 0;       // rows in the pool, including the padding page 0
  std::size_t layers = 0;      // layers held by this rank (a contiguous PP slice)
  std::size_t heads = 0;       // KV heads held by this rank
  std::size_t page_size = 0;   // token slots per page
  std::size_t dims = 0;        // elements per head (full mode)
  std::uint64_t layer_base = 0;               // global id of local layer 0
  const std::uint32_t* head_ids = nullptr;    // global id of each local head
  const std::uint64_t* slot_coef = nullptr;   // P(s) for s < page_size
  const std::uint64_t* dim_coef = nullptr;    // w(d) for d < dims
  const std::uint64_t* kv_coef = nullptr;     // optional: kv_coeff of (local layer l, local head h) at l * heads + h

  std::size_t full_words() const { return pages * layers * heads * page_size * dims; }
  std::size_t digest_words() const { return pages * layers * heads; }
  std::size_t full_index(std::size_t page, std::size_t l, std::size_t h, std::size_t slot, std::size_t d) const {
    return (((page * layers + l) * heads + h) * page_size + slot) * dims + d;
  }
  std::size_t digest_index(std::size_t page, std::size_t l, std::size_t h) const { return (page * layers + l) * heads + h; }
};

// Writes token i's KV (feature F[i]) into (page[i], slot[i]) for every local layer and head.
void write_tokens_full(const PageLayout& g, std::uint64_t* pool, std::span<const std::uint32_t> page,
                       std::span<const std::uint32_t> slot, std::span<const std::uint64_t> F);
void write_tokens_digest(const PageLayout& g, std::uint64_t* pool, std::span<const std::uint32_t> page,
                         std::span<const std::uint32_t> slot, std::span<const std::uint64_t> F);

// out[l * heads + h] += fold over the listed whole pages, pages[j] read as page-table entry
// first_index + j. Folds of local layers [layer_begin, layer_end) only (default: all) — a
// layer-wise reader.
void fold_pages_full(const PageLayout& g, const std::uint64_t* pool, std::span<const std::uint32_t> pages,
                     std::size_t first_index, std::span<std::uint64_t> out, std::size_t layer_begin = 0,
                     std::size_t layer_end = ~std::size_t{0});
void fold_pages_digest(const PageLayout& g, const std::uint64_t* pool, std::span<const std::uint32_t> pages,
                       std::size_t first_index, std::span<std::uint64_t> out, std::size_t layer_begin = 0,
                       std::size_t layer_end = ~std::size_t{0});

// out[(i * layers + l) * heads + h] = fold of token i as stored at (page[i], slot[i]), read as
// position first_pos + i.
void fold_tokens_full(const PageLayout& g, const std::uint64_t* pool, std::span<const std::uint32_t> page,
                      std::span<const std::uint32_t> slot, std::size_t first_pos, std::span<std::uint64_t> out);

}  // namespace kvgrid::kernels
