// Kokkos KV kernels against a plain reference over a parameter grid, in both payload modes.
#include <gtest/gtest.h>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cstdio>
#include <tuple>

#include <unistd.h>

#include "cache/kv_pool.hpp"
#include "cache/pool_words.hpp"
#include "core/fast_mod.hpp"
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

// The scheduler draws a decode step's token as its hash reduced by FastMod64: next_token's token.
TEST(KvMath, NextTokenReducedWithoutADivisionIsTheSameToken) {
  Rng r(7);
  for (std::uint64_t vocab : {1ULL, 2ULL, 1000ULL, 32000ULL, 50257ULL, 151936ULL}) {
    const FastMod64 f(vocab);
    for (int i = 0; i < 1000; ++i) {
      const std::uint64_t ph = r.next_u64();
      ASSERT_EQ(f.mod(kernels::next_token_hash(ph)), kernels::next_token(ph, vocab)) << "vocab " << vocab << " ph " << ph;
    }
  }
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

// The pool's content digest reads only the pages the process touched (an untouched page is zero):
// it is a digest of the content all the same — equal for equal words wherever zeros were written
// or never touched, different for one word anywhere and for the same word one page over.
TEST(KvPool, ContentDigestSeesEveryWordAndNotWhereZerosCameFrom) {
  const cache::KvPoolConfig cfg{Pages(512), Tokens(16), 0, 4, {0, 1}, 16, cache::Payload::Full};
  cache::KvPool a(cfg), b(cfg), c(cfg);
  EXPECT_EQ(a.content_digest(), b.content_digest());
  auto put = [](cache::KvPool& p, std::uint32_t page, std::uint64_t f) {
    p.write(std::vector<std::uint32_t>{page}, std::vector<std::uint32_t>{3}, std::vector<std::uint64_t>{f});
  };
  for (std::uint32_t page : {7u, 500u})  // zeros written: the same content as never touched
    for (std::size_t l = 0; l < 4; ++l) std::fill_n(b.layer_block(PageId(page), l), 64, std::uint64_t{0});
  EXPECT_EQ(a.content_digest(), b.content_digest());
  put(a, 300, 0x1234567);
  EXPECT_NE(a.content_digest(), b.content_digest());
  put(b, 300, 0x1234567);
  EXPECT_EQ(a.content_digest(), b.content_digest());
  put(c, 301, 0x1234567);  // the same token one page over
  EXPECT_NE(a.content_digest(), c.content_digest());
  put(a, 511, 1);  // the last page
  EXPECT_NE(a.content_digest(), b.content_digest());
}

// PoolWords::for_each_touched: increasing, disjoint ranges that cover every non-zero word; with
// /proc/self/pagemap readable they leave out most of an array the process never touched.
TEST(KvPool, TouchedRangesCoverEveryWrittenWord) {
  cache::PoolWords w(1 << 24, nullptr, transfer::PoolKind::Host);  // 128 MiB, mapped as it is touched
  Rng rng(7);
  std::vector<std::size_t> written;
  for (int i = 0; i < 8; ++i) written.push_back(rng.next_u64() % w.size());
  written.push_back(0);
  written.push_back(w.size() - 1);
  for (std::size_t i : written) w[i] = i + 1;
  std::vector<std::pair<std::size_t, std::size_t>> ranges;
  w.for_each_touched([&](std::size_t b, std::size_t e) { ranges.push_back({b, e}); });
  std::size_t covered = 0;
  for (std::size_t k = 0; k < ranges.size(); ++k) {
    EXPECT_LT(ranges[k].first, ranges[k].second);
    EXPECT_LE(ranges[k].second, w.size());
    if (k > 0) {
      EXPECT_LT(ranges[k - 1].second, ranges[k].first);  // disjoint, increasing, not adjacent
    }
    covered += ranges[k].second - ranges[k].first;
  }
  for (std::size_t i : written) {
    const bool in = std::any_of(ranges.begin(), ranges.end(), [&](auto r) { return r.first <= i && i < r.second; });
    EXPECT_TRUE(in) << "word " << i << " outside every range";
  }
  std::printf("touched ranges: %zu, covering %zu of %zu words\n", ranges.size(), covered, w.size());
  if (::access("/proc/self/pagemap", R_OK) == 0) {
    EXPECT_LT(covered, w.size() / 2);
  }
}

}  // namespace
}  // namespace kvgrid
