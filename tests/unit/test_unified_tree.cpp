// Unified radix tree core (cache/unified_tree.hpp) and its FULL, SWA and MAMBA components: the
// second article's Figures 2 and 3 made concrete and one behaviour test per hook. The randomized
// differential tests are in test_unified_differential.cpp.
#include <gtest/gtest.h>

#include "unified_rig.hpp"

namespace kvgrid::cache::unified {
namespace {

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
    EXPECT_EQ(m.candidates[i].votes(), votes[i]);
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
  for (const auto& c : m.candidates) EXPECT_EQ(c.votes().size(), 2u);
  VerifyAccounts acc{{{16, 10, 0}, {16, 14, 0}}, {0, 0, 0, 0, 0}, {}};
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
  EXPECT_EQ(m.candidates[0].votes(), (std::vector<bool>{true, true, false}));
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
  for (const auto& c : m.candidates) EXPECT_EQ(c.votes().size(), 2u);
  Node* lower = tree.find_node(t, Tokens(16));
  ASSERT_TRUE(lower);
  for (std::size_t i = 0; i < 2; ++i) {  // the lower fragment's pages still find their payload
    EXPECT_EQ(d->read((*lower->at(full).value)[i])[0], 103 + i);
    EXPECT_EQ(x->read((*lower->at(swa).value)[i])[0], 203 + i);
  }
  VerifyAccounts acc{{}, {0, 0}, {}};
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
  VerifyAccounts with_request{{}, {1, 0}, {}};
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
  VerifyAccounts acc{{{10, 3, 0}, {10, 5, 0}, {10, 7, 0}}, {}, {}};  // FULL: 3 + 7 in the tree = 10
  h.tree.verify(&acc);
  acc.components[1].held_by_requests = 1;  // one SWA page too many
  EXPECT_THROW(h.tree.verify(&acc), InternalError);
  LockHandle never_taken{n3, {LockPart{true, Tokens(0)}, LockPart{}, LockPart{}}};
  EXPECT_THROW(h.tree.unlock(never_taken), InternalError);  // releasing what was never locked
}

}  // namespace
}  // namespace kvgrid::cache::unified

namespace kvgrid::cache::unified {
namespace {

// insert_below continues from a node on the key's path (the request's locked match) without
// walking it again: the tree it leaves is the one insert() leaves, `present` included; an offer
// reaching above the node is refused before anything changes.
TEST(UnifiedTree, InsertBelowTheMatchedNodeEqualsAWholeInsert) {
  Hybrid a(8, 8), b(8, 8);
  const auto t = toks(64);
  for (Hybrid* h : {&a, &b}) h->put(t, 24, run(1, 6), run(1, 6), 0, /*state=*/1);
  // Both extend [0, 24) to [0, 48): a by a whole insert, b below its match of the first 24.
  std::vector<InsertValue> v{InsertValue::pages(run(7, 6), Tokens(24)), InsertValue::pages(run(7, 6), Tokens(24)),
                             InsertValue::state(Slot(2), Tokens(48))};
  const auto ra = a.tree.insert(head(t, 48), v);
  auto m = b.tree.match_prefix(head(t, 25));
  ASSERT_EQ(m.matched.value(), 24);
  const auto rb = b.tree.insert_below(m.last_node, head(t, 48), v);
  EXPECT_EQ(a.tree.digest(), b.tree.digest());
  for (std::size_t c = 0; c < 3; ++c) {
    EXPECT_EQ(ra.components[c].present, rb.components[c].present) << c;
    EXPECT_EQ(ra.components[c].returned, rb.components[c].returned) << c;
  }
  EXPECT_EQ(ra.last_node->end, rb.last_node->end);
  // The path above the start node is accessed with the insert, as a whole insert accesses it.
  EXPECT_EQ(m.last_node->last_access, rb.last_node->last_access);
  a.tree.verify();
  b.tree.verify();
  // An offer starting above the node is refused, and the tree is unchanged.
  const auto before = b.tree.digest();
  auto m2 = b.tree.match_prefix(head(t, 49));
  std::vector<InsertValue> bad{InsertValue::pages(run(20, 8), Tokens(32)), InsertValue::pages(run(20, 8), Tokens(32)),
                               InsertValue::none()};
  EXPECT_THROW(b.tree.insert_below(m2.last_node, head(t, 64), bad), InternalError);
  EXPECT_EQ(b.tree.digest(), before);
}

}  // namespace
}  // namespace kvgrid::cache::unified
