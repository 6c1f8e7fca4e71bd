// Unified radix tree core: one token-keyed topology that several cache components share.
//
// What it is: the same paged trie as `RadixTree` (keys are whole pages of `page_size` tokens,
// children filed under the hash of their first page), but a node carries one `ComponentData` per
// registered component instead of a device page list. A component is a kind of cached state with
// its own reuse rule and its own index space: FULL attention pages (reusable along the whole
// path), SWA pages (reusable only if the tail window before a boundary is live), MAMBA states
// (point values, reusable only exactly where they were taken). The core walks, splits, inserts,
// locks and evicts; every decision that depends on what a component *is* goes through a hook of
// `Component` (unified_node.hpp: the node and that interface; unified_components.hpp has FULL,
// SWA and MAMBA). The core names no component.
//
// Contract:
//  * The core holds indices only. It never allocates: callers pass the slots they computed, and
//    get back the slots the tree did not take (insert duplicates) or gave up (eviction); they
//    return them to their pools. Every component's slots are its own index space.
//  * A component value on a node is `std::optional<std::vector<Slot>>`: absent = a tombstone (the
//    node stays, the component has nothing there). Paged components hold one slot per page of the
//    node's key; point components hold at most one slot, the state at the node's end depth.
//  * match: every node the walk reaches is a candidate boundary (its end depth). Each component's
//    stateful validator votes on every candidate; the boundary is the deepest candidate every
//    component accepts. A rejection never stops the walk. Finalizers then report, per component,
//    what the request may reuse (MAMBA: which state to copy; the caller copies).
//  * Sidecars follow a source component's slot ids exactly (no index space, no node data, no
//    vote): their entries are dropped when the tree gives the source's slots up.
//  * LRU is a logical access counter (one per tree, bumped by every accounted match and insert),
//    ties broken by node id — never wall time — so replicas taking the same calls agree.
//  * Eviction of component c on node v evicts every component whose priority on v is <= c's
//    (cascade). On a leaf every priority is 0: any eviction deletes the whole node; on an internal
//    node FULL 2 > SWA 1 > MAMBA 0 (the components choose; the core only compares).
//
// Invariants (checked by `verify()`):
//  * every non-root key is a non-empty page multiple; a node's `end` is its parent's end plus its
//    key; children of a node have distinct first pages, filed under that page's hash;
//  * no leaf is all-tombstone (one is deleted at once, and then its all-tombstone ancestors);
//  * each value has its component's shape (`Component::verify_node`: FULL values form a prefix
//    from the root, MAMBA states sit at their node's end depth on the checkpoint grid);
//  * every slot appears at most once per index space; held/protected counters match the nodes;
//  * lock counts are >= 0; a component with path locks (FULL) has lock_ref >= its children's sum;
//  * a node is in component c's eviction set iff c has a value there, c's candidate rule holds and
//    every component the eviction would cascade to is unlocked on the node;
//  * given pool counts (`PoolCounts`): free + held by the tree + held by requests = capacity per
//    component, and each sidecar has entries exactly for its source's tree slots plus requests'.
//
// Host values (the host tier, L2): a component's data on a node may also have a host copy
// (`ComponentData::host`, slots of the component's host index space). A value and its host copy
// are independent: device eviction keeps the host copy (the node stays, host-only for that
// component), host eviction keeps the device value. Rules (checked by `verify()` where the core
// can see them; the components state theirs in `verify_node`):
//  * a match runs two sets of validators over the same walk: device-only (`matched`, what can be
//    read now) and with host copies (`host_matched` >= matched, what a load-back can make
//    readable); `plan_load` lists, top-down, the (node, component) copies that load-back needs
//    — each component says which nodes it wants on the device (FULL every one, SWA only its
//    rounded window before the boundary — a host-only node straddling the window start is split
//    first, so that no more than the window is loaded —, MAMBA the boundary's state) —, and the
//    caller commits each landed copy (`commit_load`);
//  * backups: `backup_candidates` gives, top-down, the nodes of a path holding a device value
//    without its host copy and no write in flight (`Node::pending_write`, copied by splits);
//    `set_host` publishes a copy; FULL host copies form a prefix from the root;
//  * host eviction (`evict_host`): a node whose component c has a host copy and no device value,
//    allowed by c's `host_eviction_candidate`, nothing cascaded locked (locks protect host copies
//    too) and no write in flight; the same priorities cascade over host copies; a node with
//    neither values nor host copies is empty, and an empty leaf is deleted up the chain.
// Used by the serving loop for hybrid models (cache/hybrid_cache.hpp); full-attention-only
// models still use RadixTree, which the differential test holds this core's FULL to.
// Storage (L3) keeps no per-node state: objects are named by the page hash chain, and a prefetch
// lands as host copies (`insert_host`).
//
// Sessions (session-aware eviction; unified_tree_sessions.cpp): a request of a session that
// finishes registers, per component, the region a next turn of that session can reuse — a
// *frontier* node (`Component::session_frontier`: the nearest node at or above the request's end
// holding the component's data) and the depth its region starts at (`Component::session_from`:
// FULL the whole path, SWA the tail window, MAMBA the frontier's state alone). Every node of the
// frontier's path ending deeper than that depth carries a counted `SessionMark`; a component's
// `session_ref` on a node is the number of distinct sessions marking it. A deeper frontier of a
// session replaces the frontiers above it; a deleted frontier recedes to its nearest ancestor
// holding data; closing a session removes its marks and nothing else (recency kept). With
// `SessionPolicy::order` the eviction sets (device and host) order candidates by rank — the
// references of the component and of every component of equal priority its eviction would
// cascade to — before LRU: unreferenced first, then fewer references. References are soft: a
// referenced node is still evicted when nothing else is left (counted as a forced eviction).
// Generations: opening a session gives it a new generation; a finisher whose generation is not
// its session's current one, or whose session closed (a bounded set of closed ids), registers
// nothing. `verify()` recomputes every mark from the frontiers and checks that no closed session
// holds references.
// Not thread-safe: one tree per rank, used from the scheduler thread.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <unordered_map>
#include <vector>

