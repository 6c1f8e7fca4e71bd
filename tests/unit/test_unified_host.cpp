// Unified radix tree core with host copies (the host tier's data in the tree): the window-only
// load-back by hand (bug-catalogue #19), one test per host rule, and a randomized differential
// test of device + host values against a page-level reference (every operation followed by
// verify()). The differential test prints its seed; KVGRID_TEST_SEED replays one.
#include <gtest/gtest.h>

#include "unified_rig.hpp"

namespace kvgrid::cache::unified {
namespace {

constexpr std::int64_t kWindow = 10, kChunk = 8;  // rounded window: 12 tokens = 3 pages
using Key = std::vector<TokenId>;

Key prefix(const std::vector<TokenId>& t, std::size_t n) { return Key(t.begin(), t.begin() + static_cast<std::ptrdiff_t>(n)); }

std::vector<Slot> host_of(const Node* n, ComponentId c) { return n->at(c).host ? *n->at(c).host : std::vector<Slot>{}; }

// Backs up every device value on the path to `n` (host slots counted up from `next`).
void backup_all(Hybrid& h, Node* n, std::uint32_t& next) {
  for (Node* b : h.tree.backup_candidates(n))
    for (ComponentId c : {h.full, h.swa, h.mamba}) {
      const ComponentData& d = b->at(c);
      if (!d.live() || d.backed()) continue;
      h.tree.set_host(b, c, run(next, d.value->size()));
      next += static_cast<std::uint32_t>(d.value->size());
    }
}

// ---- by hand --------------------------------------------------------------------------------

// A host-only history longer than the window: the load-back restores every FULL page but only
// the rounded SWA window (3 pages), cutting the host-only node that straddles the window's start
// first (#19: loading it whole would take SWA pages nobody reads), and the boundary's state.
TEST(UnifiedHost, LoadBackRestoresFullPagesTheRoundedSwaWindowAndTheBoundaryState) {
  Hybrid h(kWindow, kChunk);
  const auto t = toks(24);
  h.put(t, 12, run(1, 3), run(1, 3), 0);              // A = [0, 12): SWA live (the window covers it all)
  h.put(t, 16, run(1, 4), S({4}), 12, /*state=*/1);   // B = [12, 16): SWA live, state at 16
  Node* a = h.node(t, 12);
  Node* b = h.node(t, 16);
  std::uint32_t next = 101;
  backup_all(h, b, next);
  EXPECT_EQ(host_of(a, h.full), S({101, 102, 103}));
  EXPECT_EQ(host_of(a, h.swa), S({104, 105, 106}));
  EXPECT_EQ(host_of(b, h.full), S({107}));
  EXPECT_EQ(host_of(b, h.swa), S({108}));
  EXPECT_EQ(host_of(b, h.mamba), S({109}));
  EXPECT_TRUE(h.tree.backup_candidates(b).empty()) << "a backed-up path has nothing left to back up";

  auto e = h.tree.evict(h.full, 100);  // the whole device tier goes; the nodes stay host-only
  EXPECT_EQ(e.freed[h.full.value()].size(), 4u);
  EXPECT_EQ(e.nodes_deleted, 0u);
  EXPECT_EQ(h.tree.node_count(), 2u);
  EXPECT_EQ(h.tree.host_slots(h.full), 4);
  h.tree.verify();

  auto m = h.tree.match_prefix(head(t, 20));
  EXPECT_EQ(m.matched, Tokens(0));
  EXPECT_EQ(m.host_matched, Tokens(16));
  ASSERT_EQ(m.host_path.size(), 2u);
  auto items = h.tree.plan_load(m);
  // A was cut at 16 - 12 = 4: A1 = [0, 4) keeps its SWA page on the host only.
  Node* a1 = h.node(t, 4);
  Node* a2 = h.node(t, 12);
  EXPECT_EQ(a2, a);  // a split keeps the node as the lower part
  ASSERT_EQ(m.host_path.size(), 3u);
  EXPECT_EQ(m.host_path[0], a1);
  EXPECT_EQ(host_of(a1, h.swa), S({104}));
  EXPECT_EQ(host_of(a2, h.swa), S({105, 106}));
  struct Want {
    Node* node;
    ComponentId c;
    std::vector<Slot> host;
  };
  const std::vector<Want> want{{a1, h.full, S({101})}, {a2, h.full, S({102, 103})}, {a2, h.swa, S({105, 106})},
                               {b, h.full, S({107})},  {b, h.swa, S({108})},        {b, h.mamba, S({109})}};
  ASSERT_EQ(items.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(items[i].node, want[i].node) << "item " << i;
    EXPECT_EQ(items[i].component, want[i].c) << "item " << i;
    EXPECT_EQ(items[i].host, want[i].host) << "item " << i;
  }
  std::uint32_t dev = 1;
  for (const auto& it : items) {
    h.tree.commit_load(it, run(dev, it.host.size()));
    dev += static_cast<std::uint32_t>(it.host.size());
  }
  h.tree.verify();
  auto again = h.tree.match_prefix(head(t, 20));
  EXPECT_EQ(again.matched, Tokens(16)) << "after the load-back the device alone serves the boundary";
  EXPECT_EQ(value_of(a1, h.swa), std::vector<Slot>{}) << "the page above the window stays on the host";
  EXPECT_EQ(again.components[h.swa.value()].from, Tokens(4));
  EXPECT_EQ(again.components[h.mamba.value()].slots, S({8}));
}

// Short of the window (a boundary at 8 < W): the window reaches the root, nothing is cut.
TEST(UnifiedHost, ABoundaryShallowerThanTheWindowLoadsTheWholePath) {
  Hybrid h(kWindow, kChunk);
  const auto t = toks(12);
  h.put(t, 8, run(1, 2), run(1, 2), 0, /*state=*/1);
  std::uint32_t next = 50;
  backup_all(h, h.node(t, 8), next);
  h.tree.evict(h.full, 10);
  auto m = h.tree.match_prefix(t);
  ASSERT_EQ(m.host_matched, Tokens(8));
  auto items = h.tree.plan_load(m);
  ASSERT_EQ(items.size(), 3u);
  EXPECT_EQ(items[1].component, h.swa);
  EXPECT_EQ(items[1].host, S({52, 53}));
  EXPECT_EQ(h.tree.node_count(), 1u);
}

TEST(UnifiedHost, DeviceEvictionKeepsHostCopiesAndHostEvictionCascadesAndDeletesEmptyLeaves) {
  Hybrid h(kWindow, kChunk);
  const auto t = toks(24);
  h.put(t, 16, run(1, 4), run(1, 4), 0, /*state=*/1);  // [0, 4) SWA tombstone, [4, 16) live, state at 16
  Node* leaf = h.node(t, 16);
  std::uint32_t next = 20;
  backup_all(h, leaf, next);
  Node* top = h.node(t, 4);
  EXPECT_FALSE(top->at(h.swa).backed()) << "a tombstone has no host copy";
  // Device: SWA on the leaf (priority 0 on a leaf: the whole device part of the leaf goes).
  auto e = h.tree.evict_component(leaf, h.swa);
  EXPECT_EQ(e.freed[h.full.value()].size(), 3u);
  EXPECT_EQ(e.nodes_deleted, 0u);
  EXPECT_TRUE(leaf->at(h.full).backed() && leaf->at(h.swa).backed() && leaf->at(h.mamba).backed());
  EXPECT_EQ(h.tree.host_eviction_candidates(h.full), 1u) << "only the host-only leaf";
  EXPECT_FALSE(top->in_host_evictable[h.full.value()]) << "top still has its device pages";
  h.tree.verify();
  // Host: FULL on the leaf goes with everything (a leaf), then the leaf is empty and deleted.
  auto hv = h.tree.evict_host(h.full, 1);
  EXPECT_EQ(hv.freed[h.full.value()], S({21, 22, 23}));
  EXPECT_EQ(hv.freed[h.swa.value()], S({24, 25, 26}));
  EXPECT_EQ(hv.freed[h.mamba.value()], S({27}));
  EXPECT_EQ(hv.nodes_deleted, 1u);
  EXPECT_EQ(h.tree.node_count(), 1u);
  EXPECT_EQ(h.tree.host_slots(h.full), 1);
  EXPECT_EQ(h.tree.host_eviction_candidates(h.full), 0u) << "top keeps its device page";
  h.tree.verify();
}

TEST(UnifiedHost, LocksAndWritesInFlightProtectHostCopiesAndFullHostCopiesGoBottomUp) {
  Hybrid h(kWindow, kChunk);
  const auto t = toks(24);
  h.put(t, 8, run(1, 2), run(1, 2), 0);
  h.put(t, 16, run(1, 4), S({3, 4}), 8);
  std::uint32_t next = 30;
  Node* low = h.node(t, 16);
  Node* up = h.node(t, 8);
  backup_all(h, low, next);
  h.tree.evict(h.full, 100);
  h.tree.verify();
  // FULL's host copy of `up` cannot go while `low` has one (host copies form a prefix).
  EXPECT_FALSE(up->in_host_evictable[h.full.value()]);
  EXPECT_TRUE(low->in_host_evictable[h.full.value()]);
  LockHandle lk = h.tree.lock(low);
  EXPECT_EQ(h.tree.host_eviction_candidates(h.full), 0u) << "a lock protects host copies";
  EXPECT_TRUE(h.tree.evict_host(h.full, 10).freed[h.full.value()].empty());
  h.tree.unlock(lk);
  h.tree.mark_writing(low, 7);
  EXPECT_EQ(h.tree.host_eviction_candidates(h.full), 0u) << "a write in flight protects the node";
  h.tree.mark_writing(low, 0);
  auto e = h.tree.evict_host(h.full, 3);  // low (2 pages), then up
  EXPECT_EQ(e.freed[h.full.value()], S({34, 35, 30, 31}));
  EXPECT_EQ(h.tree.node_count(), 0u);
  h.tree.verify();
}

TEST(UnifiedHost, SplitsSliceHostCopiesCopyTheWriteAndVerifyNamesABrokenHostPrefix) {
  Hybrid h(kWindow, kChunk);
  const auto t = toks(24);
  h.put(t, 16, run(1, 4), run(1, 3), 4, /*state=*/1);  // [0, 4) an SWA tombstone, [4, 16) live
  Node* leaf = h.node(t, 16);
  std::uint32_t next = 40;
  backup_all(h, leaf, next);
  h.tree.mark_writing(leaf, 9);
  h.tree.match_prefix(head(t, 9));  // splits the leaf [4, 16) at 8
  Node* mid = h.node(t, 8);
  EXPECT_EQ(mid->pending_write, 9u);
  EXPECT_EQ(host_of(mid, h.full), S({41}));
  EXPECT_EQ(host_of(leaf, h.full), S({42, 43}));
  EXPECT_EQ(host_of(mid, h.mamba), std::vector<Slot>{}) << "a state's host copy stays at its depth";
  EXPECT_EQ(host_of(leaf, h.mamba), S({47}));
  h.tree.verify();
  Hybrid g(kWindow, kChunk);
  g.put(t, 8, run(1, 2), run(1, 2), 0);
  g.put(t, 16, run(1, 4), S({3, 4}), 8);
  g.tree.set_host(g.node(t, 16), g.full, S({5, 6}));  // below a node without a host copy
  EXPECT_THROW(g.tree.verify(), InternalError);
}

// ---- randomized differential test against a page-level reference ---------------------------

constexpr std::int64_t kInf = std::numeric_limits<std::int64_t>::max();

// Every cached page is the token prefix ending with it: per component (FULL, SWA, MAMBA — the
// state at the page's end) a device slot and a host slot, each maybe absent.
struct HPage {
  std::optional<Slot> dev[3], host[3];
  std::int64_t full_locks = 0, mamba_locks = 0;
  bool empty() const {
    for (int c = 0; c < 3; ++c)
      if (dev[c] || host[c]) return false;
    return true;
  }
};

struct HostRef {
  std::map<Key, HPage> pages;

