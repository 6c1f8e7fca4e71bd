// Paged radix tree: one behaviour per test, then a randomized differential test against a
// deliberately simple reference model (a map from cached page prefixes to pages).
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

TEST_F(RadixTreeTest, UnlockWithoutLockIsABug) {
  auto r = tree.insert(seq({1}), page_ids({1}));
  EXPECT_THROW(tree.unlock(r.last_node), InternalError);
}

// ---- differential test ----------------------------------------------------------------------

// The reference: every cached page is identified by the token prefix that ends with it.
struct Model {
  struct Entry {
    PageId page;
    std::int64_t locks = 0;
    std::uint64_t last_access = 0;
  };
  std::map<std::vector<TokenId>, Entry> pages;
  std::uint64_t clock = 0;

  static std::vector<TokenId> prefix(const std::vector<TokenId>& t, std::size_t n) {
    return std::vector<TokenId>(t.begin(), t.begin() + static_cast<std::ptrdiff_t>(n));
  }
  std::pair<std::size_t, std::vector<PageId>> match(const std::vector<TokenId>& t) {
    ++clock;
    std::vector<PageId> out;
    if (t.size() <= 1) return {0, out};
    const std::size_t limit = (t.size() - 1) / kPage * kPage;
    std::size_t n = 0;
    for (; n + kPage <= limit; n += kPage) {
      auto it = pages.find(prefix(t, n + kPage));
      if (it == pages.end()) break;
      it->second.last_access = clock;
      out.push_back(it->second.page);
    }
    return {n, out};
  }
  std::size_t insert(const std::vector<TokenId>& t, const std::vector<PageId>& pg) {
    ++clock;
    std::size_t present = 0;
    bool missing = false;
    for (std::size_t i = 0; i < pg.size(); ++i) {
      auto key = prefix(t, (i + 1) * kPage);
      auto it = pages.find(key);
      if (!missing && it != pages.end()) {
        it->second.last_access = clock;
        present = (i + 1) * kPage;
        continue;
      }
      missing = true;
      pages[key] = Entry{pg[i], 0, clock};
    }
    return present;
  }
  void add_lock(const std::vector<TokenId>& t, std::size_t n, int delta) {
    for (std::size_t k = kPage; k <= n; k += kPage) pages.at(prefix(t, k)).locks += delta;
  }
  bool has_extension(const std::vector<TokenId>& key) const {
    auto it = pages.upper_bound(key);
    return it != pages.end() && it->first.size() > key.size() && std::equal(key.begin(), key.end(), it->first.begin());
  }
  std::uint64_t digest() const {
    std::uint64_t acc = mix64(kPage);
    for (const auto& [key, e] : pages) {
      std::uint64_t chain = 0;
      for (std::size_t k = 0; k < key.size(); k += kPage)
        chain = hash_combine(chain, hash_u32(std::span<const TokenId>(key.data() + k, kPage)));
      acc += mix64(chain ^ mix64(static_cast<std::uint64_t>(e.locks) + 0x5bd1e995ULL));
    }
    return acc;
  }
};

struct Held {
  TreeNode* node;
  std::vector<TokenId> tokens;
  std::size_t len;
};

