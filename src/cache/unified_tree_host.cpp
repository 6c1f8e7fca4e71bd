#include <algorithm>

#include "cache/unified_tree.hpp"
#include "core/check.hpp"

// The unified tree's host copies (the host tier's data): backup candidates, publishing a copy,
// host eviction with its cascade, and the load-back plan and its commits.
namespace kvgrid::cache::unified {

// ---- host copies ----------------------------------------------------------------------------

std::vector<Node*> UnifiedTree::path_to(Node* node) const {
  std::vector<Node*> path;
  for (Node* n = node; n != root_.get(); n = n->parent) path.push_back(n);
  std::reverse(path.begin(), path.end());
  return path;
}

std::vector<Node*> UnifiedTree::backup_candidates(Node* node) {
  auto unbacked = [](const Node* n) {
    return std::any_of(n->comp.begin(), n->comp.end(), [](const ComponentData& d) { return d.live() && !d.backed(); });
  };
  std::vector<Node*> path;
  for (Node* n = node; n != root_.get() && n->pending_write == 0 && unbacked(n); n = n->parent) path.push_back(n);
  std::reverse(path.begin(), path.end());
  return path;
}

void UnifiedTree::set_host(Node* node, ComponentId c, std::vector<Slot> host) {
  KVGRID_CHECK(node != root_.get(), "a host copy on the root");
  const Component& comp = *components_[c.value()];
  ComponentData& d = node->at(c);
  const std::size_t want = comp.paged() ? node->key.size() / static_cast<std::size_t>(page_size_.value()) : 1;
  KVGRID_CHECK(!d.backed() && host.size() == want, "component ", comp.name(), " host copy of ", host.size(),
               " slots on node ", node->id, " (", d.backed() ? "which has one" : "expects ", want, ")");
  host_held_[c.value()] += static_cast<std::int64_t>(want);
  d.host = std::move(host);
  refresh(node);
  refresh(node->parent);  // FULL's host rule looks at the children
}

void UnifiedTree::give_up_host(Node* node, ComponentId c, EvictResult& out) {
  ComponentData& d = node->at(c);
  if (!d.host) return;
  count_forced(node, c, d.host->size(), /*host=*/true);
  auto& f = out.freed[c.value()];
  f.insert(f.end(), d.host->begin(), d.host->end());
  host_held_[c.value()] -= static_cast<std::int64_t>(d.host->size());
  d.host.reset();
  refresh(node);
  refresh(node->parent);
}

EvictResult UnifiedTree::evict_host(ComponentId c, std::int64_t slots) {
  EvictResult r = empty_result();
  Component& comp = *components_[c.value()];
  while (static_cast<std::int64_t>(r.freed[c.value()].size()) < slots) {
    Node* victim = comp.host_evict_next(*this);
    if (!victim) break;
    KVGRID_CHECK(is_host_candidate(victim, c), "host eviction of ", comp.name(), " on node ", victim->id,
                 " that is not a candidate");
    const bool leaf = victim->is_leaf();
    const int priority = comp.eviction_priority(leaf);
    for (std::size_t d = 0; d < components_.size(); ++d)
      if (components_[d]->eviction_priority(leaf) <= priority) give_up_host(victim, ComponentId(static_cast<std::uint32_t>(d)), r);
    if (leaf) prune_tombstone_leaves(victim, r.nodes_deleted);
  }
  return r;
}

std::vector<LoadItem> UnifiedTree::plan_load(MatchResult& m) {
  std::vector<LoadItem> items;
  if (m.host_matched <= m.matched) return items;
  for (Node* n : split_for_load(m))
    for (std::size_t c = 0; c < components_.size(); ++c) {
      const Component& comp = *components_[c];
      const ComponentData& d = n->comp[c];
      if (d.live() || !comp.load_wanted(*n, m.host_matched)) continue;
      KVGRID_CHECK(d.backed(), comp.name(), " needs node ", n->id, " [", n->start(), ", ", n->end,
                   ") on the device to reach ", m.host_matched, " but it has no host copy there");
      items.push_back({n, comp.id(), *d.host});
    }
  return items;
}

std::optional<std::vector<LoadItem>> UnifiedTree::plan_private_load(MatchResult& m) {
  std::vector<LoadItem> items;
  if (m.host_matched <= m.matched) return items;
  for (Node* n : split_for_load(m)) {
    if (n->end <= m.matched) continue;
    for (std::size_t c = 0; c < components_.size(); ++c) {
      const Component& comp = *components_[c];
      const ComponentData& d = n->comp[c];
      if (!comp.load_wanted(*n, m.host_matched)) continue;
      if (!d.backed()) return std::nullopt;
      items.push_back({n, comp.id(), *d.host});
    }
  }
  return items;
}

std::vector<Node*> UnifiedTree::split_for_load(MatchResult& m) {
  std::vector<Node*> path = path_to(m.host_node);
  for (const auto& comp : components_) {  // cut where a component loads only part of a node
    auto at = comp->load_split(path, m.host_matched);
    if (!at) continue;
    auto it = std::find_if(path.begin(), path.end(), [&](const Node* n) { return n->start() < *at && *at < n->end; });
    KVGRID_CHECK(it != path.end() && at->value() % page_size_.value() == 0, "component ", comp->name(),
                 " asked to cut the load-back path at ", *at);
    Node* upper = split(*it, static_cast<std::size_t>((*at - (*it)->start()).value()));
    path.insert(it, upper);
  }
  m.host_path.clear();
  for (Node* n : path)
    if (n->end > m.matched) m.host_path.push_back(n);
  return path;
}

void UnifiedTree::commit_load(const LoadItem& item, std::vector<Slot> device) {
  const ComponentData& d = item.node->at(item.component);
  KVGRID_CHECK(!d.live() && device.size() == item.host.size(), components_[item.component.value()]->name(),
               " load-back of ", device.size(), " slots onto node ", item.node->id,
               d.live() ? ", which holds a value" : "");
  set_value(item.node, item.component, std::move(device));
  components_[item.component.value()]->loaded(*item.node);
}

std::vector<Slot> UnifiedTree::uncommit_load(const LoadItem& item) {
  const ComponentData& d = item.node->at(item.component);
  KVGRID_CHECK(d.live() && d.backed(), components_[item.component.value()]->name(), " load-back of node ", item.node->id,
               " taken back, but the node holds no loaded value");
  std::vector<Slot> slots = *d.value;
  for (const auto& sc : sidecars_)
    if (sc->source() == item.component) sc->drop(slots);
  set_value(item.node, item.component, std::nullopt);
  return slots;
}

void UnifiedTree::mark_writing(Node* node, std::uint64_t write) {
  KVGRID_CHECK(node != root_.get(), "a write of the root");
  node->pending_write = write;
  refresh(node);
}

}  // namespace kvgrid::cache::unified