  // The deepest boundary <= limit where FULL is present on every page from the root, SWA on the
  // last min(W, d) tokens and MAMBA exactly at d; present = on the device (or on the host).
  std::size_t match(const std::vector<TokenId>& t, std::size_t limit, bool with_host) const {
    std::size_t boundary = 0;
    std::int64_t live = kInf;
    for (std::size_t d = kPage; d <= limit / kPage * kPage; d += kPage) {
      auto it = pages.find(prefix(t, d));
      if (it == pages.end()) break;
      const HPage& pg = it->second;
      auto present = [&](int c) { return pg.dev[c].has_value() || (with_host && pg.host[c].has_value()); };
      if (!present(0)) break;
      live = !present(1) ? 0 : live == kInf ? kInf : live + kPage;
      if (live >= std::min<std::int64_t>(kWindow, static_cast<std::int64_t>(d)) && present(2)) boundary = d;
    }
    return boundary;
  }
  // The host slots a load-back to `b` copies, per component, in page order: FULL every page
  // without a device page, SWA the pages of the rounded window, MAMBA the state at b.
  std::vector<Slot> load(const std::vector<TokenId>& t, std::size_t b, int c) const {
    std::vector<Slot> out;
    const std::size_t rounded = static_cast<std::size_t>((kWindow + kPage - 1) / kPage * kPage);
    for (std::size_t d = kPage; d <= b; d += kPage) {
      const HPage& pg = pages.at(prefix(t, d));
      const bool wanted = c == 0 || (c == 1 && d + rounded > b) || (c == 2 && d == b);
      if (wanted && !pg.dev[c]) out.push_back(*pg.host[c]);
    }
    return out;
  }
  HPage* find(int c, Slot s, bool host, Key* key = nullptr) {
    for (auto& [k, pg] : pages)
      if ((host ? pg.host[c] : pg.dev[c]) == s) {
        if (key) *key = k;
        return &pg;
      }
    return nullptr;
  }
  void lock(const std::vector<TokenId>& t, std::size_t cached, int delta) {
    for (std::size_t d = kPage; d <= cached; d += kPage) pages.at(prefix(t, d)).full_locks += delta;
    if (cached > 0) pages.at(prefix(t, cached)).mamba_locks += delta;
  }
  bool has_extension(const Key& key) const {
    auto it = pages.upper_bound(key);
    return it != pages.end() && it->first.size() > key.size() && std::equal(key.begin(), key.end(), it->first.begin());
  }
};

std::map<Key, HPage> host_content(const Hybrid& h) {
  std::map<Key, HPage> out;
  const ComponentId ids[3] = {h.full, h.swa, h.mamba};
  std::vector<std::pair<const Node*, Key>> stack{{h.tree.root(), {}}};
  while (!stack.empty()) {
    auto [n, path] = std::move(stack.back());
    stack.pop_back();
    const std::size_t pages = n->key.size() / kPage;
    for (std::size_t i = 0; i < pages; ++i) {
      path.insert(path.end(), n->key.begin() + static_cast<std::ptrdiff_t>(i * kPage),
                  n->key.begin() + static_cast<std::ptrdiff_t>((i + 1) * kPage));
      HPage pg;
      for (int c = 0; c < 3; ++c) {
        const ComponentData& d = n->at(ids[c]);
        const bool here = c < 2 || i + 1 == pages;  // a state sits at the node's end
        if (here && d.value) pg.dev[c] = (*d.value)[c < 2 ? i : 0];
        if (here && d.host) pg.host[c] = (*d.host)[c < 2 ? i : 0];
      }
      out[path] = pg;
    }
    for (const auto& [k, c] : n->children) stack.push_back({c.get(), path});
  }
  return out;
}

// Component c's next host victim from the rules alone: a host copy without a device value, no
// write in flight, FULL only where no child has a FULL host copy, nothing the cascade reaches
// locked; the least (last access, node id).
std::optional<Slot> host_victim_slot(const Hybrid& h, int c) {
  const ComponentId ids[3] = {h.full, h.swa, h.mamba};
  const Node* best = nullptr;
  std::vector<const Node*> stack{h.tree.root()};
  while (!stack.empty()) {
    const Node* n = stack.back();
    stack.pop_back();
    for (const auto& [k, child] : n->children) stack.push_back(child.get());
    if (n == h.tree.root() || !n->at(ids[c]).backed() || n->at(ids[c]).live() || n->pending_write) continue;
    bool ok = true;
    if (c == 0)
      for (const auto& [k, child] : n->children) ok = ok && !child->at(h.full).backed();
    for (int d = 0; d < 3; ++d)
      if ((n->is_leaf() || c == 0 || d >= c) && n->at(ids[d]).lock_ref > 0) ok = false;
    if (ok && (!best || n->last_access < best->last_access || (n->last_access == best->last_access && n->id < best->id)))
      best = n;
  }
  if (!best) return std::nullopt;
  return (*best->at(ids[c]).host)[0];
}

struct HostRequest {
  std::vector<TokenId> tokens;
  std::size_t end = 0, cached = 0;
  LockHandle lock;
  std::vector<Slot> full_tree, full_own;
  SwaRequest swa;
  Slot state;
};

struct HostCoverage {
  std::size_t admitted = 0, rejected = 0, loads = 0, partial_loads = 0, swa_left_on_host = 0, host_evicted = 0,
              host_only_pages = 0, backups = 0, device_evicted = 0, healed_from_host = 0;
};

void run_host_differential(std::uint64_t seed, int ops, std::int64_t full_pages, std::int64_t host_pages, std::size_t max_requests,
                           HostCoverage& cov) {
  SCOPED_TRACE("unified host differential seed " + std::to_string(seed));
  std::printf("[ unified host differential ] seed %llu, %d operations, %lld device / %lld host FULL pages\n",
              static_cast<unsigned long long>(seed), ops, static_cast<long long>(full_pages), static_cast<long long>(host_pages));
  Rng rng(seed);
  Hybrid h(kWindow, kChunk);
  const ComponentId ids[3] = {h.full, h.swa, h.mamba};
  SlotPool dev[3] = {SlotPool(full_pages), SlotPool(40), SlotPool(24)};
  SlotPool host[3] = {SlotPool(host_pages), SlotPool(host_pages), SlotPool(host_pages / 2)};
  HostRef ref;
  std::vector<std::unique_ptr<HostRequest>> reqs;
  std::vector<std::vector<TokenId>> bases;
  for (int i = 0; i < 3; ++i) {
    std::vector<TokenId> b(static_cast<std::size_t>(rng.between(8, 40)));
    for (auto& x : b) x = static_cast<TokenId>(rng.below(3));
    bases.push_back(b);
  }
  auto random_prompt = [&] {
    std::vector<TokenId> t = bases[rng.below(bases.size())];
    t.resize(static_cast<std::size_t>(rng.between(1, static_cast<std::int64_t>(t.size()))));
    const auto extra = rng.between(0, 12);
    for (std::int64_t i = 0; i < extra; ++i) t.push_back(static_cast<TokenId>(rng.below(3)));
    return t;
  };
  auto drop_empty = [&](std::vector<Key> keys) {
    std::sort(keys.begin(), keys.end(), [](const Key& a, const Key& b) { return a.size() > b.size(); });
    for (const Key& k : keys) {
      auto it = ref.pages.find(k);
      if (it == ref.pages.end() || !it->second.empty()) continue;
      ref.pages.erase(it);
      ASSERT_FALSE(ref.has_extension(k)) << "a page left the tree before its extensions";
    }
  };
  auto apply_device_eviction = [&](const EvictResult& e) {
    std::vector<Key> touched;
    for (int c : {1, 2, 0})
      for (Slot s : e.freed[c]) {
        Key k;
        HPage* pg = ref.find(c, s, false, &k);
        ASSERT_TRUE(pg) << "evicted device slot " << s << " of component " << c << " not cached";
        ASSERT_EQ(c == 0 ? pg->full_locks : c == 2 ? pg->mamba_locks : 0, 0) << "evicted a locked value of component " << c;
        pg->dev[c].reset();
        ASSERT_TRUE(c != 0 || !(pg->dev[1] || pg->dev[2])) << "FULL left, its page kept SWA or a state on the device";
        touched.push_back(k);
      }
    drop_empty(touched);
    for (int c = 0; c < 3; ++c) {
      dev[c].free(e.freed[c]);
      cov.device_evicted += e.freed[c].size();
    }
  };
  auto apply_host_eviction = [&](const EvictResult& e) {
    std::vector<Key> touched;
    for (int c = 0; c < 3; ++c)
      for (Slot s : e.freed[c]) {
        Key k;
        HPage* pg = ref.find(c, s, true, &k);
        ASSERT_TRUE(pg) << "evicted host slot " << s << " of component " << c << " not cached";
        pg->host[c].reset();
        touched.push_back(k);
      }
    drop_empty(touched);
    for (int c = 0; c < 3; ++c) {
      host[c].free(e.freed[c]);
      cov.host_evicted += e.freed[c].size();
    }
  };
  auto alloc = [&](int c, std::int64_t n) -> std::optional<std::vector<Slot>> {
    if (dev[c].free_count() < n) {
      apply_device_eviction(h.tree.evict(ids[c], n - dev[c].free_count()));
      if (::testing::Test::HasFatalFailure()) return std::nullopt;
    }
    return dev[c].alloc(n);
  };
  auto alloc_host = [&](int c, std::int64_t n) -> std::optional<std::vector<Slot>> {
    if (host[c].free_count() < n) {
      apply_host_eviction(h.tree.evict_host(ids[c], n - host[c].free_count()));
      if (::testing::Test::HasFatalFailure()) return std::nullopt;
    }
    return host[c].alloc(n);
  };
  auto check_match = [&](const MatchResult& m, const std::vector<TokenId>& t, std::size_t limit) {
    ASSERT_EQ(m.matched.value(), static_cast<std::int64_t>(ref.match(t, limit, false)));
    ASSERT_EQ(m.host_matched.value(), static_cast<std::int64_t>(ref.match(t, limit, true)));
    ASSERT_EQ(m.host_node->end, m.host_matched);
  };

  for (int op = 0; op < ops; ++op) {
    SCOPED_TRACE("operation " + std::to_string(op));
    const auto kind = rng.below(20);
    if (kind < 6 && reqs.size() < max_requests) {  // admit: match, load the host part back, allocate the rest
      auto t = random_prompt();
      auto m = h.tree.match_prefix(t);
      check_match(m, t, t.size() - 1);
      if (::testing::Test::HasFatalFailure()) return;
      const std::size_t hb = static_cast<std::size_t>(m.host_matched.value());
      LockHandle load_lock = h.tree.lock(m.host_node);  // the path stays while making room
      ref.lock(t, hb, +1);
      auto items = h.tree.plan_load(m);
      std::vector<Slot> got[3];
      for (const auto& it : items) got[it.component.value()].insert(got[it.component.value()].end(), it.host.begin(), it.host.end());
      for (int c = 0; c < 3; ++c) ASSERT_EQ(got[c], ref.load(t, hb, c)) << "load-back of component " << c;
      if (!items.empty()) ++cov.loads;
      for (std::size_t d = kPage; d + (kWindow + kPage - 1) / kPage * kPage <= hb; d += kPage) {
        const HPage& pg = ref.pages.at(prefix(t, d));
        cov.swa_left_on_host += !pg.dev[1] && pg.host[1] ? 1 : 0;
      }
      bool all = true;
      for (const auto& it : items) {
        const int c = static_cast<int>(it.component.value());
        auto d = alloc(c, static_cast<std::int64_t>(it.host.size()));
        if (::testing::Test::HasFatalFailure()) return;
        if (!d) {
          all = false;
          break;
        }
        h.tree.commit_load(it, *d);
        for (std::size_t i = 0; i < d->size(); ++i) ref.find(c, it.host[i], true)->dev[c] = (*d)[i];
      }
      cov.partial_loads += all ? 0 : 1;
      auto m2 = h.tree.match_prefix(t);
      check_match(m2, t, t.size() - 1);
      if (::testing::Test::HasFatalFailure()) return;
      if (all) {
        ASSERT_EQ(m2.matched, m2.host_matched) << "a complete load-back serves the host boundary from the device";
      }
      auto r = std::make_unique<HostRequest>();
      r->tokens = t;
      r->end = t.size() / kPage * kPage;
      r->cached = static_cast<std::size_t>(m2.matched.value());
      r->lock = h.tree.lock(m2.last_node);
      ref.lock(t, r->cached, +1);
      h.tree.unlock(load_lock);
      ref.lock(t, hb, -1);
      r->full_tree = m2.components[0].slots;
      r->swa.lock = &r->lock;
      r->swa.own_from = m2.matched;
      const std::int64_t pages = static_cast<std::int64_t>((r->end - r->cached) / kPage);
      auto f = alloc(0, pages);
      auto s = f ? alloc(1, pages) : std::nullopt;
      auto st = s ? alloc(2, 1) : std::nullopt;
      if (::testing::Test::HasFatalFailure()) return;
      if (!st) {
        if (f) dev[0].free(*f);
        if (s) dev[1].free(*s);
        h.tree.unlock(r->lock);
        ref.lock(t, r->cached, -1);
        ++cov.rejected;
      } else {
        r->full_own = *f;
        r->swa.own = *s;
        r->state = (*st)[0];
        reqs.push_back(std::move(r));
        ++cov.admitted;
      }
    } else if (kind < 9) {  // finish: insert, the reference's rules for a page that exists or not
      if (reqs.empty()) continue;
      const auto i = rng.below(reqs.size());
      HostRequest& r = *reqs[i];
      std::vector<Slot> full = r.full_tree;
      full.insert(full.end(), r.full_own.begin(), r.full_own.end());
      const std::size_t at = r.end / kChunk * kChunk;
      std::vector<InsertValue> v{InsertValue::pages(full), InsertValue::pages(r.swa.own, r.swa.own_from),
                                 at > 0 ? InsertValue::state(r.state, Tokens(static_cast<std::int64_t>(at))) : InsertValue::none()};
      auto res = h.tree.insert(head(r.tokens, r.end), v);
      std::int64_t present[3] = {0, 0, 0};
      std::vector<Slot> returned[3];
      const std::size_t rounded = static_cast<std::size_t>((kWindow + kPage - 1) / kPage * kPage);
      const std::size_t from = static_cast<std::size_t>(r.swa.own_from.value());
      const std::size_t w = std::max(from, r.end > rounded ? r.end - rounded : 0);
      for (std::size_t p = 0; p < r.end / kPage; ++p) {
        const std::size_t s = p * kPage;
        std::optional<Slot> mine;
        if (s >= from) mine = r.swa.own[(s - from) / kPage];
        HPage& pg = ref.pages[prefix(r.tokens, s + kPage)];
        if (pg.dev[0]) {
          present[0] += kPage;
          if (full[p] != *pg.dev[0]) returned[0].push_back(full[p]);
        } else {
          cov.healed_from_host += pg.host[0] ? 1 : 0;
          pg.dev[0] = full[p];
        }
        if (pg.dev[1]) {
          present[1] += kPage;
          if (mine && *mine != *pg.dev[1]) returned[1].push_back(*mine);
        } else if (s >= w) {
          pg.dev[1] = mine;
        } else if (mine) {
          returned[1].push_back(*mine);
        }
        if (pg.dev[2]) present[2] = static_cast<std::int64_t>(s + kPage);
      }
      if (at > 0) {
        HPage& pg = ref.pages.at(prefix(r.tokens, at));
        if (!pg.dev[2]) pg.dev[2] = r.state;
        else if (*pg.dev[2] != r.state) returned[2].push_back(r.state);
      }
      for (int c = 0; c < 3; ++c) {
        SCOPED_TRACE("component " + std::to_string(c));
        ASSERT_EQ(res.components[c].present.value(), present[c]);
        ASSERT_EQ(res.components[c].returned, returned[c]);
        dev[c].free(res.components[c].returned);
      }
      if (at == 0) dev[2].free(std::vector<Slot>{r.state});
      h.tree.unlock(r.lock);
      ref.lock(r.tokens, r.cached, -1);
      reqs.erase(reqs.begin() + static_cast<std::ptrdiff_t>(i));
    } else if (kind < 11) {  // decode moves on: SWA pages leave the window
      if (reqs.empty()) continue;
      HostRequest& r = *reqs[rng.below(reqs.size())];
      const std::int64_t last = static_cast<std::int64_t>(r.end) + kPage - 1 - kWindow;
      const auto pos = rng.between(r.swa.own_from.value(), std::max(r.swa.own_from.value(), last));
      dev[1].free(h.swa_comp->free_before(h.tree, r.swa, Tokens(pos)));
    } else if (kind < 13) {  // match only
      auto t = random_prompt();
      auto m = rng.bernoulli(0.5) ? h.tree.match_prefix(t) : h.tree.peek_prefix(t);
      check_match(m, t, t.size() - 1);
    } else if (kind < 16) {  // back up a path (synchronously: the tier's write, landed)
      if (ref.pages.empty()) continue;
      auto it = ref.pages.begin();
      std::advance(it, static_cast<std::ptrdiff_t>(rng.below(ref.pages.size())));
      Node* n = h.tree.find_node(it->first, Tokens(static_cast<std::int64_t>(it->first.size())));
      if (!n) continue;
      bool stop = false;
      for (Node* b : h.tree.backup_candidates(n)) {
        for (int c = 0; c < 3 && !stop; ++c) {
          const ComponentData& d = b->at(ids[c]);
          if (!d.live() || d.backed()) continue;
          const std::vector<Slot> device = *d.value;
          auto hs = alloc_host(c, static_cast<std::int64_t>(device.size()));
          if (::testing::Test::HasFatalFailure()) return;
          if (!hs) {
            stop = true;  // host full of what cannot go: this and deeper nodes stay device-only
            break;
          }
          h.tree.set_host(b, ids[c], *hs);
          for (std::size_t k = 0; k < device.size(); ++k) ref.find(c, device[k], false)->host[c] = (*hs)[k];
          cov.backups += hs->size();
        }
        if (stop) break;
      }
    } else if (kind < 17) {  // device eviction pressure
      const int c = static_cast<int>(rng.below(3));
      apply_device_eviction(h.tree.evict(ids[c], rng.between(1, 4)));
    } else if (kind < 18) {  // demote a chosen path: its device values go from the bottom up
      if (ref.pages.empty()) continue;
      auto it = ref.pages.begin();
      std::advance(it, static_cast<std::ptrdiff_t>(rng.below(ref.pages.size())));
      const Key key = it->first;
      for (std::size_t d = key.size(); d >= static_cast<std::size_t>(kPage); d -= kPage) {
        Node* n = h.tree.find_node(key, Tokens(static_cast<std::int64_t>(d)));
        if (!n || !n->in_evictable[h.full.value()]) continue;
        apply_device_eviction(h.tree.evict_component(n, h.full));
        if (::testing::Test::HasFatalFailure()) return;
      }
    } else {  // host eviction; the first victim checked against the rules
      const int c = static_cast<int>(rng.below(3));
      std::optional<Slot> first = host_victim_slot(h, c);
      auto e = h.tree.evict_host(ids[c], rng.between(1, 4));
      ASSERT_EQ(first.has_value(), !e.freed[c].empty());
      if (first) {
        ASSERT_EQ(e.freed[c][0], *first) << "not the least recently used host candidate";
      }
      apply_host_eviction(e);
    }
    if (::testing::Test::HasFatalFailure()) return;

    VerifyAccounts acc;
    std::int64_t held[3] = {0, 0, 0};
    for (const auto& r : reqs) {
      held[0] += static_cast<std::int64_t>(r->full_own.size());
      held[1] += static_cast<std::int64_t>(r->swa.own.size());
      held[2] += 1;
    }
    for (int c = 0; c < 3; ++c) {
      acc.components.push_back({dev[c].capacity(), dev[c].free_count(), held[c]});
      acc.host.push_back({host[c].capacity(), host[c].free_count(), 0});
    }
    h.tree.verify(&acc);
    auto got = host_content(h);
    ASSERT_EQ(got.size(), ref.pages.size());
    for (const auto& [k, pg] : ref.pages) {
      auto g = got.find(k);
      ASSERT_NE(g, got.end()) << "a reference page missing from the tree";
      for (int c = 0; c < 3; ++c) {
        ASSERT_EQ(g->second.dev[c], pg.dev[c]) << "component " << c << " device slot of a " << k.size() << "-token page";
        ASSERT_EQ(g->second.host[c], pg.host[c]) << "component " << c << " host slot of a " << k.size() << "-token page";
      }
      cov.host_only_pages += !pg.dev[0] ? 1 : 0;
    }
  }
  std::printf("[ unified host differential ] seed %llu: %zu admitted, %zu rejected, %zu load-backs (%zu partial), %zu SWA "
              "pages left on the host above a window, %zu backed up, %zu device / %zu host slots evicted, %zu FULL pages "
              "healed by inserts over host copies\n",
              static_cast<unsigned long long>(seed), cov.admitted, cov.rejected, cov.loads, cov.partial_loads,
              cov.swa_left_on_host, cov.backups, cov.device_evicted, cov.host_evicted, cov.healed_from_host);
}

TEST(UnifiedHostDifferential, DeviceAndHostValuesAgreeWithThePageLevelReference) {
  HostCoverage cov;
  const std::uint64_t seed = seed_or(20261202);
  run_host_differential(seed, 10000, /*full_pages=*/32, /*host_pages=*/48, /*max_requests=*/5, cov);
  if (HasFatalFailure()) return;
  run_host_differential(seed + 1, 6000, /*full_pages=*/20, /*host_pages=*/24, /*max_requests=*/9, cov);  // both tiers short
  if (HasFatalFailure()) return;
  // What the runs must have exercised (the thresholds hold for seeds 1-10 too).
  EXPECT_GT(cov.loads, 80u);
  EXPECT_GT(cov.partial_loads, 1u);
  EXPECT_GT(cov.swa_left_on_host, 3u);
  EXPECT_GT(cov.host_evicted, 200u);
  EXPECT_GT(cov.host_only_pages, 1000u);
  EXPECT_GT(cov.healed_from_host, 50u);
}

}  // namespace
}  // namespace kvgrid::cache::unified
