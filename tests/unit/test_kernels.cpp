// Kokkos KV kernels against a plain reference over a parameter grid, in both payload modes.
#include <gtest/gtest.h>

#include <Kokkos_Core.hpp>
#include <tuple>

#include "cache/kv_pool.hpp"
#include "core/rng.hpp"
#include "kernels/kv_math.hpp"
#include "kokkos_env.hpp"

namespace kvgrid {
namespace {

[[maybe_unused]] const bool kokkos_ready = (testing::ensure_kokkos(), true);

TEST(KvMath, ElementsOfATokenFoldToFeatureTimesCoefficient) {
  for (std::uint64_t dims : {1, 2, 7, 16}) {
    for (std::uint64_t F : {0ULL, 1ULL, 0xdeadbeefcafef00dULL}) {
      std::uint64_t sum = 0;
      for (std::uint64_t d = 0; d < dims; ++d) sum += kernels::dim_coeff(d, dims) * kernels::kv_element(F, 3, 5, d, dims);
      EXPECT_EQ(sum, F * kernels::kv_coeff(3, 5)) << "dims " << dims;
    }
  }
  EXPECT_NE(kernels::kv_coeff(0, 1), kernels::kv_coeff(1, 0));
  EXPECT_EQ(kernels::kv_coeff(4, 2) & 1, 1u);
}

// (layers, heads, page_size, dims)
class KvKernelGrid : public ::testing::TestWithParam<std::tuple<int, int, int, int>> {};

TEST_P(KvKernelGrid, PoolFoldsMatchThePlainReferenceInBothModes) {
  const auto [layers, heads, page_size, dims] = GetParam();
  std::vector<std::uint32_t> head_ids;
  for (int h = 0; h < heads; ++h) head_ids.push_back(static_cast<std::uint32_t>(2 * h + 1));  // a TP shard
  auto make = [&](cache::Payload p) {
    return cache::KvPool({Pages(12), Tokens(page_size), 2, static_cast<std::uint64_t>(layers), head_ids,
                          static_cast<std::uint64_t>(dims), p});
  };
  cache::KvPool full = make(cache::Payload::Full), digest = make(cache::Payload::Digest);
  Rng rng(static_cast<std::uint64_t>(layers * 1000 + heads * 100 + page_size * 10 + dims));
  // Fill pages 3, 5 and 9 completely and page 7 partly.
  std::vector<std::uint32_t> page, slot;
  std::vector<std::uint64_t> F;
  for (std::uint32_t p : {3u, 5u, 9u, 7u})
    for (int s = 0; s < (p == 7 ? page_size / 2 + 1 : page_size); ++s) {
      page.push_back(p);
      slot.push_back(static_cast<std::uint32_t>(s));
      F.push_back(rng.next_u64());
    }
  full.write(page, slot, F);
  digest.write(page, slot, F);
  // Reference: sum over the tokens of the chosen pages (read as page-table entries 0 and 1) of
  // Q(entry) * P(slot) * F * M(l, h).
  const std::vector<std::uint32_t> chosen = {3, 9};
  std::vector<std::uint64_t> want(static_cast<std::size_t>(layers * heads), 0);
  for (std::size_t i = 0; i < page.size(); ++i)
    if (page[i] == 3 || page[i] == 9)
      for (int l = 0; l < layers; ++l)
        for (int h = 0; h < heads; ++h)
          want[static_cast<std::size_t>(l * heads + h)] += kernels::page_coeff(page[i] == 3 ? 0 : 1) *
                                                           kernels::slot_coeff(slot[i]) * F[i] *
                                                           kernels::kv_coeff(2 + l, head_ids[static_cast<std::size_t>(h)]);
  std::vector<std::uint64_t> got_full(want.size(), 0), got_digest(want.size(), 0);
  full.fold_pages(chosen, got_full);
  digest.fold_pages(chosen, got_digest);
  EXPECT_EQ(got_full, want);
  EXPECT_EQ(got_digest, want);

  // Per-token folds read back (full) or taken from scratch (digest) agree with the reference.
  std::vector<std::uint64_t> tf(page.size() * want.size()), td(tf.size());
  full.fold_tokens(page, slot, F, /*first_pos=*/0, tf);
  digest.fold_tokens(page, slot, F, /*first_pos=*/0, td);
  EXPECT_EQ(tf, td);
  EXPECT_EQ(tf[0], kernels::page_coeff(0) * kernels::slot_coeff(0) * F[0] * kernels::kv_coeff(2, head_ids[0]));

  // A flipped bit in a read page changes the fold in both modes.
  Rng flip(7);
  full.corrupt(PageId(9), flip);
  digest.corrupt(PageId(9), flip);
  std::vector<std::uint64_t> after_full(want.size(), 0), after_digest(want.size(), 0);
  full.fold_pages(chosen, after_full);
  digest.fold_pages(chosen, after_digest);
  EXPECT_NE(after_full, want);
  EXPECT_NE(after_digest, want);

  // reset() clears digest pages for new content; full pages are overwritten slot by slot.
  digest.reset(std::vector<PageId>{PageId(3)});
  std::vector<std::uint64_t> cleared(want.size(), 0);
  digest.fold_pages(std::vector<std::uint32_t>{3}, cleared);
  EXPECT_EQ(cleared, std::vector<std::uint64_t>(want.size(), 0));
}

INSTANTIATE_TEST_SUITE_P(Grid, KvKernelGrid,
                         ::testing::Combine(::testing::Values(1, 3), ::testing::Values(1, 4), ::testing::Values(1, 16),
                                            ::testing::Values(1, 8)));

TEST(KvKernels, LaunchersRejectPagesOutsideThePool) {
  cache::KvPool pool({Pages(4), Tokens(4), 0, 1, {0}, 2, cache::Payload::Full});
  std::vector<std::uint64_t> out(1, 0);
  EXPECT_ANY_THROW(pool.fold_pages(std::vector<std::uint32_t>{5}, out));
  EXPECT_ANY_THROW(pool.fold_pages(std::vector<std::uint32_t>{0}, out));  // the padding page holds no KV
  EXPECT_ANY_THROW(pool.write(std::vector<std::uint32_t>{1}, std::vector<std::uint32_t>{4}, std::vector<std::uint64_t>{1}));
}

}  // namespace
}  // namespace kvgrid
