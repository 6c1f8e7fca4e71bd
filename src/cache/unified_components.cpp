#include "cache/unified_components.hpp"

#include <algorithm>
#include <limits>

#include "core/check.hpp"

namespace kvgrid::cache::unified {

namespace {

// ---- helpers shared by the paged components (FULL, SWA) ----

std::size_t page_index(Tokens offset, Tokens page) { return static_cast<std::size_t>(offset.value() / page.value()); }

// The caller's slots for tokens [a, b) of a paged offer (a >= v.from, both page-aligned).
std::vector<Slot> offered(const InsertValue& v, Tokens a, Tokens b, Tokens page) {
  KVGRID_CHECK(a >= v.from && b >= a, "offer of [", a, ", ", b, ") from pages starting at ", v.from);
  const auto first = v.slots.begin() + static_cast<std::ptrdiff_t>(page_index(a - v.from, page));
  return std::vector<Slot>(first, first + static_cast<std::ptrdiff_t>(page_index(b - a, page)));
}

// The caller's slots over node [s, e) that are not the tree's own there go back to the caller.
void return_unused(const Node& node, ComponentId id, const InsertValue& v, Tokens page, ComponentInsert& out) {
  const Tokens a = std::max(node.start(), v.from);
  if (a >= node.end) return;
  const std::vector<Slot> mine = offered(v, a, node.end, page);
  const ComponentData& d = node.at(id);
  for (std::size_t i = 0; i < mine.size(); ++i) {
    const bool own = d.value && (*d.value)[page_index(a - node.start(), page) + i] == mine[i];
    if (!own) out.returned.push_back(mine[i]);
  }
}

void check_paged_offer(std::string_view name, const InsertContext& ctx, const InsertValue& v, Tokens page) {
  KVGRID_CHECK(v.from.value() >= 0 && v.from <= ctx.end && v.from.value() % page.value() == 0, name,
               " offer starts at ", v.from, " for a key of ", ctx.end, " tokens");
  KVGRID_CHECK(v.slots.size() == page_index(ctx.end - v.from, page), name, " offer of ", v.slots.size(),
               " slots for tokens [", v.from, ", ", ctx.end, ")");
  for (Slot s : v.slots) KVGRID_CHECK(s.value() != 0, name, " offer holds slot 0 (padding)");
}

// A split of a paged value: the new parent takes the first pages; path-style locks and metadata
// are copied (a lock that covered the node covers both fragments).
void split_paged(ComponentData& parent, ComponentData& child, std::size_t prefix_pages) {
  parent.lock_ref = child.lock_ref;
  parent.meta = child.meta;
  if (child.value) {
    auto cut = child.value->begin() + static_cast<std::ptrdiff_t>(prefix_pages);
    parent.value.emplace(child.value->begin(), cut);
    child.value->erase(child.value->begin(), cut);
  }
}

void append_value(const Node& node, ComponentId id, std::vector<Slot>& out) {
  const ComponentData& d = node.at(id);
  KVGRID_CHECK(d.value.has_value(), "a finalized match crosses a tombstone on node ", node.id);
  out.insert(out.end(), d.value->begin(), d.value->end());
}

// ---- validators ----

class FullValidator final : public MatchValidator {
 public:
  FullValidator(ComponentId id, bool with_host) : id_(id), host_(with_host) {}
  // Every page from the root must be present: one tombstone rejects everything below it.
  bool accept(const Node& node) override { return ok_ = ok_ && node.at(id_).present(host_); }

 private:
  ComponentId id_;
  bool host_;
  bool ok_ = true;
};

class SwaValidator final : public MatchValidator {
 public:
  SwaValidator(ComponentId id, Tokens window, bool buggy, bool with_host)
      : id_(id), window_(window.value()), buggy_(buggy), host_(with_host) {}
  // Live tokens since the last tombstone; "infinite" until the first one (nothing precedes the
  // root, so a run from the root covers every window). swa_run_across_tombstones (#14): only the
  // first tombstone resets the run; later ones are counted as if they were live.
  bool accept(const Node& node) override {
    constexpr std::int64_t kInf = std::numeric_limits<std::int64_t>::max();
    const bool live = node.at(id_).present(host_);  // a host copy counts where a load-back may follow
    if (!live && !(buggy_ && reset_)) {
      run_ = 0;
      reset_ = true;
    } else if (run_ != kInf) {
      run_ += static_cast<std::int64_t>(node.key.size());
    }
    return run_ >= window_;
  }

