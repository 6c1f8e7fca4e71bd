// The component bug record (cache/component_bugs.hpp) at the level of the tree core: the SWA
// validator against a brute-force reference (bug-catalogue #14's differential), and one exact
// case per planted bug of the components (#14, #17, #18, #20). The request-path bugs (#15, #16,
// #21 in both forms, #22, #23) need a running request and are caught in runs: jobs/component_bugs.py, whose
// smoke is the CLI test `component_bugs`.
#include <gtest/gtest.h>

#include "cache/component_bugs.hpp"
#include "unified_rig.hpp"

namespace kvgrid::cache::unified {
namespace {

ComponentBugs bugs_of(std::initializer_list<ComponentBug> list) {
  ComponentBugs b;
  for (auto x : list) b.add(x);
  return b;
}

// FULL + SWA (window W) with the given bugs, page size 4.
struct FullSwa {
  UnifiedTree tree{Tokens(kPage)};
  ComponentId full, swa;
  FullSwa(std::int64_t window, ComponentBugs bugs) {
    full = tree.add_component(std::make_unique<FullComponent>());
    swa = tree.add_component(std::make_unique<SwaComponent>(Tokens(window), bugs));
  }
  InsertResult put(const std::vector<TokenId>& t, std::size_t n, std::uint32_t swa_first, std::int64_t swa_from) {
    std::vector<InsertValue> v{InsertValue::pages(run(1, n / kPage)),
                               InsertValue::pages(run(swa_first, (n - static_cast<std::size_t>(swa_from)) / kPage), Tokens(swa_from))};
    return tree.insert(head(t, n), v);
  }
};

// The reference: boundary b is reusable iff every token of [max(0, b - W), b) has a live SWA page.
Tokens brute_force_boundary(UnifiedTree& tree, ComponentId swa, const MatchResult& m, const std::vector<TokenId>& t,
                            std::int64_t window) {
  Tokens best(0);
  for (const auto& c : m.candidates) {
    const std::int64_t b = c.node->end.value();
    const auto pages = tree.page_values(head(t, static_cast<std::size_t>(b)), swa);
    bool live = true;
    for (std::int64_t pg = std::max<std::int64_t>(0, b - window) / kPage; pg < b / kPage; ++pg) live = live && pages[pg] > 0;
    if (live) best = Tokens(b);
  }
  return best;
}

TEST(ComponentBugs, NamesParseAndEveryCatalogueEntryIsListed) {
  std::vector<int> numbers;
  for (const auto& b : component_bug_list()) {
    EXPECT_EQ(parse_component_bug(b.name), b.bug);
    numbers.push_back(b.catalogue);
  }
  EXPECT_EQ(numbers, (std::vector<int>{14, 15, 16, 17, 18, 19, 20, 21, 21, 22, 23}));
  EXPECT_FALSE(parse_component_bug("nonsense").has_value());
  const std::vector<std::string> names{"state_at_floor"};
  EXPECT_TRUE(ComponentBugs::parse(names).has(ComponentBug::StateAtFloor));
  EXPECT_FALSE(ComponentBugs::parse(names).has(ComponentBug::SharedStateSlot));
  EXPECT_TRUE(ComponentBugs().empty());
}

// #14 by hand: tombstone [0, 8), live [8, 16), tombstone [16, 24), live [24, 28) with W = 8. The
// boundary at 28 has only 4 live tokens behind it: the correct validator stops at 16; the buggy
// one counts the second tombstone as live and hands out a window with a hole.
TEST(ComponentBugs, SwaRunAcrossTombstonesAcceptsAWindowWithAHole) {
  auto t = toks(40);
  for (bool buggy : {false, true}) {
    SCOPED_TRACE(buggy ? "swa_run_across_tombstones" : "correct");
    FullSwa h(8, buggy ? bugs_of({ComponentBug::SwaRunAcrossTombstones}) : ComponentBugs{});
    h.put(t, 16, 1, 8);   // window [8, 16) live
    h.put(t, 28, 3, 24);  // [16, 24) a tombstone, [24, 28) live
    h.tree.verify();
    auto m = h.tree.match_prefix(head(t, 29));
    EXPECT_EQ(m.walked, Tokens(28));
    EXPECT_EQ(m.matched, buggy ? Tokens(28) : Tokens(16));
    const auto& sw = m.components[h.swa.value()];
    if (buggy) {
      EXPECT_EQ(sw.from, Tokens(16));
      EXPECT_EQ(sw.slots, S({0, 0, 3}));  // the hole: no SWA page behind positions 16..23
    } else {
      EXPECT_EQ(sw.from, Tokens(8));
      EXPECT_EQ(sw.slots, S({1, 2}));
    }
  }
}

// #14's differential: random trees of FULL + SWA inserts (each keeping only its window, some
// offering less), random prompts; the correct validator equals the reference on every match, the
// buggy one departs from it somewhere.
TEST(ComponentBugs, SwaValidatorEqualsTheBruteForceReferenceAndTheBugDoesNot) {
  const std::uint64_t seed = seed_or(1914);
  std::printf("# seed %llu (KVGRID_TEST_SEED)\n", static_cast<unsigned long long>(seed));
  for (bool buggy : {false, true}) {
    std::int64_t differ = 0, matches = 0;
    Rng rng(seed);
    for (int trial = 0; trial < 300; ++trial) {
      const std::int64_t window = kPage * rng.between(1, 4);
      FullSwa h(window, buggy ? bugs_of({ComponentBug::SwaRunAcrossTombstones}) : ComponentBugs{});
      std::vector<std::vector<TokenId>> prompts;
      for (int f = 0; f < 2; ++f) prompts.push_back(toks(64, static_cast<TokenId>(1000 * (f + 1))));
      std::uint32_t next_swa = 1;
      for (int i = 0; i < 6; ++i) {
        const auto& t = prompts[rng.below(prompts.size())];
        const std::size_t n = static_cast<std::size_t>(kPage * rng.between(1, 16));
        const std::int64_t from = kPage * rng.between(0, static_cast<std::int64_t>(n) / kPage);
        h.put(t, n, next_swa, from);
        next_swa += static_cast<std::uint32_t>((static_cast<std::int64_t>(n) - from) / kPage);
      }
      for (int q = 0; q < 4; ++q) {
        const auto& t = prompts[rng.below(prompts.size())];
        auto m = h.tree.peek_prefix(head(t, static_cast<std::size_t>(rng.between(2, 64))));
        ++matches;
        if (m.matched != brute_force_boundary(h.tree, h.swa, m, t, window)) ++differ;
      }
    }
    std::printf("# %s: %lld of %lld matches differ from the reference\n", buggy ? "buggy" : "correct",
                static_cast<long long>(differ), static_cast<long long>(matches));
    if (buggy) EXPECT_GT(differ, 0) << "seed " << seed;
    else EXPECT_EQ(differ, 0) << "seed " << seed;
  }
}

// #17: page 4 > window 2. The correct insert keeps ceil(2/4) = 1 page at its end; the floored
// frontier keeps none, so the leaf the insert just computed is an SWA tombstone (FULL live).
TEST(ComponentBugs, FlooredFrontierLeavesTheInsertsEndAnSwaTombstone) {
  auto t = toks(16);
  for (bool buggy : {false, true}) {
    SCOPED_TRACE(buggy ? "floored_frontier" : "correct");
    FullSwa h(2, buggy ? bugs_of({ComponentBug::FlooredFrontier}) : ComponentBugs{});
    auto r = h.put(t, 8, 1, 0);
    const auto swa = h.tree.page_values(head(t, 8), h.swa);
    EXPECT_EQ(swa, buggy ? (std::vector<std::int64_t>{0, 0}) : (std::vector<std::int64_t>{0, 2}));
    EXPECT_EQ(r.components[h.swa.value()].returned, buggy ? S({1, 2}) : S({1}));
    EXPECT_EQ(h.tree.page_values(head(t, 8), h.full), (std::vector<std::int64_t>{1, 2}));
  }
}

// #18: a new leaf shorter than the window. The correct tree caches FULL's pages whatever SWA
// holds; the vetoing SWA refuses the leaf and every offer comes back.
TEST(ComponentBugs, SwaVetoFullLeafDropsFullsPages) {
  auto t = toks(16);
  for (bool buggy : {false, true}) {
    SCOPED_TRACE(buggy ? "swa_veto_full_leaf" : "correct");
    FullSwa h(16, buggy ? bugs_of({ComponentBug::SwaVetoFullLeaf}) : ComponentBugs{});
    auto r = h.put(t, 8, 1, 0);
    EXPECT_EQ(h.tree.node_count(), buggy ? 0u : 1u);
    EXPECT_EQ(r.components[h.full.value()].returned, buggy ? S({1, 2}) : S({}));
    EXPECT_EQ(r.components[h.swa.value()].returned, buggy ? S({1, 2}) : S({}));
    if (buggy) {
      EXPECT_EQ(r.last_node, h.tree.root());
    }
    h.tree.verify();
  }
}

// #18 below an existing path: the vetoed part is only the new leaf; what was offered for the path
// the tree already holds is returned as duplicates are (FULL's own pages stay), and a state at a
// depth the veto does not reach is not handed back twice.
TEST(ComponentBugs, SwaVetoBelowAnExistingPathReturnsOnlyTheNewLeafsOffer) {
  auto t = toks(32);
  FullSwa h(16, bugs_of({ComponentBug::SwaVetoFullLeaf}));
  h.put(t, 16, 1, 0);  // [0, 16): 16 tokens, a whole window: not vetoed
  ASSERT_EQ(h.tree.node_count(), 1u);
  std::vector<InsertValue> v{InsertValue::pages(run(11, 6)), InsertValue::pages(S({21, 22}), Tokens(16))};
  auto r = h.tree.insert(head(t, 24), v);  // the new leaf [16, 24) is shorter than the window
  EXPECT_EQ(h.tree.node_count(), 1u);
  EXPECT_EQ(r.components[h.full.value()].present, Tokens(16));
  EXPECT_EQ(r.components[h.full.value()].returned, run(11, 6));  // four duplicates and the two refused
  EXPECT_EQ(r.components[h.swa.value()].returned, S({21, 22}));
  EXPECT_EQ(r.last_node, h.tree.find_node(t, Tokens(16)));
  h.tree.verify();
}

// #20: identical prompt minus one splits the node mid-edge. The correct split leaves the state on
// the deeper fragment (MAMBA rejects the new interior node); the buggy one hands it to the prefix,
// which then claims a state of another depth — verify() names it, and a match would reuse it.
TEST(ComponentBugs, SplitTruncatesStateHandsTheStateToThePrefix) {
  auto t = toks(20);
  for (bool buggy : {false, true}) {
    SCOPED_TRACE(buggy ? "split_truncates_state" : "correct");
    UnifiedTree tree{Tokens(kPage)};
    const ComponentId full = tree.add_component(std::make_unique<FullComponent>());
    const ComponentId mamba =
        tree.add_component(std::make_unique<MambaComponent>(Tokens(kPage), buggy ? bugs_of({ComponentBug::SplitTruncatesState}) : ComponentBugs{}));
    std::vector<InsertValue> v{InsertValue::pages(run(1, 4)), InsertValue::state(Slot(7))};
    tree.insert(head(t, 16), v);
    auto m = tree.match_prefix(head(t, 9));  // reuse at most 8 tokens: the node [0, 16) splits at 8
    EXPECT_EQ(tree.splits(), 1u);
    EXPECT_EQ(m.matched, buggy ? Tokens(8) : Tokens(0));
    EXPECT_EQ(m.components[mamba.value()].slots, buggy ? S({7}) : S({}));
    if (buggy) {
      try {
        tree.verify();
        ADD_FAILURE() << "verify() accepted a state at the wrong depth";
      } catch (const InternalError& e) {
        EXPECT_NE(std::string(e.what()).find("ending at 8 holds a state taken at depth 16"), std::string::npos) << e.what();
      }
    } else {
      tree.verify();
    }
    (void)full;
  }
}

}  // namespace
}  // namespace kvgrid::cache::unified
