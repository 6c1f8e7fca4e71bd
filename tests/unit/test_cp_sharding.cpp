// CP page ownership in one process: a sharded KV pool stores only its rank's pages (at ⌊q/N⌋)
// and copies only pages it owns; the device cache allocates cyclic owners by position (the first
// article's Figure 1a through DeviceCache is in test_cp_placement.cpp); any-owner allocation
// breaks the cycle.
#include <gtest/gtest.h>

#include <algorithm>

#include "cache/device_pool.hpp"
#include "cache/kv_pool.hpp"
#include "core/check.hpp"

namespace kvgrid::cache {
namespace {

KvPool sharded_pool(std::uint32_t shards, std::uint32_t rank, Payload payload = Payload::Full) {
  return KvPool(KvPoolConfig{Pages(4), Tokens(2), 0, 2, {0, 1}, 3, payload, CpPlacement{shards, 2}, rank});
}

TEST(CpSharding, AShardedPoolStoresOnlyItsPagesAtTheirLocalRows) {
  auto r0 = sharded_pool(2, 0), r1 = sharded_pool(2, 1);
  // Tokens on logical pages 2 (rank 0, row 1), 3 (rank 1, row 1) and 4 (rank 0, row 2).
  const std::vector<std::uint32_t> page = {2, 2, 3, 3, 4}, slot = {0, 1, 0, 1, 0};
  const std::vector<std::uint64_t> F = {11, 12, 13, 14, 15};
  r0.write(page, slot, F);
  r1.write(page, slot, F);
  EXPECT_TRUE(r0.owns(PageId(2)) && r0.owns(PageId(4)) && !r0.owns(PageId(3)));
  EXPECT_EQ(r0.layer_block(PageId(2), 0), r0.layer_block(PageId(3), 0)) << "pages 2 and 3 share row 1 (on different ranks)";
  // What each rank holds equals an unsharded pool's copy of its pages.
  KvPool whole(KvPoolConfig{Pages(8), Tokens(2), 0, 2, {0, 1}, 3, Payload::Full});
  whole.write(page, slot, F);
  const std::size_t words = whole.layer_block_bytes() / 8;
  for (std::uint32_t q : {2u, 3u, 4u}) {
    const KvPool& owner = q % 2 == 0 ? r0 : r1;
    for (std::size_t l = 0; l < 2; ++l)
      EXPECT_TRUE(std::equal(whole.layer_block(PageId(q), l), whole.layer_block(PageId(q), l) + words,
                             owner.layer_block(PageId(q), l)))
          << "page " << q << " layer " << l;
  }
  // Rank 1 wrote nothing of page 2 or 4: its row 2 is untouched.
  const std::uint64_t* row2 = r1.layer_block(PageId(5), 0);  // logical 5 = rank 1, row 2
  EXPECT_TRUE(std::all_of(row2, row2 + words, [](std::uint64_t w) { return w == 0; }));
  // Reading a page owned elsewhere is a bug.
  std::vector<std::uint64_t> out(4, 0);
  const std::vector<std::uint32_t> other = {3};
  EXPECT_THROW(r0.fold_pages(other, out), InternalError);
}

TEST(CpSharding, CopiesMoveOnlyOwnedPagesAndNeverAcrossOwners) {
  set_debug_checks(true);
  auto dev = sharded_pool(2, 1), host = sharded_pool(2, 1);
  const std::vector<PageId> src = {PageId(2), PageId(3), PageId(4), PageId(5)}, dst = {PageId(6), PageId(7), PageId(8), PageId(9)};
  auto copies = layer_copies(host, dst, dev, src);
  ASSERT_EQ(copies.size(), 2u);
  EXPECT_EQ(copies[0].size(), 2u);  // pages 3 -> 7 and 5 -> 9: this rank's
  EXPECT_EQ(copies[0][0].dst, host.layer_block(PageId(7), 0));
  EXPECT_EQ(copies[0][0].src, dev.layer_block(PageId(3), 0));
  // A destination owned here whose source belongs to another rank: the copy would read this
  // rank's row of someone else's page.
  const std::vector<PageId> wrong_src = {PageId(4)}, wrong_dst = {PageId(7)};
  EXPECT_THROW(layer_copies(host, wrong_dst, dev, wrong_src), InternalError);
  set_debug_checks(false);
  EXPECT_EQ(layer_copies(host, wrong_dst, dev, wrong_src)[0].size(), 1u);  // without checks it happens
  set_debug_checks(true);
}

TEST(CpSharding, AnyOwnerAllocationIgnoresTheCycle) {
  DevicePool pool(Pages(6), CpPlacement{2, 4});
  auto a = pool.alloc(Pages(4), 0);  // owners 0 1 0 1
  ASSERT_TRUE(a);
  EXPECT_EQ(rotation_error(pool.placement(), *a), "");
  pool.free(std::vector<PageId>{(*a)[1], (*a)[3]});  // rank 1 has more free pages now
  auto b = pool.alloc_any(Pages(2));
  ASSERT_TRUE(b);
  EXPECT_EQ(pool.placement().page_owner((*b)[0].value()), 1u);
  EXPECT_EQ(pool.placement().page_owner((*b)[1].value()), 1u);  // still the fuller: not cyclic
  EXPECT_NE(rotation_error(pool.placement(), *b), "");
  pool.verify();
  EXPECT_EQ(pool.shortfall(Pages(20), 0), Pages(12));  // 10 pages wanted from each owner, 4 free on each
}

}  // namespace
}  // namespace kvgrid::cache