#include "cache/unified_node.hpp"
#include "cache/unified_sessions.hpp"
#include "core/ids.hpp"

namespace kvgrid::cache::unified {

// ---- the tree -------------------------------------------------------------------------------

class UnifiedTree {
 public:
  explicit UnifiedTree(Tokens page_size);
  ~UnifiedTree();
  UnifiedTree(const UnifiedTree&) = delete;
  UnifiedTree& operator=(const UnifiedTree&) = delete;

  // Registers a component (before the first insert); components vote in registration order.
  ComponentId add_component(std::unique_ptr<Component> c);
  // Registers a sidecar of an already registered component; returns its index.
  std::size_t add_sidecar(std::unique_ptr<Sidecar> s);

  // Deepest boundary every component accepts, reusing at most tokens.size() - 1 tokens (the last
  // prompt token must be computed), rounded down to pages. Splits the node the walk ends inside;
  // bumps the access counter of the accepted path.
  MatchResult match_prefix(std::span<const TokenId> tokens);
  // The same over `tokens` itself (no prompt - 1 rule): chunked-prefill re-match.
  MatchResult match_computed(std::span<const TokenId> tokens);
  // match_prefix without an access (no LRU touch).
  MatchResult peek_prefix(std::span<const TokenId> tokens);

  // Inserts a page-aligned key with one InsertValue per component (by ComponentId). Bumps the
  // access counter of the key's path.
  InsertResult insert(std::span<const TokenId> tokens, std::span<const InsertValue> values);
  // The same from `start` down: a node on the key's path (the one a request holds locked, whose
  // path was its match), not walked, compared or touched again; nothing may be offered above it
  // (paged values from >= its end, states deeper than it). What the path to it holds is counted
  // into `present`.
  InsertResult insert_below(Node* start, std::span<const TokenId> tokens, std::span<const InsertValue> values);

  LockHandle lock(Node* node);
  // The lock a device→host write needs: the node's own values only (path-locking components
  // still lock the path — their invariant —, the others just this node and its split fragments).
  LockHandle lock_node(Node* node);
  void unlock(LockHandle& h);  // releases the parts still held
  // Releases one component's part early (SWA's release_window).
  void release_component_lock(LockHandle& h, ComponentId c);

