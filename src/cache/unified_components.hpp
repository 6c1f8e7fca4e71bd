// The components of the unified radix tree (unified_tree.hpp) and what surrounds them: FULL,
// SWA and MAMBA, payload sidecars, and a simple slot pool per index space.
//
//  * FULL (full attention): a page of KV per page of key, reusable along the whole path. Locks the
//    path to the root; evicted only at nodes with no FULL child (FULL values form a prefix from
//    the root). Priority on internal nodes 2.
//  * SWA (sliding-window attention, window W tokens): a page of SWA KV per page of key, its own
//    index space. A boundary b is reusable only if the last min(W, b) tokens before it are live:
//    the validator counts the live length since the last tombstone (from "infinite" at the root)
//    and accepts once it reaches W. Locks only the tail window; releases it early once decode has
//    passed it. An insert keeps only its window [max(from, end - ceil(W/p)·p), end) of the caller's
//    pages: a new leaf is split there (the part above is a tombstone) and a tombstone on the path
//    is healed where the window covers it (all of it, the part inside, or none). Priority 2 > 1.
//  * MAMBA (recurrent state, checkpoint grid `chunk` tokens): a point value — one state slot at
//    its node's end depth, reusable only at exactly that depth, so a split leaves the new parent
//    without a state. The match finalizer names the state to copy into a private request slot
//    (the caller copies). Locks one node. Priority 0.
//  * Sidecars (`PayloadSidecar`): per-slot payload following a source component's slot ids.
//  * Planted bugs (`ComponentBugs`, cache/component_bugs.hpp): SWA and MAMBA take the set at
//    construction; each bug changes only the rule it names (see the bug list).
//  * `SlotPool`: slots 1..capacity of one index space (0 is padding), all-or-nothing and
//    deterministic (a fresh pool hands out the lowest slots; freed slots come back first); what
//    tests and the later integration use for SWA and MAMBA.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "cache/component_bugs.hpp"
#include "cache/unified_tree.hpp"

namespace kvgrid::cache::unified {

class FullComponent final : public Component {
 public:
  std::string_view name() const override { return "full"; }
  bool paged() const override { return true; }
  std::unique_ptr<MatchValidator> make_validator(bool with_host) const override;
  void finalize_match(std::span<Node* const> path, Tokens boundary, ComponentMatch& out) const override;
  void redistribute_on_split(ComponentData& parent, ComponentData& child, std::size_t prefix_pages) const override;
  void check_insert(const InsertContext& ctx, const InsertValue& v) const override;
  std::optional<Tokens> insert_boundary(const InsertContext&, const Node*, Tokens, Tokens) const override { return std::nullopt; }
  void insert_overlap(UnifiedTree& tree, Node* node, const InsertContext& ctx, ComponentInsert& out) const override;
  void commit_insert(UnifiedTree& tree, Node* node, const InsertContext& ctx, ComponentInsert& out) const override;
  LockPart acquire_lock(UnifiedTree& tree, Node* node) const override;
  void release_lock(UnifiedTree& tree, Node* node, const LockPart& part) const override;
  bool path_locks() const override { return true; }
  int eviction_priority(bool leaf) const override { return leaf ? 0 : 2; }
  bool eviction_candidate(const Node& node) const override;
  bool host_eviction_candidate(const Node& node) const override;
  void verify_node(const UnifiedTree& tree, const Node& node) const override;
};

// A running request's SWA footprint: the tree prefix it holds through `lock`, and its own pages
// `own`, one per page from `own_from`. `own_from` records how far the request has freed (nothing
// of its own lies before it); its insert offers InsertValue::pages(own, own_from).
struct SwaRequest {
  LockHandle* lock = nullptr;
  Tokens own_from{0};
  std::vector<Slot> own;
};

class SwaComponent final : public Component {
 public:
  explicit SwaComponent(Tokens window, ComponentBugs bugs = {});
  std::string_view name() const override { return "swa"; }
  bool paged() const override { return true; }
  Tokens window() const { return window_; }
  // sessions: the tail window before the frontier's end.
  Tokens session_from(const Node& f) const override { return std::max(Tokens(0), f.end - window_); }
  std::unique_ptr<MatchValidator> make_validator(bool with_host) const override;
  void finalize_match(std::span<Node* const> path, Tokens boundary, ComponentMatch& out) const override;
  void redistribute_on_split(ComponentData& parent, ComponentData& child, std::size_t prefix_pages) const override;
  void check_insert(const InsertContext& ctx, const InsertValue& v) const override;
  std::optional<Tokens> insert_boundary(const InsertContext& ctx, const Node* node, Tokens start, Tokens end) const override;
  void insert_overlap(UnifiedTree& tree, Node* node, const InsertContext& ctx, ComponentInsert& out) const override;
  void commit_insert(UnifiedTree& tree, Node* node, const InsertContext& ctx, ComponentInsert& out) const override;
  bool veto_leaf(const InsertContext& ctx, Tokens start) const override;
  LockPart acquire_lock(UnifiedTree& tree, Node* node) const override;
  void release_lock(UnifiedTree& tree, Node* node, const LockPart& part) const override;
  int eviction_priority(bool leaf) const override { return leaf ? 0 : 1; }
  bool eviction_candidate(const Node&) const override { return true; }
  std::optional<Tokens> load_split(std::span<Node* const> path, Tokens boundary) const override;
  bool load_wanted(const Node& node, Tokens boundary) const override;
  void verify_node(const UnifiedTree&, const Node&) const override {}
  // The window rounded up to whole pages: what an insert keeps and a load-back restores.
  Tokens rounded_window() const;