 private:
  ComponentId id_;
  std::int64_t window_;
  bool buggy_, host_, reset_ = false;
  std::int64_t run_ = std::numeric_limits<std::int64_t>::max();
};

class MambaValidator final : public MatchValidator {
 public:
  MambaValidator(ComponentId id, bool with_host) : id_(id), host_(with_host) {}
  // A state exactly at this node's end depth.
  bool accept(const Node& node) override { return node.at(id_).present(host_); }

 private:
  ComponentId id_;
  bool host_;
};

}  // namespace

// ---- FULL -----------------------------------------------------------------------------------

std::unique_ptr<MatchValidator> FullComponent::make_validator(bool with_host) const {
  return std::make_unique<FullValidator>(id(), with_host);
}

void FullComponent::finalize_match(std::span<Node* const> path, Tokens, ComponentMatch& out) const {
  out.from = Tokens(0);
  if (!path.empty()) out.slots.reserve(static_cast<std::size_t>(path.back()->end.value() / page_size().value()));
  for (const Node* n : path) append_value(*n, id(), out.slots);
}

void FullComponent::redistribute_on_split(ComponentData& parent, ComponentData& child, std::size_t prefix_pages) const {
  split_paged(parent, child, prefix_pages);
}

void FullComponent::check_insert(const InsertContext& ctx, const InsertValue& v) const {
  check_paged_offer(name(), ctx, v, page_size());
}

void FullComponent::insert_overlap(UnifiedTree& tree, Node* node, const InsertContext& ctx, ComponentInsert& out) const {
  const InsertValue& v = ctx.values[id().value()];
  if (node->at(id()).live()) {
    out.present += node->length();
    return_unused(*node, id(), v, page_size(), out);
    return;
  }
  commit_insert(tree, node, ctx, out);  // a tombstone on the path takes the caller's pages
}

void FullComponent::commit_insert(UnifiedTree& tree, Node* node, const InsertContext& ctx, ComponentInsert&) const {
  const InsertValue& v = ctx.values[id().value()];
  KVGRID_CHECK(v.from <= node->start(), "full: the insert offers pages from ", v.from, " but node ", node->id, " [",
               node->start(), ", ", node->end, ") has none");
  tree.set_value(node, id(), offered(v, node->start(), node->end, page_size()));
}

LockPart FullComponent::acquire_lock(UnifiedTree& tree, Node* node) const {
  LockPart part;
  for (Node* n = node; n != tree.root(); n = n->parent) {
    tree.add_lock(n, id(), +1);
    part.held = true;
  }
  return part;
}

void FullComponent::release_lock(UnifiedTree& tree, Node* node, const LockPart&) const {
  for (Node* n = node; n != tree.root(); n = n->parent) tree.add_lock(n, id(), -1);
}

bool FullComponent::eviction_candidate(const Node& node) const {
  for (const auto& [h, c] : node.children)
    if (c->at(id()).live()) return false;
  return true;
}

bool FullComponent::host_eviction_candidate(const Node& node) const {
  for (const auto& [h, c] : node.children)
    if (c->at(id()).backed()) return false;
  return true;
}

void FullComponent::verify_node(const UnifiedTree& tree, const Node& node) const {
  if (node.at(id()).live())
    KVGRID_CHECK(node.parent == tree.root() || node.parent->at(id()).live(), "full: node ", node.id,
                 " holds pages below a tombstone (FULL values must form a prefix from the root)");
  if (node.at(id()).backed())
    KVGRID_CHECK(node.parent == tree.root() || node.parent->at(id()).backed(), "full: node ", node.id,
                 " has a host copy below a node without one (host copies must form a prefix from the root)");
}

// ---- SWA ------------------------------------------------------------------------------------

SwaComponent::SwaComponent(Tokens window, ComponentBugs bugs) : window_(window), bugs_(bugs) {
  KVGRID_CHECK(window.value() >= 1, "swa window of ", window, " tokens");
}

std::unique_ptr<MatchValidator> SwaComponent::make_validator(bool with_host) const {
  return std::make_unique<SwaValidator>(id(), window_, bugs_.has(ComponentBug::SwaRunAcrossTombstones), with_host);
}

Tokens SwaComponent::rounded_window() const {
  const std::int64_t p = page_size().value();
  return Tokens((window_.value() + p - 1) / p * p);
}

std::optional<Tokens> SwaComponent::load_split(std::span<Node* const> path, Tokens boundary) const {
  // A host-only node reaching above the rounded window would load pages nobody reads (and more
  // than a request's SWA budget): cut it at the window's start (bug-catalogue #19).
  if (bugs_.has(ComponentBug::SwaLoadWholeNode)) return std::nullopt;  // #19: the node is loaded whole
  const Tokens w = boundary - rounded_window();
  for (const Node* n : path)
    if (n->start() < w && w < n->end && !n->at(id()).live()) return w;
  return std::nullopt;
}

bool SwaComponent::load_wanted(const Node& node, Tokens boundary) const { return node.end > boundary - rounded_window(); }

void SwaComponent::finalize_match(std::span<Node* const> path, Tokens boundary, ComponentMatch& out) const {
  out.from = boundary;
  Tokens covered(0);
  std::size_t first = path.size();
  while (first > 0 && covered < window_) {
    --first;
    covered += path[first]->length();
  }
  if (first == path.size()) return;
  out.from = path[first]->start();
  for (std::size_t i = first; i < path.size(); ++i) {
    // A tombstone inside the window is reachable only through the validator's bug (#14): its
    // pages have no SWA KV, and the request's page table points at the padding page there.
    if (!path[i]->at(id()).live() && bugs_.has(ComponentBug::SwaRunAcrossTombstones))
      out.slots.insert(out.slots.end(), page_index(path[i]->length(), page_size()), Slot(0));
    else
      append_value(*path[i], id(), out.slots);
  }
}

void SwaComponent::redistribute_on_split(ComponentData& parent, ComponentData& child, std::size_t prefix_pages) const {
  split_paged(parent, child, prefix_pages);
}

void SwaComponent::check_insert(const InsertContext& ctx, const InsertValue& v) const {
  check_paged_offer(name(), ctx, v, page_size());
}

Tokens SwaComponent::insert_window_start(const InsertContext& ctx) const {
  const std::int64_t p = page_size().value();
  const Tokens from = ctx.values[id().value()].from;
  // unfinished_insert_live (#16): the tree trusts the caller's release point and keeps the
  // whole offer live (the caller, under the same bug, does not forward it).
  if (bugs_.has(ComponentBug::UnfinishedInsertLive)) return std::max(from, Tokens(0));
  // floored_frontier (#17): the window rounded down to pages — none at all when page > window.
  const std::int64_t pages = bugs_.has(ComponentBug::FlooredFrontier) ? window_.value() / p : (window_.value() + p - 1) / p;
  return std::max({from, ctx.end - Tokens(pages * p), Tokens(0)});
}

std::optional<Tokens> SwaComponent::insert_boundary(const InsertContext& ctx, const Node* node, Tokens start,
                                                    Tokens end) const {
  if (node && node->at(id()).live()) return std::nullopt;  // live pages are kept whole
  const Tokens w = insert_window_start(ctx);
  if (start < w && w < end) return w;
  return std::nullopt;
}

void SwaComponent::insert_overlap(UnifiedTree& tree, Node* node, const InsertContext& ctx, ComponentInsert& out) const {
  if (node->at(id()).live()) {
    out.present += node->length();
    return_unused(*node, id(), ctx.values[id().value()], page_size(), out);
    return;
  }
  commit_insert(tree, node, ctx, out);  // a tombstone: healed where the window covers it
}

void SwaComponent::commit_insert(UnifiedTree& tree, Node* node, const InsertContext& ctx, ComponentInsert& out) const {
  const InsertValue& v = ctx.values[id().value()];
  if (node->start() >= insert_window_start(ctx)) {
    tree.set_value(node, id(), offered(v, node->start(), node->end, page_size()));
    return;
  }
  // Above the window (insert_boundary cut the node there): stays a tombstone.
  return_unused(*node, id(), v, page_size(), out);
}

bool SwaComponent::veto_leaf(const InsertContext& ctx, Tokens start) const {
  // swa_veto_full_leaf (#18): a leaf that cannot hold a whole window by itself is refused.
  return bugs_.has(ComponentBug::SwaVetoFullLeaf) && ctx.end - start < window_;
}

LockPart SwaComponent::acquire_lock(UnifiedTree& tree, Node* node) const {
  LockPart part;
  Tokens covered(0);
  for (Node* n = node; n != tree.root() && covered < window_; n = n->parent) {
    tree.add_lock(n, id(), +1);
    covered += n->length();
    part.held = true;
    part.top = n->start();
  }
  return part;
}

void SwaComponent::release_lock(UnifiedTree& tree, Node* node, const LockPart& part) const {
  // Splits since the lock only cut the locked nodes into fragments that start at or below `top`.
  for (Node* n = node; n != tree.root() && n->start() >= part.top; n = n->parent) tree.add_lock(n, id(), -1);
}

std::vector<Slot> SwaComponent::free_before(UnifiedTree& tree, SwaRequest& req, Tokens position) const {
  const Tokens p = page_size();
  std::size_t k = 0;
  while (k < req.own.size() && req.own_from + Tokens(static_cast<std::int64_t>(k + 1) * p.value()) <= position) ++k;
  std::vector<Slot> freed(req.own.begin(), req.own.begin() + static_cast<std::ptrdiff_t>(k));
  req.own.erase(req.own.begin(), req.own.begin() + static_cast<std::ptrdiff_t>(k));
  req.own_from += Tokens(static_cast<std::int64_t>(k) * p.value());
  tree.drop_sidecars(id(), freed);
  if (req.lock && req.lock->parts.at(id().value()).held && req.lock->node->end <= position) release_window(tree, *req.lock);
  return freed;
}

// ---- MAMBA ----------------------------------------------------------------------------------

MambaComponent::MambaComponent(Tokens chunk, ComponentBugs bugs) : chunk_(chunk), bugs_(bugs) {
  KVGRID_CHECK(chunk.value() >= 1, "mamba checkpoint chunk of ", chunk, " tokens");
}

void MambaComponent::attached() {
  KVGRID_CHECK(chunk_.value() % page_size().value() == 0, "mamba checkpoint chunk of ", chunk_,
               " tokens is not a multiple of the page size ", page_size());
}

std::unique_ptr<MatchValidator> MambaComponent::make_validator(bool with_host) const {
  return std::make_unique<MambaValidator>(id(), with_host);
}

void MambaComponent::loaded(Node& node) const { node.at(id()).meta = static_cast<std::uint64_t>(node.end.value()); }

void MambaComponent::finalize_match(std::span<Node* const> path, Tokens boundary, ComponentMatch& out) const {
  out.from = boundary;
  if (path.empty()) return;
  append_value(*path.back(), id(), out.slots);  // the state to copy into a private request slot
}

void MambaComponent::redistribute_on_split(ComponentData& parent, ComponentData& child, std::size_t) const {
  parent = ComponentData{};  // a state is valid only at its node's end depth: it stays on the child
  if (bugs_.has(ComponentBug::SplitTruncatesState) && child.live()) {
    // split_truncates_state (#20): the state goes with the prefix, as a paged value's first pages
    // would — the new node ending shallower claims a state of the deeper depth.
    parent.value = std::move(child.value);
    parent.meta = child.meta;
    child.value.reset();
  }
}

Tokens MambaComponent::state_depth(const InsertContext& ctx) const {
  const InsertValue& v = ctx.values[id().value()];
  if (v.slots.empty()) return Tokens(-1);
  return v.at.value() < 0 ? ctx.end : v.at;
}

void MambaComponent::check_insert(const InsertContext& ctx, const InsertValue& v) const {
  KVGRID_CHECK(v.slots.size() <= 1, "mamba offer of ", v.slots.size(), " states (one at most)");
  if (v.slots.empty()) return;
  const Tokens d = state_depth(ctx);
  KVGRID_CHECK(d.value() > 0 && d <= ctx.end && d.value() % chunk_.value() == 0 && v.slots[0].value() != 0,
               "mamba state at depth ", d, " (slot ", v.slots[0], ") for a key of ", ctx.end,
               " tokens on a checkpoint grid of ", chunk_);
}

std::optional<Tokens> MambaComponent::insert_boundary(const InsertContext& ctx, const Node*, Tokens start, Tokens end) const {
  const Tokens d = state_depth(ctx);
  if (start < d && d < end) return d;
  return std::nullopt;
}

void MambaComponent::insert_overlap(UnifiedTree& tree, Node* node, const InsertContext& ctx, ComponentInsert& out) const {
  if (node->at(id()).live()) out.present = std::max(out.present, node->end);
  commit_insert(tree, node, ctx, out);
}

void MambaComponent::commit_insert(UnifiedTree& tree, Node* node, const InsertContext& ctx, ComponentInsert& out) const {
  const Tokens d = state_depth(ctx);
  if (node->end != d) return;
  const Slot s = ctx.values[id().value()].slots[0];
  ComponentData& data = node->at(id());
  if (data.live()) {
    if ((*data.value)[0] != s) out.returned.push_back(s);  // the tree has a state here already
    return;
  }
  tree.set_value(node, id(), std::vector<Slot>{s});
  data.meta = static_cast<std::uint64_t>(d.value());
}

LockPart MambaComponent::acquire_lock(UnifiedTree& tree, Node* node) const {
  LockPart part;
  if (node == tree.root()) return part;
  tree.add_lock(node, id(), +1);
  part.held = true;
  part.top = node->end;
  return part;
}

void MambaComponent::release_lock(UnifiedTree& tree, Node* node, const LockPart&) const { tree.add_lock(node, id(), -1); }
// (UnifiedTree::lock_node takes the same node lock for a write: released here the same way.)

void MambaComponent::verify_node(const UnifiedTree&, const Node& node) const {
  const ComponentData& d = node.at(id());
  if (!d.live()) return;
  KVGRID_CHECK(d.meta == static_cast<std::uint64_t>(node.end.value()), "mamba: node ", node.id, " ending at ", node.end,
               " holds a state taken at depth ", d.meta);
  KVGRID_CHECK(node.end.value() % chunk_.value() == 0, "mamba: node ", node.id, " holds a state at depth ", node.end,
               ", off the checkpoint grid of ", chunk_);
}

// ---- sidecars -------------------------------------------------------------------------------

PayloadSidecar::PayloadSidecar(std::string name, ComponentId source, std::size_t words_per_slot, std::size_t capacity)
    : name_(std::move(name)), source_(source), words_per_slot_(words_per_slot),
      words_((capacity + 1) * words_per_slot, 0), present_(capacity + 1, false) {
  KVGRID_CHECK(words_per_slot >= 1, "sidecar ", name_, " with no words per slot");
}

std::unique_ptr<PayloadSidecar> PayloadSidecar::make(const UnifiedTree& tree, std::string name, ComponentId source,
                                                     std::size_t words_per_token, std::size_t capacity) {
  KVGRID_CHECK(source.value() < tree.components(), "sidecar ", name, " follows unknown component ", source);
  const std::size_t tokens = tree.component(source).paged() ? static_cast<std::size_t>(tree.page_size().value()) : 1;
  return std::make_unique<PayloadSidecar>(std::move(name), source, words_per_token * tokens, capacity);
}

void PayloadSidecar::write(Slot s, std::span<const std::uint64_t> words) {
  KVGRID_CHECK(s.value() >= 1 && s.value() < present_.size() && words.size() == words_per_slot_, "sidecar ", name_,
               " write of ", words.size(), " words to slot ", s);
  std::copy(words.begin(), words.end(), words_.begin() + static_cast<std::ptrdiff_t>(s.value() * words_per_slot_));
  if (!present_[s.value()]) ++entries_;
  present_[s.value()] = true;
}

std::span<const std::uint64_t> PayloadSidecar::read(Slot s) const {
  KVGRID_CHECK(has(s), "sidecar ", name_, " has no entry for slot ", s);
  return std::span<const std::uint64_t>(words_.data() + s.value() * words_per_slot_, words_per_slot_);
}

void PayloadSidecar::drop(std::span<const Slot> s) {
  for (Slot x : s)
    if (has(x)) {
      present_[x.value()] = false;
      --entries_;
    }
}

// ---- pools ----------------------------------------------------------------------------------

SlotPool::SlotPool(std::int64_t capacity) : capacity_(capacity), allocated_(static_cast<std::size_t>(capacity + 1), false) {
  KVGRID_CHECK(capacity >= 0, "slot pool of ", capacity);
  for (std::int64_t s = capacity; s >= 1; --s) free_.push_back(Slot(static_cast<std::uint32_t>(s)));
}

std::optional<std::vector<Slot>> SlotPool::alloc(std::int64_t n) {
  if (n < 0 || n > free_count()) return std::nullopt;
  std::vector<Slot> out;
  out.reserve(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    out.push_back(free_.back());
    free_.pop_back();
    allocated_[out.back().value()] = true;
  }
  return out;
}

void SlotPool::free(std::span<const Slot> s) {
  for (Slot x : s) {
    KVGRID_CHECK(is_allocated(x), "free of slot ", x, " that is not allocated");
    allocated_[x.value()] = false;
    free_.push_back(x);
  }
}

}  // namespace kvgrid::cache::unified
