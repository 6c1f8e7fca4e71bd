// Unified radix tree core with host copies: a randomized differential test of device + host
// values (inserts, matches, backups, demotions, load-backs, device and host eviction) against a
// page-level reference, every operation followed by verify(). Prints its seed; KVGRID_TEST_SEED
// replays one.
#include <gtest/gtest.h>

#include "unified_rig.hpp"

namespace kvgrid::cache::unified {
namespace {

constexpr std::int64_t kWindow = 10, kChunk = 8;  // rounded window: 12 tokens = 3 pages

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
  const Node* best = least_recent(h.tree, [&](const Node& n) {
    if (!n.at(ids[c]).backed() || n.at(ids[c]).live() || n.pending_write || cascade_locked(n, ids, c)) return false;
    for (const auto& [k, child] : n.children)
      if (c == 0 && child->at(h.full).backed()) return false;
    return true;
  });
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