  // Evicts component c's LRU victims (with their cascades) until at least `slots` of c's slots are
  // freed or none is left. `before_drop` (write_back) sees each victim before its values go: what
  // it gives host copies (set_host) survives on the host, the node staying host-only; one it
  // starts a write for (pending_write: across pipeline stages) is skipped, locked until published.
  EvictResult evict(ComponentId c, std::int64_t slots, const std::function<void(Node*)>& before_drop = {});
  // Evicts component c on `node` (which must hold an unlocked value of c) and its cascade; a
  // leaf is deleted, then its all-tombstone ancestors.
  EvictResult evict_component(Node* node, ComponentId c);

  // ---- host copies (the host tier) ----
  // Top-down, the nodes of the path ending at `node` that hold a device value without its host
  // copy and have no write in flight (the walk up stops at the first that does not).
  std::vector<Node*> backup_candidates(Node* node);
  // Publishes component c's host copy on `node` (which has none). FULL: its parent has one, or
  // is the root (host copies form a prefix).
  void set_host(Node* node, ComponentId c, std::vector<Slot> host);
  // A device→host write of `node` is in flight (`write` != 0) or over (0): no host eviction there.
  void mark_writing(Node* node, std::uint64_t write);
  // Evicts component c's host copies (LRU, with their cascades) until at least `slots` of c's host
  // slots are freed or none is left; `freed` holds host slots.
  EvictResult evict_host(ComponentId c, std::int64_t slots);
  // The copies that make a device-only match reach m.host_matched, top-down (a node's components
  // in registration order); splits where a component asks (load_split) first and refreshes
  // m.host_node and m.host_path. Empty when host_matched == matched.
  std::vector<LoadItem> plan_load(MatchResult& m);
  // A private load-back's plan (into the request's own slots): every copy a component wants past
  // the device boundary, from the host even where the device holds it; nullopt: one has no host copy.
  std::optional<std::vector<LoadItem>> plan_private_load(MatchResult& m);
  // A load-back's copy landed: `device` (one slot per host slot) becomes the item's value.
  void commit_load(const LoadItem& item, std::vector<Slot> device);
  // Its outcome was agreed broken: the value goes (the host copy stays), its slots back to free.
  std::vector<Slot> uncommit_load(const LoadItem& item);
  // A storage prefetch landed: host copies for tokens[below->end, size) under `below` (on the
  // key's path, locked by the caller, or the root); one offer per component — paged: slots for
  // [from, key end), from >= below->end; point: at most the state at the key's end. Nodes on the
  // way take the copies they lack, new nodes hold host copies only, cut where a paged offer starts
  // and at the key's end; the walk stops at a node with a write in flight (nothing below takes
  // any). FULL's host copies stay a prefix. Returns per component the slots not taken (to free).
  std::vector<std::vector<Slot>> insert_host(Node* below, std::span<const TokenId> tokens, std::span<const InsertValue> host);

  // ---- used by components ----
  // Sets component c's value on a node, keeping the counters and eviction sets; a value that is
  // replaced must have been given away already (returns nothing).
  void set_value(Node* node, ComponentId c, std::optional<std::vector<Slot>> v);
  void add_lock(Node* node, ComponentId c, std::int64_t delta);
  Node* lru_candidate(ComponentId c) const;  // LRU victim of component c, or null

