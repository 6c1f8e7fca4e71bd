// Paged radix tree: a randomized differential test against a deliberately simple reference model
// (a map from cached page prefixes to their device and host pages) covering matches across tiers,
// inserts (adopting host-only pages), locks, device and host eviction in LRU order, backups,
// load-backs and storage prefetches landing as host-only pages (insert_host), with verify() after every operation. Seeds are printed; KVGRID_TEST_SEED replays.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>

#include "cache/device_pool.hpp"
#include "cache/radix_tree.hpp"
#include "core/check.hpp"
#include "core/hash.hpp"
#include "core/rng.hpp"

namespace kvgrid::cache {
namespace {

constexpr std::int64_t kPage = 4;

// ---- differential test ----------------------------------------------------------------------

// The reference: every cached page is identified by the token prefix that ends with it, and holds
// a device page, a host page, or both.
struct Model {
  struct Entry {
    PageId page{0};  // device page; 0: not on the device
    PageId host{0};  // host page; 0: not backed up
    std::int64_t locks = 0;
    std::uint64_t last_access = 0;
    bool device() const { return page.value() != 0; }
    bool backed() const { return host.value() != 0; }
  };
  std::map<std::vector<TokenId>, Entry> pages;
  std::uint64_t clock = 0;

  static std::vector<TokenId> prefix(const std::vector<TokenId>& t, std::size_t n) {
    return std::vector<TokenId>(t.begin(), t.begin() + static_cast<std::ptrdiff_t>(n));
  }
  struct Match {
    std::size_t device = 0, total = 0;
    std::vector<PageId> device_pages, host_pages;
  };
  Match match(const std::vector<TokenId>& t) {
    ++clock;
    Match m;
    if (t.size() <= 1) return m;
    const std::size_t limit = (t.size() - 1) / kPage * kPage;
    std::size_t n = 0;
    bool host_part = false;
    for (; n + kPage <= limit; n += kPage) {
      auto it = pages.find(prefix(t, n + kPage));
      if (it == pages.end()) break;
      it->second.last_access = clock;
      if (!it->second.device()) host_part = true;
      if (host_part) m.host_pages.push_back(it->second.host);
      else m.device_pages.push_back(it->second.page);
      if (!host_part) m.device = n + kPage;
    }
    m.total = n;
    return m;
  }
  std::size_t insert(const std::vector<TokenId>& t, const std::vector<PageId>& pg) {
    ++clock;
    std::size_t present = 0;
    bool adopted = false, missing = false;
    for (std::size_t i = 0; i < pg.size(); ++i) {
      auto key = prefix(t, (i + 1) * kPage);
      auto it = pages.find(key);
      if (!missing && it != pages.end()) {
        it->second.last_access = clock;
        if (!it->second.device()) {
          it->second.page = pg[i];  // a host-only page takes the caller's device page
          adopted = true;
        } else if (!adopted) {
          present = (i + 1) * kPage;
        }
        continue;
      }
      missing = true;
      pages[key] = Entry{pg[i], PageId(0), 0, clock};
    }
    return present;
  }
  // A storage prefetch lands: pages [start, t.size()) get the host pages `pg`; returns the unused.
  std::vector<PageId> insert_host(const std::vector<TokenId>& t, std::size_t start, const std::vector<PageId>& pg) {
    ++clock;
    std::vector<PageId> unused;
    const std::size_t first = start / kPage, np = t.size() / kPage;
    bool prev_backed = true;  // the root
    for (std::size_t i = 0; i < np; ++i) {
      auto key = prefix(t, (i + 1) * kPage);
      auto it = pages.find(key);
      if (it == pages.end()) {
        if (!prev_backed) {
          unused.insert(unused.end(), pg.begin() + static_cast<std::ptrdiff_t>(i - first), pg.end());
          return unused;
        }
        for (std::size_t j = i; j < np; ++j) pages[prefix(t, (j + 1) * kPage)] = Entry{PageId(0), pg[j - first], 0, clock};
        return unused;
      }
      it->second.last_access = clock;
      if (i >= first) {
        if (it->second.backed()) unused.push_back(pg[i - first]);
        else if (prev_backed) it->second.host = pg[i - first];
      }
      prev_backed = it->second.backed();
    }
    return unused;
  }
  void add_lock(const std::vector<TokenId>& t, std::size_t n, int delta) {
    for (std::size_t k = kPage; k <= n; k += kPage) pages.at(prefix(t, k)).locks += delta;
  }
  // Cached extensions of `key` (longer keys starting with it), optionally only device-resident ones.
  bool has_extension(const std::vector<TokenId>& key, bool device_only = false) const {
    for (auto it = pages.upper_bound(key); it != pages.end() && it->first.size() > key.size() &&
                                           std::equal(key.begin(), key.end(), it->first.begin());
         ++it)
      if (!device_only || it->second.device()) return true;
    return false;
  }
  std::vector<TokenId> key_of_device(PageId p) const {
    for (const auto& [k, e] : pages)
      if (e.page == p) return k;
    return {};
  }
  std::vector<TokenId> key_of_host(PageId p) const {
    for (const auto& [k, e] : pages)
      if (e.host == p) return k;
    return {};
  }
  std::uint64_t digest() const {
    std::uint64_t acc = mix64(kPage);
    for (const auto& [key, e] : pages) {
      std::uint64_t chain = 0;
      for (std::size_t k = 0; k < key.size(); k += kPage)
        chain = hash_combine(chain, hash_u32(std::span<const TokenId>(key.data() + k, kPage)));
      const std::uint64_t tiers = (e.device() ? 1 : 0) | (e.backed() ? 2 : 0);
      acc += mix64(chain ^ mix64(static_cast<std::uint64_t>(e.locks) + 0x5bd1e995ULL + (tiers << 40)));
    }
    return acc;
  }
};

struct Held {
  TreeNode* node;
  std::vector<TokenId> tokens;
  std::size_t len;
};

struct Coverage {
  std::size_t evicted = 0, host_evicted = 0, rejected = 0, locks = 0, backups = 0, loads = 0, adopted = 0,
              host_hits = 0, max_nodes = 0, prefetched = 0;
};

void run_differential(std::uint64_t seed, int ops, Coverage& cov) {
  SCOPED_TRACE("differential seed " + std::to_string(seed));
  std::printf("[ radix differential ] seed %llu, %d operations\n", static_cast<unsigned long long>(seed), ops);
  Rng rng(seed);
  RadixTree tree(TreeConfig{Tokens(kPage)});
  DevicePool pool(Pages(48)), host_pool(Pages(96));
  Model model;
  std::vector<Held> held;
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
  // Checks a device eviction against the model and applies it there.
  auto apply_device_eviction = [&](const std::vector<PageId>& freed) {
    std::vector<std::vector<TokenId>> keys;
    for (PageId p : freed) {
      auto k = model.key_of_device(p);
      ASSERT_FALSE(k.empty()) << "evicted device page " << p << " not cached";
      keys.push_back(k);
    }
    std::sort(keys.begin(), keys.end(), [](const auto& a, const auto& b) { return a.size() > b.size(); });
    for (const auto& k : keys) {
      auto& e = model.pages.at(k);
      ASSERT_EQ(e.locks, 0) << "evicted a locked page";
      ASSERT_FALSE(model.has_extension(k, /*device_only=*/true)) << "evicted a page whose extension stays on the device";
      if (e.backed()) {
        e.page = PageId(0);  // stays as host-only
      } else {
        ASSERT_FALSE(model.has_extension(k)) << "dropped a page that still has cached extensions";
        model.pages.erase(k);
      }
    }
    pool.free(freed);
    cov.evicted += freed.size();
  };

  // Checks a host eviction against the model (deepest pages first) and applies it there.
  auto apply_host_eviction = [&](const std::vector<PageId>& freed) {
    std::vector<std::vector<TokenId>> keys;
    for (PageId p : freed) {
      auto k = model.key_of_host(p);
      ASSERT_FALSE(k.empty()) << "evicted host page " << p << " not cached";
      keys.push_back(k);
    }
    std::sort(keys.begin(), keys.end(), [](const auto& a, const auto& b) { return a.size() > b.size(); });
    for (const auto& k : keys) {
      ASSERT_FALSE(model.pages.at(k).device()) << "host eviction of a device-resident page";
      ASSERT_EQ(model.pages.at(k).locks, 0);
      ASSERT_FALSE(model.has_extension(k)) << "host eviction of a page with cached extensions";
      model.pages.erase(k);
    }
    host_pool.free(freed);
    cov.host_evicted += freed.size();
  };

  for (int op = 0; op < ops; ++op) {
    SCOPED_TRACE("operation " + std::to_string(op));
    const auto kind = rng.below(18);
    if (kind < 3) {  // match (and maybe hold the match)
      auto t = random_prompt();
      auto m = tree.match_prefix(t);
      auto ref = model.match(t);
      if (m.matched.value() != static_cast<std::int64_t>(ref.device)) {
        std::printf("prompt len %zu: tree device %lld total %lld; model device %zu total %zu\n", t.size(),
                    static_cast<long long>(m.matched.value()), static_cast<long long>(m.host_matched.value()), ref.device, ref.total);
        for (std::size_t k = kPage; k <= t.size(); k += kPage) {
          auto it = model.pages.find(Model::prefix(t, k));
          if (it == model.pages.end()) break;
          std::printf("  model page %zu: device %u host %u\n", k / kPage, it->second.page.value(), it->second.host.value());
        }
        for (const TreeNode* n = m.last_node; n != tree.root(); n = n->parent)
          std::printf("  tree node %llu: %zu tokens, device %zu host %zu\n", static_cast<unsigned long long>(n->id), n->key.size(), n->device.size(), n->host.size());
      }
      ASSERT_EQ(m.matched.value(), static_cast<std::int64_t>(ref.device));
      ASSERT_EQ(m.device_pages, ref.device_pages);
      ASSERT_EQ(m.host_matched.value(), static_cast<std::int64_t>(ref.total));
      ASSERT_EQ(m.host_pages, ref.host_pages);
      cov.host_hits += m.host_pages.size();
      if (ref.device > 0 && rng.bernoulli(0.3)) {
        tree.lock(m.last_node);
        ++cov.locks;
        model.add_lock(t, ref.device, +1);
        held.push_back({m.last_node, t, ref.device});
      }
    } else if (kind < 7) {  // insert a page-aligned prompt with fresh pages
      auto t = random_prompt();
      t.resize(t.size() / kPage * kPage);
      const auto need = Pages(static_cast<std::int64_t>(t.size() / kPage));
      if (need > pool.free_pages()) {
        apply_device_eviction(tree.evict(need - pool.free_pages()));
        if (::testing::Test::HasFatalFailure()) return;
      }
      auto fresh = pool.alloc(need);
      if (!fresh) {
        ++cov.rejected;
        for (const auto& [k, e] : model.pages)
          if (e.device() && !model.has_extension(k, true)) {
            ASSERT_GT(e.locks, 0) << "allocation failed while an unlocked device leaf remained";
          }
        continue;
      }
      std::size_t host_only_before = 0;
      for (std::size_t i = 1; i * kPage <= t.size(); ++i) {
        auto it = model.pages.find(Model::prefix(t, i * kPage));
        if (it == model.pages.end()) break;
        host_only_before += it->second.device() ? 0 : 1;
      }
      auto r = tree.insert(t, *fresh);
      const std::size_t present = model.insert(t, *fresh);
      ASSERT_EQ(r.prefix_len.value(), static_cast<std::int64_t>(present));
      cov.adopted += host_only_before;
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
    } else if (kind < 10) {  // device eviction; the first victim is the least recently used candidate
      const auto want = Pages(rng.between(1, 6));
      std::uint64_t oldest = ~0ull;
      for (const auto& [k, e] : model.pages)
        if (e.device() && e.locks == 0 && !model.has_extension(k, true)) oldest = std::min(oldest, e.last_access);
      auto freed = tree.evict(want);
      if (!freed.empty()) {
        ASSERT_EQ(model.pages.at(model.key_of_device(freed[0])).last_access, oldest);
      }
      apply_device_eviction(freed);
      if (::testing::Test::HasFatalFailure()) return;
    } else if (kind < 12) {  // backup: the matched path's nodes without a host copy, top down
      auto t = random_prompt();
      auto m = tree.match_prefix(t);
      model.match(t);
      std::vector<std::pair<TreeNode*, std::size_t>> chain;  // (node, its end in tokens), leaf first
      std::size_t end = static_cast<std::size_t>(m.matched.value());
      for (TreeNode* n = m.last_node; n != tree.root(); n = n->parent) {
        chain.push_back({n, end});
        end -= n->key.size();
      }
      for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
        TreeNode* n = it->first;
        if (!n->host.empty()) continue;
        const std::size_t start = it->second - n->key.size();
        auto hp = host_pool.alloc(n->key_pages(kPage));
        if (!hp) {
          apply_host_eviction(tree.evict_host(n->key_pages(kPage) - host_pool.free_pages()));
          if (::testing::Test::HasFatalFailure()) return;
          hp = host_pool.alloc(n->key_pages(kPage));
          if (!hp) break;
        }
        tree.set_host(n, *hp);
        for (std::size_t i = 0; i < hp->size(); ++i) model.pages.at(Model::prefix(t, start + (i + 1) * kPage)).host = (*hp)[i];
        ++cov.backups;
      }
    } else if (kind < 15) {  // load-back of a host hit
      auto t = random_prompt();
      auto m = tree.match_prefix(t);
      auto ref = model.match(t);
      if (m.host_path.empty()) continue;
      std::size_t pos = ref.device;
      for (TreeNode* n : m.host_path) {
        const Pages k = n->key_pages(kPage);
        if (k > pool.free_pages()) {
          tree.lock(m.last_node);  // keep the path being loaded
          apply_device_eviction(tree.evict(k - pool.free_pages()));
          tree.unlock(m.last_node);
          if (::testing::Test::HasFatalFailure()) return;
        }
        auto dp = pool.alloc(k);
        if (!dp) break;
        tree.set_device(n, *dp);
        for (std::size_t i = 0; i < dp->size(); ++i) model.pages.at(Model::prefix(t, pos + (i + 1) * kPage)).page = (*dp)[i];
        pos += n->key.size();
        ++cov.loads;
      }
    } else if (kind >= 16) {  // a storage prefetch lands below the deepest backed-up page of a prompt
      auto t = random_prompt();
      t.resize(t.size() / kPage * kPage);
      auto backed_prefix = [&] {
        std::size_t n = 0;
        for (; n + kPage <= t.size(); n += kPage) {
          auto it = model.pages.find(Model::prefix(t, n + kPage));
          if (it == model.pages.end() || !it->second.backed()) break;
        }
        return n;
      };
      if (backed_prefix() == t.size()) continue;
      Pages need(static_cast<std::int64_t>((t.size() - backed_prefix()) / kPage));
      if (need > host_pool.free_pages()) {
        apply_host_eviction(tree.evict_host(need - host_pool.free_pages()));
        if (::testing::Test::HasFatalFailure()) return;
      }
      const std::size_t start = backed_prefix();  // the eviction may have shortened it
      auto hp = host_pool.alloc(Pages(static_cast<std::int64_t>((t.size() - start) / kPage)));
      if (!hp) continue;
      auto unused = tree.insert_host(t, Tokens(static_cast<std::int64_t>(start)), *hp);
      auto ref_unused = model.insert_host(t, start, *hp);
      ASSERT_EQ(unused, ref_unused);
      host_pool.free(unused);
      cov.prefetched += hp->size() - unused.size();
    } else {  // host eviction
      const auto want = Pages(rng.between(1, 4));
      std::uint64_t oldest = ~0ull;
      for (const auto& [k, e] : model.pages)
        if (!e.device() && e.locks == 0 && !model.has_extension(k)) oldest = std::min(oldest, e.last_access);
      auto freed = tree.evict_host(want);
      if (!freed.empty()) {
        ASSERT_EQ(model.pages.at(model.key_of_host(freed[0])).last_access, oldest);
      }
      apply_host_eviction(freed);
      if (::testing::Test::HasFatalFailure()) return;
    }
    tree.verify();
    pool.verify();
    host_pool.verify();
    ASSERT_EQ(tree.total_pages(), pool.used_pages());
    ASSERT_EQ(tree.host_pages(), host_pool.used_pages());
    ASSERT_EQ(tree.digest(), model.digest());
    cov.max_nodes = std::max(cov.max_nodes, tree.node_count());
  }
  std::printf("[ radix differential ] seed %llu: %zu device pages evicted, %zu host pages evicted, %zu backups, "
              "%zu load-backs, %zu host-only pages adopted by inserts, %zu host-hit pages, %zu prefetched pages inserted, "
              "%zu rejected, %zu nodes at most\n",
              static_cast<unsigned long long>(seed), cov.evicted, cov.host_evicted, cov.backups, cov.loads, cov.adopted,
              cov.host_hits, cov.prefetched, cov.rejected, cov.max_nodes);
  for (auto& h : held) tree.unlock(h.node);
  tree.verify();
}

TEST(RadixTreeDifferential, TenThousandMixedOperationsAgreeWithReferenceModel) {
  std::uint64_t seed = 20261129;
  if (const char* s = std::getenv("KVGRID_TEST_SEED")) seed = std::strtoull(s, nullptr, 10);
  Coverage total;
  for (std::uint64_t k = 0; k < 3; ++k) {
    Coverage c;
    run_differential(seed + k, 4000, c);
    if (HasFatalFailure()) return;
    total.evicted += c.evicted;
    total.backups += c.backups;
    total.loads += c.loads;
    total.host_hits += c.host_hits;
    total.host_evicted += c.host_evicted;
    total.adopted += c.adopted;
    total.prefetched += c.prefetched;
    total.max_nodes = std::max(total.max_nodes, c.max_nodes);
  }
  // The runs must have exercised what they claim to test.
  EXPECT_GT(total.evicted, 1000u);
  EXPECT_GT(total.backups, 50u);  // (prefetch landings give many nodes their host copy first)
  EXPECT_GT(total.loads, 20u);
  EXPECT_GT(total.host_hits, 20u);
  EXPECT_GT(total.prefetched, 100u);
  EXPECT_GT(total.host_evicted, 50u);
  EXPECT_GT(total.adopted, 20u);
  EXPECT_GT(total.max_nodes, 10u);
}

}  // namespace
}  // namespace kvgrid::cache
