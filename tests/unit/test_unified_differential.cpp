// Unified radix tree core: a randomized differential test of the hybrid reuse rule (FULL + SWA +
// MAMBA) against a brute-force reference model, and of FULL alone against today's RadixTree,
// decision for decision. Both print their seed; KVGRID_TEST_SEED replays one.
#include <gtest/gtest.h>

#include "unified_rig.hpp"

namespace kvgrid::cache::unified {
namespace {

// ---- randomized differential test against a brute-force reference ---------------------------

constexpr std::int64_t kWindow = 10, kChunk = 8;  // W off the page grid and above the checkpoint grid

// The reference knows nothing of nodes: every cached page is the token prefix that ends with it,
// holding a FULL page, an SWA page or an SWA tombstone, and maybe a MAMBA state at its end.
struct RefPage {
  Slot full;
  std::optional<Slot> swa;
  std::optional<Slot> state;
  std::int64_t full_locks = 0, mamba_locks = 0;
};

struct RefModel {
  std::map<Key, RefPage> pages;
  std::size_t healed = 0;  // SWA tombstones an insert brought back

  struct Match {
    std::size_t boundary = 0;
    std::vector<Slot> full;
    std::optional<Slot> state;
  };
  // The deepest boundary d <= limit where FULL holds every page of [0, d), SWA holds the last
  // min(W, d) tokens live and MAMBA has a state at exactly d.
  Match match(const std::vector<TokenId>& t, std::size_t limit) const {
    Match m;
    std::int64_t live = kInf;  // live tokens since the last tombstone
    for (std::size_t d = kPage; d <= limit / kPage * kPage; d += kPage) {
      auto it = pages.find(prefix(t, d));
      if (it == pages.end()) break;
      live = !it->second.swa ? 0 : live == kInf ? kInf : live + kPage;
      if (live >= std::min<std::int64_t>(kWindow, static_cast<std::int64_t>(d)) && it->second.state) m.boundary = d;
    }
    for (std::size_t d = kPage; d <= m.boundary; d += kPage) m.full.push_back(pages.at(prefix(t, d)).full);
    if (m.boundary > 0) m.state = pages.at(prefix(t, m.boundary)).state;
    return m;
  }

  struct Insert {
    std::int64_t present[3] = {0, 0, 0};
    std::vector<Slot> returned[3];
  };
  // SWA keeps the window [max(from, n - ceil(W/p)p), n) of the caller's pages; MAMBA one state.
  Insert insert(const std::vector<TokenId>& t, std::size_t n, const std::vector<Slot>& full, const std::vector<Slot>& swa,
                std::size_t swa_from, std::optional<Slot> state, std::size_t state_at) {
    Insert r;
    const std::int64_t span = (kWindow + kPage - 1) / kPage * kPage;
    const std::size_t w = static_cast<std::size_t>(
        std::max<std::int64_t>({static_cast<std::int64_t>(swa_from), static_cast<std::int64_t>(n) - span, 0}));
    for (std::size_t i = 0; i < n / kPage; ++i) {
      const std::size_t s = i * kPage;
      std::optional<Slot> mine;
      if (s >= swa_from) mine = swa[(s - swa_from) / kPage];
      auto key = prefix(t, s + kPage);
      auto it = pages.find(key);
      if (it != pages.end()) {
        RefPage& pg = it->second;
        r.present[0] += kPage;
        if (full[i] != pg.full) r.returned[0].push_back(full[i]);
        if (pg.swa) {
          r.present[1] += kPage;
          if (mine && *mine != *pg.swa) r.returned[1].push_back(*mine);
        } else if (s >= w) {
          pg.swa = mine;
          ++healed;
        } else if (mine) {
          r.returned[1].push_back(*mine);
        }
        if (pg.state) r.present[2] = static_cast<std::int64_t>(s + kPage);
      } else {
        RefPage pg;
        pg.full = full[i];
        if (s >= w) pg.swa = mine;
        else if (mine) r.returned[1].push_back(*mine);
        pages.emplace(std::move(key), pg);
      }
    }
    if (state) {
      RefPage& pg = pages.at(prefix(t, state_at));
      if (!pg.state) pg.state = state;
      else if (*pg.state != *state) r.returned[2].push_back(*state);
    }
    return r;
  }

