// The unified radix tree's node and the interface its components and sidecars implement: the
// per-component state a node carries (`ComponentData`: a device value or tombstone, a host copy,
// locks, session marks), the values match / insert / lock / eviction calls pass in and out, and
// the hooks through which the core (cache/unified_tree.hpp, whose banner states the contract and
// invariants) asks a component every question that depends on what it is
// (cache/unified_components.hpp has FULL, SWA and MAMBA).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "cache/unified_sessions.hpp"
#include "core/ids.hpp"

namespace kvgrid::cache::unified {

struct SlotTag {};
struct ComponentIdTag {};
// An index into one component's pool (FULL: a device page id; SWA: an SWA page; MAMBA: a state
// slot). Slot 0 is never a value (pools keep it as padding, like DevicePool's page 0).
using Slot = StrongId<SlotTag, std::uint32_t>;
// A component's position in its tree (registration order).
using ComponentId = StrongId<ComponentIdTag, std::uint32_t>;

class Component;
class Sidecar;
class UnifiedTree;

// One component's state on one node.
struct ComponentData {
  std::optional<std::vector<Slot>> value;  // absent: tombstone
  std::int64_t lock_ref = 0;
  std::uint64_t meta = 0;  // owned by the component (MAMBA: the depth its state was taken at)
  std::optional<std::vector<Slot>> host;   // the host copy (host index space); absent: none
  std::vector<SessionMark> marks;          // sessions whose reusable region covers this node
  std::int64_t session_ref = 0;            // distinct sessions in `marks`
  bool live() const { return value.has_value(); }
  bool backed() const { return host.has_value(); }
  // Readable now, or after a load-back (`with_host`).
  bool present(bool with_host) const { return live() || (with_host && backed()); }
};

struct Node {
  std::uint64_t id = 0;
  Node* parent = nullptr;
  std::vector<TokenId> key;
  Tokens end{0};  // depth (tokens from the root) where this node's key ends
  std::unordered_multimap<std::uint64_t, std::unique_ptr<Node>> children;  // by first-page hash
  std::uint64_t first_page_hash = 0;
  std::uint64_t last_access = 0;
  // The access stamp of its last real use (last_access is what eviction orders by; they differ only
  // under the planted bug session_close_resets_recency), and whether it sits in the tree's set of
  // idle nodes a closed session left (for the recency-inversion count).
  std::uint64_t last_used = 0;
  bool closed_idle = false;
  std::vector<ComponentData> comp;  // indexed by ComponentId
  std::vector<bool> in_evictable;   // per component: filed in its eviction set
  std::vector<std::uint64_t> filed_at;  // per component: the last_access it is filed under (<= last_access)
  std::vector<std::int64_t> filed_rank;  // per component: the session rank it is filed under
  std::vector<bool> in_host_evictable;       // per component: filed in its host eviction set
  std::vector<std::uint64_t> host_filed_at;  // per component: the last_access it is filed under there
  std::vector<std::int64_t> host_filed_rank;  // per component: the session rank it is filed under there
  std::uint64_t pending_write = 0;  // id of an unpublished device→host backup (0: none; a split copies it)
  bool write_back_failed = false;   // write_back across stages: its backup failed; the next eviction drops it
  std::uint64_t hit_count = 0;      // accounted matches whose device boundary reached this node (write_through_selective)