  // ---- introspection ----
  Tokens page_size() const { return page_size_; }
  std::size_t components() const { return components_.size(); }
  const Component& component(ComponentId c) const { return *components_[c.value()]; }
  std::size_t sidecars() const { return sidecars_.size(); }
  Sidecar& sidecar(std::size_t i) { return *sidecars_[i]; }
  // Drops the sidecar entries of source c's slots `s` (a request freed them).
  void drop_sidecars(ComponentId c, std::span<const Slot> s);
  std::int64_t held_slots(ComponentId c) const { return held_[c.value()]; }
  std::int64_t host_slots(ComponentId c) const { return host_held_[c.value()]; }
  std::size_t host_eviction_candidates(ComponentId c) const { return host_evictable_[c.value()].size(); }
  Node* host_lru_candidate(ComponentId c) const;  // host LRU victim of component c, or null
  std::int64_t protected_slots(ComponentId c) const { return protected_[c.value()]; }
  std::int64_t evictable_slots(ComponentId c) const { return held_[c.value()] - protected_[c.value()]; }
  std::size_t eviction_candidates(ComponentId c) const { return evictable_[c.value()].size(); }
  std::size_t node_count() const { return node_count_; }  // excluding the root
  std::uint64_t splits() const { return splits_; }
  const Node* root() const { return root_.get(); }
  Node* root() { return root_.get(); }
  // The node whose key ends exactly at depth `end` along `tokens`, or null.
  Node* find_node(std::span<const TokenId> tokens, Tokens end);
  // Component c along tokens[0, n) (n a page multiple), page by page, without touching the tree:
  // the slot of a live page, 0 for a tombstone, -1 where no node holds the page.
  std::vector<std::int64_t> page_values(std::span<const TokenId> tokens, ComponentId c) const;
  // Digest of the content: every node's path, depth and, per component, value and lock count
  // (independent of node ids and child order; replicas that took the same calls agree).
  std::uint64_t digest() const;

  void verify(const VerifyAccounts* accounts = nullptr) const;

  // ---- sessions (unified_tree_sessions.cpp) ----
  void set_session_policy(const SessionPolicy& p);
  const SessionPolicy& session_policy() const { return session_policy_; }
  // Opens `s` (or reopens it: a new generation; a closed id is open again); returns its generation.
  std::uint64_t open_session(SessionId s);
  // The generation a request of `s` arriving now carries: an open session's; an id never seen is
  // opened; a closed one gives 0 (its finish registers nothing).
  std::uint64_t session_arrival(SessionId s);
  // Closes `s`: its references go, its nodes keep their recency. False: it was not open.
  bool close_session(SessionId s);
  // A request of session `s` with `generation` finished at `last` (the node ending its inserted
  // key): each component registers its frontier there.
  SessionRegistration register_session(SessionId s, std::uint64_t generation, Node* last);
  bool session_open(SessionId s) const { return sessions_.count(s) != 0; }
  bool session_closed(SessionId s) const { return closed_.count(s) != 0; }
  std::size_t open_sessions() const { return sessions_.size(); }
  std::size_t closed_sessions_remembered() const { return closed_.size(); }
  const SessionStats& session_stats() const { return session_stats_; }
  // The frontiers of `s` for component c (nodes and the depths their regions start at).
  std::vector<std::pair<const Node*, Tokens>> session_frontiers(SessionId s, ComponentId c) const;

 private:
  // Eviction sets order by (rank, last_access, id); rank is 0 unless SessionPolicy::order.
  struct EvictKey {
    std::int64_t rank;
    std::uint64_t last_access, id;
    Node* node;
    bool operator<(const EvictKey& o) const {
      if (rank != o.rank) return rank < o.rank;
      return last_access != o.last_access ? last_access < o.last_access : id < o.id;
    }
  };
  struct SessionFrontier {
    Node* node;
    Tokens from;
  };
  struct SessionState {
    std::uint64_t generation = 0;
    std::vector<std::vector<SessionFrontier>> frontiers;  // by ComponentId
  };
  // The rank component c's candidate on `node` is filed under: the most references among c and
  // the components of equal priority its eviction would cascade to (0 without SessionPolicy::order).
  std::int64_t session_rank(const Node* node, std::size_t c) const;
  // Adds `delta` to session s's mark (from) on the frontier's path for component c.
  void adjust_marks(Node* frontier, Tokens from, SessionId s, std::size_t c, std::int32_t delta);
  void add_frontier(SessionState& st, SessionId s, std::size_t c, Node* f);
  // `node` (a leaf being deleted) is a frontier: its sessions recede to the nearest ancestor with data.
  void recede_frontiers(Node* node);
  void count_forced(const Node* node, ComponentId c, std::size_t slots, bool host);
  // Before a device eviction of component c on `victim`: counts a recency inversion.
  void count_inversion(const Node* victim, ComponentId c);
  void set_closed_idle(Node* node, bool idle);
  void verify_sessions() const;

