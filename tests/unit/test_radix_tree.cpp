// Paged radix tree: one behaviour per test, across the device and host tiers. The randomized
// differential test against a reference model is in test_radix_tree_differential.cpp.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <numeric>

#include "cache/device_pool.hpp"
#include "cache/radix_tree.hpp"
#include "core/check.hpp"
#include "core/hash.hpp"
#include "core/rng.hpp"

namespace kvgrid::cache {
namespace {

constexpr std::int64_t kPage = 4;

std::vector<TokenId> seq(std::initializer_list<TokenId> pages_first_tokens) {
  // Each listed value becomes one page of kPage identical tokens: seq({1,2}) = 1111 2222.
  std::vector<TokenId> out;
  for (TokenId t : pages_first_tokens)
    for (std::int64_t i = 0; i < kPage; ++i) out.push_back(t);
  return out;
}

std::vector<PageId> page_ids(std::initializer_list<std::uint32_t> ids) {
  std::vector<PageId> out;
  for (auto i : ids) out.push_back(PageId(i));
  return out;
}

std::vector<TokenId> plus(std::vector<TokenId> v, std::initializer_list<TokenId> extra) {
  v.insert(v.end(), extra);
  return v;
}

class RadixTreeTest : public ::testing::Test {
 protected:
  RadixTreeTest() : tree(TreeConfig{Tokens(kPage)}) {}
  void SetUp() override { set_debug_checks(true); }
  RadixTree tree;
};

TEST_F(RadixTreeTest, EmptyTreeMatchesNothing) {
  auto m = tree.match_prefix(plus(seq({1, 2}), {9}));
  EXPECT_EQ(m.matched, Tokens(0));
  EXPECT_TRUE(m.device_pages.empty());
  EXPECT_EQ(m.last_node, tree.root());
  EXPECT_EQ(tree.node_count(), 0u);
  EXPECT_EQ(tree.total_pages(), Pages(0));
  EXPECT_TRUE(tree.evict(Pages(10)).empty());
  tree.verify();
}

TEST_F(RadixTreeTest, PartialPageIsNeverMatched) {
  tree.insert(seq({1, 2}), page_ids({10, 11}));
  // Prompt = 2 full pages + 3 tokens: the cached 2 pages match, the partial page does not exist.
  auto m = tree.match_prefix(plus(seq({1, 2}), {3, 3, 3}));
  EXPECT_EQ(m.matched, Tokens(8));
  EXPECT_EQ(m.device_pages, page_ids({10, 11}));
  // A prompt diverging inside page 2 matches page 1 only.
  auto m2 = tree.match_prefix(plus(plus(seq({1}), {2, 2, 2, 7}), {5}));
  EXPECT_EQ(m2.matched, Tokens(4));
  EXPECT_EQ(m2.device_pages, page_ids({10}));
  tree.verify();
}

TEST_F(RadixTreeTest, InsertSplitsMidNode) {
  tree.insert(seq({1, 2, 3, 4}), page_ids({1, 2, 3, 4}));
  ASSERT_EQ(tree.node_count(), 1u);
  auto r = tree.insert(seq({1, 2, 7, 8}), page_ids({5, 6, 7, 8}));
  EXPECT_EQ(r.prefix_len, Tokens(8));
  EXPECT_EQ(tree.node_count(), 3u);  // [1 2] -> {[3 4], [7 8]}
  EXPECT_EQ(tree.total_pages(), Pages(6));
  auto m = tree.match_prefix(plus(seq({1, 2, 7, 8}), {0}));
  EXPECT_EQ(m.device_pages, page_ids({1, 2, 7, 8}));  // shared prefix keeps the first insert's pages
  tree.verify();
}

TEST_F(RadixTreeTest, MatchEndingInsideNodeSplitsIt) {
  tree.insert(seq({1, 2, 3, 4}), page_ids({1, 2, 3, 4}));
  auto m = tree.match_prefix(plus(seq({1, 2, 9}), {0}));
  EXPECT_EQ(m.matched, Tokens(8));
  EXPECT_EQ(tree.node_count(), 2u);
  EXPECT_EQ(m.last_node->key, seq({1, 2}));
  EXPECT_EQ(m.last_node->children.size(), 1u);
  tree.verify();
}

TEST_F(RadixTreeTest, LockProtectsPathFromEviction) {
  tree.insert(seq({1, 2}), page_ids({1, 2}));
  auto r = tree.insert(seq({1, 2, 3}), page_ids({1, 2, 3}));
  tree.lock(r.last_node);
  EXPECT_EQ(tree.protected_pages(), Pages(3));
  EXPECT_EQ(tree.evictable_pages(), Pages(0));
  EXPECT_TRUE(tree.evict(Pages(100)).empty());
  tree.unlock(r.last_node);
  EXPECT_EQ(tree.evictable_pages(), Pages(3));
  auto freed = tree.evict(Pages(100));
  EXPECT_EQ(freed.size(), 3u);
  EXPECT_EQ(tree.node_count(), 0u);
  tree.verify();
}

TEST_F(RadixTreeTest, LockedChildKeepsAncestorsButSiblingIsEvictable) {
  tree.insert(seq({1, 2}), page_ids({1, 2}));
  auto a = tree.insert(seq({1, 2, 3}), page_ids({1, 2, 3}));
  tree.insert(seq({1, 2, 4}), page_ids({1, 2, 4}));
  tree.lock(a.last_node);
  auto freed = tree.evict(Pages(100));
  EXPECT_EQ(freed, page_ids({4}));  // only the unlocked sibling leaf
  EXPECT_EQ(tree.total_pages(), Pages(3));
  tree.unlock(a.last_node);
  tree.verify();
}

TEST_F(RadixTreeTest, EvictionFollowsLogicalLruOrder) {
  tree.insert(seq({1}), page_ids({1}));
  tree.insert(seq({2}), page_ids({2}));
  tree.insert(seq({3}), page_ids({3}));
  tree.match_prefix(plus(seq({1}), {0}));  // 1 becomes the most recently used
  EXPECT_EQ(tree.evict(Pages(1)), page_ids({2}));
  EXPECT_EQ(tree.evict(Pages(1)), page_ids({3}));
  EXPECT_EQ(tree.evict(Pages(1)), page_ids({1}));
  tree.verify();
}

TEST_F(RadixTreeTest, EvictionFreesWholeLeavesAndThenTheirParents) {
  tree.insert(seq({1, 2}), page_ids({1, 2}));
  tree.insert(seq({1, 2, 3, 4}), page_ids({1, 2, 3, 4}));
  // Needs 3 pages: the leaf [3 4] (2 pages) is not enough, so its parent [1 2] follows.
  auto freed = tree.evict(Pages(3));
  EXPECT_EQ(freed, page_ids({3, 4, 1, 2}));
  tree.verify();
}

TEST_F(RadixTreeTest, DuplicateInsertReportsPrefixAndKeepsTreePages) {
  tree.insert(seq({1, 2, 3}), page_ids({1, 2, 3}));
  auto r = tree.insert(seq({1, 2, 3}), page_ids({7, 8, 9}));
  EXPECT_EQ(r.prefix_len, Tokens(12));  // caller frees 7, 8, 9
  EXPECT_EQ(tree.total_pages(), Pages(3));
  auto m = tree.match_prefix(plus(seq({1, 2, 3}), {0}));
  EXPECT_EQ(m.device_pages, page_ids({1, 2, 3}));
  auto r2 = tree.insert(seq({1, 2, 3, 4}), page_ids({7, 8, 9, 10}));
  EXPECT_EQ(r2.prefix_len, Tokens(12));  // 7, 8, 9 are duplicates; 10 is taken
  EXPECT_EQ(tree.total_pages(), Pages(4));
  tree.verify();
}

TEST_F(RadixTreeTest, MatchReusesAtMostPromptMinusOneTokens) {
  tree.insert(seq({1, 2}), page_ids({1, 2}));
  // A prompt equal to the cached 8 tokens may reuse at most 7: one page.
  EXPECT_EQ(tree.match_prefix(seq({1, 2})).matched, Tokens(4));
  EXPECT_EQ(tree.match_prefix(plus(seq({1, 2}), {5})).matched, Tokens(8));
  EXPECT_EQ(tree.match_prefix(std::vector<TokenId>{1}).matched, Tokens(0));
  EXPECT_EQ(tree.match_prefix(std::vector<TokenId>{}).matched, Tokens(0));
  tree.verify();
}

class EvenPagesOnly final : public TreeComponent {
 public:
  std::string_view name() const override { return "even-pages"; }
  Tokens accept_boundary(std::span<const PathStep>, Tokens candidate) const override {
    return Tokens(candidate.value() / (2 * kPage) * (2 * kPage));
  }
};

TEST_F(RadixTreeTest, ComponentValidatorCanShortenTheMatch) {
  tree.add_component(std::make_unique<EvenPagesOnly>());
  tree.insert(seq({1, 2, 3}), page_ids({1, 2, 3}));
  auto m = tree.match_prefix(plus(seq({1, 2, 3}), {0}));
  EXPECT_EQ(m.matched, Tokens(8));
  EXPECT_EQ(m.device_pages, page_ids({1, 2}));
  EXPECT_EQ(m.last_node->key, seq({1, 2}));  // split at the accepted boundary
  tree.verify();
}

TEST_F(RadixTreeTest, SplitCarriesNodeState) {
  auto r = tree.insert(seq({1, 2, 3}), page_ids({1, 2, 3}));
  r.last_node->ext.hit_count = 5;
  tree.lock(r.last_node);
  tree.insert(seq({1, 9}), page_ids({4, 5}));
  const TreeNode* prefix = r.last_node->parent;
  EXPECT_EQ(prefix->key, seq({1}));
  EXPECT_EQ(prefix->ext.hit_count, 5u);
  EXPECT_EQ(prefix->lock_ref, 1);
  tree.unlock(r.last_node);
  tree.verify();
}

TEST_F(RadixTreeTest, DigestIgnoresSplitPointsButSeesContentAndLocks) {
  RadixTree other(TreeConfig{Tokens(kPage)});
  tree.insert(seq({1, 2, 3, 4}), page_ids({1, 2, 3, 4}));
  other.insert(seq({1, 2}), page_ids({5, 6}));
  other.insert(seq({1, 2, 3, 4}), page_ids({5, 6, 7, 8}));
  EXPECT_NE(tree.node_count(), other.node_count());
  EXPECT_EQ(tree.digest(), other.digest());
  auto r = other.insert(seq({1, 2, 3, 4}), page_ids({5, 6, 7, 8}));
  other.lock(r.last_node);
  EXPECT_NE(tree.digest(), other.digest());
  other.unlock(r.last_node);
  EXPECT_EQ(tree.digest(), other.digest());
  other.insert(seq({1, 2, 3, 5}), page_ids({5, 6, 7, 9}));
  EXPECT_NE(tree.digest(), other.digest());
}

TEST_F(RadixTreeTest, VerifyCatchesCorruptedCounters) {
  auto r = tree.insert(seq({1, 2}), page_ids({1, 2}));
  r.last_node->lock_ref = 3;  // a lock without the path and counters that go with it
  EXPECT_THROW(tree.verify(), InternalError);
  r.last_node->lock_ref = 0;
  tree.verify();
  r.last_node->device[1] = PageId(1);  // the same page twice
  EXPECT_THROW(tree.verify(), InternalError);
}

TEST_F(RadixTreeTest, RollingVerifyRehashesNewAndChangedKeysAtOnceAndEveryKeyWithinOneSliceCycle) {
  // verify(Rolling) re-hashes a node's first page where its key is new or changed since it last did,
  // and for the ids of one slice per call (call k: id % kVerifySlices == k % kVerifySlices).
  static_assert(kVerifySlices == 8);
  std::vector<TreeNode*> nodes;  // ids 1..16, one leaf each under the root
  for (std::uint32_t t = 1; t <= 16; ++t) nodes.push_back(tree.insert(seq({t, 100 + t}), page_ids({2 * t - 1, 2 * t})).last_node);
  ASSERT_EQ(nodes[4]->id, 5u);
  tree.verify(VerifyDepth::Rolling);  // call 0: every key is new
  nodes[4]->key[0] ^= 1;              // a key changed in place, behind the tree's back
  EXPECT_THROW(tree.verify(), InternalError);  // (full: at once)
  for (int call = 1; call < 5; ++call) EXPECT_NO_THROW(tree.verify(VerifyDepth::Rolling)) << "call " << call;
  EXPECT_THROW(tree.verify(VerifyDepth::Rolling), InternalError);  // call 5: id 5's slice
  nodes[4]->key[0] ^= 1;
  tree.verify(VerifyDepth::Rolling);  // call 6

  // A split shortens the rest's key (id 9, slice 1): re-hashed at the next call (7), whatever its slice.
  tree.insert(seq({9, 50}), page_ids({40, 41}));  // [9 109] -> [9] -> {[109], [50]}
  ASSERT_EQ(nodes[8]->key, seq({109}));
  nodes[8]->key[0] ^= 1;
  EXPECT_THROW(tree.verify(VerifyDepth::Rolling), InternalError);
  nodes[8]->key[0] ^= 1;
  tree.verify(VerifyDepth::Rolling);  // call 8
  // A new node (id 19, slice 3) is re-hashed at the next call (9).
  TreeNode* fresh = tree.insert(seq({60, 61}), page_ids({50, 51})).last_node;
  ASSERT_EQ(fresh->id, 19u);
  fresh->key[0] ^= 1;
  EXPECT_THROW(tree.verify(VerifyDepth::Rolling), InternalError);
  fresh->key[0] ^= 1;
  tree.verify(VerifyDepth::Rolling);
  tree.verify();
}

TEST_F(RadixTreeTest, UnlockWithoutLockIsABug) {
  auto r = tree.insert(seq({1}), page_ids({1}));
  EXPECT_THROW(tree.unlock(r.last_node), InternalError);
}

TEST_F(RadixTreeTest, BackedUpLeafBecomesHostOnlyOnDeviceEvictionAndIsLoadedBack) {
  auto r = tree.insert(seq({1, 2}), page_ids({1, 2}));
  tree.set_host(r.last_node, page_ids({40, 41}));
  EXPECT_EQ(tree.host_pages(), Pages(2));
  EXPECT_EQ(tree.evict(Pages(2)), page_ids({1, 2}));
  EXPECT_EQ(tree.node_count(), 1u);  // still there, host-only
  auto m = tree.match_prefix(plus(seq({1, 2}), {0}));
  EXPECT_EQ(m.matched, Tokens(0));
  EXPECT_EQ(m.host_matched, Tokens(8));
  EXPECT_EQ(m.host_pages, page_ids({40, 41}));
  ASSERT_EQ(m.host_path.size(), 1u);
  tree.set_device(m.host_path[0], page_ids({7, 8}));
  auto again = tree.match_prefix(plus(seq({1, 2}), {0}));
  EXPECT_EQ(again.matched, Tokens(8));
  EXPECT_EQ(again.device_pages, page_ids({7, 8}));
  tree.verify();
}

TEST_F(RadixTreeTest, HostEvictionRemovesHostOnlyLeavesOnly) {
  auto a = tree.insert(seq({1}), page_ids({1}));
  auto b = tree.insert(seq({2}), page_ids({2}));
  tree.set_host(a.last_node, page_ids({50}));
  tree.set_host(b.last_node, page_ids({51}));
  EXPECT_TRUE(tree.evict_host(Pages(5)).empty());  // both still on the device
  EXPECT_EQ(tree.evict(Pages(1)), page_ids({1}));  // a is older: host-only now
  EXPECT_EQ(tree.evict_host(Pages(5)), page_ids({50}));
  EXPECT_EQ(tree.node_count(), 1u);
  EXPECT_EQ(tree.host_pages(), Pages(1));
  tree.verify();
}

TEST_F(RadixTreeTest, BackupsAndLoadsKeepTheirPrefixes) {
  tree.insert(seq({1, 2}), page_ids({1, 2}));
  auto r = tree.insert(seq({1, 2, 3}), page_ids({1, 2, 3}));  // [1 2] -> [3]
  EXPECT_THROW(tree.set_host(r.last_node, page_ids({60})), InternalError);  // parent not backed up
  tree.set_host(r.last_node->parent, page_ids({60, 61}));
  tree.set_host(r.last_node, page_ids({62}));
  tree.evict(Pages(3));  // both become host-only
  auto m = tree.match_prefix(plus(seq({1, 2, 3}), {0}));
  ASSERT_EQ(m.host_path.size(), 2u);
  EXPECT_THROW(tree.set_device(m.host_path[1], page_ids({9})), InternalError);  // parent not loaded yet
  tree.set_device(m.host_path[0], page_ids({7, 8}));
  tree.set_device(m.host_path[1], page_ids({9}));
  tree.verify();
}

TEST_F(RadixTreeTest, InsertOverAHostOnlyNodeAdoptsTheCallersPages) {
  auto r = tree.insert(seq({1, 2}), page_ids({1, 2}));
  tree.set_host(r.last_node, page_ids({70, 71}));
  tree.evict(Pages(2));
  auto ins = tree.insert(seq({1, 2, 3}), page_ids({4, 5, 6}));
  EXPECT_EQ(ins.prefix_len, Tokens(0));  // nothing was on the device: the caller keeps its pages
  auto m = tree.match_prefix(plus(seq({1, 2, 3}), {0}));
  EXPECT_EQ(m.device_pages, page_ids({4, 5, 6}));
  EXPECT_EQ(tree.host_pages(), Pages(2));
  tree.verify();
}

}  // namespace
}  // namespace kvgrid::cache