  // Where an insert of `ctx` starts keeping SWA pages: max(from, end - ceil(W/p)·p), at least 0.
  Tokens insert_window_start(const InsertContext& ctx) const;
  // The serving loop's call as decode moves on: `position` is the first token the request's
  // window still needs (its length - W). Frees its own pages that end at or before `position`
  // (returned: the caller gives them back to its SWA pool; their sidecar entries are dropped) and
  // advances own_from; once the locked window ends at or before `position`, releases the
  // request's SWA window lock early (release_window). Calling it again with the same position
  // does nothing.
  std::vector<Slot> free_before(UnifiedTree& tree, SwaRequest& req, Tokens position) const;
  // Releases the SWA part of a lock before the rest (decode has passed the window).
  void release_window(UnifiedTree& tree, LockHandle& h) const { tree.release_component_lock(h, id()); }

 private:
  Tokens window_;
  ComponentBugs bugs_;
};

class MambaComponent final : public Component {
 public:
  explicit MambaComponent(Tokens chunk, ComponentBugs bugs = {});
  std::string_view name() const override { return "mamba"; }
  bool paged() const override { return false; }
  Tokens chunk() const { return chunk_; }
  // sessions: the frontier's state alone (no ancestor ends deeper than its end - 1).
  Tokens session_from(const Node& f) const override { return f.end - Tokens(1); }
  void attached() override;
  std::unique_ptr<MatchValidator> make_validator(bool with_host) const override;
  void finalize_match(std::span<Node* const> path, Tokens boundary, ComponentMatch& out) const override;
  void redistribute_on_split(ComponentData& parent, ComponentData& child, std::size_t prefix_pages) const override;
  void check_insert(const InsertContext& ctx, const InsertValue& v) const override;
  std::optional<Tokens> insert_boundary(const InsertContext& ctx, const Node* node, Tokens start, Tokens end) const override;
  void insert_overlap(UnifiedTree& tree, Node* node, const InsertContext& ctx, ComponentInsert& out) const override;
  void commit_insert(UnifiedTree& tree, Node* node, const InsertContext& ctx, ComponentInsert& out) const override;
  LockPart acquire_lock(UnifiedTree& tree, Node* node) const override;
  void release_lock(UnifiedTree& tree, Node* node, const LockPart& part) const override;
  int eviction_priority(bool) const override { return 0; }
  bool eviction_candidate(const Node&) const override { return true; }
  bool load_wanted(const Node& node, Tokens boundary) const override { return node.end == boundary; }
  void loaded(Node& node) const override;
  void verify_node(const UnifiedTree& tree, const Node& node) const override;

  // The depth an insert's state belongs to (InsertValue::at, or the key's end), or -1 for none.
  Tokens state_depth(const InsertContext& ctx) const;

 private:
  Tokens chunk_;
  ComponentBugs bugs_;
};

// Per-slot payload following a source component's slot ids: `words_per_token` words per token,
// times the tokens one source slot stands for (a page for a paged source, 1 for a point value).
class PayloadSidecar final : public Sidecar {
 public:
  PayloadSidecar(std::string name, ComponentId source, std::size_t words_per_slot, std::size_t capacity);
  // A sidecar of `source` in `tree` for source slots 1..capacity.
  static std::unique_ptr<PayloadSidecar> make(const UnifiedTree& tree, std::string name, ComponentId source,
                                              std::size_t words_per_token, std::size_t capacity);

  std::string_view name() const override { return name_; }
  ComponentId source() const override { return source_; }
  bool has(Slot s) const override { return s.value() < present_.size() && present_[s.value()]; }
  std::size_t entries() const override { return entries_; }
  void drop(std::span<const Slot> s) override;

  std::size_t words_per_slot() const { return words_per_slot_; }
  void write(Slot s, std::span<const std::uint64_t> words);
  std::span<const std::uint64_t> read(Slot s) const;

 private:
  std::string name_;
  ComponentId source_;
  std::size_t words_per_slot_;
  std::vector<std::uint64_t> words_;  // (capacity + 1) × words_per_slot
  std::vector<bool> present_;
  std::size_t entries_ = 0;
};

class SlotPool {
 public:
  explicit SlotPool(std::int64_t capacity);
  std::optional<std::vector<Slot>> alloc(std::int64_t n);  // all or nothing, lowest slots first
  void free(std::span<const Slot> s);                       // freeing a free slot is a bug
  std::int64_t capacity() const { return capacity_; }
  std::int64_t free_count() const { return static_cast<std::int64_t>(free_.size()); }
  std::int64_t used() const { return capacity_ - free_count(); }
  bool is_allocated(Slot s) const { return s.value() >= 1 && s.value() <= capacity_ && allocated_[s.value()]; }

 private:
  std::int64_t capacity_;
  std::vector<Slot> free_;  // a stack: fresh slots in ascending order, freed ones pushed on top
  std::vector<bool> allocated_;
};

}  // namespace kvgrid::cache::unified
