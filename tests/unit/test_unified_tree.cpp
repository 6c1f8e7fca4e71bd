// Unified radix tree core (cache/unified_tree.hpp) and its FULL, SWA and MAMBA components:
// the second article's Figures 2 and 3 made concrete, one behaviour test per hook, a randomized
// differential test against a brute-force reference model of the hybrid reuse rule, and a
// differential test of FULL alone against today's RadixTree. Randomized tests print their seed;
// KVGRID_TEST_SEED replays one.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <list>
#include <map>

#include "cache/device_pool.hpp"
#include "cache/radix_tree.hpp"
#include "cache/unified_components.hpp"
#include "cache/unified_tree.hpp"
#include "core/check.hpp"
#include "core/rng.hpp"

namespace kvgrid::cache::unified {
namespace {

constexpr std::int64_t kPage = 4;

std::vector<Slot> S(std::initializer_list<std::uint32_t> ids) {
  std::vector<Slot> v;
  for (auto i : ids) v.push_back(Slot(i));
  return v;
}

std::vector<Slot> run(std::uint32_t first, std::size_t n) {
  std::vector<Slot> v;
  for (std::size_t i = 0; i < n; ++i) v.push_back(Slot(first + static_cast<std::uint32_t>(i)));
  return v;
}

std::vector<TokenId> toks(std::size_t n, TokenId base = 100) {
  std::vector<TokenId> t(n);
  for (std::size_t i = 0; i < n; ++i) t[i] = base + static_cast<TokenId>(i);
  return t;
}

std::span<const TokenId> head(const std::vector<TokenId>& t, std::size_t n) { return std::span<const TokenId>(t).first(n); }

std::uint64_t seed_or(std::uint64_t fallback) {
  if (const char* s = std::getenv("KVGRID_TEST_SEED")) return std::strtoull(s, nullptr, 10);
  return fallback;
}

// A tree with FULL, SWA (window W) and MAMBA (checkpoint grid `chunk`), page size 4.
struct Hybrid {
  UnifiedTree tree{Tokens(kPage)};
  ComponentId full, swa, mamba;
  const SwaComponent* swa_comp = nullptr;

