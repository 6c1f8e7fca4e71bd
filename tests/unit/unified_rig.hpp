// Shared by the unified tree core's tests (test_unified_tree.cpp: the figures and one test per
// hook; test_unified_differential.cpp: the randomized differential tests): slot and token
// helpers, the seed, and a FULL + SWA + MAMBA tree with its pools.
#pragma once

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
#include "test_seed.hpp"

namespace kvgrid::cache::unified {


constexpr std::int64_t kPage = 4;

inline std::vector<Slot> S(std::initializer_list<std::uint32_t> ids) {
  std::vector<Slot> v;
  for (auto i : ids) v.push_back(Slot(i));
  return v;
}

inline std::vector<Slot> run(std::uint32_t first, std::size_t n) {
  std::vector<Slot> v;
  for (std::size_t i = 0; i < n; ++i) v.push_back(Slot(first + static_cast<std::uint32_t>(i)));
  return v;
}

inline std::vector<TokenId> toks(std::size_t n, TokenId base = 100) {
  std::vector<TokenId> t(n);
  for (std::size_t i = 0; i < n; ++i) t[i] = base + static_cast<TokenId>(i);
  return t;
}

inline std::span<const TokenId> head(const std::vector<TokenId>& t, std::size_t n) { return std::span<const TokenId>(t).first(n); }

using kvgrid::testing::seed_or;

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

// Token-prefix keys of the page-level reference models (a page is the prefix ending with it).
using Key = std::vector<TokenId>;
inline Key prefix(const std::vector<TokenId>& t, std::size_t n) { return Key(t.begin(), t.begin() + static_cast<std::ptrdiff_t>(n)); }
constexpr std::int64_t kInf = std::numeric_limits<std::int64_t>::max();

// The eviction order by brute force: of the nodes `allowed` admits (the root never), the least
// (last access, node id); null when none.
template <typename Pred>
const Node* least_recent(const UnifiedTree& tree, Pred allowed) {
  const Node* best = nullptr;
  std::vector<const Node*> stack{tree.root()};
  while (!stack.empty()) {
    const Node* n = stack.back();
    stack.pop_back();
    for (const auto& [k, child] : n->children) stack.push_back(child.get());
    if (n == tree.root() || !allowed(*n)) continue;
    if (!best || n->last_access < best->last_access || (n->last_access == best->last_access && n->id < best->id)) best = n;
  }
  return best;
}
// Does a cascade from component c (0 FULL, 1 SWA, 2 MAMBA of Hybrid) reach a locked value on n?
// A leaf cascades to everything, an internal FULL to everything, SWA to SWA and MAMBA, MAMBA to itself.
inline bool cascade_locked(const Node& n, const ComponentId (&ids)[3], int c) {
  for (int d = 0; d < 3; ++d)
    if ((n.is_leaf() || c == 0 || d >= c) && n.at(ids[d]).lock_ref > 0) return true;
  return false;
}

inline std::vector<Slot> value_of(const Node* n, ComponentId c) {
  return n->at(c).value ? *n->at(c).value : std::vector<Slot>{};
}

// The article's Figure 2: n1 = [0, 8) and n2 = [8, 16) live with MAMBA states at 8 and 16;
// n3 = [16, 24) an SWA tombstone with a state at 24; n4 = [24, 28) live without a state.
inline void build_figure2(Hybrid& h, const std::vector<TokenId>& t) {
  h.put(t, 8, run(1, 2), run(1, 2), 0, /*state=*/1);          // n1
  h.put(t, 16, run(1, 4), run(1, 4), 0, /*state=*/2);         // n2 (n1's pages are the tree's own)
  h.put(t, 24, run(1, 6), {}, /*s_from=*/24, /*state=*/3);    // n3: the request had freed its SWA pages
  h.put(t, 28, run(1, 7), S({5}), /*s_from=*/24);             // n4: window [24, 28) live, no state
}

}  // namespace kvgrid::cache::unified
