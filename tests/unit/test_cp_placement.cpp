// CP page ownership: the placement arithmetic against a brute-force model over N and p, the
// owner-rotating allocator (cyclic owners, lowest free local page, all or nothing), the first
// article's Figure 1a example, and the tree's rotation checks (insert, split, restore).
#include <gtest/gtest.h>

#include <map>

#include "cache/cp_placement.hpp"
#include "cache/device_cache.hpp"
#include "cache/device_pool.hpp"
#include "core/decision_log.hpp"
#include "cache/radix_tree.hpp"
#include "core/check.hpp"
#include "core/rng.hpp"

namespace kvgrid::cache {
namespace {

// The pages of Figure 1a (4 tokens each) and prompts made of them.
std::vector<TokenId> page(TokenId t) { return {t, t, t, t}; }
std::vector<TokenId> concat(std::initializer_list<std::vector<TokenId>> parts) {
  std::vector<TokenId> out;
  for (const auto& v : parts) out.insert(out.end(), v.begin(), v.end());
  return out;
}
const auto A = page(1), B = page(2), C = page(3), D = page(4), E = page(5);

TEST(CpPlacement, ArithmeticMatchesABruteForceAssignmentForEveryNAndPageSize) {
  for (std::uint32_t n : {1u, 2u, 3u, 4u, 8u}) {
    for (std::uint64_t p : {1u, 4u, 16u, 64u}) {
      SCOPED_TRACE("N " + std::to_string(n) + ", p " + std::to_string(p));
      const CpPlacement pl{n, p};
      // Model: logical pages are dealt to ranks round robin; each rank stacks its pages in order.
      std::vector<std::uint64_t> next(n, 0);
      std::map<std::pair<std::uint32_t, std::uint64_t>, std::uint64_t> seen;  // (rank, row) -> slot
      for (std::uint64_t q = 0; q < 5 * n + 3; ++q) {
        const std::uint32_t rank = static_cast<std::uint32_t>(q % n);
        const std::uint64_t local = next[rank]++;
        for (std::uint64_t o = 0; o < p; ++o) {
          const std::uint64_t x = q * p + o;
          ASSERT_EQ(pl.logical_page(x), q);
          ASSERT_EQ(pl.owner(x), rank);
          ASSERT_EQ(pl.local_row(x), local * p + o);
          ASSERT_TRUE(seen.emplace(std::make_pair(rank, pl.local_row(x)), x).second) << "two slots share a row";
        }
        ASSERT_EQ(pl.logical(rank, local), q);
        ASSERT_EQ(pl.local_page(q), local);
      }
    }
  }
}

TEST(CpPlacement, Figure1aExample) {
  // Two ranks. A/B/C, then A/B/E sharing A/B, then D extending A/B/C.
  const CpPlacement pl{2, 4};
  DevicePool alloc(Pages(7), pl);  // 7 pages per rank besides the padding page
  RadixTree tree(TreeConfig{Tokens(4), 2});
  auto abc = alloc.alloc(Pages(3), 0);
  ASSERT_TRUE(abc);
  EXPECT_EQ(*abc, (std::vector<PageId>{PageId(2), PageId(3), PageId(4)}));  // A, B, C: owners 0, 1, 0
  tree.insert(concat({A, B, C}), *abc);
  // A/B/E: the match ends after B (owner 1), so E goes to rank 0.
  auto m = tree.match_computed(concat({A, B}));
  ASSERT_EQ(m.device_pages.size(), 2u);
  auto e = alloc.alloc(Pages(1), (pl.page_owner(m.device_pages.back().value()) + 1) % 2);
  EXPECT_EQ(*e, (std::vector<PageId>{PageId(6)}));
  tree.insert(concat({A, B, E}), std::vector<PageId>{m.device_pages[0], m.device_pages[1], (*e)[0]});
  // Rank 0 stores A, C, E at local pages 1, 2, 3; rank 1 stores B at local page 1.
  EXPECT_EQ(pl.local_page(2), 1u);
  EXPECT_EQ(pl.local_page(4), 2u);
  EXPECT_EQ(pl.local_page(6), 3u);
  EXPECT_EQ(pl.page_owner(3), 1u);
  EXPECT_EQ(pl.local_page(3), 1u);
  // D extends A/B/C: owners 0, 1, 0, then 1 -> logical page 5, local page 2 on rank 1.
  auto mabc = tree.match_computed(concat({A, B, C}));
  auto d = alloc.alloc(Pages(1), (pl.page_owner(mabc.device_pages.back().value()) + 1) % 2);
  ASSERT_TRUE(d);
  EXPECT_EQ((*d)[0], PageId(5));
  EXPECT_EQ(pl.page_owner(5), 1u);
  EXPECT_EQ(pl.local_page(5), 2u);
  auto pages = mabc.device_pages;
  pages.push_back((*d)[0]);
  tree.insert(concat({A, B, C, D}), pages);
  tree.verify();
}

TEST(CpPlacement, DeviceCacheFollowsTheFigure1aRotation) {
  set_debug_checks(true);
  DecisionLog log;
  DeviceCache dc({Tokens(4), Pages(7), 2}, log);
  auto abc = dc.admit(RequestId(1), concat({A, B, C}));
  ASSERT_TRUE(abc.admitted);
  EXPECT_EQ(dc.tree().match_computed(concat({A, B, C})).device_pages, (std::vector<PageId>{PageId(2), PageId(3), PageId(4)}));
  dc.release(abc);
  auto abe = dc.admit(RequestId(2), concat({A, B, E}));
  EXPECT_EQ(abe.matched, Tokens(8));
  EXPECT_EQ(dc.tree().match_computed(concat({A, B, E})).device_pages.back(), PageId(6));  // rank 0, local page 3
  dc.release(abe);
  auto abcd = dc.admit(RequestId(3), concat({A, B, C, D}));
  EXPECT_EQ(abcd.matched, Tokens(12));
  const PageId d = dc.tree().match_computed(concat({A, B, C, D})).device_pages.back();
  EXPECT_EQ(d, PageId(5));  // logical page 5: rank 1, local page 2
  EXPECT_EQ(dc.pool().placement().page_owner(d.value()), 1u);
  EXPECT_EQ(dc.pool().placement().local_page(d.value()), 2u);
  dc.release(abcd);
  dc.verify();
  // Rank 0 holds A, C, E (3 pages), rank 1 B, D (2).
  EXPECT_EQ(dc.pool().high_water(0), Pages(3));
  EXPECT_EQ(dc.pool().high_water(1), Pages(2));
}

TEST(CpPlacement, AllocatorChainsAreCyclicBalancedAndAllOrNothing) {
  Rng rng(7);
  for (std::uint32_t n : {1u, 2u, 3u, 4u, 8u}) {
    SCOPED_TRACE("N " + std::to_string(n));
    const CpPlacement pl{n, 16};
    DevicePool alloc(Pages(19), pl);  // 19 allocatable pages per rank
    std::vector<std::vector<PageId>> live;
    std::set<std::uint32_t> taken;
    for (int op = 0; op < 400; ++op) {
      if (live.empty() || rng.bernoulli(0.6)) {
        const auto first = static_cast<std::uint32_t>(rng.below(n));
        const auto len = rng.below(3 * n + 2) + 1;
        std::vector<std::uint64_t> before(n);
        for (std::uint32_t r = 0; r < n; ++r) before[r] = static_cast<std::uint64_t>(alloc.free_pages(r).value());
        const Pages want(static_cast<std::int64_t>(len));
        const Pages short_by = alloc.shortfall(want, first);
        auto c = alloc.alloc(want, first);
        ASSERT_EQ(c.has_value(), short_by.value() == 0);
        if (!c) {  // all or nothing: some owner lacked pages, nothing was taken
          bool short_somewhere = false;
          for (std::uint32_t r = 0; r < n; ++r) {
            ASSERT_EQ(static_cast<std::uint64_t>(alloc.free_pages(r).value()), before[r]);
            std::uint64_t need = 0;
            for (std::uint64_t k = 0; k < len; ++k) need += (first + k) % n == r ? 1 : 0;
            short_somewhere = short_somewhere || need > before[r];
          }
          ASSERT_TRUE(short_somewhere);
          std::int64_t brute = 0;  // the shortfall by brute force
          for (std::uint32_t r = 0; r < n; ++r) {
            std::uint64_t need = 0;
            for (std::uint64_t k = 0; k < len; ++k) need += (first + k) % n == r ? 1 : 0;
            brute += need > before[r] ? static_cast<std::int64_t>(need - before[r]) : 0;
          }
          ASSERT_EQ(short_by.value(), brute);
          continue;
        }
        ASSERT_EQ(c->size(), len);
        ASSERT_EQ(rotation_error(pl, *c), "");
        ASSERT_EQ(pl.page_owner((*c)[0].value()), first);
        std::vector<std::uint64_t> per(n, 0);
        for (PageId q : *c) {
          ASSERT_GE(pl.local_page(q.value()), 1u) << "the padding page was allocated";
          ASSERT_TRUE(taken.insert(q.value()).second) << "page " << q << " handed out twice";
          ++per[pl.page_owner(q.value())];
        }
        ASSERT_LE(*std::max_element(per.begin(), per.end()) - *std::min_element(per.begin(), per.end()), 1u);
        alloc.verify();
        live.push_back(*c);
      } else {
        const auto i = rng.below(live.size());
        for (PageId q : live[i]) taken.erase(q.value());
        alloc.free(live[i]);
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
      }
    }
  }
}

TEST(CpPlacement, TheTreeRejectsIncompatibleRotationsAndKeepsOwnersOnSplitAndRestore) {
  set_debug_checks(true);  // the restore's owner check is a debug check
  RadixTree tree(TreeConfig{Tokens(2), 2});
  const std::vector<TokenId> ab = {1, 1, 2, 2};
  tree.insert(ab, std::vector<PageId>{PageId(2), PageId(3)});  // owners 0, 1
  // An extension whose first page is owned by rank 1 again would break the cycle.
  const std::vector<TokenId> abx = {1, 1, 2, 2, 9, 9};
  try {
    tree.insert(abx, std::vector<PageId>{PageId(2), PageId(3), PageId(5)});
    FAIL() << "accepted an incompatible rotation";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("incompatible ownership rotations"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("expected rank 0"), std::string::npos) << e.what();
  }
  // Pages within one insert must be cyclic too.
  EXPECT_THROW(tree.insert(std::vector<TokenId>{7, 7, 8, 8}, std::vector<PageId>{PageId(4), PageId(6)}), InternalError);
  // A split keeps each fragment's first owner: splitting A/B after A leaves B starting at rank 1.
  auto m = tree.match_computed(std::vector<TokenId>{1, 1});
  ASSERT_EQ(m.device_pages.size(), 1u);
  tree.insert(abx, std::vector<PageId>{PageId(2), PageId(3), PageId(4)});  // owners 0, 1, 0: fine
  tree.verify();
  TreeNode* a = tree.root()->children.begin()->second.get();
  ASSERT_EQ(a->key.size(), 2u);  // split at A by the match
  TreeNode* b = a->children.begin()->second.get();
  EXPECT_EQ(a->ext.rotation_base, 0u);
  EXPECT_EQ(b->ext.rotation_base, 1u);  // B starts on rank 1 after the split
  TreeNode* x = b->children.begin()->second.get();
  EXPECT_EQ(x->ext.rotation_base, 0u);
  // Back up and evict everything; a restore must put each page back on its owner (rows may change).
  tree.set_host(a, std::vector<PageId>{PageId(20)});
  tree.set_host(b, std::vector<PageId>{PageId(21)});
  tree.set_host(x, std::vector<PageId>{PageId(22)});
  tree.evict(Pages(3));
  ASSERT_TRUE(a->device.empty() && b->device.empty() && x->device.empty());
  tree.set_device(a, std::vector<PageId>{PageId(8)});                                 // owner 0: a new row
  EXPECT_THROW(tree.set_device(b, std::vector<PageId>{PageId(6)}), InternalError);  // owner 0, B's is 1
  tree.set_device(b, std::vector<PageId>{PageId(9)});                                 // owner 1
  tree.verify();
}

}  // namespace
}  // namespace kvgrid::cache