  Tokens start() const { return end - Tokens(static_cast<std::int64_t>(key.size())); }
  Tokens length() const { return Tokens(static_cast<std::int64_t>(key.size())); }
  bool is_leaf() const { return children.empty(); }
  const ComponentData& at(ComponentId c) const { return comp[c.value()]; }
  ComponentData& at(ComponentId c) { return comp[c.value()]; }
};

// ---- match ----------------------------------------------------------------------------------

// A stateful predicate for one match: asked about every node the walk reaches, in order.
class MatchValidator {
 public:
  virtual ~MatchValidator() = default;
  virtual bool accept(const Node& node) = 0;
};

// What one component may reuse of a match. Paged: `slots` cover tokens [from, boundary), one per
// page. Point (MAMBA): `slots` is the state to copy into a private request slot (empty: none).
struct ComponentMatch {
  std::vector<Slot> slots;
  Tokens from{0};
};

// One candidate of the walk and every component's vote on it (kept for tests and diagnostics).
struct Candidate {
  const Node* node;
  std::uint64_t yes = 0;     // bit c: component c accepted (at most 64 components)
  std::uint32_t voters = 0;  // components asked
  bool accepted() const { return yes == (voters == 64 ? ~0ULL : (1ULL << voters) - 1); }
  std::vector<bool> votes() const;  // by ComponentId
};

struct MatchResult {
  Tokens matched{0};              // the boundary: the deepest candidate every component accepted
  Node* last_node = nullptr;      // the node ending at `matched` (the root when 0)
  Tokens walked{0};               // how deep the walk went (>= matched)
  std::vector<ComponentMatch> components;  // by ComponentId (of the device boundary)
  std::vector<Candidate> candidates;       // the walk, in order (device-only votes)
  // With host copies: the deepest candidate every component accepts counting host copies as
  // present (>= matched), the node ending there, and the nodes of (matched, host_matched].
  Tokens host_matched{0};
  Node* host_node = nullptr;
  std::vector<Node*> host_path;
};

// One copy of a load-back: component c's host copy on `node` goes to the device.
struct LoadItem {
  Node* node = nullptr;
  ComponentId component{0};
  std::vector<Slot> host;  // the source (node->at(c).host at planning time)
};

// ---- insert ---------------------------------------------------------------------------------

// What a caller offers one component. Paged: `slots` cover [from, key end), one per page. Point:
// at most one slot, the state at depth `at` (-1: the key's end).
struct InsertValue {
  std::vector<Slot> slots;
  Tokens from{0};
  Tokens at{-1};
  static InsertValue pages(std::vector<Slot> s, Tokens from = Tokens(0)) { return {std::move(s), from, Tokens(-1)}; }
  static InsertValue state(Slot s, Tokens at = Tokens(-1)) { return {{s}, Tokens(0), at}; }
  static InsertValue none() { return {}; }
};

struct ComponentInsert {
  // Tokens of the key the component already had: paged, the sum of the existing path's live
  // lengths (FULL: RadixTree's prefix_len); point, the deepest existing state's depth on the key.
  Tokens present{0};
  std::vector<Slot> returned;  // the caller's slots the tree did not take (the caller frees them)
};

struct InsertResult {
  Node* last_node = nullptr;  // the node ending the key (its nearest kept ancestor if none stays)
  std::vector<ComponentInsert> components;  // by ComponentId
};

// Per-insert context handed to the insert hooks.
struct InsertContext {
  std::span<const TokenId> tokens;
  Tokens end{0};  // the key's length
  std::span<const InsertValue> values;
};

// ---- locks ----------------------------------------------------------------------------------

// One component's share of a lock: `held` until released; `top` is component-owned (SWA: the
// start depth of the highest node its window lock reached).
struct LockPart {
  bool held = false;
  Tokens top{0};
};

// A lock on a node for every component (FULL: the path; SWA: the tail window; MAMBA: the node).
// The node stays valid while the lock is held (it cannot be evicted; a split keeps it as the
// lower part).
struct LockHandle {
  Node* node = nullptr;
  std::vector<LockPart> parts;  // by ComponentId
  bool held() const;
};

// ---- eviction -------------------------------------------------------------------------------

struct EvictResult {
  std::vector<std::vector<Slot>> freed;          // by ComponentId, in eviction order
  std::vector<std::vector<Slot>> sidecar_freed;  // by sidecar index (the source's ids)
  std::size_t nodes_deleted = 0;
};

// Pool counts for verify(): free + held by the tree + held by requests must equal capacity.
struct PoolCounts {
  std::int64_t capacity = 0, free = 0, held_by_requests = 0;
};
struct VerifyAccounts {
  std::vector<PoolCounts> components;           // by ComponentId (empty: not checked)
  std::vector<std::int64_t> sidecar_requests;   // by sidecar: entries held by requests (empty: not checked)
  std::vector<PoolCounts> host;                 // host pools by ComponentId (empty: not checked)
};

// ---- the component interface ----------------------------------------------------------------

class Component {
 public:
  virtual ~Component() = default;
  virtual std::string_view name() const = 0;
  // Paged: one slot per page of a node's key; otherwise one slot per node (a point value).
  virtual bool paged() const = 0;
  ComponentId id() const { return id_; }
  Tokens page_size() const { return page_size_; }
  // Called once the tree has registered the component (id and page size set): checks settings.
  virtual void attached() {}

  // match: a fresh validator for one walk (the boundary advances only where all accept);
  // `with_host`: host copies count as present (the walk's second set of votes).
  virtual std::unique_ptr<MatchValidator> make_validator(bool with_host) const = 0;
  // match: what the request may reuse of the accepted path `path` (root excluded, in order).
  virtual void finalize_match(std::span<Node* const> path, Tokens boundary, ComponentMatch& out) const = 0;

  // split: `parent` (new, the first `prefix_pages` pages) and `child` (the rest) from `child`'s data.
  virtual void redistribute_on_split(ComponentData& parent, ComponentData& child, std::size_t prefix_pages) const = 0;
  // split of the host copy: paged copies are sliced, a point copy stays on the child (its depth).
  virtual void redistribute_host_on_split(ComponentData& parent, ComponentData& child, std::size_t prefix_pages) const;