  MatchResult match_up_to(std::span<const TokenId> tokens, std::size_t max_tokens, bool account);
  std::unique_ptr<Node> new_node();
  Node* find_child(Node* node, std::span<const TokenId> first_page) const;
  std::unordered_multimap<std::uint64_t, std::unique_ptr<Node>>::iterator entry_of(Node* child);
  void add_child(Node* parent, std::unique_ptr<Node> child);
  std::size_t common_pages_tokens(const Node* node, std::span<const TokenId> tokens) const;
  std::uint64_t page_hash(std::span<const TokenId> page) const;
  // Splits `child` so that a new parent holds its first `split_tokens` tokens; returns the parent.
  Node* split(Node* child, std::size_t split_tokens);
  // plan_load's cuts; refreshes m's host path and returns the whole path to m.host_node.
  std::vector<Node*> split_for_load(MatchResult& m);
  // Splits `node` at every depth in `at` (sorted, strictly inside); returns its fragments in order.
  std::vector<Node*> split_at(Node* node, std::vector<Tokens> at);
  std::vector<Tokens> insert_splits(const InsertContext& ctx, const Node* node, Tokens start, Tokens end) const;
  void touch(Node* node);
  bool is_candidate(const Node* node, ComponentId c) const;
  bool is_host_candidate(const Node* node, ComponentId c) const;
  void file(std::vector<std::set<EvictKey>>& sets, std::vector<bool>& in, std::vector<std::uint64_t>& at,
            std::vector<std::int64_t>& rank_at, Node* node, std::size_t c, bool want, std::int64_t rank);
  Node* front(std::vector<std::set<EvictKey>>& sets, std::size_t c, bool host) const;
  std::vector<Node*> path_to(Node* node) const;  // root excluded, top-down
  bool cascade_unlocked(const Node* node, int priority) const;
  void refresh(Node* node);
  bool all_tombstone(const Node* node) const;  // no value and no host copy: empty
  bool unlocked(const Node* node) const;
  void delete_leaf(Node* node);
  // Deletes `node` and then its ancestors while each is an unlocked all-tombstone leaf; returns
  // the nearest node kept (the root at worst) and counts deletions into `deleted`.
  Node* prune_tombstone_leaves(Node* node, std::size_t& deleted);
  void give_up(Node* node, ComponentId c, EvictResult& out);
  void give_up_host(Node* node, ComponentId c, EvictResult& out);
  void evict_into(Node* node, ComponentId c, EvictResult& out);
  EvictResult empty_result() const;

  Tokens page_size_;
  std::unique_ptr<Node> root_;
  std::vector<std::unique_ptr<Component>> components_;
  std::vector<std::unique_ptr<Sidecar>> sidecars_;
  mutable std::vector<std::set<EvictKey>> evictable_;  // by ComponentId (lru_candidate re-files stale entries)
  mutable std::vector<std::set<EvictKey>> host_evictable_;  // by ComponentId: host copies that may go
  std::vector<std::int64_t> held_, protected_;  // slots, by ComponentId
  std::vector<std::int64_t> host_held_;         // host slots, by ComponentId
  std::uint64_t clock_ = 0, next_id_ = 1, splits_ = 0;
  std::size_t node_count_ = 0;
  SessionPolicy session_policy_;
  std::map<SessionId, SessionState> sessions_;  // open sessions
  std::list<SessionId> closed_order_;           // closed ids, oldest first (bounded)
  std::unordered_map<SessionId, std::list<SessionId>::iterator> closed_;
  std::uint64_t generations_ = 0;
  SessionStats session_stats_;
  std::set<std::pair<std::uint64_t, std::uint64_t>> closed_idle_;  // (last_used, id) of closed sessions' idle nodes
  std::unordered_map<std::uint64_t, Node*> closed_idle_nodes_;       // by id
  bool frozen_ = false;  // components registered and the first insert done
};

}  // namespace kvgrid::cache::unified
