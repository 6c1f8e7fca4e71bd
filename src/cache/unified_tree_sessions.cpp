// Sessions on the unified tree: frontiers, counted marks, generations, closed ids, the eviction
// rank (see "Sessions" in unified_tree.hpp). Nothing here frees or moves a value: references only
// order eviction.
#include <algorithm>
#include <map>
#include <set>

#include "cache/unified_tree.hpp"
#include "core/check.hpp"

namespace kvgrid::cache::unified {

const char* registration_name(SessionRegistration r) {
  switch (r) {
    case SessionRegistration::Registered: return "registered";
    case SessionRegistration::NoSession: return "no_session";
    case SessionRegistration::Stale: return "stale";
    case SessionRegistration::Closed: return "closed";
    case SessionRegistration::Root: return "root";
  }
  return "?";
}

Node* Component::session_frontier(Node* last) const {
  for (Node* n = last; n && n->parent; n = n->parent)
    if (n->at(id()).present(/*with_host=*/true)) return n;
  return nullptr;
}

void UnifiedTree::set_session_policy(const SessionPolicy& p) {
  KVGRID_CHECK(sessions_.empty() || p.order == session_policy_.order, "the session eviction order changed with ",
               sessions_.size(), " sessions open");
  session_policy_ = p;
  if (session_policy_.tombstones == 0) session_policy_.tombstones = 1;
}

std::int64_t UnifiedTree::session_rank(const Node* node, std::size_t c) const {
  if (!session_policy_.order) return 0;
  const bool leaf = node->is_leaf();
  const int pc = components_[c]->eviction_priority(leaf);
  std::int64_t rank = node->comp[c].session_ref;
  // A component without references may not take, by cascade, one of equal priority that has them.
  for (std::size_t d = 0; d < components_.size(); ++d)
    if (d != c && components_[d]->eviction_priority(leaf) == pc) rank = std::max(rank, node->comp[d].session_ref);
  return rank;
}

void UnifiedTree::adjust_marks(Node* frontier, Tokens from, SessionId s, std::size_t c, std::int32_t delta) {
  for (Node* n = frontier; n != root_.get() && n->end > from; n = n->parent) {
    ComponentData& d = n->comp[c];
    auto it = std::lower_bound(d.marks.begin(), d.marks.end(), std::make_pair(s, from), [](const SessionMark& m, const auto& k) {
      return m.session != k.first ? m.session < k.first : m.from < k.second;
    });
    if (it == d.marks.end() || it->session != s || it->from != from) {
      KVGRID_CHECK(delta > 0, "session ", s, " releases a ", components_[c]->name(), " mark it never made on node ", n->id);
      it = d.marks.insert(it, SessionMark{s, from, 0});
    }
    it->count += delta;
    KVGRID_CHECK(it->count >= 0, "session ", s, " mark on node ", n->id, " went negative");
    if (it->count == 0) d.marks.erase(it);
    d.session_ref = distinct_sessions(d.marks);
    refresh(n);
  }
}

std::uint64_t UnifiedTree::open_session(SessionId s) {
  KVGRID_CHECK(s != 0, "session id 0 is \"no session\"");
  if (auto it = closed_.find(s); it != closed_.end()) {
    closed_order_.erase(it->second);
    closed_.erase(it);
  }
  SessionState& st = sessions_[s];
  if (st.frontiers.empty()) {
    st.frontiers.resize(components_.size());
    ++session_stats_.opened;
  }
  st.generation = ++generations_;
  return st.generation;
}

std::uint64_t UnifiedTree::session_arrival(SessionId s) {
  if (s == 0) return 0;
  if (auto it = sessions_.find(s); it != sessions_.end() && it->second.generation != 0) return it->second.generation;
  if (closed_.count(s)) return 0;
  return open_session(s);
}

bool UnifiedTree::close_session(SessionId s) {
  auto it = sessions_.find(s);
  if (it == sessions_.end()) return false;
  SessionState st = std::move(it->second);
  sessions_.erase(it);
  for (std::size_t c = 0; c < st.frontiers.size(); ++c)
    for (const SessionFrontier& f : st.frontiers[c]) adjust_marks(f.node, f.from, s, c, -1);
  // Its nodes that no other session references are idle closed KV (the recency-inversion count);
  // planted bug #24 stamps every node of its regions as just used (eviction sets re-file lazily).
  if (session_policy_.close_resets_recency) ++clock_;
  for (const auto& fs : st.frontiers)
    for (const SessionFrontier& f : fs)
      for (Node* n = f.node; n != root_.get() && n->end > f.from; n = n->parent) {
        if (session_policy_.close_resets_recency) n->last_access = clock_;
        if (!n->closed_idle && std::all_of(n->comp.begin(), n->comp.end(), [](const ComponentData& d) { return d.session_ref == 0; }))
          set_closed_idle(n, true);
      }
  closed_order_.push_back(s);
  closed_[s] = std::prev(closed_order_.end());
  while (closed_order_.size() > session_policy_.tombstones) {
    closed_.erase(closed_order_.front());
    closed_order_.pop_front();
  }
  ++session_stats_.closed;
  return true;
}

void UnifiedTree::add_frontier(SessionState& st, SessionId s, std::size_t c, Node* f) {
  const Tokens from = components_[c]->session_from(*f);
  auto& fs = st.frontiers[c];
  for (const SessionFrontier& g : fs)
    if (g.node == f && g.from == from) return;  // registered there already
  adjust_marks(f, from, s, c, +1);
  // Frontiers at or above the new one are superseded: a next turn resumes from the deeper one.
  std::vector<SessionFrontier> keep;
  for (const SessionFrontier& g : fs) {
    bool above = false;
    for (const Node* n = f; n && !above; n = n->parent) above = n == g.node;
    if (above) adjust_marks(g.node, g.from, s, c, -1);
    else keep.push_back(g);
  }
  keep.push_back(SessionFrontier{f, from});
  fs = std::move(keep);
}

SessionRegistration UnifiedTree::register_session(SessionId s, std::uint64_t generation, Node* last) {
  if (s == 0) return SessionRegistration::NoSession;
  auto it = sessions_.find(s);
  if (!session_policy_.no_generation) {
    if (closed_.count(s)) {
      ++session_stats_.closed_finishes;
      return SessionRegistration::Closed;
    }
    if (it == sessions_.end() || it->second.generation != generation) {
      ++session_stats_.stale_finishes;
      return SessionRegistration::Stale;
    }
  } else if (it == sessions_.end()) {  // planted bug #25: a late finisher re-creates its session's references
    it = sessions_.emplace(s, SessionState{}).first;
    it->second.frontiers.resize(components_.size());
  }
  if (!last || last == root_.get()) return SessionRegistration::Root;
  for (std::size_t c = 0; c < components_.size(); ++c)
    if (Node* f = components_[c]->session_frontier(last)) add_frontier(it->second, s, c, f);
  ++session_stats_.registered;
  return SessionRegistration::Registered;
}

void UnifiedTree::recede_frontiers(Node* node) {
  for (std::size_t c = 0; c < components_.size(); ++c) {
    if (node->comp[c].marks.empty()) continue;
    std::set<SessionId> sids;
    for (const SessionMark& m : node->comp[c].marks) sids.insert(m.session);
    for (SessionId s : sids) {
      auto it = sessions_.find(s);
      KVGRID_CHECK(it != sessions_.end(), "node ", node->id, " carries a mark of session ", s, " that holds no state");
      auto& fs = it->second.frontiers[c];
      std::vector<SessionFrontier> gone;
      std::erase_if(fs, [&](const SessionFrontier& f) {
        if (f.node != node) return false;
        gone.push_back(f);
        return true;
      });
      KVGRID_CHECK(!gone.empty(), "deleted leaf ", node->id, " carries session ", s, "'s mark but is not its frontier");
      for (const SessionFrontier& f : gone) adjust_marks(f.node, f.from, s, c, -1);
      if (Node* up = components_[c]->session_frontier(node->parent)) add_frontier(it->second, s, c, up);
    }
    KVGRID_CHECK(node->comp[c].marks.empty(), "deleted leaf ", node->id, " keeps session marks");
  }
}

void UnifiedTree::count_forced(const Node* node, ComponentId c, std::size_t slots, bool host) {
  if (node->at(c).session_ref == 0) return;
  const Component& comp = *components_[c.value()];
  const auto n = static_cast<std::int64_t>(slots);
  const std::int64_t tokens = comp.paged() ? n * page_size_.value() : node->length().value();
  auto& st = session_stats_;
  (host ? st.forced_host_slots : st.forced_slots)[c.value()] += n;
  (host ? st.forced_host_tokens : st.forced_tokens)[c.value()] += tokens;
}

void UnifiedTree::set_closed_idle(Node* node, bool idle) {
  if (node->closed_idle == idle) return;
  node->closed_idle = idle;
  if (idle) {
    closed_idle_.insert({node->last_used, node->id});
    closed_idle_nodes_[node->id] = node;
  } else {
    closed_idle_.erase({node->last_used, node->id});
    closed_idle_nodes_.erase(node->id);
  }
}

// The victim is the least (rank, last_access) candidate; with last_access = last_used (every
// correct run) no candidate of rank 0 was used less recently, so this counts nothing. The scan
// looks at the few least recently used idle nodes only (an undercount, never a false count).
void UnifiedTree::count_inversion(const Node* victim, ComponentId c) {
  if (closed_idle_.empty() || victim->closed_idle || session_rank(victim, c.value()) != 0) return;
  int looked = 0;
  for (auto it = closed_idle_.begin(); it != closed_idle_.end() && it->first < victim->last_used && looked < 8; ++it, ++looked) {
    const Node* u = closed_idle_nodes_.at(it->second);
    if (u->in_evictable[c.value()] && session_rank(u, c.value()) == 0) {
      const Component& comp = *components_[c.value()];
      const auto n = static_cast<std::int64_t>(victim->at(c).value->size());
      session_stats_.recency_inversion_tokens += comp.paged() ? n * page_size_.value() : victim->length().value();
      return;
    }
  }
}

std::vector<std::pair<const Node*, Tokens>> UnifiedTree::session_frontiers(SessionId s, ComponentId c) const {
  std::vector<std::pair<const Node*, Tokens>> out;
  if (auto it = sessions_.find(s); it != sessions_.end())
    for (const SessionFrontier& f : it->second.frontiers[c.value()]) out.emplace_back(f.node, f.from);
  return out;
}

// Every mark recomputed from the frontiers; no closed session holds references; the candidates'
// ranks are current (the eviction sets' own check is in verify()).
void UnifiedTree::verify_sessions() const {
  std::map<std::pair<const Node*, std::size_t>, std::map<std::pair<SessionId, std::int64_t>, std::int32_t>> want;
  for (const auto& [s, st] : sessions_) {
    const bool refs = std::any_of(st.frontiers.begin(), st.frontiers.end(), [](const auto& fs) { return !fs.empty(); });
    KVGRID_CHECK(!refs || !closed_.count(s), "session ", s, " holds references after it was closed");
    KVGRID_CHECK(st.frontiers.size() == components_.size(), "session ", s, " frontier lists");
    for (std::size_t c = 0; c < st.frontiers.size(); ++c)
      for (const SessionFrontier& f : st.frontiers[c]) {
        KVGRID_CHECK(f.node && f.node != root_.get(), "session ", s, " has a frontier on the root");
        for (const Node* n = f.node; n != root_.get() && n->end > f.from; n = n->parent) ++want[{n, c}][{s, f.from.value()}];
      }
  }
  std::size_t marked = 0;
  std::vector<const Node*> stack{root_.get()};
  while (!stack.empty()) {
    const Node* n = stack.back();
    stack.pop_back();
    for (const auto& [h, ch] : n->children) stack.push_back(ch.get());
    for (std::size_t c = 0; c < n->comp.size(); ++c) {
      const ComponentData& d = n->comp[c];
      if (d.marks.empty()) {
        KVGRID_CHECK(d.session_ref == 0, "node ", n->id, " ", components_[c]->name(), " session_ref ", d.session_ref,
                     " without marks");
        continue;
      }
      ++marked;
      auto it = want.find({n, c});
      KVGRID_CHECK(it != want.end(), "node ", n->id, " ", components_[c]->name(), " carries marks of session ",
                   d.marks.front().session, " that no frontier of an open session explains");
      std::map<std::pair<SessionId, std::int64_t>, std::int32_t> have;
      std::set<SessionId> distinct;
      for (const SessionMark& m : d.marks) {
        have[{m.session, m.from.value()}] += m.count;
        distinct.insert(m.session);
      }
      KVGRID_CHECK(have == it->second, "node ", n->id, " ", components_[c]->name(), " session marks differ from its frontiers'");
      KVGRID_CHECK(d.session_ref == static_cast<std::int64_t>(distinct.size()), "node ", n->id, " session_ref ",
                   d.session_ref, " for ", distinct.size(), " sessions");
    }
  }
  KVGRID_CHECK(closed_idle_.size() == closed_idle_nodes_.size(), "closed idle set of ", closed_idle_.size(), " for ",
               closed_idle_nodes_.size(), " nodes");
  for (const auto& [lu, id] : closed_idle_) {
    auto it = closed_idle_nodes_.find(id);
    KVGRID_CHECK(it != closed_idle_nodes_.end() && it->second->closed_idle && it->second->last_used == lu,
                 "closed idle entry of node ", id, " is stale");
  }
  KVGRID_CHECK(marked == want.size(), "frontiers claim ", want.size(), " (node, component) marks but ", marked,
               " nodes carry them (a frontier off the tree?)");
}

}  // namespace kvgrid::cache::unified