  // insert: rejects a malformed offer (InternalError) before the tree changes.
  virtual void check_insert(const InsertContext& ctx, const InsertValue& v) const = 0;
  // insert: a depth strictly inside (start, end) where this insert needs a node boundary, if any;
  // `node` is the existing node there, or null for the new leaf.
  virtual std::optional<Tokens> insert_boundary(const InsertContext& ctx, const Node* node, Tokens start, Tokens end) const = 0;
  // insert over an existing node: keep what the tree has, heal a tombstone, report duplicates.
  virtual void insert_overlap(UnifiedTree& tree, Node* node, const InsertContext& ctx, ComponentInsert& out) const = 0;
  // insert into a node this insert created: attach the caller's value (or leave a tombstone).
  virtual void commit_insert(UnifiedTree& tree, Node* node, const InsertContext& ctx, ComponentInsert& out) const = 0;
  // insert: may this component refuse the new leaf [start, key end)? A refused leaf is not
  // created and every component's offer for it goes back to the caller. kvgrid's components never
  // refuse (FULL must stay cacheable whatever the others hold); SWA does under the planted bug
  // swa_veto_full_leaf (bug-catalogue #18).
  virtual bool veto_leaf(const InsertContext& /*ctx*/, Tokens /*start*/) const { return false; }

  // locks: take this component's lock for a request whose matched prefix ends at `node`.
  virtual LockPart acquire_lock(UnifiedTree& tree, Node* node) const = 0;
  // locks: give back exactly what acquire_lock took (splits since then included).
  virtual void release_lock(UnifiedTree& tree, Node* node, const LockPart& part) const = 0;
  // locks: path locks (lock_ref of a node >= the sum of its children's) — checked by verify.
  virtual bool path_locks() const { return false; }

  // eviction: cascade rank on a leaf or an internal node (lower ranks go with higher ones).
  virtual int eviction_priority(bool leaf) const = 0;
  // eviction: beyond "has a value, nothing cascaded is locked": may this node be a victim?
  virtual bool eviction_candidate(const Node& node) const = 0;
  // eviction pass: start, next victim (null: none left), end. Candidates are kept incrementally
  // by the core, so start/end have no per-pass state to set up yet.
  virtual void evict_start(UnifiedTree& tree);
  virtual Node* evict_next(UnifiedTree& tree);
  virtual void evict_end(UnifiedTree& tree);

  // host eviction: beyond "has a host copy and no value, nothing cascaded locked, no write in
  // flight": may this node's host copy go? (FULL: only where no child has a FULL host copy.)
  virtual bool host_eviction_candidate(const Node& /*node*/) const { return true; }
  // host eviction pass: the next victim (null: none left); default LRU over the candidates.
  virtual Node* host_evict_next(UnifiedTree& tree);

  // load-back: a depth strictly inside a node of `path` (root excluded, ending at `boundary`)
  // where this component wants the node cut before loading, so that it loads no more than it
  // needs (SWA: the rounded window's start inside a node without SWA pages), if any.
  virtual std::optional<Tokens> load_split(std::span<Node* const> /*path*/, Tokens /*boundary*/) const { return std::nullopt; }
  // load-back: does this component need its value on the device at `node` (on the path to
  // `boundary`) for a device-only match to accept `boundary`? FULL: every node.
  virtual bool load_wanted(const Node& /*node*/, Tokens /*boundary*/) const { return true; }
  // load-back: the value on `node` was just loaded from its host copy (MAMBA: its depth).
  virtual void loaded(Node& /*node*/) const {}

  // verify: this component's invariants on one node (InternalError naming the node otherwise).
  virtual void verify_node(const UnifiedTree& tree, const Node& node) const = 0;

  // sessions: the frontier a request ending at `last` registers — the nearest node at or above it
  // holding this component's data (a value or a host copy; null: none below the root).
  virtual Node* session_frontier(Node* last) const;
  // sessions: where the region of `frontier` starts (nodes of its path ending deeper are
  // covered). FULL: 0, the whole path.
  virtual Tokens session_from(const Node& /*frontier*/) const { return Tokens(0); }

 private:
  friend class UnifiedTree;
  ComponentId id_{0};
  Tokens page_size_{0};
};

// Extra per-slot payload that follows a source component's slot ids (Figure 3's C4/C128 pools,
// indexer buffers, compressor states). No index space, no node data, no vote.
class Sidecar {
 public:
  virtual ~Sidecar() = default;
  virtual std::string_view name() const = 0;
  virtual ComponentId source() const = 0;
  virtual bool has(Slot s) const = 0;
  virtual std::size_t entries() const = 0;
  // The source's slots `s` left the tree or a request: their entries are gone.
  virtual void drop(std::span<const Slot> s) = 0;
};

}  // namespace kvgrid::cache::unified
