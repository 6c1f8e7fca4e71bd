// Unified radix tree core with host copies (the host tier's data in the tree): the window-only
// load-back by hand (bug-catalogue #19) and one test per host rule. The randomized differential
// test of both tiers is in test_unified_host_differential.cpp.
#include <gtest/gtest.h>

#include "unified_rig.hpp"

namespace kvgrid::cache::unified {
namespace {

constexpr std::int64_t kWindow = 10, kChunk = 8;  // rounded window: 12 tokens = 3 pages

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

// A storage prefetch's landing (insert_host): host copies below a backed-up anchor — an existing
// device-only node takes the copies it lacks (its FULL pages read again), new nodes hold host
// copies only, cut where SWA's window starts and at the state's depth; what the tree has already
// goes back; a node with a write in flight stops the walk.
TEST(UnifiedHost, InsertHostLandsAPrefetchAsHostCopiesCutAtTheWindowAndTheState) {
  Hybrid h(kWindow, kChunk);  // rounded window: 3 pages
  const auto t = toks(40);
  h.put(t, 8, run(1, 2), run(1, 2), 0);          // A = [0, 8): the anchor (backed up below)
  h.put(t, 12, run(1, 3), S({3}), 8);            // B = [8, 12): device only
  Node* a = h.node(t, 8);
  Node* b = h.node(t, 12);
  std::uint32_t next = 50;
  backup_all(h, a, next);  // A's FULL and SWA on the host (50, 51 and 52, 53)
  ASSERT_TRUE(a->at(h.full).backed() && !b->at(h.full).backed());
  // The prefetch read [8, 32): FULL pages 60..65, the SWA window [20, 32) as 70..72, the state at 32.
  std::vector<InsertValue> offer{InsertValue::pages(run(60, 6), Tokens(8)), InsertValue::pages(run(70, 3), Tokens(20)),
                                 InsertValue::state(Slot(80))};
  auto back = h.tree.insert_host(a, head(t, 32), offer);
  EXPECT_TRUE(back[h.full.value()].empty() && back[h.swa.value()].empty() && back[h.mamba.value()].empty());
  EXPECT_EQ(host_of(b, h.full), S({60})) << "the device-only node took its FULL host copy";
  EXPECT_FALSE(b->at(h.swa).backed()) << "outside the window: a host tombstone";
  Node* mid = h.node(t, 20);  // [12, 20): FULL only
  Node* low = h.node(t, 32);  // [20, 32): the window and the state
  EXPECT_EQ(host_of(mid, h.full), S({61, 62}));
  EXPECT_FALSE(mid->at(h.full).live() || mid->at(h.swa).backed() || mid->at(h.mamba).backed());
  EXPECT_EQ(host_of(low, h.full), S({63, 64, 65}));
  EXPECT_EQ(host_of(low, h.swa), S({70, 71, 72}));
  EXPECT_EQ(host_of(low, h.mamba), S({80}));
  h.tree.verify();
  auto m = h.tree.peek_prefix(head(t, 33));
  EXPECT_EQ(m.matched, Tokens(0)) << "no SWA window on the device";
  EXPECT_EQ(m.host_matched, Tokens(32)) << "a load-back can make 32 readable";

  // The same landing again: everything is there already and goes back.
  auto again = h.tree.insert_host(a, head(t, 32), offer);
  EXPECT_EQ(again[h.full.value()], run(60, 6));
  EXPECT_EQ(again[h.swa.value()], run(70, 3));
  EXPECT_EQ(again[h.mamba.value()], S({80}));

  // A device-only node [32, 40) whose backup is in flight: a landing over it stops there (its
  // write publishes its copies), the pages above it had theirs already: everything goes back.
  std::vector<InsertValue> dev{InsertValue::pages(run(20, 10)), InsertValue::pages({}, Tokens(40)), InsertValue::none()};
  h.tree.insert(head(t, 40), dev);
  Node* tail = h.node(t, 40);
  ASSERT_FALSE(tail->at(h.full).backed());
  h.tree.mark_writing(tail, 6);
  const std::vector<InsertValue> whole{InsertValue::pages(run(100, 8), Tokens(8)), InsertValue::none(), InsertValue::none()};
  auto refused = h.tree.insert_host(a, head(t, 40), whole);
  EXPECT_EQ(refused[h.full.value()], run(100, 8)) << "[8, 32) had its copies; [32, 40) is being written";
  EXPECT_FALSE(tail->at(h.full).backed());
  h.tree.mark_writing(tail, 0);
  auto landed = h.tree.insert_host(a, head(t, 40), whole);
  EXPECT_EQ(landed[h.full.value()], run(100, 6)) << "once the write is over, [32, 40) takes its copy";
  EXPECT_EQ(host_of(tail, h.full), S({106, 107}));
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

}  // namespace
}  // namespace kvgrid::cache::unified
