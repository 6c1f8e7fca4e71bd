#include "kv_kernels.hpp"

#include <algorithm>
#include <vector>

#include <Kokkos_Core.hpp>

#include "core/check.hpp"
#include "kv_math.hpp"

namespace kvgrid::kernels {

namespace {
using Exec = Kokkos::DefaultHostExecutionSpace;

void check_layout(const PageLayout& g) {
  KVGRID_CHECK(g.layers > 0 && g.heads > 0 && g.page_size > 0 && g.dims > 0 && g.head_ids != nullptr &&
                   g.slot_coef != nullptr && g.dim_coef != nullptr,
               "bad page layout: layers ", g.layers, " heads ", g.heads, " page_size ", g.page_size, " dims ", g.dims);
}
void check_pages(const PageLayout& g, std::span<const std::uint32_t> pages) {
  for (auto p : pages) KVGRID_CHECK(p >= 1 && p < g.pages, "page ", p, " outside a pool of ", g.pages, " rows");
}
}  // namespace

void write_tokens_full(const PageLayout& g, std::uint64_t* pool, std::span<const std::uint32_t> page,
                       std::span<const std::uint32_t> slot, std::span<const std::uint64_t> F) {
  check_layout(g);
  KVGRID_CHECK(page.size() == slot.size() && page.size() == F.size(), "write_tokens_full: ", page.size(), " pages, ",
               slot.size(), " slots, ", F.size(), " features");
  check_pages(g, page);
  for (auto s : slot) KVGRID_CHECK(s < g.page_size, "slot ", s, " >= page_size ", g.page_size);
  const std::size_t n = page.size() * g.layers * g.heads;
  Kokkos::parallel_for(
      "kvgrid::write_tokens_full", Kokkos::RangePolicy<Exec>(0, n), KOKKOS_LAMBDA(const std::size_t k) {
        const std::size_t h = k % g.heads, l = (k / g.heads) % g.layers, i = k / (g.heads * g.layers);
        const std::uint64_t layer = g.layer_base + l, head = g.head_ids[h];
        std::uint64_t* v = pool + g.full_index(page[i], l, h, slot[i], 0);
        std::uint64_t rest = 0;
        for (std::size_t d = 0; d + 1 < g.dims; ++d) {
          v[d] = kv_element(F[i], layer, head, d, g.dims);
          rest += g.dim_coef[d] * v[d];
        }
        v[g.dims - 1] = F[i] * kv_coeff(layer, head) - rest;
      });
  Kokkos::fence();
}

void write_tokens_digest(const PageLayout& g, std::uint64_t* pool, std::span<const std::uint32_t> page,
                         std::span<const std::uint32_t> slot, std::span<const std::uint64_t> F) {
  check_layout(g);
  KVGRID_CHECK(page.size() == F.size() && page.size() == slot.size(), "write_tokens_digest: ", page.size(), " pages, ",
               slot.size(), " slots, ", F.size(), " features");
  check_pages(g, page);
  for (auto s : slot) KVGRID_CHECK(s < g.page_size, "slot ", s, " >= page_size ", g.page_size);
  // Consecutive tokens of one page are summed first — Σ P(s) F, the same for every layer and head
  // — then one work item per (layer, head) owns that word of every page (no atomics) and adds
  // coef × Σ P(s) F (= Σ coef × P(s) F) per run of tokens.
  // (The runs' buffers are kept between calls: a decode step writes one token, and allocating for
  // it cost more than the write.)
  static thread_local std::vector<std::uint32_t> run_page;
  static thread_local std::vector<std::uint64_t> run_sum;
  run_page.clear();
  run_sum.clear();
  for (std::size_t i = 0; i < page.size();) {
    const std::uint32_t p = page[i];
    std::uint64_t sum = 0;
    for (; i < page.size() && page[i] == p; ++i) sum += g.slot_coef[slot[i]] * F[i];
    run_page.push_back(p);
    run_sum.push_back(sum);
  }
  const std::uint32_t* rp = run_page.data();
  const std::uint64_t* rs = run_sum.data();
  const std::size_t runs = run_page.size();
  // (One work item per layer owning its heads' words: a decode step writes one token, and a division
  // per (layer, head) item cost more than the write.)
  Kokkos::parallel_for(
      "kvgrid::write_tokens_digest", Kokkos::RangePolicy<Exec>(0, g.layers), KOKKOS_LAMBDA(const std::size_t l) {
        for (std::size_t h = 0; h < g.heads; ++h) {
          const std::size_t k = l * g.heads + h;
          const std::uint64_t coef = g.kv_coef ? g.kv_coef[k] : kv_coeff(g.layer_base + l, g.head_ids[h]);
          for (std::size_t r = 0; r < runs; ++r) pool[g.digest_index(rp[r], l, h)] += rs[r] * coef;
        }
      });
  Kokkos::fence();
}

void fold_pages_full(const PageLayout& g, const std::uint64_t* pool, std::span<const std::uint32_t> pages,
                     std::size_t first_index, std::span<std::uint64_t> out, std::size_t layer_begin, std::size_t layer_end) {
  layer_end = std::min(layer_end, g.layers);
  check_layout(g);
  check_pages(g, pages);
  KVGRID_CHECK(out.size() == g.layers * g.heads, "fold output of ", out.size(), " words");
  Kokkos::parallel_for(
      "kvgrid::fold_pages_full", Kokkos::RangePolicy<Exec>(layer_begin * g.heads, layer_end * g.heads), KOKKOS_LAMBDA(const std::size_t k) {
        const std::size_t h = k % g.heads, l = k / g.heads;
        std::uint64_t acc = 0;
        for (std::size_t j = 0; j < pages.size(); ++j) {
          const std::uint64_t* v = pool + g.full_index(pages[j], l, h, 0, 0);
          std::uint64_t page = 0;
          for (std::size_t s = 0; s < g.page_size; ++s, v += g.dims) {
            std::uint64_t tok = 0;
            for (std::size_t d = 0; d < g.dims; ++d) tok += g.dim_coef[d] * v[d];
            page += g.slot_coef[s] * tok;
          }
          acc += page_coeff(first_index + j) * page;
        }
        out[k] += acc;
      });
  Kokkos::fence();
}

void fold_pages_digest(const PageLayout& g, const std::uint64_t* pool, std::span<const std::uint32_t> pages,
                       std::size_t first_index, std::span<std::uint64_t> out, std::size_t layer_begin, std::size_t layer_end) {
  layer_end = std::min(layer_end, g.layers);
  check_layout(g);
  check_pages(g, pages);
  KVGRID_CHECK(out.size() == g.layers * g.heads, "fold output of ", out.size(), " words");
  Kokkos::parallel_for(
      "kvgrid::fold_pages_digest", Kokkos::RangePolicy<Exec>(layer_begin * g.heads, layer_end * g.heads), KOKKOS_LAMBDA(const std::size_t k) {
        const std::size_t h = k % g.heads, l = k / g.heads;
        std::uint64_t acc = 0;
        for (std::size_t j = 0; j < pages.size(); ++j) acc += page_coeff(first_index + j) * pool[g.digest_index(pages[j], l, h)];
        out[k] += acc;
      });
  Kokkos::fence();
}

void fold_tokens_full(const PageLayout& g, const std::uint64_t* pool, std::span<const std::uint32_t> page,
                      std::span<const std::uint32_t> slot, std::size_t first_pos, std::span<std::uint64_t> out) {
  check_layout(g);
  check_pages(g, page);
  KVGRID_CHECK(page.size() == slot.size() && out.size() == page.size() * g.layers * g.heads, "fold_tokens_full sizes");
  for (auto s : slot) KVGRID_CHECK(s < g.page_size, "slot ", s, " >= page_size ", g.page_size);
  const std::size_t n = page.size() * g.layers * g.heads;
  Kokkos::parallel_for(
      "kvgrid::fold_tokens_full", Kokkos::RangePolicy<Exec>(0, n), KOKKOS_LAMBDA(const std::size_t k) {
        const std::size_t h = k % g.heads, l = (k / g.heads) % g.layers, i = k / (g.heads * g.layers);
        const std::uint64_t* v = pool + g.full_index(page[i], l, h, slot[i], 0);
        std::uint64_t acc = 0;
        for (std::size_t d = 0; d < g.dims; ++d) acc += g.dim_coef[d] * v[d];
        out[k] = page_coeff((first_pos + i) / g.page_size) * g.slot_coef[slot[i]] * acc;
      });
  Kokkos::fence();
}

}  // namespace kvgrid::kernels