void run_differential(std::uint64_t seed, int ops) {
  SCOPED_TRACE("differential seed " + std::to_string(seed));
  std::printf("[ radix differential ] seed %llu, %d operations\n", static_cast<unsigned long long>(seed), ops);
  Rng rng(seed);
  RadixTree tree(TreeConfig{Tokens(kPage)});
  DevicePool pool(Pages(48));
  Model model;
  std::vector<Held> held;
  std::size_t evicted_pages = 0, rejected = 0, locks = 0, max_nodes = 0;
  std::vector<std::vector<TokenId>> bases;
  for (int i = 0; i < 6; ++i) {
    std::vector<TokenId> b(static_cast<std::size_t>(rng.between(4, 24)));
    for (auto& t : b) t = static_cast<TokenId>(rng.below(3));
    bases.push_back(b);
  }
  auto random_prompt = [&] {
    std::vector<TokenId> t = bases[rng.below(bases.size())];
    t.resize(static_cast<std::size_t>(rng.between(0, static_cast<std::int64_t>(t.size()))));
    const auto extra = rng.between(0, 12);
    for (std::int64_t i = 0; i < extra; ++i) t.push_back(static_cast<TokenId>(rng.below(3)));
    return t;
  };

  for (int op = 0; op < ops; ++op) {
    SCOPED_TRACE("operation " + std::to_string(op));
    const auto kind = rng.below(10);
    if (kind < 3) {  // match (and maybe hold the match)
      auto t = random_prompt();
      auto m = tree.match_prefix(t);
      auto [n, pg] = model.match(t);
      ASSERT_EQ(m.matched.value(), static_cast<std::int64_t>(n));
      ASSERT_EQ(m.device_pages, pg);
      if (n > 0 && rng.bernoulli(0.3)) {
        tree.lock(m.last_node);
        ++locks;
        model.add_lock(t, n, +1);
        held.push_back({m.last_node, t, n});
      }
    } else if (kind < 7) {  // insert a page-aligned prompt with fresh pages
      auto t = random_prompt();
      t.resize(t.size() / kPage * kPage);
      const auto need = Pages(static_cast<std::int64_t>(t.size() / kPage));
      if (need > pool.free_pages()) {
        auto freed = tree.evict(need - pool.free_pages());
        // Model the eviction afterwards: each freed page must be a legal victim.
        for (PageId p : freed) {
          auto it = std::find_if(model.pages.begin(), model.pages.end(), [&](const auto& e) { return e.second.page == p; });
          ASSERT_NE(it, model.pages.end()) << "evicted page " << p << " not cached";
          ASSERT_EQ(it->second.locks, 0) << "evicted a locked page";
        }
        // Remove deepest first so that "no cached extension" holds at each removal.
        std::vector<std::vector<TokenId>> keys;
        for (PageId p : freed)
          for (const auto& [k, e] : model.pages)
            if (e.page == p) keys.push_back(k);
        std::sort(keys.begin(), keys.end(), [](const auto& a, const auto& b) { return a.size() > b.size(); });
        for (const auto& k : keys) {
          ASSERT_FALSE(model.has_extension(k)) << "evicted a page whose extension stays cached";
          model.pages.erase(k);
        }
        pool.free(freed);
        evicted_pages += freed.size();
      }
      auto fresh = pool.alloc(need);
      if (!fresh) {
        ++rejected;
        // Only legal when every remaining leaf page is locked.
        for (const auto& [k, e] : model.pages)
          if (!model.has_extension(k)) {
            ASSERT_GT(e.locks, 0) << "allocation failed while an unlocked leaf remained";
          }
        continue;
      }
      auto r = tree.insert(t, *fresh);
      const std::size_t present = model.insert(t, *fresh);
      ASSERT_EQ(r.prefix_len.value(), static_cast<std::int64_t>(present));
      pool.free(std::span<const PageId>(*fresh).first(present / kPage));  // duplicates
      if (!t.empty() && rng.bernoulli(0.3)) {
        tree.lock(r.last_node);
        model.add_lock(t, t.size(), +1);
        held.push_back({r.last_node, t, t.size()});
      }
    } else if (kind < 9) {  // release a held lock
      if (held.empty()) continue;
      const auto i = rng.below(held.size());
      tree.unlock(held[i].node);
      model.add_lock(held[i].tokens, held[i].len, -1);
      held.erase(held.begin() + static_cast<std::ptrdiff_t>(i));
    } else {  // evict some pages and check the LRU order against the model's access clocks
      const auto want = Pages(rng.between(1, 6));
      std::uint64_t oldest_candidate = ~0ull;
      for (const auto& [k, e] : model.pages)
        if (e.locks == 0 && !model.has_extension(k)) oldest_candidate = std::min(oldest_candidate, e.last_access);
      auto freed = tree.evict(want);
      if (!freed.empty()) {
        auto it = std::find_if(model.pages.begin(), model.pages.end(), [&](const auto& e) { return e.second.page == freed[0]; });
        ASSERT_NE(it, model.pages.end());
        ASSERT_EQ(it->second.last_access, oldest_candidate) << "first victim is not the least recently used leaf";
      }
      std::vector<std::vector<TokenId>> keys;
      for (PageId p : freed)
        for (const auto& [k, e] : model.pages)
          if (e.page == p) keys.push_back(k);
      ASSERT_EQ(keys.size(), freed.size());
      std::sort(keys.begin(), keys.end(), [](const auto& a, const auto& b) { return a.size() > b.size(); });
      for (const auto& k : keys) {
        ASSERT_EQ(model.pages.at(k).locks, 0);
        ASSERT_FALSE(model.has_extension(k));
        model.pages.erase(k);
      }
      pool.free(freed);
      evicted_pages += freed.size();
      if (static_cast<std::int64_t>(freed.size()) < want.value())
        for (const auto& [k, e] : model.pages)
          if (!model.has_extension(k)) {
            ASSERT_GT(e.locks, 0) << "eviction stopped early";
          }
    }
    tree.verify();
    pool.verify();
    ASSERT_EQ(tree.total_pages(), pool.used_pages());
    ASSERT_EQ(tree.total_pages().value(), static_cast<std::int64_t>(model.pages.size()));
    ASSERT_EQ(tree.digest(), model.digest());
    max_nodes = std::max(max_nodes, tree.node_count());
  }
  std::printf("[ radix differential ] seed %llu: %zu pages evicted, %zu inserts rejected, %zu match locks, %zu nodes at most\n",
              static_cast<unsigned long long>(seed), evicted_pages, rejected, locks, max_nodes);
  // The run must have exercised what it claims to test.
  EXPECT_GT(evicted_pages, 100u);
  EXPECT_GT(locks, 50u);
  EXPECT_GT(max_nodes, 10u);
  for (auto& h : held) tree.unlock(h.node);
  tree.verify();
}

TEST(RadixTreeDifferential, TenThousandMixedOperationsAgreeWithReferenceModel) {
  std::uint64_t seed = 20261129;
  if (const char* s = std::getenv("KVGRID_TEST_SEED")) seed = std::strtoull(s, nullptr, 10);
  for (std::uint64_t k = 0; k < 3; ++k) {
    run_differential(seed + k, 4000);
    if (HasFatalFailure()) return;
  }
}

}  // namespace
}  // namespace kvgrid::cache
