#include "kernels/relayout.hpp"

#include <algorithm>
#include <vector>

#include <Kokkos_Core.hpp>

#include "core/check.hpp"

namespace kvgrid::kernels {

namespace {
using Exec = Kokkos::DefaultHostExecutionSpace;

constexpr std::size_t kMaxChunks = 64;  // chunks of one rank's page (a fixed table the kernel can capture)

// What the kernel captures: the geometry, each chunk and its word offset within a row's objects.
struct Plan {
  std::size_t layers = 0, heads = 0, page_size = 0, dims = 0;
  bool digest = false;
  std::size_t count = 0, row_words = 0;
  ChunkSpan chunk[kMaxChunks];
  std::size_t offset[kMaxChunks + 1];

  // Pool word (within the pool, given the row) of word w of a row's objects.
  KOKKOS_INLINE_FUNCTION std::size_t pool_index(std::uint32_t row, std::size_t w) const {
    std::size_t j = 0;
    while (offset[j + 1] <= w) ++j;
    const ChunkSpan& c = chunk[j];
    std::size_t r = w - offset[j];
    if (digest) {  // [layer in chunk][head in group]
      const std::size_t h = r % c.heads, l = r / c.heads;
      return (row * layers + c.layer0 + l) * heads + c.head0 + h;
    }
    const std::size_t d = r % dims;
    r /= dims;
    const std::size_t h = r % c.heads;
    r /= c.heads;
    const std::size_t s = r % page_size, l = r / page_size;
    return (((row * layers + c.layer0 + l) * heads + c.head0 + h) * page_size + s) * dims + d;
  }
};

Plan make_plan(const PageLayout& g, bool digest, std::span<const std::uint32_t> rows, std::span<const ChunkSpan> chunks) {
  KVGRID_CHECK(g.layers > 0 && g.heads > 0 && g.page_size > 0 && g.dims > 0, "relayout: bad page layout");
  KVGRID_CHECK(!chunks.empty() && chunks.size() <= kMaxChunks, "relayout: ", chunks.size(), " chunks (1 to ", kMaxChunks, ")");
  Plan p;
  p.layers = g.layers;
  p.heads = g.heads;
  p.page_size = g.page_size;
  p.dims = g.dims;
  p.digest = digest;
  p.count = chunks.size();
  p.offset[0] = 0;
  for (std::size_t j = 0; j < chunks.size(); ++j) {
    const ChunkSpan& c = chunks[j];
    KVGRID_CHECK(c.layers > 0 && c.heads > 0 && c.layer0 + c.layers <= g.layers && c.head0 + c.heads <= g.heads,
                 "relayout: chunk ", j, " (layers ", c.layer0, "+", c.layers, ", heads ", c.head0, "+", c.heads,
                 ") outside a pool of ", g.layers, " layers and ", g.heads, " heads");
    p.chunk[j] = c;
    p.offset[j + 1] = p.offset[j] + object_words(g, digest, c);
  }
  p.row_words = p.offset[chunks.size()];
  for (auto r : rows) KVGRID_CHECK(r >= 1 && r < g.pages, "relayout: row ", r, " outside a pool of ", g.pages, " rows");
  return p;
}
}  // namespace

std::size_t object_words(const PageLayout& g, bool digest, const ChunkSpan& c) {
  return digest ? c.layers * c.heads : c.layers * g.page_size * c.heads * g.dims;
}

void pack_objects(const PageLayout& g, bool digest, const std::uint64_t* pool, std::span<const std::uint32_t> rows,
                  std::span<const ChunkSpan> chunks, std::uint64_t* staging, bool kokkos) {
  if (rows.empty()) return;
  const Plan p = make_plan(g, digest, rows, chunks);
  const std::size_t n = rows.size() * p.row_words;
  const std::uint32_t* r = rows.data();
  auto body = [p, r, pool, staging](const std::size_t k) {
    staging[k] = pool[p.pool_index(r[k / p.row_words], k % p.row_words)];
  };
  if (!kokkos) {
    for (std::size_t k = 0; k < n; ++k) body(k);
    return;
  }
  Kokkos::parallel_for("kvgrid::pack_objects", Kokkos::RangePolicy<Exec>(0, n), body);
  Kokkos::fence();
}

void unpack_objects(const PageLayout& g, bool digest, std::uint64_t* pool, std::span<const std::uint32_t> rows,
                    std::span<const ChunkSpan> chunks, const std::uint64_t* staging, bool kokkos) {
  if (rows.empty()) return;
  const Plan p = make_plan(g, digest, rows, chunks);
  const std::size_t n = rows.size() * p.row_words;
  const std::uint32_t* r = rows.data();
  auto body = [p, r, pool, staging](const std::size_t k) {
    pool[p.pool_index(r[k / p.row_words], k % p.row_words)] = staging[k];
  };
  if (!kokkos) {
    for (std::size_t k = 0; k < n; ++k) body(k);
    return;
  }
  Kokkos::parallel_for("kvgrid::unpack_objects", Kokkos::RangePolicy<Exec>(0, n), body);
  Kokkos::fence();
}

std::vector<LayerRun> layer_runs(const PageLayout& g, bool digest, std::span<const ChunkSpan> chunks, std::size_t layer) {
  const std::size_t S = digest ? 1 : g.page_size, D = digest ? 1 : g.dims;  // digest: one word per head
  std::vector<LayerRun> runs;
  std::size_t offset = 0;  // the chunk's first word in the row
  for (const ChunkSpan& c : chunks) {
    KVGRID_CHECK(c.layers > 0 && c.heads > 0 && c.layer0 + c.layers <= g.layers && c.head0 + c.heads <= g.heads,
                 "page_unified layout: chunk (layers ", c.layer0, "+", c.layers, ", heads ", c.head0, "+", c.heads,
                 ") outside a pool of ", g.layers, " layers and ", g.heads, " heads");
    if (layer >= c.layer0 && layer < c.layer0 + c.layers)
      for (std::size_t h = 0; h < c.heads; ++h)
        for (std::size_t s = 0; s < S; ++s)  // object: [layer in chunk][slot][head in group][dim]
          runs.push_back({((c.head0 + h) * S + s) * D, offset + (((layer - c.layer0) * S + s) * c.heads + h) * D, D});
    offset += object_words(g, digest, c);
  }
  std::sort(runs.begin(), runs.end(), [](const LayerRun& a, const LayerRun& b) { return a.block < b.block; });
  std::vector<LayerRun> merged;
  std::size_t next = 0;  // the block word the next run must start at
  for (const LayerRun& r : runs) {
    KVGRID_CHECK(r.block == next, "page_unified layout: the chunks do not tile local layer ", layer, "'s ", g.heads,
                 " heads (block word ", next, " is ", r.block < next ? "covered twice" : "not covered", ")");
    if (!merged.empty() && merged.back().row + merged.back().words == r.row) merged.back().words += r.words;
    else merged.push_back(r);
    next = r.block + r.words;
  }
  KVGRID_CHECK(next == g.heads * S * D, "page_unified layout: the chunks do not tile local layer ", layer, "'s ", g.heads,
               " heads (they cover ", next, " of its ", g.heads * S * D, " words)");
  return merged;
}

std::size_t state_object_words(std::size_t words, const ChunkSpan& c) { return c.layers * c.heads * words; }

namespace {
// Calls f(slot word, staging word, count) for each contiguous run: one layer's heads of a chunk.
template <typename F>
void for_state_runs(std::size_t slot_words, std::size_t heads, std::size_t words, std::span<const ChunkSpan> chunks, F f) {
  std::size_t at = 0;
  for (const ChunkSpan& c : chunks) {
    KVGRID_CHECK(c.head0 + c.heads <= heads && (c.layer0 + c.layers) * heads * words <= slot_words,
                 "state relayout: chunk (layers ", c.layer0, "+", c.layers, ", heads ", c.head0, "+", c.heads,
                 ") outside a slot of ", slot_words, " words (", heads, " heads x ", words, " words)");
    for (std::size_t l = 0; l < c.layers; ++l) {
      f(((c.layer0 + l) * heads + c.head0) * words, at, c.heads * words);
      at += c.heads * words;
    }
  }
}
}  // namespace

void pack_state_objects(std::span<const std::uint64_t> slot, std::size_t heads, std::size_t words,
                        std::span<const ChunkSpan> chunks, std::uint64_t* staging) {
  for_state_runs(slot.size(), heads, words, chunks,
                 [&](std::size_t s, std::size_t o, std::size_t n) { std::copy_n(slot.data() + s, n, staging + o); });
}

void unpack_state_objects(std::span<std::uint64_t> slot, std::size_t heads, std::size_t words,
                          std::span<const ChunkSpan> chunks, const std::uint64_t* staging) {
  for_state_runs(slot.size(), heads, words, chunks,
                 [&](std::size_t s, std::size_t o, std::size_t n) { std::copy_n(staging + o, n, slot.data() + s); });
}

}  // namespace kvgrid::kernels