  Hybrid(std::int64_t window, std::int64_t chunk) {
    full = tree.add_component(std::make_unique<FullComponent>());
    auto s = std::make_unique<SwaComponent>(Tokens(window));
    swa_comp = s.get();
    swa = tree.add_component(std::move(s));
    mamba = tree.add_component(std::make_unique<MambaComponent>(Tokens(chunk)));
  }
  // Inserts t[0, n) with FULL pages `f` (from 0), SWA pages `s` from `s_from`, and a state slot
  // at depth `at` when `state` is non-zero.
  InsertResult put(const std::vector<TokenId>& t, std::size_t n, std::vector<Slot> f, std::vector<Slot> s,
                   std::int64_t s_from, std::uint32_t state = 0, std::int64_t at = -1) {
    std::vector<InsertValue> v{InsertValue::pages(std::move(f)), InsertValue::pages(std::move(s), Tokens(s_from)),
                               state ? InsertValue::state(Slot(state), Tokens(at)) : InsertValue::none()};
    return tree.insert(head(t, n), v);
  }
  // The node ending at `end` along t; throws (a test failure, not a crash) when there is none.
  Node* node(const std::vector<TokenId>& t, std::int64_t end) {
    Node* n = tree.find_node(t, Tokens(end));
    if (!n) throw std::runtime_error("no node ends at " + std::to_string(end));
    return n;
  }
};

std::vector<Slot> value_of(const Node* n, ComponentId c) {
  return n->at(c).value ? *n->at(c).value : std::vector<Slot>{};
}

// The article's Figure 2: n1 = [0, 8) and n2 = [8, 16) live with MAMBA states at 8 and 16;
// n3 = [16, 24) an SWA tombstone with a state at 24; n4 = [24, 28) live without a state.
void build_figure2(Hybrid& h, const std::vector<TokenId>& t) {
  h.put(t, 8, run(1, 2), run(1, 2), 0, /*state=*/1);          // n1
  h.put(t, 16, run(1, 4), run(1, 4), 0, /*state=*/2);         // n2 (n1's pages are the tree's own)
  h.put(t, 24, run(1, 6), {}, /*s_from=*/24, /*state=*/3);    // n3: the request had freed its SWA pages
  h.put(t, 28, run(1, 7), S({5}), /*s_from=*/24);             // n4: window [24, 28) live, no state
}

// ---- Figure 2: component votes --------------------------------------------------------------

TEST(UnifiedTree, Figure2WalkReachesN4ButTheBoundaryIsN2) {
  Hybrid h(/*window=*/8, /*chunk=*/8);
  auto t = toks(40);
  build_figure2(h, t);
  h.tree.verify();
  ASSERT_EQ(h.tree.node_count(), 4u);
  Node* n1 = h.node(t, 8);
  Node* n2 = h.node(t, 16);
  Node* n3 = h.node(t, 24);
  Node* n4 = h.node(t, 28);
  ASSERT_TRUE(n1 && n2 && n3 && n4);
  EXPECT_EQ(value_of(n3, h.full), S({5, 6}));
  EXPECT_FALSE(n3->at(h.swa).live());
  EXPECT_EQ(value_of(n3, h.mamba), S({3}));
  EXPECT_EQ(value_of(n4, h.swa), S({5}));
  EXPECT_FALSE(n4->at(h.mamba).live());

  auto prompt = toks(29);  // reuse at most 28 tokens: the walk may reach n4
  auto m = h.tree.match_prefix(prompt);
  EXPECT_EQ(m.walked, Tokens(28));
  EXPECT_EQ(m.matched, Tokens(16));
  EXPECT_EQ(m.last_node, n2);
  ASSERT_EQ(m.candidates.size(), 4u);
  // votes, by component: FULL, SWA, MAMBA
  const std::vector<std::vector<bool>> votes{{true, true, true}, {true, true, true}, {true, false, true}, {true, false, false}};
  const std::vector<const Node*> nodes{n1, n2, n3, n4};
  for (std::size_t i = 0; i < 4; ++i) {
    SCOPED_TRACE("candidate n" + std::to_string(i + 1));
    EXPECT_EQ(m.candidates[i].node, nodes[i]);
    EXPECT_EQ(m.candidates[i].votes, votes[i]);
  }
  // Finalizers: FULL reuses every page, SWA the window before 16, MAMBA names the state to copy.
  EXPECT_EQ(m.components[h.full.value()].slots, run(1, 4));
  EXPECT_EQ(m.components[h.swa.value()].slots, S({3, 4}));
  EXPECT_EQ(m.components[h.swa.value()].from, Tokens(8));
  EXPECT_EQ(m.components[h.mamba.value()].slots, S({2}));
  // Only the accepted path counts as accessed.
  EXPECT_EQ(n1->last_access, n2->last_access);
  EXPECT_LT(n3->last_access, n2->last_access);
  EXPECT_LT(n4->last_access, n2->last_access);
}

// ---- Figure 3: separate index spaces and sidecars -------------------------------------------

TEST(UnifiedTree, Figure3FullTailPagesMapToTheirOwnSwaSlots) {
  UnifiedTree tree{Tokens(kPage)};
  const ComponentId full = tree.add_component(std::make_unique<FullComponent>());
  const ComponentId swa = tree.add_component(std::make_unique<SwaComponent>(Tokens(2 * kPage)));
  // Figure 3's derived pools as sidecars (which follows which is this test's choice): three follow
  // FULL's slots, two follow SWA's.
  std::vector<PayloadSidecar*> sc;
  for (const char* name : {"c4_kv", "c128_kv", "indexer"}) {
    auto s = PayloadSidecar::make(tree, name, full, /*words_per_token=*/1, /*capacity=*/16);
    sc.push_back(s.get());
    tree.add_sidecar(std::move(s));
  }
  for (const char* name : {"c4_compressor", "c128_compressor"}) {
    auto s = PayloadSidecar::make(tree, name, swa, /*words_per_token=*/2, /*capacity=*/16);
    sc.push_back(s.get());
    tree.add_sidecar(std::move(s));
  }
  auto t = toks(24);
  // Six pages: FULL pages F0..F5 are slots 1..6 of FULL's space; the request kept SWA pages only
  // for its window, S0 and S1 — slots 1 and 2 of SWA's own space (the same numbers, other pages).
  const auto F = run(1, 6);
  const auto SW = run(1, 2);
  for (std::size_t i = 0; i < 3; ++i)
    for (Slot f : F) sc[i]->write(f, std::vector<std::uint64_t>(kPage, 1000 * (i + 1) + f.value()));
  for (std::size_t i = 3; i < 5; ++i)
    for (Slot s : SW) sc[i]->write(s, std::vector<std::uint64_t>(2 * kPage, 1000 * (i + 1) + s.value()));
  std::vector<InsertValue> v{InsertValue::pages(F), InsertValue::pages(SW, Tokens(16))};
  auto r = tree.insert(t, v);
  EXPECT_TRUE(r.components[0].returned.empty());
  EXPECT_TRUE(r.components[1].returned.empty());
  ASSERT_EQ(tree.node_count(), 2u);
  Node* top = tree.find_node(t, Tokens(16));
  Node* tail = tree.find_node(t, Tokens(24));
  ASSERT_TRUE(top && tail);
  EXPECT_EQ(value_of(top, full), run(1, 4));
  EXPECT_FALSE(top->at(swa).live());  // outside the window: a tombstone, the node stays
  EXPECT_EQ(value_of(tail, full), S({5, 6}));
  EXPECT_EQ(value_of(tail, swa), S({1, 2}));

  auto m = tree.match_computed(t);
  ASSERT_EQ(m.matched, Tokens(24));
  const auto& fm = m.components[full.value()];
  const auto& sm = m.components[swa.value()];
  ASSERT_EQ(fm.slots, F);
  ASSERT_EQ(sm.from, Tokens(16));
  ASSERT_EQ(sm.slots.size(), 2u);
  // The mapping: FULL tail page k (k = 4, 5) is SWA page k - 4 of the window.
  for (std::size_t k = 4; k < 6; ++k) {
    const Slot f = fm.slots[k], s = sm.slots[k - static_cast<std::size_t>(sm.from.value() / kPage)];
    EXPECT_EQ(f, Slot(static_cast<std::uint32_t>(k + 1)));  // F4 = 5, F5 = 6
    EXPECT_EQ(s, Slot(static_cast<std::uint32_t>(k - 3)));  // S0 = 1, S1 = 2
    for (std::size_t i = 0; i < 3; ++i) EXPECT_EQ(sc[i]->read(f)[0], 1000 * (i + 1) + f.value());
    for (std::size_t i = 3; i < 5; ++i) EXPECT_EQ(sc[i]->read(s)[0], 1000 * (i + 1) + s.value());
  }
  // Sidecars add no tree slot and no vote.
  for (const auto& c : m.candidates) EXPECT_EQ(c.votes.size(), 2u);
  VerifyAccounts acc{{{16, 10, 0}, {16, 14, 0}}, {0, 0, 0, 0, 0}};
  tree.verify(&acc);
  EXPECT_EQ(tree.held_slots(full), 6);
  EXPECT_EQ(tree.held_slots(swa), 2);
}

// ---- split ----------------------------------------------------------------------------------

TEST(UnifiedTree, SplitSlicesPagesCopiesPathLocksAndLeavesTheStateOnTheChild) {
  Hybrid h(/*window=*/16, /*chunk=*/8);
  auto t = toks(16);
  h.put(t, 16, run(1, 4), run(11, 4), 0, /*state=*/7);
  Node* node = h.node(t, 16);
  ASSERT_TRUE(node);
  node->at(h.swa).meta = 77;  // component-owned metadata: SWA's travels with both fragments
  auto lk = h.tree.lock(node);
  EXPECT_EQ(node->at(h.full).lock_ref, 1);
  EXPECT_EQ(node->at(h.swa).lock_ref, 1);
  EXPECT_EQ(node->at(h.mamba).lock_ref, 1);

  auto prompt = toks(8);
  for (TokenId x : {900u, 901u, 902u, 903u, 904u}) prompt.push_back(x);  // diverges at 8
  auto m = h.tree.match_prefix(prompt);
  ASSERT_EQ(h.tree.node_count(), 2u);
  EXPECT_EQ(h.tree.splits(), 1u);
  Node* parent = h.node(t, 8);
  ASSERT_TRUE(parent);
  EXPECT_EQ(node->parent, parent);  // the locked node is still the lower part
  EXPECT_EQ(value_of(parent, h.full), S({1, 2}));
  EXPECT_EQ(value_of(node, h.full), S({3, 4}));
  EXPECT_EQ(value_of(parent, h.swa), S({11, 12}));
  EXPECT_EQ(value_of(node, h.swa), S({13, 14}));
  EXPECT_EQ(parent->at(h.full).lock_ref, 1);
  EXPECT_EQ(parent->at(h.swa).lock_ref, 1);
  EXPECT_EQ(parent->at(h.swa).meta, 77u);
  EXPECT_FALSE(parent->at(h.mamba).live());  // no state at depth 8
  EXPECT_EQ(parent->at(h.mamba).lock_ref, 0);
  EXPECT_EQ(value_of(node, h.mamba), S({7}));
  EXPECT_EQ(node->at(h.mamba).meta, 16u);
  // The new parent is a candidate boundary: FULL and SWA accept, MAMBA has no state there.
  ASSERT_EQ(m.candidates.size(), 1u);
  EXPECT_EQ(m.candidates[0].votes, (std::vector<bool>{true, true, false}));
  EXPECT_EQ(m.matched, Tokens(0));
  h.tree.verify();
  EXPECT_EQ(h.tree.protected_slots(h.full), 4);
  h.tree.unlock(lk);
  for (Node* n : {parent, node})
    for (ComponentId c : {h.full, h.swa, h.mamba}) EXPECT_EQ(n->at(c).lock_ref, 0);
  EXPECT_EQ(h.tree.protected_slots(h.full), 0);
  h.tree.verify();
}

// ---- insert overlap and SWA healing ---------------------------------------------------------

TEST(UnifiedTree, InsertReportsWhatWasPresentAndHealsAnSwaTombstoneAllPartOrNone) {
  auto t = toks(24);
  // Each case starts from [0, 16) cached with FULL pages 1..4 and an SWA tombstone.
  auto start = [&](std::int64_t window) {
    auto h = std::make_unique<Hybrid>(window, 8);
    h->put(t, 16, run(1, 4), {}, /*s_from=*/16);
    EXPECT_FALSE(h->node(t, 16)->at(h->swa).live());
    return h;
  };
  {  // all: W = 16, the window [0, 16) covers the whole tombstone
    auto h = start(16);
    auto r = h->put(t, 16, run(1, 4), run(21, 4), 0);
    EXPECT_EQ(r.components[h->full.value()].present, Tokens(16));
    EXPECT_TRUE(r.components[h->full.value()].returned.empty());  // the tree's own pages
    EXPECT_EQ(r.components[h->swa.value()].present, Tokens(0));
    EXPECT_TRUE(r.components[h->swa.value()].returned.empty());
    EXPECT_EQ(value_of(h->node(t, 16), h->swa), run(21, 4));
    EXPECT_EQ(h->tree.node_count(), 1u);
    h->tree.verify();
  }
  {  // part: W = 8, the window starts at 8: the tombstone is split there and its lower part healed
    auto h = start(8);
    auto r = h->put(t, 16, run(1, 4), run(21, 4), 0);
    EXPECT_EQ(r.components[h->swa.value()].returned, S({21, 22}));
    EXPECT_EQ(h->tree.node_count(), 2u);
    EXPECT_FALSE(h->node(t, 8)->at(h->swa).live());
    EXPECT_EQ(value_of(h->node(t, 16), h->swa), S({23, 24}));
    h->tree.verify();
    // Inserting the same again: SWA now has [8, 16) live; the caller's other pages are duplicates.
    auto again = h->put(t, 16, run(1, 4), run(31, 2), 8);
    EXPECT_EQ(again.components[h->swa.value()].present, Tokens(8));
    EXPECT_EQ(again.components[h->swa.value()].returned, S({31, 32}));
    h->tree.verify();
  }
  {  // none: W = 8 and a key to 24: the window [16, 24) lies below the tombstone
    auto h = start(8);
    auto r = h->put(t, 24, run(1, 6), run(21, 6), 0);
    EXPECT_EQ(r.components[h->full.value()].present, Tokens(16));
    EXPECT_EQ(r.components[h->swa.value()].returned, S({21, 22, 23, 24}));
    EXPECT_FALSE(h->node(t, 16)->at(h->swa).live());
    EXPECT_EQ(value_of(h->node(t, 24), h->swa), S({25, 26}));
    EXPECT_EQ(h->tree.node_count(), 2u);
    h->tree.verify();
  }
  {  // none either when the request has freed every SWA page of the range
    auto h = start(16);
    auto r = h->put(t, 16, run(1, 4), {}, 16);
    EXPECT_TRUE(r.components[h->swa.value()].returned.empty());
    EXPECT_FALSE(h->node(t, 16)->at(h->swa).live());
    h->tree.verify();
  }
}

// ---- commit ---------------------------------------------------------------------------------

TEST(UnifiedTree, CommitSplitsANewLeafAtTheWindowAndAttachesTheStateAtItsDepth) {
  for (std::int64_t window : {8, 6}) {  // ceil(6 / 4) * 4 = 8: the same cut
    SCOPED_TRACE("window " + std::to_string(window));
    Hybrid h(window, /*chunk=*/8);
    auto t = toks(44);
    auto r = h.put(t, 40, run(1, 10), run(101, 10), 0, /*state=*/5);
    EXPECT_EQ(r.components[h.swa.value()].returned, run(101, 8));  // outside the window [32, 40)
    ASSERT_EQ(h.tree.node_count(), 2u);
    Node* top = h.node(t, 32);
    Node* leaf = h.node(t, 40);
    ASSERT_TRUE(top && leaf);
    EXPECT_EQ(value_of(top, h.full), run(1, 8));
    EXPECT_FALSE(top->at(h.swa).live());
    EXPECT_EQ(value_of(leaf, h.swa), S({109, 110}));
    EXPECT_EQ(value_of(leaf, h.mamba), S({5}));
    EXPECT_EQ(leaf->at(h.mamba).meta, 40u);
    EXPECT_EQ(r.last_node, leaf);
    auto m = h.tree.match_prefix(toks(41));
    EXPECT_EQ(m.matched, Tokens(40));
    EXPECT_EQ(m.components[h.swa.value()].slots, S({109, 110}));
    EXPECT_EQ(m.components[h.mamba.value()].slots, S({5}));

    // A checkpoint at 24 (on the grid of 8) inside [0, 32): the node is cut so a node ends there.
    auto r2 = h.put(t, 40, run(1, 10), {}, 40, /*state=*/6, /*at=*/24);
    EXPECT_EQ(r2.components[h.mamba.value()].present, Tokens(40));
    EXPECT_TRUE(r2.components[h.mamba.value()].returned.empty());
    Node* mid = h.node(t, 24);
    ASSERT_TRUE(mid);
    EXPECT_EQ(value_of(mid, h.mamba), S({6}));
    EXPECT_EQ(mid->at(h.mamba).meta, 24u);
    EXPECT_EQ(h.tree.node_count(), 3u);
    // A second state for depth 40: the tree keeps its own, the caller's comes back.
    auto r3 = h.put(t, 40, run(1, 10), {}, 40, /*state=*/9);
    EXPECT_EQ(r3.components[h.mamba.value()].returned, S({9}));
    h.tree.verify();
    // Off the grid, a state is a caller bug.
    EXPECT_THROW(h.put(t, 44, run(1, 11), {}, 44, /*state=*/8), InternalError);
  }
}

// ---- locks ----------------------------------------------------------------------------------

TEST(UnifiedTree, LocksCoverThePathTheWindowOrOneNodeAndTheWindowIsReleasedEarly) {
  Hybrid h(/*window=*/8, /*chunk=*/8);
  auto t = toks(40);
  build_figure2(h, t);
  Node* n[5] = {h.tree.root(), h.node(t, 8), h.node(t, 16), h.node(t, 24), h.node(t, 28)};
  auto lk = h.tree.lock(n[4]);
  for (int i = 1; i <= 4; ++i) {
    SCOPED_TRACE("node n" + std::to_string(i));
    EXPECT_EQ(n[i]->at(h.full).lock_ref, 1);                 // the path to the root
    EXPECT_EQ(n[i]->at(h.swa).lock_ref, i >= 3 ? 1 : 0);     // n4 (4 tokens) + n3 (8): >= W
    EXPECT_EQ(n[i]->at(h.mamba).lock_ref, i == 4 ? 1 : 0);   // one node
  }
  EXPECT_EQ(lk.parts[h.swa.value()].top, Tokens(16));
  EXPECT_EQ(h.tree.protected_slots(h.full), 7);
  EXPECT_EQ(h.tree.protected_slots(h.swa), 1);  // n3 is a tombstone: only n4's page is protected
  h.tree.verify();

  // Decode passes the window: the request frees its own pages that left it and, once the locked
  // window [16, 28) lies wholly before the position, releases the SWA lock early.
  SwaRequest req{&lk, Tokens(28), S({41, 42})};
  EXPECT_TRUE(h.swa_comp->free_before(h.tree, req, Tokens(27)).empty());
  EXPECT_TRUE(lk.parts[h.swa.value()].held);
  EXPECT_TRUE(h.swa_comp->free_before(h.tree, req, Tokens(31)).empty());  // [28, 32) still needed
  EXPECT_FALSE(lk.parts[h.swa.value()].held);
  for (int i = 1; i <= 4; ++i) EXPECT_EQ(n[i]->at(h.swa).lock_ref, 0);
  EXPECT_EQ(n[4]->at(h.full).lock_ref, 1);
  EXPECT_EQ(h.swa_comp->free_before(h.tree, req, Tokens(33)), S({41}));
  EXPECT_EQ(req.own_from, Tokens(32));
  EXPECT_EQ(h.swa_comp->free_before(h.tree, req, Tokens(33)), S({}));  // idempotent
  EXPECT_EQ(h.swa_comp->free_before(h.tree, req, Tokens(36)), S({42}));
  EXPECT_EQ(req.own_from, Tokens(36));
  h.tree.unlock(lk);
  EXPECT_FALSE(lk.held());
  for (int i = 1; i <= 4; ++i)
    for (ComponentId c : {h.full, h.swa, h.mamba}) EXPECT_EQ(n[i]->at(c).lock_ref, 0);
  h.tree.verify();

  // A window lock survives splits of the nodes it covers.
  auto lk2 = h.tree.lock(n[2]);  // n2 alone covers W: the window is [8, 16)
  EXPECT_EQ(lk2.parts[h.swa.value()].top, Tokens(8));
  auto cut = [&](std::size_t at) {
    auto p = toks(at);
    for (TokenId x : {900u, 901u, 902u, 903u, 904u}) p.push_back(x);
    h.tree.match_prefix(p);
  };
  cut(4);   // n1 -> [0, 4) + [4, 8): outside the window
  cut(12);  // n2 -> [8, 12) + [12, 16): both inside
  EXPECT_EQ(h.tree.node_count(), 6u);
  Node* upper = h.node(t, 12);
  ASSERT_TRUE(upper);
  EXPECT_EQ(upper->at(h.swa).lock_ref, 1);
  EXPECT_EQ(h.node(t, 8)->at(h.swa).lock_ref, 0);
  EXPECT_EQ(h.node(t, 4)->at(h.full).lock_ref, 1);
  h.tree.verify();
  h.tree.unlock(lk2);
  for (std::int64_t e : {4, 8, 12, 16})
    for (ComponentId c : {h.full, h.swa, h.mamba}) EXPECT_EQ(h.node(t, e)->at(c).lock_ref, 0);
  EXPECT_EQ(h.tree.protected_slots(h.full), 0);
  EXPECT_EQ(h.tree.protected_slots(h.swa), 0);
  h.tree.verify();
}

// ---- eviction -------------------------------------------------------------------------------

// n1 = [0, 8) and n2 = [8, 16) with every component live and states at 8 and 16 (W = 16), and a
// sibling leaf n3 = [8, 16)' under n1 with FULL and SWA pages but no state.
struct EvictionRig {
  Hybrid h{16, 8};
  std::vector<TokenId> t = toks(16), u;
  Node *n1, *n2, *n3;
  EvictionRig() {
    u = toks(8);
    for (TokenId x = 0; x < 8; ++x) u.push_back(500 + x);
    h.put(t, 8, run(1, 2), run(11, 2), 0, /*state=*/1);
    h.put(t, 16, run(1, 4), run(11, 4), 0, /*state=*/2);
    h.put(u, 16, S({1, 2, 5, 6}), S({11, 12, 15, 16}), 0);
    n1 = h.node(t, 8);
    n2 = h.node(t, 16);
    n3 = h.node(u, 16);
  }
};

TEST(UnifiedTree, EvictionCascadesToEqualOrLowerPrioritiesAndALeafGoesWhole) {
  {
    EvictionRig r;
    auto& h = r.h;
    // MAMBA (0) on an internal node: only the state.
    auto e = h.tree.evict_component(r.n1, h.mamba);
    EXPECT_EQ(e.freed[h.mamba.value()], S({1}));
    EXPECT_TRUE(e.freed[h.full.value()].empty());
    EXPECT_TRUE(e.freed[h.swa.value()].empty());
    EXPECT_TRUE(r.n1->at(h.swa).live());
    h.tree.verify();
  }
  {
    EvictionRig r;
    auto& h = r.h;
    // SWA (1) on an internal node takes MAMBA (0) with it; FULL (2) stays; the node stays.
    auto e = h.tree.evict_component(r.n1, h.swa);
    EXPECT_EQ(e.freed[h.swa.value()], S({11, 12}));
    EXPECT_EQ(e.freed[h.mamba.value()], S({1}));
    EXPECT_TRUE(e.freed[h.full.value()].empty());
    EXPECT_EQ(e.nodes_deleted, 0u);
    EXPECT_EQ(value_of(r.n1, h.full), S({1, 2}));
    // FULL on an internal node with FULL children would break FULL's prefix: refused.
    EXPECT_THROW(h.tree.evict_component(r.n1, h.full), InternalError);
    // Any component on a leaf (every priority 0 there) deletes the whole node.
    auto leaf = h.tree.evict_component(r.n2, h.mamba);
    EXPECT_EQ(leaf.freed[h.full.value()], S({3, 4}));
    EXPECT_EQ(leaf.freed[h.swa.value()], S({13, 14}));
    EXPECT_EQ(leaf.freed[h.mamba.value()], S({2}));
    EXPECT_EQ(leaf.nodes_deleted, 1u);
    EXPECT_EQ(h.tree.node_count(), 2u);
    h.tree.verify();
  }
  {
    EvictionRig r;
    auto& h = r.h;
    // A lock blocks the victims whose cascade it would reach.
    auto lk = h.tree.lock(r.n1);  // FULL n1, SWA window n1 (8 < 16, then the root), MAMBA n1
    EXPECT_THROW(h.tree.evict_component(r.n1, h.mamba), InternalError);
    EXPECT_EQ(h.tree.eviction_candidates(h.mamba), 1u);  // n2 only
    EXPECT_EQ(h.tree.eviction_candidates(h.swa), 2u);    // the leaves n2 and n3
    EXPECT_EQ(h.tree.eviction_candidates(h.full), 2u);
    h.tree.unlock(lk);
    h.tree.verify();
  }
}

TEST(UnifiedTree, EvictionIsLruByTheLogicalClockWithTiesByNodeId) {
  EvictionRig r;
  auto& h = r.h;
  // n2 and n3 are leaves; n3 was inserted last. A match of n2 makes n3 the least recent.
  auto m = h.tree.match_prefix(toks(17));
  ASSERT_EQ(m.matched, Tokens(16));
  auto e = h.tree.evict(h.full, 1);
  EXPECT_EQ(e.freed[h.full.value()], S({5, 6}));  // n3 whole
  EXPECT_EQ(e.freed[h.swa.value()], S({15, 16}));
  ASSERT_EQ(h.tree.node_count(), 2u);
  // MAMBA's least recent state: n1 and n2 were touched together (a tie): the lower id, n1, which
  // is internal, so only its state goes.
  ASSERT_LT(r.n1->id, r.n2->id);
  ASSERT_EQ(r.n1->last_access, r.n2->last_access);
  auto e2 = h.tree.evict(h.mamba, 1);
  EXPECT_EQ(e2.freed[h.mamba.value()], S({1}));
  EXPECT_TRUE(e2.freed[h.full.value()].empty());
  ASSERT_EQ(h.tree.node_count(), 2u);
  // SWA: n1's pages (internal, older id) become a tombstone; then the leaf n2 goes whole.
  auto e3 = h.tree.evict(h.swa, 3);
  EXPECT_EQ(e3.freed[h.swa.value()], S({11, 12, 13, 14}));
  EXPECT_EQ(e3.freed[h.full.value()], S({3, 4}));
  EXPECT_EQ(e3.freed[h.mamba.value()], S({2}));
  ASSERT_EQ(h.tree.node_count(), 1u);
  EXPECT_FALSE(r.n1->at(h.swa).live());
  // FULL empties the rest; nothing is left to evict.
  auto e4 = h.tree.evict(h.full, 100);
  EXPECT_EQ(e4.freed[h.full.value()], S({1, 2}));
  EXPECT_EQ(h.tree.node_count(), 0u);
  EXPECT_EQ(h.tree.evict(h.swa, 1).nodes_deleted, 0u);
  h.tree.verify();
}

TEST(UnifiedTree, AnAllTombstoneLeafIsDeletedUpTheChainOfEmptyAncestors) {
  // Without FULL (an SWA + MAMBA tree), internal nodes can hold nothing at all.
  UnifiedTree tree{Tokens(kPage)};
  const ComponentId swa = tree.add_component(std::make_unique<SwaComponent>(Tokens(8)));
  const ComponentId mamba = tree.add_component(std::make_unique<MambaComponent>(Tokens(8)));
  auto t = toks(24);
  auto put = [&](std::size_t n, std::vector<Slot> s, std::int64_t from, std::uint32_t state) {
    std::vector<InsertValue> v{InsertValue::pages(std::move(s), Tokens(from)),
                               state ? InsertValue::state(Slot(state)) : InsertValue::none()};
    return tree.insert(head(t, n), v);
  };
  put(8, {}, 8, 1);            // a: a state only
  put(16, {}, 16, 2);          // b: a state only
  put(24, S({1, 2}), 16, 0);   // c: the live window [16, 24)
  ASSERT_EQ(tree.node_count(), 3u);
  // A key that would leave only tombstones is not kept at all.
  auto other = toks(8, 700);
  std::vector<InsertValue> nothing{InsertValue::pages({}, Tokens(8)), InsertValue::none()};
  auto r = tree.insert(other, nothing);
  EXPECT_EQ(r.last_node, tree.root());
  EXPECT_EQ(tree.node_count(), 3u);

  Node* a = tree.find_node(t, Tokens(8));
  Node* b = tree.find_node(t, Tokens(16));
  Node* c = tree.find_node(t, Tokens(24));
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ(tree.evict_component(a, mamba).freed[mamba.value()], S({1}));
  EXPECT_EQ(tree.evict_component(b, mamba).freed[mamba.value()], S({2}));
  EXPECT_EQ(tree.node_count(), 3u);  // empty internal nodes stay: they anchor c
  tree.verify();
  auto e = tree.evict_component(c, swa);
  EXPECT_EQ(e.freed[swa.value()], S({1, 2}));
  EXPECT_EQ(e.nodes_deleted, 3u);  // c, then b and a became empty leaves
  EXPECT_EQ(tree.node_count(), 0u);
  tree.verify();
}

// ---- sidecars -------------------------------------------------------------------------------

TEST(UnifiedTree, SidecarsFollowTheirSourceThroughSplitsAndEvictionAndNeverVote) {
  UnifiedTree tree{Tokens(kPage)};
  const ComponentId full = tree.add_component(std::make_unique<FullComponent>());
  const ComponentId swa = tree.add_component(std::make_unique<SwaComponent>(Tokens(16)));
  auto draft = PayloadSidecar::make(tree, "draft_kv", full, /*words_per_token=*/2, 16);
  auto aux = PayloadSidecar::make(tree, "swa_aux", swa, /*words_per_token=*/1, 16);
  PayloadSidecar* d = draft.get();
  PayloadSidecar* x = aux.get();
  tree.add_sidecar(std::move(draft));
  tree.add_sidecar(std::move(aux));
  EXPECT_EQ(d->words_per_slot(), 8u);
  EXPECT_EQ(x->words_per_slot(), 4u);
  auto t = toks(16);
  for (std::uint32_t s = 1; s <= 4; ++s) {
    d->write(Slot(s), std::vector<std::uint64_t>(8, 100 + s));
    x->write(Slot(10 + s), std::vector<std::uint64_t>(4, 200 + s));
  }
  std::vector<InsertValue> v{InsertValue::pages(run(1, 4)), InsertValue::pages(run(11, 4))};
  tree.insert(t, v);
  auto p = toks(8);
  for (TokenId y : {900u, 901u, 902u, 903u, 904u}) p.push_back(y);
  auto m = tree.match_prefix(p);  // splits [0, 16) at 8
  ASSERT_EQ(tree.node_count(), 2u);
  for (const auto& c : m.candidates) EXPECT_EQ(c.votes.size(), 2u);
  Node* lower = tree.find_node(t, Tokens(16));
  ASSERT_TRUE(lower);
  for (std::size_t i = 0; i < 2; ++i) {  // the lower fragment's pages still find their payload
    EXPECT_EQ(d->read((*lower->at(full).value)[i])[0], 103 + i);
    EXPECT_EQ(x->read((*lower->at(swa).value)[i])[0], 203 + i);
  }
  VerifyAccounts acc{{}, {0, 0}};
  tree.verify(&acc);
  auto e = tree.evict_component(lower, swa);
  EXPECT_EQ(e.sidecar_freed[0], S({3, 4}));
  EXPECT_EQ(e.sidecar_freed[1], S({13, 14}));
  EXPECT_FALSE(d->has(Slot(3)));
  EXPECT_FALSE(x->has(Slot(13)));
  EXPECT_EQ(d->entries(), 2u);
  EXPECT_EQ(x->entries(), 2u);
  tree.verify(&acc);
  // An entry missing under a tree slot, or one too many, breaks verify.
  d->drop(S({1}));
  EXPECT_THROW(tree.verify(), InternalError);
  d->write(Slot(1), std::vector<std::uint64_t>(8, 101));
  d->write(Slot(9), std::vector<std::uint64_t>(8, 109));  // a request's entry, unaccounted
  EXPECT_THROW(tree.verify(&acc), InternalError);
  VerifyAccounts with_request{{}, {1, 0}};
  tree.verify(&with_request);
}

TEST(UnifiedTree, VerifyNamesBrokenInvariants) {
  Hybrid h(8, 8);
  auto t = toks(40);
  build_figure2(h, t);
  h.tree.verify();
  Node* n3 = h.node(t, 24);
  n3->at(h.mamba).meta = 16;  // a state that claims another depth
  EXPECT_THROW(h.tree.verify(), InternalError);
  n3->at(h.mamba).meta = 24;
  h.tree.verify();
  VerifyAccounts acc{{{10, 3, 0}, {10, 5, 0}, {10, 7, 0}}, {}};  // FULL: 3 + 7 in the tree = 10
  h.tree.verify(&acc);
  acc.components[1].held_by_requests = 1;  // one SWA page too many
  EXPECT_THROW(h.tree.verify(&acc), InternalError);
  LockHandle never_taken{n3, {LockPart{true, Tokens(0)}, LockPart{}, LockPart{}}};
  EXPECT_THROW(h.tree.unlock(never_taken), InternalError);  // releasing what was never locked
}

// ---- randomized differential test against a brute-force reference ---------------------------

constexpr std::int64_t kWindow = 10, kChunk = 8;  // W off the page grid and above the checkpoint grid
constexpr std::int64_t kInf = std::numeric_limits<std::int64_t>::max();
using Key = std::vector<TokenId>;

Key prefix(const std::vector<TokenId>& t, std::size_t n) { return Key(t.begin(), t.begin() + static_cast<std::ptrdiff_t>(n)); }

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
  const Node* best = nullptr;
  std::vector<const Node*> stack{h.tree.root()};
  while (!stack.empty()) {
    const Node* n = stack.back();
    stack.pop_back();
    for (const auto& [k, child] : n->children) stack.push_back(child.get());
    if (n == h.tree.root() || !n->at(ids[c]).live()) continue;
    bool ok = true;
    if (c == 0)
      for (const auto& [k, child] : n->children) ok = ok && !child->at(h.full).live();
    for (int d = 0; d < 3; ++d) {
      const bool cascaded = n->is_leaf() || c == 0 || d >= c;
      if (cascaded && n->at(ids[d]).lock_ref > 0) ok = false;
    }
    if (ok && (!best || n->last_access < best->last_access || (n->last_access == best->last_access && n->id < best->id)))
      best = n;
  }
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
