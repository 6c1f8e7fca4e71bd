// A plain-loop reference of the KV kernels (kernels/kv_kernels.hpp) and the relayout
// (kernels/relayout.hpp), written from kv_math.hpp's definitions without Kokkos: the CUDA tests
// compare the device kernels with it where a GPU exists (bit for bit), and the unit test
// test_kv_reference.cpp compares it with the Kokkos host kernels everywhere — so the device
// kernels are held to the host kernels through it, on a machine with neither tool missing.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kernels/kv_kernels.hpp"
#include "kernels/kv_math.hpp"
#include "kernels/relayout.hpp"

namespace kvgrid::kvref {

using kernels::ChunkSpan;
using kernels::PageLayout;

// A layout with its coefficient tables (owned).
struct Geometry {
  PageLayout g;
  std::vector<std::uint32_t> head_ids;
  std::vector<std::uint64_t> slot_coef, dim_coef;
  Geometry(std::size_t pages, std::size_t layers, std::size_t heads, std::size_t page_size, std::size_t dims,
           std::uint64_t layer_base, std::uint32_t head0) {
    for (std::size_t h = 0; h < heads; ++h) head_ids.push_back(head0 + static_cast<std::uint32_t>(h));
    for (std::size_t s = 0; s < page_size; ++s) slot_coef.push_back(kernels::slot_coeff(s));
    for (std::size_t d = 0; d < dims; ++d) dim_coef.push_back(kernels::dim_coeff(d, dims));
    g.pages = pages, g.layers = layers, g.heads = heads, g.page_size = page_size, g.dims = dims;
    g.layer_base = layer_base;
    g.head_ids = head_ids.data(), g.slot_coef = slot_coef.data(), g.dim_coef = dim_coef.data();
  }
};

inline void write_tokens_full(const PageLayout& g, std::uint64_t* pool, std::span<const std::uint32_t> page,
                              std::span<const std::uint32_t> slot, std::span<const std::uint64_t> F) {
  for (std::size_t i = 0; i < page.size(); ++i)
    for (std::size_t l = 0; l < g.layers; ++l)
      for (std::size_t h = 0; h < g.heads; ++h) {
        const std::uint64_t layer = g.layer_base + l, head = g.head_ids[h];
        for (std::size_t d = 0; d < g.dims; ++d)
          pool[g.full_index(page[i], l, h, slot[i], d)] = kernels::kv_element(F[i], layer, head, d, g.dims);
      }
}

inline void write_tokens_digest(const PageLayout& g, std::uint64_t* pool, std::span<const std::uint32_t> page,
                                std::span<const std::uint32_t> slot, std::span<const std::uint64_t> F) {
  for (std::size_t i = 0; i < page.size(); ++i)
    for (std::size_t l = 0; l < g.layers; ++l)
      for (std::size_t h = 0; h < g.heads; ++h)
        pool[g.digest_index(page[i], l, h)] +=
            kernels::slot_coeff(slot[i]) * F[i] * kernels::kv_coeff(g.layer_base + l, g.head_ids[h]);
}

inline void fold_pages(const PageLayout& g, bool digest, const std::uint64_t* pool, std::span<const std::uint32_t> pages,
                       std::size_t first_index, std::span<std::uint64_t> out) {
  for (std::size_t l = 0; l < g.layers; ++l)
    for (std::size_t h = 0; h < g.heads; ++h)
      for (std::size_t j = 0; j < pages.size(); ++j) {
        std::uint64_t page = 0;
        if (digest) {
          page = pool[g.digest_index(pages[j], l, h)];
        } else {
          for (std::size_t s = 0; s < g.page_size; ++s)
            for (std::size_t d = 0; d < g.dims; ++d)
              page += kernels::slot_coeff(s) * kernels::dim_coeff(d, g.dims) * pool[g.full_index(pages[j], l, h, s, d)];
        }
        out[l * g.heads + h] += kernels::page_coeff(first_index + j) * page;
      }
}

inline void fold_tokens_full(const PageLayout& g, const std::uint64_t* pool, std::span<const std::uint32_t> page,
                             std::span<const std::uint32_t> slot, std::size_t first_pos, std::span<std::uint64_t> out) {
  for (std::size_t i = 0; i < page.size(); ++i)
    for (std::size_t l = 0; l < g.layers; ++l)
      for (std::size_t h = 0; h < g.heads; ++h) {
        std::uint64_t acc = 0;
        for (std::size_t d = 0; d < g.dims; ++d) acc += kernels::dim_coeff(d, g.dims) * pool[g.full_index(page[i], l, h, slot[i], d)];
        // (the page index from the position read at, the slot coefficient from the slot stored in)
        out[(i * g.layers + l) * g.heads + h] = kernels::page_coeff((first_pos + i) / g.page_size) * kernels::slot_coeff(slot[i]) * acc;
      }
}

// The unified layout's object order, written out: for each row, each chunk, [layer][slot][head][dim]
// (full) or [layer][head] (digest).
inline std::vector<std::uint64_t> pack_objects(const PageLayout& g, bool digest, const std::uint64_t* pool,
                                               std::span<const std::uint32_t> rows, std::span<const ChunkSpan> chunks) {
  std::vector<std::uint64_t> out;
  for (auto r : rows)
    for (const auto& c : chunks)
      for (std::size_t l = c.layer0; l < c.layer0 + c.layers; ++l) {
        if (digest) {
          for (std::size_t h = c.head0; h < c.head0 + c.heads; ++h) out.push_back(pool[g.digest_index(r, l, h)]);
          continue;
        }
        for (std::size_t s = 0; s < g.page_size; ++s)
          for (std::size_t h = c.head0; h < c.head0 + c.heads; ++h)
            for (std::size_t d = 0; d < g.dims; ++d) out.push_back(pool[g.full_index(r, l, h, s, d)]);
      }
  return out;
}

}  // namespace kvgrid::kvref
