// Sessions on the unified tree (cache/unified_tree_sessions.cpp): registration and coverage by
// hand, the eviction order (unreferenced → fewer references → LRU) on hand-built trees, close
// keeping recency (and the planted bug that resets it), generations, the bounded set of closed
// ids, the planted bug without generations caught by verify(), and a randomized differential test
// of references and eviction order against a reference model.
#include <gtest/gtest.h>

#include <set>

#include "unified_rig.hpp"

namespace kvgrid::cache::unified {
namespace {

std::int64_t ref(const Node* n, ComponentId c) { return n->at(c).session_ref; }

// Three branches under the root, inserted (so last used) in order a, b, c; each of 8 tokens with
// FULL pages, SWA pages for the window and a MAMBA state at its end.
struct Branches {
  Hybrid h{/*window=*/8, /*chunk=*/8};
  std::vector<TokenId> a = toks(8, 1000), b = toks(8, 2000), c = toks(8, 3000);
  std::uint32_t next = 1;
  Node* put(const std::vector<TokenId>& t) {
    const std::uint32_t f = next, s = next + 10;
    next += 2;
    h.put(t, 8, run(f, 2), run(s, 2), 0, /*state=*/f);
    return h.node(t, 8);
  }
};

TEST(UnifiedSessions, ATurnRegistersThePathTheTailWindowAndTheFrontierState) {
  Hybrid h(/*window=*/8, /*chunk=*/8);
  auto t = toks(40);
  h.put(t, 8, run(1, 2), run(1, 2), 0, /*state=*/1);
  h.put(t, 16, run(1, 4), run(1, 4), 0, /*state=*/2);
  Node* n8 = h.node(t, 8);
  Node* n16 = h.node(t, 16);
  const std::uint64_t g = h.tree.open_session(7);
  ASSERT_EQ(h.tree.register_session(7, g, n16), SessionRegistration::Registered);
  h.tree.verify();
  // FULL: the whole path; SWA: nodes ending after 16 - 8 = 8; MAMBA: the frontier's state.
  EXPECT_EQ(ref(n8, h.full), 1);
  EXPECT_EQ(ref(n16, h.full), 1);
  EXPECT_EQ(ref(n8, h.swa), 0);
  EXPECT_EQ(ref(n16, h.swa), 1);
  EXPECT_EQ(ref(n8, h.mamba), 0);
  EXPECT_EQ(ref(n16, h.mamba), 1);

  // A deeper turn advances the frontier: the path is counted once, the window and the state move.
  h.put(t, 24, run(1, 6), run(5, 2), 16, /*state=*/3);
  Node* n24 = h.node(t, 24);
  ASSERT_EQ(h.tree.register_session(7, g, n24), SessionRegistration::Registered);
  h.tree.verify();
  EXPECT_EQ(ref(n8, h.full), 1);
  EXPECT_EQ(ref(n16, h.full), 1);
  EXPECT_EQ(ref(n24, h.full), 1);
  EXPECT_EQ(ref(n16, h.swa), 0);
  EXPECT_EQ(ref(n24, h.swa), 1);
  EXPECT_EQ(ref(n16, h.mamba), 0);
  EXPECT_EQ(ref(n24, h.mamba), 1);
  ASSERT_EQ(h.tree.session_frontiers(7, h.full).size(), 1u);
  EXPECT_EQ(h.tree.session_frontiers(7, h.full)[0].first, n24);

  // A second session on the same prefix: two references on the shared path.
  const std::uint64_t g2 = h.tree.open_session(8);
  ASSERT_EQ(h.tree.register_session(8, g2, n16), SessionRegistration::Registered);
  EXPECT_EQ(ref(n8, h.full), 2);
  EXPECT_EQ(ref(n16, h.full), 2);
  EXPECT_EQ(ref(n24, h.full), 1);

  // A split keeps the counts on both fragments (the upper one only where the region reaches it).
  auto m = h.tree.match_prefix(toks(13));  // ends inside n16: a split at 12
  EXPECT_EQ(m.matched, Tokens(8));         // (MAMBA accepts no state at 12)
  Node* n12 = h.node(t, 12);
  EXPECT_EQ(ref(n12, h.full), 2);
  EXPECT_EQ(ref(n12, h.swa), 1);  // session 7's window starts at 16, session 8's at 8: n12 ends at 12 > 8
  h.tree.verify();

  // The frontier leaf deleted: session 7 recedes to the nearest node left (n16).
  auto e = h.tree.evict_component(n24, h.full);
  EXPECT_EQ(e.nodes_deleted, 1u);
  h.tree.verify();
  ASSERT_EQ(h.tree.session_frontiers(7, h.full).size(), 1u);
  EXPECT_EQ(h.tree.session_frontiers(7, h.full)[0].first, n16);
  EXPECT_EQ(ref(n16, h.full), 2);
  EXPECT_EQ(ref(n16, h.mamba), 2);
  // the eviction took referenced KV: counted as forced (FULL 2 pages = 8 tokens)
  EXPECT_EQ(h.tree.session_stats().forced_slots[h.full.value()], 2);
  EXPECT_EQ(h.tree.session_stats().forced_tokens[h.full.value()], 8);

  // Closing removes the references and frees nothing.
  const auto held = h.tree.held_slots(h.full);
  EXPECT_TRUE(h.tree.close_session(7));
  EXPECT_FALSE(h.tree.close_session(7));  // already closed: a no-op
  EXPECT_EQ(ref(n16, h.full), 1);
  EXPECT_EQ(h.tree.held_slots(h.full), held);
  EXPECT_TRUE(h.tree.close_session(8));
  EXPECT_EQ(ref(n8, h.full), 0);
  h.tree.verify();
}

TEST(UnifiedSessions, EvictionTakesUnreferencedThenFewerReferencesThenLru) {
  for (bool order : {false, true}) {
    SCOPED_TRACE(order ? "cache.eviction = session" : "cache.eviction = lru");
    Branches br;
    auto& tree = br.h.tree;
    tree.set_session_policy(SessionPolicy{.order = order});
    Node* a = br.put(br.a);  // oldest
    Node* b = br.put(br.b);
    Node* c = br.put(br.c);  // newest
    const auto g1 = tree.open_session(1), g2 = tree.open_session(2), g3 = tree.open_session(3);
    tree.register_session(1, g1, a);
    tree.register_session(2, g2, a);  // a: two references
    tree.register_session(3, g3, b);  // b: one; c: none
    tree.verify();
    std::vector<Node*> want = order ? std::vector<Node*>{c, b, a} : std::vector<Node*>{a, b, c};
    for (std::size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(tree.lru_candidate(br.h.full), want[i]);
      EXPECT_EQ(tree.lru_candidate(br.h.mamba), want[i]);  // on a leaf every component ranks alike
      tree.evict(br.h.full, 1);
      tree.verify();
      // Forced evictions of referenced KV: LRU's first victim is a (two sessions), the session
      // order's is c (none); once nothing unreferenced is left both take referenced KV.
      if (i == 0) {
        EXPECT_EQ(tree.session_stats().forced_tokens[br.h.full.value()], order ? 0 : 8);
      }
    }
    EXPECT_EQ(tree.node_count(), 0u);
    EXPECT_EQ(tree.session_stats().forced_tokens[br.h.full.value()], order ? 16 : 16);
  }
}

TEST(UnifiedSessions, HostEvictionFollowsTheSameOrder) {
  Branches br;
  auto& tree = br.h.tree;
  tree.set_session_policy(SessionPolicy{.order = true});
  Node* a = br.put(br.a);
  Node* b = br.put(br.b);
  std::uint32_t hs = 100;
  for (Node* n : {a, b}) {
    for (ComponentId c : {br.h.full, br.h.swa, br.h.mamba}) {
      const std::size_t k = c == br.h.mamba ? 1 : 2;
      tree.set_host(n, c, run(hs, k));
      hs += 4;
    }
    tree.evict_component(n, br.h.full);  // the device copy goes: host-only nodes
  }
  const auto g = tree.open_session(1);
  // a is host-only: it has data (the host copy), so it can be a frontier
  ASSERT_EQ(tree.register_session(1, g, a), SessionRegistration::Registered);
  tree.verify();
  EXPECT_EQ(tree.host_lru_candidate(br.h.full), b);  // a is older but referenced
  tree.evict_host(br.h.full, 1);
  EXPECT_EQ(tree.host_lru_candidate(br.h.full), a);
  tree.evict_host(br.h.full, 1);
  EXPECT_EQ(tree.session_stats().forced_host_tokens[br.h.full.value()], 8);
  tree.verify();
}

TEST(UnifiedSessions, CloseKeepsRecencyAndThePlantedBugMakesAClosedSessionLookHot) {
  for (bool bug : {false, true}) {
    SCOPED_TRACE(bug ? "session_close_resets_recency" : "correct");
    Branches br;
    auto& tree = br.h.tree;
    tree.set_session_policy(SessionPolicy{.order = true, .close_resets_recency = bug});
    Node* a = br.put(br.a);  // the session's, oldest
    Node* b = br.put(br.b);  // dead KV, newer
    const auto g = tree.open_session(1);
    tree.register_session(1, g, a);
    EXPECT_EQ(tree.lru_candidate(br.h.full), b);  // while open, a is protected
    tree.close_session(1);
    tree.verify();
    // Closed: a is cold and unreferenced, so it goes first — unless closing stamped it as just used.
    EXPECT_EQ(tree.lru_candidate(br.h.full), bug ? b : a);
    // The metric that shows it: evicting b while a — idle, closed, used before b — stays.
    tree.evict(br.h.full, 1);
    tree.verify();
    EXPECT_EQ(tree.session_stats().recency_inversion_tokens, bug ? 8 : 0);
  }
}

TEST(UnifiedSessions, AComponentWithoutReferencesDoesNotTakeAReferencedEqualPriorityOne) {
  Hybrid h(/*window=*/8, /*chunk=*/8);
  h.tree.set_session_policy(SessionPolicy{.order = true});
  auto a = toks(8, 1000), b = toks(8, 2000);
  h.put(a, 8, run(1, 2), run(1, 2), 0);  // a: no state yet
  Node* na = h.node(a, 8);
  const auto g = h.tree.open_session(1);
  h.tree.register_session(1, g, na);  // FULL and SWA referenced; MAMBA has no frontier
  h.put(a, 8, run(1, 2), {}, 8, /*state=*/1);  // a's state arrives later: MAMBA unreferenced on a leaf
  h.put(b, 8, run(3, 2), run(3, 2), 0, /*state=*/2);  // b: newer, unreferenced
  Node* nb = h.node(b, 8);
  EXPECT_EQ(ref(na, h.full), 1);
  EXPECT_EQ(ref(na, h.mamba), 0);
  h.tree.verify();
  // Evicting a's state would delete the leaf and its referenced FULL pages: b's goes first.
  EXPECT_EQ(h.tree.lru_candidate(h.mamba), nb);
  // On an internal node MAMBA (priority 0) is below FULL (2): its rank is its own.
  auto deeper = toks(16, 1000);
  h.put(deeper, 16, S({1, 2, 7, 8}), S({7, 8}), 8, /*state=*/3);
  EXPECT_FALSE(na->is_leaf());
  h.tree.match_prefix(toks(9, 2000));  // b used again: a and its new child are the oldest
  h.tree.verify();
  EXPECT_EQ(h.tree.lru_candidate(h.mamba), na);  // a's state is older than b's and unreferenced
}

TEST(UnifiedSessions, GenerationsAndClosedIdsStopStaleAndLateFinishers) {
  Branches br;
  auto& tree = br.h.tree;
  tree.set_session_policy(SessionPolicy{.order = true, .tombstones = 2});
  Node* a = br.put(br.a);
  const auto g1 = tree.session_arrival(5);  // an id never seen opens
  EXPECT_GT(g1, 0u);
  EXPECT_EQ(tree.session_arrival(5), g1);
  const auto g2 = tree.open_session(5);  // reopened: a new generation
  EXPECT_GT(g2, g1);
  EXPECT_EQ(tree.register_session(5, g1, a), SessionRegistration::Stale);
  EXPECT_EQ(ref(a, br.h.full), 0);
  EXPECT_EQ(tree.register_session(5, g2, a), SessionRegistration::Registered);
  EXPECT_EQ(ref(a, br.h.full), 1);
  tree.close_session(5);
  EXPECT_EQ(tree.session_arrival(5), 0u);  // a request of a closed session carries no generation
  EXPECT_EQ(tree.register_session(5, g2, a), SessionRegistration::Closed);  // a late finisher
  EXPECT_EQ(ref(a, br.h.full), 0);
  EXPECT_EQ(tree.register_session(0, 0, a), SessionRegistration::NoSession);
  EXPECT_EQ(tree.session_stats().stale_finishes, 1);
  EXPECT_EQ(tree.session_stats().closed_finishes, 1);
  // The closed set is bounded: the oldest closed id is forgotten.
  for (SessionId s : {6, 7}) {
    tree.open_session(s);
    tree.close_session(s);
  }
  EXPECT_EQ(tree.closed_sessions_remembered(), 2u);
  EXPECT_FALSE(tree.session_closed(5));
  EXPECT_TRUE(tree.session_closed(6) && tree.session_closed(7));
  tree.verify();
}

TEST(UnifiedSessions, WithoutGenerationsALateFinisherLeavesReferencesThatVerifyCatches) {
  Branches br;
  auto& tree = br.h.tree;
  tree.set_session_policy(SessionPolicy{.order = true, .no_generation = true});
  Node* a = br.put(br.a);
  const auto g = tree.open_session(5);
  tree.close_session(5);
  EXPECT_EQ(tree.register_session(5, g, a), SessionRegistration::Registered);  // re-tagged after close
  EXPECT_EQ(ref(a, br.h.full), 1);
  try {
    tree.verify();
    FAIL() << "verify() passed with references of a closed session";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("after it was closed"), std::string::npos) << e.what();
  }
}

// ---- randomized differential test -----------------------------------------------------------

// The reference: sessions as frontier keys (token prefixes at node ends) and the depths their
// regions start at; a node's references = distinct sessions with a frontier at or below it whose
// region reaches above the node's end. The victim: least (rank, last access, id) among the
// candidates, rank from the reference's counts.
struct RefSessions {
  struct Frontier {
    Key key;
    std::int64_t from;
    bool operator==(const Frontier&) const = default;
  };
  std::map<SessionId, std::array<std::vector<Frontier>, 3>> open;
  std::map<SessionId, std::uint64_t> generation;
  std::list<SessionId> closed;
  std::size_t limit = 0;
  std::uint64_t gens = 0;