  void lock(const std::vector<TokenId>& t, std::size_t cached, int delta) {
    for (std::size_t d = kPage; d <= cached; d += kPage) pages.at(prefix(t, d)).full_locks += delta;
    if (cached > 0) pages.at(prefix(t, cached)).mamba_locks += delta;
  }

  bool has_extension(const Key& key) const {
    auto it = pages.upper_bound(key);
    return it != pages.end() && it->first.size() > key.size() && std::equal(key.begin(), key.end(), it->first.begin());
  }
  template <typename F>
  RefPage* find(F&& pred, Key* key_out = nullptr) {
    for (auto& [k, pg] : pages)
      if (pred(pg)) {
        if (key_out) *key_out = k;
        return &pg;
      }
    return nullptr;
  }
};

// The tree's content in the reference's terms (node boundaries forgotten).
std::map<Key, std::tuple<Slot, std::optional<Slot>, std::optional<Slot>>> content(const UnifiedTree& tree, ComponentId full,
                                                                                   ComponentId swa, ComponentId mamba) {
  std::map<Key, std::tuple<Slot, std::optional<Slot>, std::optional<Slot>>> out;
  struct Item {
    const Node* node;
    Key path;
  };
  std::vector<Item> stack{{tree.root(), {}}};
  while (!stack.empty()) {
    Item it = std::move(stack.back());
    stack.pop_back();
    const Node* n = it.node;
    const std::size_t pages = n->key.size() / kPage;
    for (std::size_t i = 0; i < pages; ++i) {
      it.path.insert(it.path.end(), n->key.begin() + static_cast<std::ptrdiff_t>(i * kPage),
                     n->key.begin() + static_cast<std::ptrdiff_t>((i + 1) * kPage));
      std::optional<Slot> sw, st;
      if (n->at(swa).value) sw = (*n->at(swa).value)[i];
      if (i + 1 == pages && n->at(mamba).value) st = (*n->at(mamba).value)[0];
      out[it.path] = {n->at(full).value ? (*n->at(full).value)[i] : Slot(0), sw, st};
    }
    for (const auto& [h, c] : n->children) stack.push_back({c.get(), it.path});
  }
  return out;
}

// The first slot of component c's next victim, found over the whole tree from the rules alone: c
// has a value; FULL only where no child has FULL pages; nothing the cascade reaches is locked (a
// leaf cascades to everything, an internal FULL to everything, SWA to SWA and MAMBA, MAMBA to
// itself); the least (last access, node id).
std::optional<Slot> lru_victim_slot(const Hybrid& h, int c) {
  const ComponentId ids[3] = {h.full, h.swa, h.mamba};
  const Node* best = least_recent(h.tree, [&](const Node& n) {
    if (!n.at(ids[c]).live() || cascade_locked(n, ids, c)) return false;
    for (const auto& [k, child] : n.children)
      if (c == 0 && child->at(h.full).live()) return false;
    return true;
  });
  if (!best) return std::nullopt;
  return (*best->at(ids[c]).value)[0];
}

struct Request {
  std::vector<TokenId> tokens;
  std::size_t end = 0;     // the page-aligned part of the prompt (what the request inserts)
  std::size_t cached = 0;  // its match boundary
  LockHandle lock;
  std::vector<Slot> full_tree, full_own;  // FULL pages [0, cached) (the tree's), [cached, end) (its own)
  SwaRequest swa;                         // its own SWA pages
  std::optional<Slot> state;              // its private MAMBA slot (a copy of the match's state)
};

struct Coverage {
  std::size_t admitted = 0, rejected = 0, finished = 0, hits = 0, deeper_accept_after_reject = 0, swa_returned = 0,
              healed = 0, early_releases = 0, evicted[3] = {0, 0, 0}, swa_tombstoned_internal = 0,
              mamba_dropped_internal = 0, nodes_deleted = 0, max_nodes = 0, splits = 0;
  void add(const Coverage& o) {
    admitted += o.admitted, rejected += o.rejected, finished += o.finished, hits += o.hits;
    deeper_accept_after_reject += o.deeper_accept_after_reject, swa_returned += o.swa_returned, healed += o.healed;
    early_releases += o.early_releases, swa_tombstoned_internal += o.swa_tombstoned_internal;
    mamba_dropped_internal += o.mamba_dropped_internal, nodes_deleted += o.nodes_deleted, splits += o.splits;
    for (int c = 0; c < 3; ++c) evicted[c] += o.evicted[c];
    max_nodes = std::max(max_nodes, o.max_nodes);
  }
};

// `full_pages`: FULL's pool; a small one makes admissions fail now and then.
void run_hybrid_differential(std::uint64_t seed, int ops, std::int64_t full_pages, Coverage& total) {
  Coverage cov;
  SCOPED_TRACE("unified differential seed " + std::to_string(seed));
  std::printf("[ unified differential ] seed %llu, %d operations, %lld FULL pages\n", static_cast<unsigned long long>(seed), ops,
              static_cast<long long>(full_pages));
  Rng rng(seed);
  Hybrid h(kWindow, kChunk);
  const ComponentId ids[3] = {h.full, h.swa, h.mamba};
  auto full_side = PayloadSidecar::make(h.tree, "draft_kv", h.full, 1, static_cast<std::size_t>(full_pages));
  auto swa_side = PayloadSidecar::make(h.tree, "swa_indexer", h.swa, 1, 40);
  PayloadSidecar* sides[2] = {full_side.get(), swa_side.get()};
  h.tree.add_sidecar(std::move(full_side));
  h.tree.add_sidecar(std::move(swa_side));
  SlotPool pools[3] = {SlotPool(full_pages), SlotPool(40), SlotPool(24)};
  RefModel model;
  std::vector<std::unique_ptr<Request>> reqs;

  std::vector<std::vector<TokenId>> bases;
  for (int i = 0; i < 3; ++i) {
    std::vector<TokenId> b(static_cast<std::size_t>(rng.between(8, 40)));
    for (auto& x : b) x = static_cast<TokenId>(rng.below(3));
    bases.push_back(b);
  }
  auto random_prompt = [&] {
    std::vector<TokenId> t = bases[rng.below(bases.size())];
    t.resize(static_cast<std::size_t>(rng.between(1, static_cast<std::int64_t>(t.size()))));
    if (rng.bernoulli(0.15)) {  // now and then a long one, so that admissions can fail
      const auto& more = bases[rng.below(bases.size())];
      t.insert(t.end(), more.begin(), more.end());
    }
    const auto extra = rng.between(0, 12);
    for (std::int64_t i = 0; i < extra; ++i) t.push_back(static_cast<TokenId>(rng.below(3)));
    return t;
  };
  auto apply_eviction = [&](const EvictResult& e) {
    for (Slot s : e.freed[1]) {
      RefPage* pg = model.find([&](const RefPage& p) { return p.swa == s; });
      ASSERT_TRUE(pg) << "evicted SWA slot " << s << " not cached";
      pg->swa.reset();
    }
    for (Slot s : e.freed[2]) {
      RefPage* pg = model.find([&](const RefPage& p) { return p.state == s; });
      ASSERT_TRUE(pg) << "evicted state " << s << " not cached";
      ASSERT_EQ(pg->mamba_locks, 0) << "evicted a locked state";
      pg->state.reset();
    }
    std::vector<Key> gone;
    for (Slot s : e.freed[0]) {
      Key k;
      RefPage* pg = model.find([&](const RefPage& p) { return p.full == s; }, &k);
      ASSERT_TRUE(pg) << "evicted FULL page " << s << " not cached";
      ASSERT_EQ(pg->full_locks, 0) << "evicted a locked FULL page";
      ASSERT_FALSE(pg->swa || pg->state) << "a deleted page kept its SWA page or state";
      gone.push_back(k);
    }
    std::sort(gone.begin(), gone.end(), [](const Key& a, const Key& b) { return a.size() > b.size(); });
    for (const Key& k : gone) {
      model.pages.erase(k);
      ASSERT_FALSE(model.has_extension(k)) << "a page left the tree before its extensions";
    }
    cov.swa_tombstoned_internal += e.freed[1].size() > 0 && e.freed[0].empty() ? 1 : 0;
    cov.mamba_dropped_internal += e.freed[2].size() > 0 && e.freed[0].empty() ? 1 : 0;
    cov.nodes_deleted += e.nodes_deleted;
    for (int c = 0; c < 3; ++c) {
      pools[c].free(e.freed[c]);
      cov.evicted[c] += e.freed[c].size();
    }
    ASSERT_EQ(e.sidecar_freed[0], e.freed[0]);
    ASSERT_EQ(e.sidecar_freed[1], e.freed[1]);
  };
  // `n` slots of component c, evicting c's victims first when the pool is short.
  auto alloc = [&](int c, std::int64_t n) -> std::optional<std::vector<Slot>> {
    if (pools[c].free_count() < n) {
      apply_eviction(h.tree.evict(ids[c], n - pools[c].free_count()));
      if (::testing::Test::HasFatalFailure()) return std::nullopt;
    }
    return pools[c].alloc(n);
  };
  auto check_match = [&](const MatchResult& m, const std::vector<TokenId>& t, std::size_t limit) {
    auto ref = model.match(t, limit);
    ASSERT_EQ(m.matched.value(), static_cast<std::int64_t>(ref.boundary)) << "prompt of " << t.size() << " tokens";
    ASSERT_EQ(m.components[0].slots, ref.full);
    const auto& sw = m.components[1];
    const std::size_t from = static_cast<std::size_t>(sw.from.value());
    ASSERT_GE(ref.boundary - from, std::min<std::size_t>(kWindow, ref.boundary)) << "SWA window too short";
    ASSERT_EQ(sw.slots.size(), (ref.boundary - from) / kPage);
    for (std::size_t i = 0; i < sw.slots.size(); ++i) ASSERT_EQ(model.pages.at(prefix(t, from + (i + 1) * kPage)).swa, sw.slots[i]);
    ASSERT_EQ(m.components[2].slots, ref.state ? std::vector<Slot>{*ref.state} : std::vector<Slot>{});
    cov.hits += ref.boundary > 0 ? 1 : 0;
    bool rejected = false;
    for (const auto& c : m.candidates) {
      if (!c.accepted()) rejected = true;
      else if (rejected) {
        ++cov.deeper_accept_after_reject;
        break;
      }
    }
  };
  auto release = [&](Request& r) {
    h.tree.unlock(r.lock);
    model.lock(r.tokens, r.cached, -1);
  };

  for (int op = 0; op < ops; ++op) {
    SCOPED_TRACE("operation " + std::to_string(op));
    const auto kind = rng.below(20);
    if (kind < 6 && reqs.size() < 6) {  // admit: match, lock, allocate what the request computes
      auto t = random_prompt();
      auto m = h.tree.match_prefix(t);
      check_match(m, t, t.size() - 1);
      if (::testing::Test::HasFatalFailure()) return;
      auto r = std::make_unique<Request>();
      r->tokens = t;
      r->end = t.size() / kPage * kPage;
      r->cached = static_cast<std::size_t>(m.matched.value());
      r->lock = h.tree.lock(m.last_node);
      model.lock(t, r->cached, +1);
      r->full_tree = m.components[0].slots;
      r->swa.lock = &r->lock;
      r->swa.own_from = m.matched;
      const std::int64_t pages = static_cast<std::int64_t>((r->end - r->cached) / kPage);
      auto f = alloc(0, pages);
      auto s = f ? alloc(1, pages) : std::nullopt;
      auto st = s ? alloc(2, 1) : std::nullopt;
      if (::testing::Test::HasFatalFailure()) return;
      if (!st) {  // does not fit: give back what it got
        if (f) pools[0].free(*f);
        if (s) pools[1].free(*s);
        release(*r);
        ++cov.rejected;
      } else {
        r->full_own = *f;
        r->swa.own = *s;
        r->state = (*st)[0];  // the caller copies m's state (if any) into it
        for (Slot x : r->full_own) sides[0]->write(x, std::vector<std::uint64_t>(kPage, x.value()));
        for (Slot x : r->swa.own) sides[1]->write(x, std::vector<std::uint64_t>(kPage, x.value()));
        reqs.push_back(std::move(r));
        ++cov.admitted;
      }
    } else if (kind < 9) {  // finish: insert what the request holds, unlock
      if (reqs.empty()) continue;
      const auto i = rng.below(reqs.size());
      Request& r = *reqs[i];
      std::vector<Slot> full = r.full_tree;
      full.insert(full.end(), r.full_own.begin(), r.full_own.end());
      const std::size_t at = r.end / kChunk * kChunk;
      std::vector<InsertValue> v{InsertValue::pages(full), InsertValue::pages(r.swa.own, r.swa.own_from),
                                 at > 0 ? InsertValue::state(*r.state, Tokens(static_cast<std::int64_t>(at)))
                                        : InsertValue::none()};
      auto res = h.tree.insert(head(r.tokens, r.end), v);
      const std::size_t healed_before = model.healed;
      auto ref = model.insert(r.tokens, r.end, full, r.swa.own, static_cast<std::size_t>(r.swa.own_from.value()),
                              at > 0 ? r.state : std::nullopt, at);
      cov.healed += model.healed - healed_before;
      for (int c = 0; c < 3; ++c) {
        SCOPED_TRACE("component " + std::to_string(c));
        ASSERT_EQ(res.components[c].present.value(), ref.present[c]);
        ASSERT_EQ(res.components[c].returned, ref.returned[c]);
        pools[c].free(res.components[c].returned);
      }
      cov.swa_returned += ref.returned[1].size();
      if (at == 0) pools[2].free(std::vector<Slot>{*r.state});
      release(r);
      reqs.erase(reqs.begin() + static_cast<std::ptrdiff_t>(i));
      ++cov.finished;
    } else if (kind < 12) {  // decode moves on: free SWA pages that left the window
      if (reqs.empty()) continue;
      Request& r = *reqs[rng.below(reqs.size())];
      const bool was_held = r.lock.parts[1].held;
      // The window's first token is length - W, and the request ends within a page of `end`.
      const std::int64_t last = static_cast<std::int64_t>(r.end) + kPage - 1 - kWindow;
      const auto pos = rng.between(r.swa.own_from.value(), std::max(r.swa.own_from.value(), last));
      pools[1].free(h.swa_comp->free_before(h.tree, r.swa, Tokens(pos)));
      cov.early_releases += was_held && !r.lock.parts[1].held ? 1 : 0;
    } else if (kind < 15) {  // match only (split-inducing walks included)
      auto t = random_prompt();
      const auto mode = rng.below(3);
      auto m = mode == 0 ? h.tree.match_prefix(t) : mode == 1 ? h.tree.peek_prefix(t) : h.tree.match_computed(t);
      check_match(m, t, mode == 2 ? t.size() : t.size() - 1);
    } else if (kind < 18) {  // eviction pressure on one component; the first victim checked by brute force
      const int c = static_cast<int>(rng.below(3));
      std::optional<Slot> first = lru_victim_slot(h, c);
      auto e = h.tree.evict(ids[c], rng.between(1, 4));
      ASSERT_EQ(first.has_value(), !e.freed[c].empty());
      if (first) {
        ASSERT_EQ(e.freed[c][0], *first) << "not the least recently used candidate";
      }
      apply_eviction(e);
    } else {  // evict one component on a chosen node
      if (model.pages.empty()) continue;
      auto it = model.pages.begin();
      std::advance(it, static_cast<std::ptrdiff_t>(rng.below(model.pages.size())));
      Node* n = h.tree.find_node(it->first, Tokens(static_cast<std::int64_t>(it->first.size())));
      if (!n) continue;
      const int c = static_cast<int>(rng.below(3));
      if (!n->in_evictable[static_cast<std::size_t>(c)]) continue;
      const bool leaf = n->is_leaf();
      bool had[3];
      for (int d = 0; d < 3; ++d) had[d] = n->at(ids[d]).live();
      auto e = h.tree.evict_component(n, ids[c]);
      for (int d = 0; d < 3; ++d) {  // the cascade, from the priorities: leaf all; FULL 2 > SWA 1 > MAMBA 0
        const bool cascaded = leaf || c == 0 || d >= c;
        ASSERT_EQ(!e.freed[d].empty(), had[d] && cascaded) << "evicting component " << c << " on a "
                                                           << (leaf ? "leaf" : "internal node") << ", component " << d;
      }
      apply_eviction(e);
    }
    if (::testing::Test::HasFatalFailure()) return;

    VerifyAccounts acc;
    std::int64_t held[3] = {0, 0, 0};
    for (const auto& r : reqs) {
      held[0] += static_cast<std::int64_t>(r->full_own.size());
      held[1] += static_cast<std::int64_t>(r->swa.own.size());
      held[2] += 1;
    }
    for (int c = 0; c < 3; ++c) acc.components.push_back({pools[c].capacity(), pools[c].free_count(), held[c]});
    acc.sidecar_requests = {held[0], held[1]};
    h.tree.verify(&acc);
    auto got = content(h.tree, h.full, h.swa, h.mamba);
    ASSERT_EQ(got.size(), model.pages.size());
    for (const auto& [k, pg] : model.pages) {
      auto g = got.find(k);
      ASSERT_NE(g, got.end()) << "a reference page missing from the tree";
      ASSERT_EQ(std::get<0>(g->second), pg.full);
      ASSERT_EQ(std::get<1>(g->second), pg.swa);
      ASSERT_EQ(std::get<2>(g->second), pg.state);
    }
    cov.max_nodes = std::max(cov.max_nodes, h.tree.node_count());
  }
  while (!reqs.empty()) {
    Request& r = *reqs.back();
    pools[0].free(r.full_own);
    h.tree.drop_sidecars(h.full, r.full_own);
    pools[1].free(r.swa.own);
    h.tree.drop_sidecars(h.swa, r.swa.own);
    pools[2].free(std::vector<Slot>{*r.state});
    release(r);
    reqs.pop_back();
  }
  VerifyAccounts acc;
  for (int c = 0; c < 3; ++c) acc.components.push_back({pools[c].capacity(), pools[c].free_count(), 0});
  acc.sidecar_requests = {0, 0};
  h.tree.verify(&acc);
  for (ComponentId c : ids) EXPECT_EQ(h.tree.protected_slots(c), 0);
  cov.splits += h.tree.splits();
  std::printf("[ unified differential ] seed %llu: %zu admitted (%zu hits at admission or match), %zu rejected, %zu finished, "
              "%zu deeper accepts after a rejection, %zu SWA pages healed, %zu returned, %zu early window releases, "
              "evicted %zu/%zu/%zu FULL/SWA/MAMBA slots (%zu SWA and %zu MAMBA internal-only), %zu nodes deleted, "
              "%llu splits, %zu nodes at most\n",
              static_cast<unsigned long long>(seed), cov.admitted, cov.hits, cov.rejected, cov.finished,
              cov.deeper_accept_after_reject, cov.healed, cov.swa_returned, cov.early_releases, cov.evicted[0],
              cov.evicted[1], cov.evicted[2], cov.swa_tombstoned_internal, cov.mamba_dropped_internal, cov.nodes_deleted,
              static_cast<unsigned long long>(h.tree.splits()), cov.max_nodes);
  total.add(cov);
}

TEST(UnifiedDifferential, TenThousandMixedOperationsAgreeWithTheBruteForceReference) {
  const auto t0 = std::chrono::steady_clock::now();
  Coverage cov;
  const std::uint64_t seed = seed_or(20261201);
  run_hybrid_differential(seed, 6000, /*full_pages=*/40, cov);  // room for hits
  if (HasFatalFailure()) return;
  run_hybrid_differential(seed + 1, 4000, /*full_pages=*/24, cov);  // admissions that do not fit
  if (HasFatalFailure()) return;
  // The runs must have exercised what they claim to test (thresholds hold for seeds 1-30 too).
  EXPECT_GT(cov.hits, 60u);
  EXPECT_GT(cov.deeper_accept_after_reject, 50u);
  EXPECT_GT(cov.healed, 50u);
  EXPECT_GT(cov.early_releases, 10u);
  EXPECT_GT(cov.rejected, 50u);
  EXPECT_GT(cov.swa_tombstoned_internal, 20u);
  EXPECT_GT(cov.mamba_dropped_internal, 40u);
  EXPECT_GT(cov.evicted[0], 1500u);
  EXPECT_GT(cov.evicted[1], 800u);
  EXPECT_GT(cov.evicted[2], 400u);
  EXPECT_GT(cov.splits, 500u);
  EXPECT_GT(cov.max_nodes, 12u);
  std::printf("[ unified differential ] %.2f s\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

// ---- FULL alone against today's RadixTree ---------------------------------------------------

std::vector<Slot> as_slots(const std::vector<PageId>& pages) {
  std::vector<Slot> v;
  v.reserve(pages.size());
  for (PageId p : pages) v.push_back(Slot(p.value()));
  return v;
}

TEST(UnifiedDifferential, FullAloneDecidesExactlyAsRadixTree) {
  const std::uint64_t seed = seed_or(20261202);
  std::printf("[ unified vs radix ] seed %llu\n", static_cast<unsigned long long>(seed));
  Rng rng(seed);
  RadixTree rt(TreeConfig{Tokens(kPage)});
  UnifiedTree ut{Tokens(kPage)};
  const ComponentId full = ut.add_component(std::make_unique<FullComponent>());
  DevicePool pool(Pages(48));
  struct Held {
    TreeNode* rn;
    LockHandle uh;
  };
  std::list<Held> held;
  std::vector<std::vector<TokenId>> bases;
  for (int i = 0; i < 6; ++i) {
    std::vector<TokenId> b(static_cast<std::size_t>(rng.between(4, 32)));
    for (auto& x : b) x = static_cast<TokenId>(rng.below(3));
    bases.push_back(b);
  }
  auto random_prompt = [&] {
    std::vector<TokenId> t = bases[rng.below(bases.size())];
    t.resize(static_cast<std::size_t>(rng.between(0, static_cast<std::int64_t>(t.size()))));
    const auto extra = rng.between(0, 12);
    for (std::int64_t i = 0; i < extra; ++i) t.push_back(static_cast<TokenId>(rng.below(3)));
    return t;
  };
  std::size_t evicted = 0, matched = 0, locks = 0;
  auto evict_both = [&](Pages n) {
    auto a = rt.evict(n);
    auto b = ut.evict(full, n.value());
    ASSERT_EQ(as_slots(a), b.freed[full.value()]) << "different victims";
    pool.free(a);
    evicted += a.size();
  };
  for (int op = 0; op < 10000; ++op) {
    SCOPED_TRACE("operation " + std::to_string(op));
    const auto kind = rng.below(16);
    if (kind < 6) {  // match_prefix, match_computed or peek_prefix; maybe hold a lock
      auto t = random_prompt();
      const auto mode = rng.below(3);
      auto rm = mode == 0 ? rt.match_prefix(t) : mode == 1 ? rt.match_computed(t) : rt.peek_prefix(t);
      auto um = mode == 0 ? ut.match_prefix(t) : mode == 1 ? ut.match_computed(t) : ut.peek_prefix(t);
      ASSERT_EQ(rm.matched, um.matched);
      ASSERT_EQ(as_slots(rm.device_pages), um.components[full.value()].slots);
      matched += rm.matched.value() > 0 ? 1 : 0;
      if (rng.bernoulli(0.3)) {
        rt.lock(rm.last_node);
        held.push_back({rm.last_node, ut.lock(um.last_node)});
        ++locks;
      }
    } else if (kind < 11) {  // insert with fresh pages, evicting first when short
      auto t = random_prompt();
      t.resize(t.size() / kPage * kPage);
      const Pages need(static_cast<std::int64_t>(t.size() / kPage));
      if (need > pool.free_pages()) evict_both(need - pool.free_pages());
      if (HasFatalFailure()) return;
      auto fresh = pool.alloc(need);
      if (!fresh) continue;
      auto rr = rt.insert(t, *fresh);
      std::vector<InsertValue> v{InsertValue::pages(as_slots(*fresh))};
      auto ur = ut.insert(t, v);
      ASSERT_EQ(rr.prefix_len, ur.components[full.value()].present);
      std::vector<PageId> dup(fresh->begin(), fresh->begin() + rr.prefix_len.value() / kPage);
      ASSERT_EQ(as_slots(dup), ur.components[full.value()].returned);
      pool.free(dup);
      if (!t.empty() && rng.bernoulli(0.3)) {
        rt.lock(rr.last_node);
        held.push_back({rr.last_node, ut.lock(ur.last_node)});
      }
    } else if (kind < 14) {  // release a lock
      if (held.empty()) continue;
      auto it = held.begin();
      std::advance(it, static_cast<std::ptrdiff_t>(rng.below(held.size())));
      rt.unlock(it->rn);
      ut.unlock(it->uh);
      held.erase(it);
    } else {
      evict_both(Pages(rng.between(1, 6)));
      if (HasFatalFailure()) return;
    }
    rt.verify();
    ut.verify();
    ASSERT_EQ(rt.node_count(), ut.node_count());
    ASSERT_EQ(rt.evictable_pages().value(), ut.evictable_slots(full));
    ASSERT_EQ(rt.protected_pages().value(), ut.protected_slots(full));
    ASSERT_EQ(rt.eviction_candidates(), ut.eviction_candidates(full));
  }
  std::printf("[ unified vs radix ] seed %llu: %zu pages evicted in the same order, %zu hits, %zu locks, %zu nodes\n",
              static_cast<unsigned long long>(seed), evicted, matched, locks, rt.node_count());
  EXPECT_GT(evicted, 1000u);
  EXPECT_GT(matched, 1000u);
}

}  // namespace
}  // namespace kvgrid::cache::unified