namespace kvgrid::cache::unified {

// ---- storage prefetch landing ---------------------------------------------------------------

std::vector<std::vector<Slot>> UnifiedTree::insert_host(Node* below, std::span<const TokenId> tokens,
                                                         std::span<const InsertValue> host) {
  const std::int64_t p = page_size_.value();
  const std::size_t nc = components_.size();
  const Tokens end(static_cast<std::int64_t>(tokens.size()));
  KVGRID_CHECK(tokens.size() % static_cast<std::size_t>(p) == 0 && host.size() == nc && below->end <= end,
               "host insert of ", tokens.size(), " tokens with ", host.size(), " offers for ", nc, " components below depth ",
               below->end);
  if (below != root_.get() && KVGRID_DEBUG_CHECKS_ON())
    KVGRID_CHECK(find_node(tokens, below->end) == below, "host insert below node ", below->id, " that is not on the key's path");
  std::vector<Tokens> cuts;  // where an offer starts, strictly inside the new range
  for (std::size_t c = 0; c < nc; ++c) {
    const InsertValue& v = host[c];
    if (v.slots.empty()) continue;
    if (components_[c]->paged()) {
      KVGRID_CHECK(v.from >= below->end && v.from.value() % p == 0 &&
                       static_cast<std::int64_t>(v.slots.size()) * p == (end - v.from).value(),
                   components_[c]->name(), " host offer of ", v.slots.size(), " pages from ", v.from, " for a key ending at ", end);
      if (v.from > below->end && v.from < end) cuts.push_back(v.from);
    } else {
      KVGRID_CHECK(v.slots.size() == 1 && (v.at.value() < 0 || v.at == end), components_[c]->name(),
                   " host offer of a state not at the key's end");
    }
  }
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  std::vector<std::vector<bool>> taken(nc);
  for (std::size_t c = 0; c < nc; ++c) taken[c].assign(host[c].slots.size(), false);
  // Gives node f the copies it lacks of what is offered over its range.
  auto offer = [&](Node* f) {
    for (std::size_t c = 0; c < nc; ++c) {
      const InsertValue& v = host[c];
      if (v.slots.empty() || f->comp[c].backed()) continue;
      const ComponentId id(static_cast<std::uint32_t>(c));
      if (!components_[c]->paged()) {
        if (f->end != end) continue;
        set_host(f, id, {v.slots[0]});
        taken[c][0] = true;
        continue;
      }
      if (f->start() < v.from) continue;  // above the offer (cuts make nodes wholly in or out)
      const auto first = static_cast<std::size_t>((f->start() - v.from).value() / p);
      const std::size_t k = f->key.size() / static_cast<std::size_t>(p);
      set_host(f, id, std::vector<Slot>(v.slots.begin() + static_cast<std::ptrdiff_t>(first),
                                        v.slots.begin() + static_cast<std::ptrdiff_t>(first + k)));
      std::fill(taken[c].begin() + static_cast<std::ptrdiff_t>(first), taken[c].begin() + static_cast<std::ptrdiff_t>(first + k), true);
    }
  };
  auto cuts_in = [&](Tokens s, Tokens e) {
    std::vector<Tokens> at;
    for (Tokens d : cuts)
      if (s < d && d < e) at.push_back(d);
    return at;
  };
  ++clock_;
  Node* node = below;
  std::size_t pos = static_cast<std::size_t>(below->end.value());
  bool stopped = false;
  while (pos < tokens.size() && !stopped) {  // the existing part of the path
    Node* child = find_child(node, tokens.subspan(pos, static_cast<std::size_t>(p)));
    if (!child) break;
    const std::size_t n = common_pages_tokens(child, tokens.subspan(pos));
    if (n < child->key.size()) child = split(child, n);
    const Tokens s(static_cast<std::int64_t>(pos)), e(static_cast<std::int64_t>(pos + n));
    for (Node* f : split_at(child, cuts_in(s, e))) {
      if (f->pending_write != 0) {  // its write publishes its copies; nothing below may come first
        stopped = true;
        break;
      }
      offer(f);
      node = f;
    }
    pos += n;
  }
  if (!stopped && pos < tokens.size()) {  // the new part: host copies only
    auto leaf = new_node();
    leaf->key.assign(tokens.begin() + static_cast<std::ptrdiff_t>(pos), tokens.end());
    leaf->end = end;
    leaf->last_access = leaf->last_used = clock_;
    Node* raw = leaf.get();
    add_child(node, std::move(leaf));
    ++node_count_;
    Node* last = raw;
    for (Node* f : split_at(raw, cuts_in(Tokens(static_cast<std::int64_t>(pos)), end))) {
      f->last_access = f->last_used = clock_;
      offer(f);
      last = f;
    }
    refresh(node);
    std::size_t deleted = 0;
    if (all_tombstone(last)) prune_tombstone_leaves(last, deleted);  // nothing was offered down there
  }
  std::vector<std::vector<Slot>> out(nc);
  for (std::size_t c = 0; c < nc; ++c)
    for (std::size_t i = 0; i < taken[c].size(); ++i)
      if (!taken[c][i]) out[c].push_back(host[c].slots[i]);
  return out;
}

}  // namespace kvgrid::cache::unified