  std::int64_t refs(const Node* n, int c, const Key& path) const {
    std::int64_t k = 0;
    for (const auto& [s, fs] : open) {
      bool hit = false;
      for (const Frontier& f : fs[c])
        hit = hit || (f.key.size() >= path.size() && std::equal(path.begin(), path.end(), f.key.begin()) &&
                      n->end.value() > f.from);
      k += hit ? 1 : 0;
    }
    return k;
  }
};

Key path_of(const Node* n) {
  Key k;
  std::vector<const Node*> up;
  for (; n && n->parent; n = n->parent) up.push_back(n);
  for (auto it = up.rbegin(); it != up.rend(); ++it) k.insert(k.end(), (*it)->key.begin(), (*it)->key.end());
  return k;
}

TEST(UnifiedSessions, RandomOperationsAgreeWithTheReferenceModel) {
  const std::uint64_t seed = seed_or(20261203);
  std::printf("seed %llu (KVGRID_TEST_SEED)\n", static_cast<unsigned long long>(seed));
  Rng rng(seed);
  constexpr std::int64_t kWindow = 8, kChunk = 8;
  Hybrid h(kWindow, kChunk);
  h.tree.set_session_policy(SessionPolicy{.order = true, .tombstones = 4});
  const ComponentId ids[3] = {h.full, h.swa, h.mamba};
  RefSessions ref;
  ref.limit = 4;
  std::uint32_t next_slot[3] = {1, 1, 1};
  std::vector<Key> families;
  for (int f = 0; f < 4; ++f) families.push_back(toks(64, static_cast<TokenId>(1000 * (f + 1))));
  auto prompt = [&] {
    const Key& fam = families[rng.below(families.size())];
    Key t(fam.begin(), fam.begin() + rng.between(1, 12) * kPage);
    if (rng.below(3) == 0) t.back() += 1;  // a branch
    return t;
  };
  // The reference's frontier for component c of a request ending at `last`.
  auto frontier_of = [&](Node* last, int c) -> Node* {
    for (Node* n = last; n && n->parent; n = n->parent)
      if (n->at(ids[c]).present(true)) return n;
    return nullptr;
  };
  auto from_of = [&](const Node* f, int c) -> std::int64_t {
    return c == 0 ? 0 : c == 1 ? std::max<std::int64_t>(0, f->end.value() - kWindow) : f->end.value() - 1;
  };
  // Frontiers whose node is gone recede to the nearest node left on their key.
  auto recede = [&] {
    for (auto& [s, fs] : ref.open)
      for (int c = 0; c < 3; ++c) {
        std::vector<RefSessions::Frontier> out;
        for (const auto& f : fs[c]) {
          if (h.tree.find_node(f.key, Tokens(static_cast<std::int64_t>(f.key.size())))) {
            out.push_back(f);
            continue;
          }
          for (std::size_t len = f.key.size(); len > 0; len -= kPage) {
            Node* n = h.tree.find_node(f.key, Tokens(static_cast<std::int64_t>(len - kPage)));
            if (!n || n == h.tree.root()) continue;
            Node* fr = frontier_of(n, c);
            if (!fr) break;
            RefSessions::Frontier nf{path_of(fr), from_of(fr, c)};
            if (std::find(out.begin(), out.end(), nf) == out.end()) out.push_back(nf);
            break;
          }
        }
        fs[c] = out;
      }
  };
  auto check = [&] {
    h.tree.verify();
    std::vector<const Node*> stack{h.tree.root()};
    while (!stack.empty()) {
      const Node* n = stack.back();
      stack.pop_back();
      for (const auto& [k, ch] : n->children) stack.push_back(ch.get());
      if (n == h.tree.root()) continue;
      const Key p = path_of(n);
      for (int c = 0; c < 3; ++c) ASSERT_EQ(n->at(ids[c]).session_ref, ref.refs(n, c, p)) << "node " << n->id << " component " << c;
    }
  };
  auto victim = [&](int c) -> const Node* {
    const Node* best = nullptr;
    std::tuple<std::int64_t, std::uint64_t, std::uint64_t> bk{};
    std::vector<const Node*> stack{h.tree.root()};
    while (!stack.empty()) {
      const Node* n = stack.back();
      stack.pop_back();
      for (const auto& [k, ch] : n->children) stack.push_back(ch.get());
      if (n == h.tree.root() || !n->at(ids[c]).live()) continue;
      bool ok = true;
      for (const auto& [k, ch] : n->children) ok = ok && !(c == 0 && ch->at(h.full).live());
      if (!ok) continue;
      const Key p = path_of(n);
      std::int64_t rank = ref.refs(n, c, p);
      if (n->is_leaf())
        for (int d = 0; d < 3; ++d) rank = std::max(rank, ref.refs(n, d, p));
      const auto key = std::make_tuple(rank, n->last_access, n->id);
      if (!best || key < bk) best = n, bk = key;
    }
    return best;
  };
  std::size_t registered = 0, evictions = 0, ranked_out_of_lru = 0, closes = 0, recessions = 0;
  for (int op = 0; op < 5000; ++op) {
    SCOPED_TRACE("operation " + std::to_string(op));
    const auto kind = rng.below(20);
    if (kind < 6) {  // insert a prompt with FULL pages, its window's SWA pages, a state at its end on the grid
      Key t = prompt();
      const std::size_t n = t.size();
      const std::int64_t sfrom = std::max<std::int64_t>(0, static_cast<std::int64_t>(n) - kWindow) / kPage * kPage;
      std::vector<Slot> f = run(next_slot[0], n / kPage), s = run(next_slot[1], (n - static_cast<std::size_t>(sfrom)) / kPage);
      next_slot[0] += static_cast<std::uint32_t>(n / kPage);
      next_slot[1] += static_cast<std::uint32_t>(s.size());
      const bool state = n % kChunk == 0;
      h.put(t, n, f, s, sfrom, state ? next_slot[2]++ : 0);
    } else if (kind < 9) {  // a finisher of a random session registers at its prompt's node
      Key t = prompt();
      Node* last = nullptr;  // the deepest node ending on the prompt's path (where its insert ended)
      for (std::size_t len = t.size(); len > 0 && !last; len -= kPage)
        last = h.tree.find_node(t, Tokens(static_cast<std::int64_t>(len)));
      if (!last) continue;
      const SessionId s = 1 + rng.below(6);
      const bool stale = rng.below(8) == 0;
      const auto g = h.tree.session_arrival(s);
      const std::uint64_t carried = stale ? g + 1000 : g;
      auto r = h.tree.register_session(s, carried, last);
      // reference
      const bool closed = std::find(ref.closed.begin(), ref.closed.end(), s) != ref.closed.end();
      if (!closed && !ref.generation.count(s)) {
        ref.generation[s] = ++ref.gens;
        ref.open[s];
      }
      const bool want = !closed && !stale && carried != 0;
      ASSERT_EQ(r == SessionRegistration::Registered, want) << registration_name(r);
      if (want) {
        ++registered;
        for (int c = 0; c < 3; ++c) {
          Node* fr = frontier_of(last, c);
          if (!fr) continue;
          RefSessions::Frontier nf{path_of(fr), from_of(fr, c)};
          auto& fs = ref.open[s][c];
          if (std::find(fs.begin(), fs.end(), nf) != fs.end()) continue;
          std::erase_if(fs, [&](const RefSessions::Frontier& g2) {
            return g2.key.size() <= nf.key.size() && std::equal(g2.key.begin(), g2.key.end(), nf.key.begin());
          });
          fs.push_back(nf);
        }
      }
    } else if (kind < 10) {  // open or reopen
      const SessionId s = 1 + rng.below(6);
      h.tree.open_session(s);
      ref.closed.remove(s);
      ref.generation[s] = ++ref.gens;
      ref.open[s];
    } else if (kind < 12) {  // close
      const SessionId s = 1 + rng.below(6);
      const bool was = ref.open.count(s) != 0;
      ASSERT_EQ(h.tree.close_session(s), was);
      if (was) {
        ++closes;
        ref.open.erase(s);
        ref.generation.erase(s);
        ref.closed.push_back(s);
        if (ref.closed.size() > ref.limit) ref.closed.pop_front();
      }
    } else if (kind < 15) {  // match (splits, accesses)
      Key t = prompt();
      h.tree.match_prefix(t);
    } else {  // eviction pressure: the first victim by brute force
      const int c = static_cast<int>(rng.below(3));
      const Node* want = victim(c);
      const Node* lru = least_recent(h.tree, [&](const Node& n) { return n.in_evictable[static_cast<std::size_t>(c)]; });
      ranked_out_of_lru += want && lru && want != lru ? 1 : 0;
      const Slot first = want ? (*want->at(ids[c]).value)[0] : Slot(0);
      auto e = h.tree.evict(ids[c], 1);  // one victim: what receded is observable after the operation
      ASSERT_EQ(want != nullptr, !e.freed[static_cast<std::size_t>(c)].empty());
      if (want) {
        ASSERT_EQ(e.freed[static_cast<std::size_t>(c)][0], first) << "not the least (rank, access, id) candidate";
      }
      evictions += want ? 1 : 0;
      recessions += e.nodes_deleted;
      recede();
    }
    check();
    if (::testing::Test::HasFatalFailure()) return;
  }
  std::printf("registered %zu, closes %zu, evictions %zu (%zu ranked ahead of the LRU victim), nodes deleted %zu\n",
              registered, closes, evictions, ranked_out_of_lru, recessions);
  EXPECT_EQ(h.tree.session_stats().recency_inversion_tokens, 0) << "the correct order never evicts past older closed KV";
  EXPECT_GT(registered, 200u);
  EXPECT_GT(ranked_out_of_lru, 20u);
  EXPECT_GT(recessions, 50u);
}

}  // namespace
}  // namespace kvgrid::cache::unified
