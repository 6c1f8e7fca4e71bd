#include "cache/unified_tree.hpp"

#include <algorithm>
#include <cstring>
#include <limits>

#include "core/check.hpp"
#include "core/hash.hpp"

// The operations; host copies (backups, host eviction, load-back plans) are in
// unified_tree_host.cpp, introspection (find_node, page_values, digest) and verify() in
// unified_tree_inspect.cpp.
namespace kvgrid::cache::unified {

std::vector<bool> Candidate::votes() const {
  std::vector<bool> v(voters);
  for (std::uint32_t c = 0; c < voters; ++c) v[c] = (yes >> c) & 1;
  return v;
}

bool LockHandle::held() const {
  return std::any_of(parts.begin(), parts.end(), [](const LockPart& p) { return p.held; });
}

void Component::evict_start(UnifiedTree&) {}
Node* Component::evict_next(UnifiedTree& tree) { return tree.lru_candidate(id()); }
void Component::evict_end(UnifiedTree&) {}
Node* Component::host_evict_next(UnifiedTree& tree) { return tree.host_lru_candidate(id()); }

void Component::redistribute_host_on_split(ComponentData& parent, ComponentData& child, std::size_t prefix_pages) const {
  parent.host.reset();
  if (!child.host || !paged()) return;  // a point copy belongs to the child's depth
  auto cut = child.host->begin() + static_cast<std::ptrdiff_t>(prefix_pages);
  parent.host.emplace(child.host->begin(), cut);
  child.host->erase(child.host->begin(), cut);
}

// ---- construction ---------------------------------------------------------------------------

UnifiedTree::UnifiedTree(Tokens page_size) : page_size_(page_size), root_(std::make_unique<Node>()) {
  KVGRID_CHECK(page_size.value() >= 1, "page_size ", page_size);
  root_->id = 0;
}

UnifiedTree::~UnifiedTree() {
  // Iterative teardown: a long chain of unique_ptr destructors could overflow the stack.
  std::vector<std::unique_ptr<Node>> stack;
  stack.push_back(std::move(root_));
  while (!stack.empty()) {
    auto n = std::move(stack.back());
    stack.pop_back();
    for (auto& [h, c] : n->children) stack.push_back(std::move(c));
  }
}

ComponentId UnifiedTree::add_component(std::unique_ptr<Component> c) {
  KVGRID_CHECK(!frozen_ && node_count_ == 0, "component ", c->name(), " registered after the first insert");
  KVGRID_CHECK(components_.size() < 64, "more than 64 components");
  const ComponentId id(static_cast<std::uint32_t>(components_.size()));
  c->id_ = id;
  c->page_size_ = page_size_;
  c->attached();
  components_.push_back(std::move(c));
  evictable_.emplace_back();
  held_.push_back(0);
  protected_.push_back(0);
  host_evictable_.emplace_back();
  host_held_.push_back(0);
  root_->comp.emplace_back();
  root_->in_evictable.push_back(false);
  root_->filed_at.push_back(0);
  root_->filed_rank.push_back(0);
  root_->in_host_evictable.push_back(false);
  root_->host_filed_at.push_back(0);
  root_->host_filed_rank.push_back(0);
  session_stats_.forced_slots.push_back(0);
  session_stats_.forced_tokens.push_back(0);
  session_stats_.forced_host_slots.push_back(0);
  session_stats_.forced_host_tokens.push_back(0);
  return id;
}

std::size_t UnifiedTree::add_sidecar(std::unique_ptr<Sidecar> s) {
  KVGRID_CHECK(s->source().value() < components_.size(), "sidecar ", s->name(), " follows unknown component ",
               s->source());
  KVGRID_CHECK(!frozen_ && node_count_ == 0, "sidecar ", s->name(), " registered after the first insert");
  sidecars_.push_back(std::move(s));
  return sidecars_.size() - 1;
}

std::unique_ptr<Node> UnifiedTree::new_node() {
  auto n = std::make_unique<Node>();
  n->id = next_id_++;
  n->comp.resize(components_.size());
  n->in_evictable.assign(components_.size(), false);
  n->filed_at.assign(components_.size(), 0);
  n->filed_rank.assign(components_.size(), 0);
  n->in_host_evictable.assign(components_.size(), false);
  n->host_filed_at.assign(components_.size(), 0);
  n->host_filed_rank.assign(components_.size(), 0);
  return n;
}

EvictResult UnifiedTree::empty_result() const {
  EvictResult r;
  r.freed.resize(components_.size());
  r.sidecar_freed.resize(sidecars_.size());
  return r;
}

// ---- topology helpers -----------------------------------------------------------------------

std::uint64_t UnifiedTree::page_hash(std::span<const TokenId> page) const { return hash_u32(page); }

Node* UnifiedTree::find_child(Node* node, std::span<const TokenId> first_page) const {
  if (node->children.empty()) return nullptr;
  if (node->children.size() == 1) {  // most nodes of a path have one child: compare, no hash
    Node* only = node->children.begin()->second.get();
    return std::memcmp(only->key.data(), first_page.data(), first_page.size() * sizeof(TokenId)) == 0 ? only : nullptr;
  }
  auto [it, end] = node->children.equal_range(page_hash(first_page));
  for (; it != end; ++it)
    if (std::memcmp(it->second->key.data(), first_page.data(), first_page.size() * sizeof(TokenId)) == 0)
      return it->second.get();
  return nullptr;
}

std::unordered_multimap<std::uint64_t, std::unique_ptr<Node>>::iterator UnifiedTree::entry_of(Node* child) {
  auto [it, end] = child->parent->children.equal_range(child->first_page_hash);
  for (; it != end; ++it)
    if (it->second.get() == child) return it;
  KVGRID_CHECK(false, "node ", child->id, " missing from its parent");
  return end;
}

void UnifiedTree::add_child(Node* parent, std::unique_ptr<Node> child) {
  const std::size_t p = static_cast<std::size_t>(page_size_.value());
  child->parent = parent;
  child->first_page_hash = page_hash(std::span<const TokenId>(child->key.data(), p));
  const std::uint64_t h = child->first_page_hash;
  parent->children.emplace(h, std::move(child));
}

std::size_t UnifiedTree::common_pages_tokens(const Node* node, std::span<const TokenId> tokens) const {
  const std::size_t p = static_cast<std::size_t>(page_size_.value());
  const std::size_t n = std::min(node->key.size(), tokens.size() / p * p);
  if (std::memcmp(node->key.data(), tokens.data(), n * sizeof(TokenId)) == 0) return n;
  std::size_t m = 0;
  while (m + p <= n && std::memcmp(node->key.data() + m, tokens.data() + m, p * sizeof(TokenId)) == 0) m += p;
  return m;
}

Node* UnifiedTree::split(Node* child, std::size_t split_tokens) {
  const std::size_t p = static_cast<std::size_t>(page_size_.value());
  KVGRID_CHECK(split_tokens > 0 && split_tokens < child->key.size() && split_tokens % p == 0, "split of a ",
               child->key.size(), "-token node at ", split_tokens);
  auto it = entry_of(child);
  auto mid = new_node();
  mid->parent = child->parent;
  mid->key.assign(child->key.begin(), child->key.begin() + static_cast<std::ptrdiff_t>(split_tokens));
  mid->end = child->start() + Tokens(static_cast<std::int64_t>(split_tokens));
  mid->first_page_hash = child->first_page_hash;  // same first page, so the same entry in the parent
  mid->last_access = child->last_access;
  mid->last_used = child->last_used;
  mid->pending_write = child->pending_write;  // the write covers both fragments
  mid->write_back_failed = child->write_back_failed;
  mid->hit_count = child->hit_count;          // every match that reached the child crossed the new parent
  auto count = [](const std::optional<std::vector<Slot>>& v) { return v ? static_cast<std::int64_t>(v->size()) : 0; };
  for (std::size_t c = 0; c < components_.size(); ++c) {
    ComponentData& cd = child->comp[c];
    const std::int64_t before = count(cd.value), host_before = count(cd.host);
    if (cd.lock_ref > 0) protected_[c] -= before;
    std::optional<std::vector<Slot>> host = std::move(cd.host);
    cd.host.reset();
    components_[c]->redistribute_on_split(mid->comp[c], cd, split_tokens / p);
    cd.host = std::move(host);
    components_[c]->redistribute_host_on_split(mid->comp[c], cd, split_tokens / p);
    const ComponentData& md = mid->comp[c];
    const std::int64_t a = count(md.value), b = count(cd.value);
    KVGRID_CHECK(a + b == before && count(md.host) + count(cd.host) == host_before, "component ",
                 components_[c]->name(), " split of node ", child->id, " turned ", before, " slots into ", a, " + ", b,
                 " (host copy: ", host_before, " into ", count(md.host), " + ", count(cd.host), ")");
    if (md.lock_ref > 0) protected_[c] += a;
    if (cd.lock_ref > 0) protected_[c] += b;
    // Session regions: the upper fragment lies on the same frontier paths; it is covered by each
    // mark whose region reaches above its end.
    mid->comp[c].marks.clear();
    for (const SessionMark& m : cd.marks)
      if (mid->end > m.from) mid->comp[c].marks.push_back(m);
    mid->comp[c].session_ref = distinct_sessions(mid->comp[c].marks);
  }
  std::unique_ptr<Node> owned = std::move(it->second);
  owned->key.erase(owned->key.begin(), owned->key.begin() + static_cast<std::ptrdiff_t>(split_tokens));
  Node* mid_raw = mid.get();
  it->second = std::move(mid);
  add_child(mid_raw, std::move(owned));
  ++node_count_;
  ++splits_;
  if (child->closed_idle) set_closed_idle(mid_raw, true);
  refresh(mid_raw);
  refresh(child);
  refresh(mid_raw->parent);
  return mid_raw;
}

std::vector<Node*> UnifiedTree::split_at(Node* node, std::vector<Tokens> at) {
  std::vector<Node*> frags;
  for (Tokens d : at) frags.push_back(split(node, static_cast<std::size_t>((d - node->start()).value())));
  frags.push_back(node);  // a split keeps `node` as the lower part
  return frags;
}

std::vector<Tokens> UnifiedTree::insert_splits(const InsertContext& ctx, const Node* node, Tokens start, Tokens end) const {
  std::vector<Tokens> at;
  for (const auto& c : components_) {
    auto d = c->insert_boundary(ctx, node, start, end);
    if (!d) continue;
    KVGRID_CHECK(*d > start && *d < end && d->value() % page_size_.value() == 0, "component ", c->name(),
                 " asked for an insert boundary at ", *d, " inside [", start, ", ", end, ")");
    at.push_back(*d);
  }
  std::sort(at.begin(), at.end());
  at.erase(std::unique(at.begin(), at.end()), at.end());
  return at;
}

// ---- eviction sets and counters -------------------------------------------------------------

// An access only stamps the node: its entries in the eviction sets keep the stamp they were filed
// with (never newer than the node's), and lru_candidate re-files a stale entry when it reaches
// the front — so the front is always the true (last_access, id) minimum, at O(1) per touched node.
void UnifiedTree::touch(Node* node) {
  if (node->closed_idle) set_closed_idle(node, false);  // used again: no longer a closed session's idle KV
  node->last_access = clock_;
  node->last_used = clock_;
}

bool UnifiedTree::cascade_unlocked(const Node* node, int priority) const {
  const bool leaf = node->is_leaf();
  for (std::size_t d = 0; d < components_.size(); ++d)
    if (components_[d]->eviction_priority(leaf) <= priority && node->comp[d].lock_ref != 0) return false;
  return true;
}

bool UnifiedTree::is_candidate(const Node* node, ComponentId c) const {
  if (node == root_.get() || !node->at(c).live()) return false;
  const Component& comp = *components_[c.value()];
  return comp.eviction_candidate(*node) && cascade_unlocked(node, comp.eviction_priority(node->is_leaf()));
}

bool UnifiedTree::is_host_candidate(const Node* node, ComponentId c) const {
  if (node == root_.get() || node->pending_write != 0) return false;
  const ComponentData& d = node->at(c);
  if (!d.backed() || d.live()) return false;
  const Component& comp = *components_[c.value()];
  return comp.host_eviction_candidate(*node) && cascade_unlocked(node, comp.eviction_priority(node->is_leaf()));
}

// A node filed under a stale rank moves at once (ranks change with references and leafness, not
// with accesses); its access stamp stays the one it was filed with.
void UnifiedTree::file(std::vector<std::set<EvictKey>>& sets, std::vector<bool>& in, std::vector<std::uint64_t>& at,
                       std::vector<std::int64_t>& rank_at, Node* node, std::size_t c, bool want, std::int64_t rank) {
  if (want == in[c] && (!want || rank == rank_at[c])) return;
  if (in[c]) sets[c].erase(EvictKey{rank_at[c], at[c], node->id, node});
  if (want) {
    if (!in[c]) at[c] = node->last_access;
    sets[c].insert(EvictKey{rank, at[c], node->id, node});
    rank_at[c] = rank;
  }
  in[c] = want;
}

void UnifiedTree::refresh(Node* node) {
  if (node == root_.get()) return;
  for (std::size_t c = 0; c < components_.size(); ++c) {
    const ComponentId id(static_cast<std::uint32_t>(c));
    const std::int64_t rank = session_rank(node, c);
    file(evictable_, node->in_evictable, node->filed_at, node->filed_rank, node, c, is_candidate(node, id), rank);
    file(host_evictable_, node->in_host_evictable, node->host_filed_at, node->host_filed_rank, node, c,
         is_host_candidate(node, id), rank);
  }
}

bool UnifiedTree::all_tombstone(const Node* node) const {
  return std::none_of(node->comp.begin(), node->comp.end(), [](const ComponentData& d) { return d.live() || d.backed(); });
}

bool UnifiedTree::unlocked(const Node* node) const {
  return std::all_of(node->comp.begin(), node->comp.end(), [](const ComponentData& d) { return d.lock_ref == 0; });
}

void UnifiedTree::set_value(Node* node, ComponentId c, std::optional<std::vector<Slot>> v) {
  KVGRID_CHECK(node != root_.get(), "a value on the root");
  const Component& comp = *components_[c.value()];
  const std::size_t want = comp.paged() ? node->key.size() / static_cast<std::size_t>(page_size_.value()) : 1;
  KVGRID_CHECK(!v || v->size() == want, "component ", comp.name(), " value of ", v ? v->size() : 0, " slots on node ",
               node->id, " (", node->key.size(), " tokens) expects ", want);
  ComponentData& d = node->at(c);
  const std::int64_t old = d.value ? static_cast<std::int64_t>(d.value->size()) : 0;
  const std::int64_t now = v ? static_cast<std::int64_t>(v->size()) : 0;
  held_[c.value()] += now - old;
  if (d.lock_ref > 0) protected_[c.value()] += now - old;
  d.value = std::move(v);
  refresh(node);
  refresh(node->parent);  // a parent's candidate rule may look at its children's values (FULL)
}

void UnifiedTree::add_lock(Node* node, ComponentId c, std::int64_t delta) {
  KVGRID_CHECK(node != root_.get(), "a lock on the root");
  ComponentData& d = node->at(c);
  const std::int64_t after = d.lock_ref + delta;
  KVGRID_CHECK(after >= 0, "unlock of ", components_[c.value()]->name(), " on node ", node->id, " with lock_ref ",
               d.lock_ref);
  const std::int64_t slots = d.value ? static_cast<std::int64_t>(d.value->size()) : 0;
  if (d.lock_ref == 0 && after > 0) protected_[c.value()] += slots;
  if (d.lock_ref > 0 && after == 0) protected_[c.value()] -= slots;
  d.lock_ref = after;
  refresh(node);
}

Node* UnifiedTree::front(std::vector<std::set<EvictKey>>& sets, std::size_t c, bool host) const {
  auto& set = sets[c];
  while (!set.empty()) {
    Node* n = set.begin()->node;
    if (set.begin()->last_access == n->last_access) return n;
    const std::int64_t rank = set.begin()->rank;
    set.erase(set.begin());  // accessed since it was filed: file it under its stamp now
    set.insert(EvictKey{rank, n->last_access, n->id, n});
    (host ? n->host_filed_at : n->filed_at)[c] = n->last_access;
  }
  return nullptr;
}

Node* UnifiedTree::lru_candidate(ComponentId c) const { return front(evictable_, c.value(), false); }
Node* UnifiedTree::host_lru_candidate(ComponentId c) const { return front(host_evictable_, c.value(), true); }

void UnifiedTree::drop_sidecars(ComponentId c, std::span<const Slot> s) {
  for (auto& sc : sidecars_)
    if (sc->source() == c) sc->drop(s);
}

// ---- match ----------------------------------------------------------------------------------

MatchResult UnifiedTree::match_prefix(std::span<const TokenId> tokens) {
  return match_up_to(tokens, tokens.empty() ? 0 : tokens.size() - 1, /*account=*/true);
}

MatchResult UnifiedTree::match_computed(std::span<const TokenId> tokens) {
  return match_up_to(tokens, tokens.size(), /*account=*/true);
}

MatchResult UnifiedTree::peek_prefix(std::span<const TokenId> tokens) {
  return match_up_to(tokens, tokens.empty() ? 0 : tokens.size() - 1, /*account=*/false);
}

MatchResult UnifiedTree::match_up_to(std::span<const TokenId> tokens, std::size_t max_tokens, bool account) {
  const std::size_t p = static_cast<std::size_t>(page_size_.value());
  const std::size_t nc = components_.size();
  MatchResult r;
  r.last_node = root_.get();
  r.components.resize(nc);
  const std::size_t limit = max_tokens / p * p;
  std::vector<Node*> walked;
  std::size_t best = 0, host_best = 0;  // accepted nodes: walked[0, best), with host copies walked[0, host_best)
  if (limit > 0) {
    if (account) ++clock_;
    std::vector<std::unique_ptr<MatchValidator>> validators, host_validators;
    validators.reserve(nc);
    host_validators.reserve(nc);
    for (const auto& c : components_) {
      validators.push_back(c->make_validator(false));
      host_validators.push_back(c->make_validator(true));
    }
    Node* node = root_.get();
    std::size_t pos = 0;
    while (pos < limit) {
      auto first = tokens.subspan(pos, p);
      Node* child = find_child(node, first);
      if (!child) break;
      const std::size_t n = common_pages_tokens(child, tokens.subspan(pos, limit - pos));
      const bool partial = n < child->key.size();
      if (partial) child = split(child, n);  // the walk's end becomes a candidate boundary
      Candidate cand{child, 0, static_cast<std::uint32_t>(nc)};
      bool all_host = true;
      for (std::size_t c = 0; c < nc; ++c) {  // every validator sees every node
        if (validators[c]->accept(*child)) cand.yes |= 1ULL << c;
        all_host = host_validators[c]->accept(*child) && all_host;
      }
      walked.push_back(child);
      if (cand.accepted()) best = walked.size();
      if (all_host) host_best = walked.size();
      r.candidates.push_back(std::move(cand));
      node = child;
      pos += n;
      if (partial) break;
    }
    r.walked = Tokens(static_cast<std::int64_t>(pos));
  }
  host_best = std::max(host_best, best);  // a device value is present with host copies too
  std::span<Node* const> path(walked.data(), best);
  if (account) {
    for (std::size_t i = 0; i < host_best; ++i) touch(walked[i]);  // only what is reused counts as accessed
    for (Node* n : path) ++n->hit_count;
  }
  if (best > 0) {
    r.last_node = path.back();
    r.matched = path.back()->end;
  }
  r.host_node = host_best > 0 ? walked[host_best - 1] : r.last_node;
  r.host_matched = host_best > 0 ? r.host_node->end : r.matched;
  r.host_path.assign(walked.begin() + static_cast<std::ptrdiff_t>(best), walked.begin() + static_cast<std::ptrdiff_t>(host_best));
  for (std::size_t c = 0; c < nc; ++c) components_[c]->finalize_match(path, r.matched, r.components[c]);
  return r;
}

// ---- insert ---------------------------------------------------------------------------------

InsertResult UnifiedTree::insert(std::span<const TokenId> tokens, std::span<const InsertValue> values) {
  return insert_below(root_.get(), tokens, values);
}

InsertResult UnifiedTree::insert_below(Node* start, std::span<const TokenId> tokens, std::span<const InsertValue> values) {
  const std::size_t p = static_cast<std::size_t>(page_size_.value());
  const std::size_t nc = components_.size();
  KVGRID_CHECK(tokens.size() % p == 0, "insert of ", tokens.size(), " tokens, not a multiple of page size ", p);
  KVGRID_CHECK(values.size() == nc, "insert with ", values.size(), " values for ", nc, " components");
  KVGRID_CHECK(start == root_.get() || static_cast<std::size_t>(start->end.value()) <= tokens.size(), "insert of ",
               tokens.size(), " tokens below node ", start->id, " ending at ", start->end);
  if (start != root_.get() && KVGRID_DEBUG_CHECKS_ON())
    KVGRID_CHECK(find_node(tokens, start->end) == start, "insert below node ", start->id, " that is not on the key's path");
  frozen_ = true;
  const InsertContext ctx{tokens, Tokens(static_cast<std::int64_t>(tokens.size())), values};
  for (std::size_t c = 0; c < nc; ++c) {
    components_[c]->check_insert(ctx, values[c]);
    if (start != root_.get())
      KVGRID_CHECK(values[c].slots.empty() || (components_[c]->paged() ? values[c].from >= start->end
                                                                      : (values[c].at.value() < 0 ? ctx.end : values[c].at) > start->end),
                   components_[c]->name(), " offers values above node ", start->id, " (ending at ", start->end,
                   "), where an insert below it does not go");
  }
  ++clock_;
  InsertResult r;
  r.components.resize(nc);
  // What the path down to `start` already holds (it is not walked again: nothing is offered
  // there); its nodes are accessed as a whole insert's would be.
  for (Node* n = start; n != root_.get(); n = n->parent) {
    touch(n);
    for (std::size_t c = 0; c < nc; ++c) {
      if (!n->comp[c].live()) continue;
      if (components_[c]->paged()) r.components[c].present += n->length();
      else r.components[c].present = std::max(r.components[c].present, n->end);
    }
  }
  Node* node = start;
  std::size_t pos = static_cast<std::size_t>(start->end.value());
  while (pos < tokens.size()) {  // the existing part of the path
    auto first = tokens.subspan(pos, p);
    Node* child = find_child(node, first);
    if (!child) break;
    const std::size_t n = common_pages_tokens(child, tokens.subspan(pos));
    if (n < child->key.size()) child = split(child, n);
    const Tokens s(static_cast<std::int64_t>(pos)), e(static_cast<std::int64_t>(pos + n));
    for (Node* f : split_at(child, insert_splits(ctx, child, s, e))) {
      touch(f);
      for (std::size_t c = 0; c < nc; ++c) components_[c]->insert_overlap(*this, f, ctx, r.components[c]);
      node = f;
    }
    pos += n;
  }
  bool vetoed = false;
  for (std::size_t c = 0; c < nc && pos < tokens.size(); ++c) vetoed = vetoed || components_[c]->veto_leaf(ctx, Tokens(static_cast<std::int64_t>(pos)));
  if (vetoed) {  // no leaf: what was offered for [pos, end) goes back
    const Tokens s(static_cast<std::int64_t>(pos));
    for (std::size_t c = 0; c < nc; ++c) {
      const InsertValue& v = values[c];
      if (v.slots.empty()) continue;
      if (!components_[c]->paged()) {
        if ((v.at.value() < 0 ? ctx.end : v.at) > s) r.components[c].returned.push_back(v.slots[0]);
        continue;
      }
      const std::size_t skip = static_cast<std::size_t>((std::max(v.from, s) - v.from).value()) / p;
      r.components[c].returned.insert(r.components[c].returned.end(), v.slots.begin() + static_cast<std::ptrdiff_t>(skip), v.slots.end());
    }
    pos = tokens.size();
  }
  if (pos < tokens.size()) {  // the new part: one leaf, cut where components need boundaries
    auto leaf = new_node();
    leaf->key.assign(tokens.begin() + static_cast<std::ptrdiff_t>(pos), tokens.end());
    leaf->end = ctx.end;
    leaf->last_access = leaf->last_used = clock_;
    Node* raw = leaf.get();
    add_child(node, std::move(leaf));
    ++node_count_;
    refresh(node);
    for (Node* f : split_at(raw, insert_splits(ctx, nullptr, Tokens(static_cast<std::int64_t>(pos)), ctx.end))) {
      for (std::size_t c = 0; c < nc; ++c) components_[c]->commit_insert(*this, f, ctx, r.components[c]);
      refresh(f);
      node = f;
    }
  }
  r.last_node = node;
  // Only a tree without an always-valued component (no FULL) can end an insert on an empty leaf.
  if (node != root_.get() && node->is_leaf() && all_tombstone(node) && unlocked(node)) {
    std::size_t deleted = 0;
    r.last_node = prune_tombstone_leaves(node, deleted);
  }
  for (std::size_t c = 0; c < nc; ++c) drop_sidecars(ComponentId(static_cast<std::uint32_t>(c)), r.components[c].returned);
  return r;
}

// ---- locks ----------------------------------------------------------------------------------

LockHandle UnifiedTree::lock(Node* node) {
  LockHandle h;
  h.node = node;
  h.parts.reserve(components_.size());
  for (const auto& c : components_) h.parts.push_back(c->acquire_lock(*this, node));
  return h;
}

LockHandle UnifiedTree::lock_node(Node* node) {
  KVGRID_CHECK(node != root_.get(), "a node lock on the root");
  LockHandle h;
  h.node = node;
  h.parts.reserve(components_.size());
  for (const auto& c : components_) {
    if (c->path_locks()) {
      h.parts.push_back(c->acquire_lock(*this, node));
      continue;
    }
    add_lock(node, c->id(), +1);
    h.parts.push_back(LockPart{true, node->start()});
  }
  return h;
}

void UnifiedTree::release_component_lock(LockHandle& h, ComponentId c) {
  LockPart& part = h.parts.at(c.value());
  if (!part.held) return;
  components_[c.value()]->release_lock(*this, h.node, part);
  part.held = false;
}

void UnifiedTree::unlock(LockHandle& h) {
  for (std::size_t c = 0; c < h.parts.size(); ++c) release_component_lock(h, ComponentId(static_cast<std::uint32_t>(c)));
}

}  // namespace kvgrid::cache::unified
