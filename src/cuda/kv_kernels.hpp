// The synthetic model's KV kernels and the unified layout's relayout kernel as CUDA kernels: the
// same launchers (names, arguments, meaning) as kernels/kv_kernels.hpp and kernels/relayout.hpp,
// the same arithmetic (kernels/kv_math.hpp, compiled for the device), so every result is bit for
// bit the host kernels' — the CUDA tests compare them.
//
// `pool` and `staging` are device-accessible memory (cuda/device.hpp: device, pinned or scratch);
// the small argument arrays (pages, slots, features, the layout's coefficient tables, `out`) are
// ordinary host memory, copied to and from the device by the launcher. Launchers validate their
// arguments as the host ones do (std::invalid_argument) and return when the kernel has finished.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "kernels/kv_kernels.hpp"
#include "kernels/relayout.hpp"

namespace kvgrid::cuda::kernels {

using kvgrid::kernels::ChunkSpan;
using kvgrid::kernels::PageLayout;

void write_tokens_full(const PageLayout& g, std::uint64_t* pool, std::span<const std::uint32_t> page,
                       std::span<const std::uint32_t> slot, std::span<const std::uint64_t> F);
void write_tokens_digest(const PageLayout& g, std::uint64_t* pool, std::span<const std::uint32_t> page,
                         std::span<const std::uint32_t> slot, std::span<const std::uint64_t> F);
void fold_pages_full(const PageLayout& g, const std::uint64_t* pool, std::span<const std::uint32_t> pages,
                     std::size_t first_index, std::span<std::uint64_t> out, std::size_t layer_begin = 0,
                     std::size_t layer_end = ~std::size_t{0});
void fold_pages_digest(const PageLayout& g, const std::uint64_t* pool, std::span<const std::uint32_t> pages,
                       std::size_t first_index, std::span<std::uint64_t> out, std::size_t layer_begin = 0,
                       std::size_t layer_end = ~std::size_t{0});
void fold_tokens_full(const PageLayout& g, const std::uint64_t* pool, std::span<const std::uint32_t> page,
                      std::span<const std::uint32_t> slot, std::size_t first_pos, std::span<std::uint64_t> out);

// Unified layout (kernels/relayout.hpp): pool rows → staging in object order, and back.
void pack_objects(const PageLayout& g, bool digest, const std::uint64_t* pool, std::span<const std::uint32_t> rows,
                  std::span<const ChunkSpan> chunks, std::uint64_t* staging);
void unpack_objects(const PageLayout& g, bool digest, std::uint64_t* pool, std::span<const std::uint32_t> rows,
                    std::span<const ChunkSpan> chunks, const std::uint64_t* staging);

// The page gather: dst row dst_rows[i] ← src row src_rows[i], rows of `row_bytes` bytes (one block
// per row). A CP layer gather's send buffer is such a gather of the owner's pages.
void gather_rows(void* dst, const void* src, std::span<const std::uint32_t> dst_rows,
                 std::span<const std::uint32_t> src_rows, std::size_t row_bytes);

}  // namespace kvgrid::cuda::kernels
