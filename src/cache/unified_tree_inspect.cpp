// The unified tree's introspection and invariants (unified_tree.hpp): finding a node, one
// component's values along a key, the content digest replicas compare, and verify(). Apart from
// the operations (unified_tree.cpp) because none of them changes the tree.
#include "cache/unified_tree.hpp"

#include <algorithm>
#include <vector>

#include "core/check.hpp"
#include "core/hash.hpp"

namespace kvgrid::cache::unified {

Node* UnifiedTree::find_node(std::span<const TokenId> tokens, Tokens end) {
  const std::size_t p = static_cast<std::size_t>(page_size_.value());
  const std::size_t want = static_cast<std::size_t>(end.value());
  if (want == 0) return root_.get();
  if (want > tokens.size() || want % p != 0) return nullptr;
  Node* node = root_.get();
  std::size_t pos = 0;
  while (pos < want) {
    auto first = tokens.subspan(pos, p);
    Node* child = find_child(node, first);
    if (!child || child->key.size() > want - pos) return nullptr;
    if (common_pages_tokens(child, tokens.subspan(pos, want - pos)) != child->key.size()) return nullptr;
    node = child;
    pos += child->key.size();
  }
  return node;
}

std::vector<std::int64_t> UnifiedTree::page_values(std::span<const TokenId> tokens, ComponentId c) const {
  const std::size_t p = static_cast<std::size_t>(page_size_.value()), n = tokens.size() / p * p;
  std::vector<std::int64_t> out(n / p, -1);
  Node* node = root_.get();
  std::size_t pos = 0;
  while (pos < n) {
    auto first = tokens.subspan(pos, p);
    Node* child = find_child(node, first);
    if (!child) break;
    const std::size_t m = common_pages_tokens(child, tokens.subspan(pos, n - pos));
    const ComponentData& d = child->at(c);
    for (std::size_t i = 0; i < m / p; ++i) out[pos / p + i] = d.live() ? static_cast<std::int64_t>((*d.value)[i].value()) : 0;
    if (m < child->key.size()) break;
    pos += m;
    node = child;
  }
  return out;
}

std::uint64_t UnifiedTree::digest() const {
  std::uint64_t sum = 0;
  std::vector<std::pair<const Node*, std::uint64_t>> stack;  // node, hash of its parent's path
  for (const auto& [h, c] : root_->children) stack.emplace_back(c.get(), 0x756e6966ULL);
  while (!stack.empty()) {
    auto [n, parent_path] = stack.back();
    stack.pop_back();
    const std::uint64_t path = hash_u32(std::span<const std::uint32_t>(n->key.data(), n->key.size()), parent_path);
    std::uint64_t h = hash_combine(path, static_cast<std::uint64_t>(n->end.value()));
    for (const ComponentData& d : n->comp) {
      h = hash_combine(h, static_cast<std::uint64_t>(d.lock_ref));
      h = hash_combine(h, d.live() ? d.value->size() + 1 : 0);
      if (d.live())
        for (Slot s : *d.value) h = hash_combine(h, s.value());
      if (d.session_ref != 0) h = hash_combine(h, 0x73657373ULL + static_cast<std::uint64_t>(d.session_ref));  // only when referenced
      if (d.backed()) {  // folded only when present: trees without host copies digest as before
        h = hash_combine(h, 0x686f7374ULL + d.host->size());
        for (Slot s : *d.host) h = hash_combine(h, s.value());
      }
    }
    sum += mix64(h);
    for (const auto& [k, c] : n->children) stack.emplace_back(c.get(), path);
  }
  return sum;
}

// ---- invariants ------------------------------------------------------------------------------

void UnifiedTree::verify(const VerifyAccounts* accounts) const {
  const std::size_t p = static_cast<std::size_t>(page_size_.value());
  const std::size_t nc = components_.size();
  KVGRID_CHECK(root_->key.empty() && root_->parent == nullptr && root_->end == Tokens(0) && root_->comp.size() == nc,
               "root state");
  for (const auto& d : root_->comp) KVGRID_CHECK(!d.live() && d.lock_ref == 0, "the root holds a value or a lock");
  std::vector<std::vector<std::uint8_t>> seen(nc), seen_host(nc);
  std::vector<std::int64_t> held(nc, 0), prot(nc, 0), host_held(nc, 0);
  std::vector<std::size_t> candidates(nc, 0), host_candidates(nc, 0);
  auto once = [](std::vector<std::uint8_t>& bits, Slot s) {
    if (s.value() >= bits.size()) bits.resize(std::max<std::size_t>(2 * bits.size(), s.value() + 1), 0);
    const bool first = !bits[s.value()];
    bits[s.value()] = 1;
    return first;
  };
  std::size_t nodes = 0;
  std::vector<const Node*> stack{root_.get()};
  while (!stack.empty()) {
    const Node* n = stack.back();
    stack.pop_back();
    std::vector<std::int64_t> child_locks(nc, 0);
    for (const auto& [h, owned] : n->children) {
      const Node* c = owned.get();
      KVGRID_CHECK(c->parent == n, "node ", c->id, " has a wrong parent pointer");
      KVGRID_CHECK(!c->key.empty() && c->key.size() % p == 0, "node ", c->id, " key of ", c->key.size(), " tokens");
      KVGRID_CHECK(c->end == n->end + c->length(), "node ", c->id, " ends at ", c->end, " but its parent ends at ",
                   n->end, " and its key has ", c->key.size(), " tokens");
      KVGRID_CHECK(c->first_page_hash == h && h == hash_u32(std::span<const TokenId>(c->key.data(), p)), "node ", c->id,
                   " is filed under a stale first-page hash");
      auto [same, end] = n->children.equal_range(h);
      for (; same != end; ++same)
        KVGRID_CHECK(same->second.get() == c || !std::equal(c->key.begin(), c->key.begin() + static_cast<std::ptrdiff_t>(p),
                                                            same->second->key.begin()),
                     "children of node ", n->id, " share a first page");
      KVGRID_CHECK(c->comp.size() == nc && c->in_evictable.size() == nc, "node ", c->id, " component data size");
      if (c->is_leaf()) KVGRID_CHECK(!all_tombstone(c), "leaf node ", c->id, " holds only tombstones (and no host copy)");
      for (std::size_t k = 0; k < nc; ++k) {
        const ComponentData& d = c->comp[k];
        const Component& comp = *components_[k];
        KVGRID_CHECK(d.lock_ref >= 0, "node ", c->id, " ", comp.name(), " lock_ref ", d.lock_ref);
        child_locks[k] += d.lock_ref;
        if (d.value) {
          const std::size_t want = comp.paged() ? c->key.size() / p : 1;
          KVGRID_CHECK(d.value->size() == want, "node ", c->id, " ", comp.name(), " value of ", d.value->size(),
                       " slots, expected ", want);
          for (Slot s : *d.value) {
            KVGRID_CHECK(s.value() != 0, "node ", c->id, " ", comp.name(), " holds slot 0 (padding)");
            KVGRID_CHECK(once(seen[k], s), comp.name(), " slot ", s, " appears twice in the tree");
            for (const auto& sc : sidecars_)
              if (sc->source().value() == k)
                KVGRID_CHECK(sc->has(s), "sidecar ", sc->name(), " has no entry for ", comp.name(), " slot ", s,
                             " of node ", c->id);
          }
          held[k] += static_cast<std::int64_t>(want);
          if (d.lock_ref > 0) prot[k] += static_cast<std::int64_t>(want);
        }
        if (d.host) {
          const std::size_t want = comp.paged() ? c->key.size() / p : 1;
          KVGRID_CHECK(d.host->size() == want, "node ", c->id, " ", comp.name(), " host copy of ", d.host->size(),
                       " slots, expected ", want);
          for (Slot s : *d.host)
            KVGRID_CHECK(s.value() != 0 && once(seen_host[k], s), comp.name(), " host slot ", s,
                         " is padding or appears twice in the tree");
          host_held[k] += static_cast<std::int64_t>(want);
        }
        const ComponentId id(static_cast<std::uint32_t>(k));
        KVGRID_CHECK(c->in_evictable[k] == is_candidate(c, id), "node ", c->id, " ", comp.name(),
                     " eviction-candidate flag is stale");
        if (c->in_evictable[k]) {
          ++candidates[k];
          KVGRID_CHECK(c->filed_at[k] <= c->last_access && c->filed_rank[k] == session_rank(c, k) &&
                           evictable_[k].count(EvictKey{c->filed_rank[k], c->filed_at[k], c->id, nullptr}) == 1,
                       "candidate node ", c->id, " missing from the ", comp.name(), " eviction set (or filed under a stale rank)");
        }
        KVGRID_CHECK(c->in_host_evictable[k] == is_host_candidate(c, id), "node ", c->id, " ", comp.name(),
                     " host-eviction-candidate flag is stale");
        if (c->in_host_evictable[k]) {
          ++host_candidates[k];
          KVGRID_CHECK(c->host_filed_at[k] <= c->last_access && c->host_filed_rank[k] == session_rank(c, k) &&
                           host_evictable_[k].count(EvictKey{c->host_filed_rank[k], c->host_filed_at[k], c->id, nullptr}) == 1,
                       "host candidate node ", c->id, " missing from the ", comp.name(), " host eviction set");
        }
        comp.verify_node(*this, *c);
      }
      ++nodes;
      stack.push_back(c);
    }
    if (n != root_.get())
      for (std::size_t k = 0; k < nc; ++k)
        if (components_[k]->path_locks())
          KVGRID_CHECK(n->comp[k].lock_ref >= child_locks[k], "node ", n->id, " ", components_[k]->name(), " lock_ref ",
                       n->comp[k].lock_ref, " < its children's ", child_locks[k]);
  }
  KVGRID_CHECK(nodes == node_count_, "node count ", node_count_, " but ", nodes, " reachable");
  verify_sessions();
  for (std::size_t k = 0; k < nc; ++k) {
    const auto name = components_[k]->name();
    KVGRID_CHECK(held[k] == held_[k] && prot[k] == protected_[k], name, " counters: held ", held_[k], "/", held[k],
                 " protected ", protected_[k], "/", prot[k]);
    KVGRID_CHECK(candidates[k] == evictable_[k].size(), name, " eviction set holds ", evictable_[k].size(), " but ",
                 candidates[k], " candidates exist");
    KVGRID_CHECK(host_held[k] == host_held_[k] && host_candidates[k] == host_evictable_[k].size(), name,
                 " host counters: held ", host_held_[k], "/", host_held[k], ", host eviction set ",
                 host_evictable_[k].size(), "/", host_candidates[k]);
  }
  if (accounts && !accounts->host.empty()) {
    KVGRID_CHECK(accounts->host.size() == nc, "host pool counts for ", accounts->host.size(), " of ", nc, " components");
    for (std::size_t k = 0; k < nc; ++k) {
      const PoolCounts& pc = accounts->host[k];
      KVGRID_CHECK(pc.free + host_held_[k] + pc.held_by_requests == pc.capacity, components_[k]->name(),
                   " host pool: free ", pc.free, " + tree ", host_held_[k], " + in flight ", pc.held_by_requests,
                   " != capacity ", pc.capacity);
    }
  }
  if (accounts && !accounts->components.empty()) {
    KVGRID_CHECK(accounts->components.size() == nc, "pool counts for ", accounts->components.size(), " of ", nc,
                 " components");
    for (std::size_t k = 0; k < nc; ++k) {
      const PoolCounts& pc = accounts->components[k];
      KVGRID_CHECK(pc.free + held_[k] + pc.held_by_requests == pc.capacity, components_[k]->name(), " pool: free ",
                   pc.free, " + tree ", held_[k], " + requests ", pc.held_by_requests, " != capacity ", pc.capacity);
    }
  }
  for (std::size_t s = 0; s < sidecars_.size(); ++s) {
    const Sidecar& sc = *sidecars_[s];
    const std::int64_t tree = held_[sc.source().value()];
    if (accounts && !accounts->sidecar_requests.empty()) {
      KVGRID_CHECK(accounts->sidecar_requests.size() == sidecars_.size(), "sidecar counts for ",
                   accounts->sidecar_requests.size(), " of ", sidecars_.size(), " sidecars");
      KVGRID_CHECK(static_cast<std::int64_t>(sc.entries()) == tree + accounts->sidecar_requests[s], "sidecar ", sc.name(),
                   " has ", sc.entries(), " entries; tree ", tree, " + requests ", accounts->sidecar_requests[s]);
    } else {
      KVGRID_CHECK(static_cast<std::int64_t>(sc.entries()) >= tree, "sidecar ", sc.name(), " has ", sc.entries(),
                   " entries for ", tree, " tree slots");
    }
  }
}

}  // namespace kvgrid::cache::unified
