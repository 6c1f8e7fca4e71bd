// Unified tree core: device eviction — giving a component's value up (sidecars and forced
// evictions of referenced KV counted), the cascade by priority, deleting emptied leaves up the
// chain (their session frontiers recede first). See unified_tree.hpp.
#include "cache/unified_tree.hpp"
#include "core/check.hpp"

namespace kvgrid::cache::unified {

void UnifiedTree::give_up(Node* node, ComponentId c, EvictResult& out) {
  ComponentData& d = node->at(c);
  if (!d.value) return;
  const std::vector<Slot> slots = *d.value;
  count_forced(node, c, slots.size(), /*host=*/false);
  auto& f = out.freed[c.value()];
  f.insert(f.end(), slots.begin(), slots.end());
  for (std::size_t s = 0; s < sidecars_.size(); ++s)
    if (sidecars_[s]->source() == c) {
      sidecars_[s]->drop(slots);
      out.sidecar_freed[s].insert(out.sidecar_freed[s].end(), slots.begin(), slots.end());
    }
  set_value(node, c, std::nullopt);
  d.meta = 0;
}

void UnifiedTree::delete_leaf(Node* node) {
  KVGRID_CHECK(node != root_.get() && node->is_leaf() && all_tombstone(node) && unlocked(node), "delete of node ",
               node->id, " that is not an unlocked, empty leaf");
  for (std::size_t c = 0; c < components_.size(); ++c) {
    if (node->in_evictable[c]) evictable_[c].erase(EvictKey{node->filed_rank[c], node->filed_at[c], node->id, node});
    if (node->in_host_evictable[c])
      host_evictable_[c].erase(EvictKey{node->host_filed_rank[c], node->host_filed_at[c], node->id, node});
  }
  recede_frontiers(node);
  if (node->closed_idle) set_closed_idle(node, false);
  Node* parent = node->parent;
  parent->children.erase(entry_of(node));
  --node_count_;
  refresh(parent);
}

Node* UnifiedTree::prune_tombstone_leaves(Node* node, std::size_t& deleted) {
  while (node != root_.get() && node->is_leaf() && all_tombstone(node) && unlocked(node)) {
    Node* parent = node->parent;
    delete_leaf(node);
    ++deleted;
    node = parent;
  }
  return node;
}

void UnifiedTree::evict_into(Node* node, ComponentId c, EvictResult& out) {
  KVGRID_CHECK(node != root_.get() && node->at(c).live(), "eviction of ", components_[c.value()]->name(),
               " on node ", node->id, " that holds no value of it");
  const Component& comp = *components_[c.value()];
  const bool leaf = node->is_leaf();
  const int priority = comp.eviction_priority(leaf);
  KVGRID_CHECK(comp.eviction_candidate(*node), "eviction of ", comp.name(), " on node ", node->id,
               " that its component does not allow");
  KVGRID_CHECK(cascade_unlocked(node, priority), "eviction of ", comp.name(), " on node ", node->id,
               " would evict a locked value");
  for (std::size_t d = 0; d < components_.size(); ++d)
    if (components_[d]->eviction_priority(leaf) <= priority) give_up(node, ComponentId(static_cast<std::uint32_t>(d)), out);
  if (leaf) prune_tombstone_leaves(node, out.nodes_deleted);
}

EvictResult UnifiedTree::evict(ComponentId c, std::int64_t slots, const std::function<void(Node*)>& before_drop) {
  EvictResult r = empty_result();
  Component& comp = *components_[c.value()];
  comp.evict_start(*this);
  while (static_cast<std::int64_t>(r.freed[c.value()].size()) < slots) {
    Node* victim = comp.evict_next(*this);
    if (!victim) break;
    count_inversion(victim, c);
    if (before_drop) {
      before_drop(victim);
      // A write-back across pipeline stages starts a backup that locks the victim until it is
      // published (hybrid_host_tier.hpp): it stays on the device for now.
      if (victim->pending_write != 0) {
        KVGRID_CHECK(comp.evict_next(*this) != victim, "write-back left node ", victim->id, " a candidate");
        continue;
      }
    }
    evict_into(victim, c, r);
  }
  comp.evict_end(*this);
  return r;
}

EvictResult UnifiedTree::evict_component(Node* node, ComponentId c) {
  EvictResult r = empty_result();
  evict_into(node, c, r);
  return r;
}

}  // namespace kvgrid::cache::unified
