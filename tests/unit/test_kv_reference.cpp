// The plain-loop KV reference the CUDA tests hold the device kernels to (tests/cuda/kv_reference.hpp)
// equals the Kokkos host kernels, bit for bit, over a grid of layouts: so "device == reference"
// on a GPU machine means "device == host kernels".
#include <gtest/gtest.h>

#include <numeric>

#include "../cuda/kv_reference.hpp"
#include "core/rng.hpp"
#include "kokkos_env.hpp"

namespace kvgrid {
namespace {

[[maybe_unused]] const bool kokkos_ready = (testing::ensure_kokkos(), true);

struct Case {
  std::size_t layers, heads, page_size, dims;
};

TEST(KvReference, EqualsTheHostKernels) {
  const std::uint64_t seed = 20261206;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  Rng rng(seed);
  for (const Case c : {Case{1, 1, 1, 1}, Case{3, 2, 4, 3}, Case{2, 4, 16, 8}, Case{5, 3, 7, 2}}) {
    const std::size_t pages = 9;
    kvref::Geometry geo(pages, c.layers, c.heads, c.page_size, c.dims, 7, 3);
    const auto& g = geo.g;
    std::vector<std::uint32_t> page, slot;
    std::vector<std::uint64_t> F;
    for (std::uint32_t p = 1; p < pages; ++p)
      for (std::uint32_t s = 0; s < c.page_size; ++s) page.push_back(p), slot.push_back(s), F.push_back(rng.next_u64());
    for (bool digest : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "layers " << c.layers << " heads " << c.heads << " page " << c.page_size
                                        << " dims " << c.dims << (digest ? " digest" : " full"));
      std::vector<std::uint64_t> want(digest ? g.digest_words() : g.full_words(), 0), got = want;
      if (digest) {
        kvref::write_tokens_digest(g, want.data(), page, slot, F);
        kernels::write_tokens_digest(g, got.data(), page, slot, F);
      } else {
        kvref::write_tokens_full(g, want.data(), page, slot, F);
        kernels::write_tokens_full(g, got.data(), page, slot, F);
      }
      ASSERT_EQ(got, want);
      const std::vector<std::uint32_t> read = {5, 2, 8, 1};
      std::vector<std::uint64_t> fw(g.layers * g.heads, 3), fg = fw;
      kvref::fold_pages(g, digest, want.data(), read, 4, fw);
      if (digest)
        kernels::fold_pages_digest(g, got.data(), read, 4, fg);
      else
        kernels::fold_pages_full(g, got.data(), read, 4, fg);
      EXPECT_EQ(fg, fw);
      if (!digest) {
        std::vector<std::uint64_t> tw(page.size() * g.layers * g.heads), tg = tw;
        kvref::fold_tokens_full(g, want.data(), page, slot, 11, tw);
        kernels::fold_tokens_full(g, got.data(), page, slot, 11, tg);
        EXPECT_EQ(tg, tw);
      }
      std::vector<kernels::ChunkSpan> chunks = {{0, c.layers, 0, c.heads}};
      if (c.layers > 1 && c.heads > 1)
        chunks = {{0, 1, 0, c.heads / 2}, {1, c.layers - 1, c.heads / 2, c.heads - c.heads / 2}, {0, 1, c.heads / 2, 1}};
      const std::vector<std::uint32_t> rows = {3, 1, 8};
      const auto objects = kvref::pack_objects(g, digest, want.data(), rows, chunks);
      std::vector<std::uint64_t> staging(objects.size());
      kernels::pack_objects(g, digest, got.data(), rows, chunks, staging.data());
      EXPECT_EQ(staging, objects);
    }
  }
}

}  // namespace
}  // namespace kvgrid
