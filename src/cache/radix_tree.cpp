#include "cache/radix_tree.hpp"

#include <algorithm>
#include <cstring>

#include "cache/cp_placement.hpp"
#include "core/check.hpp"
#include "core/hash.hpp"

namespace kvgrid::cache {

NodeExt NodeExt::split_prefix(Pages prefix_pages) {
  NodeExt prefix;
  prefix.hit_count = hit_count;  // every match that reached the suffix also crossed the prefix
  prefix.pending_write = pending_write;  // both fragments are published when the write's ACK is consumed
  prefix.write_back_failed = write_back_failed;
  prefix.restoring = restoring;          // both fragments are in the restore's range
  prefix.rotation_base = rotation_base;  // the prefix starts where the node started
  prefix.shards = shards;
  rotation_base = static_cast<std::uint32_t>((rotation_base + static_cast<std::uint64_t>(prefix_pages.value())) % shards);
  return prefix;
}

void RadixTree::check_rotation(const TreeNode* parent, std::span<const PageId> pages, const char* what) const {
  if (cfg_.shards <= 1 || pages.empty()) return;
  const CpPlacement pl{cfg_.shards, static_cast<std::uint64_t>(cfg_.page_size.value())};
  std::string why = rotation_error(pl, pages);
  if (why.empty() && parent != root_.get()) {
    const std::uint32_t last = static_cast<std::uint32_t>(
        (parent->ext.rotation_base + parent->key.size() / static_cast<std::size_t>(cfg_.page_size.value()) - 1) % cfg_.shards);
    const std::uint32_t first = pl.page_owner(pages.front().value());
    if (first != (last + 1) % cfg_.shards)
      why = "its first page (logical " + std::to_string(pages.front().value()) + ") is owned by rank " + std::to_string(first) +
            " but continues node " + std::to_string(parent->id) + ", whose last page is owned by rank " + std::to_string(last) +
            " (expected rank " + std::to_string((last + 1) % cfg_.shards) + ")";
  }
  KVGRID_CHECK(why.empty(), what, " would join incompatible ownership rotations: ", why);
}

RadixTree::RadixTree(TreeConfig cfg) : cfg_(cfg), root_(std::make_unique<TreeNode>()) {
  KVGRID_CHECK(cfg_.page_size.value() >= 1, "page_size ", cfg_.page_size);
  root_->id = 0;
  components_.push_back(std::make_unique<FullComponent>());
}

RadixTree::~RadixTree() {
  // Tear down iteratively: a deep chain of unique_ptr destructors could overflow the stack.
  std::vector<std::unique_ptr<TreeNode>> stack;
  stack.push_back(std::move(root_));
  while (!stack.empty()) {
    auto n = std::move(stack.back());
    stack.pop_back();
    for (auto& [h, c] : n->children) stack.push_back(std::move(c));
  }
}

void RadixTree::add_component(std::unique_ptr<TreeComponent> c) { components_.push_back(std::move(c)); }

std::uint64_t RadixTree::page_hash(std::span<const TokenId> page) const { return hash_u32(page); }

TreeNode* RadixTree::find_child(TreeNode* node, std::span<const TokenId> first_page, std::uint64_t h) const {
  const std::size_t bytes = first_page.size() * sizeof(TokenId);
  auto [it, end] = node->children.equal_range(h);
  for (; it != end; ++it)
    if (std::memcmp(it->second->key.data(), first_page.data(), bytes) == 0) return it->second.get();
  return nullptr;
}

std::unordered_multimap<std::uint64_t, std::unique_ptr<TreeNode>>::iterator RadixTree::entry_of(TreeNode* child) {
  auto [it, end] = child->parent->children.equal_range(child->first_page_hash);
  for (; it != end; ++it)
    if (it->second.get() == child) return it;
  KVGRID_CHECK(false, "node ", child->id, " missing from its parent");
  return end;
}

void RadixTree::add_child(TreeNode* parent, std::unique_ptr<TreeNode> child) {
  child->parent = parent;
  const std::size_t p = static_cast<std::size_t>(cfg_.page_size.value());
  child->first_page_hash = page_hash(std::span<const TokenId>(child->key.data(), p));
  const std::uint64_t h = child->first_page_hash;
  parent->children.emplace(h, std::move(child));
}

std::size_t RadixTree::common_pages_tokens(const TreeNode* node, std::span<const TokenId> tokens) const {
  const std::size_t p = static_cast<std::size_t>(cfg_.page_size.value());
  std::size_t n = std::min(node->key.size(), tokens.size() / p * p);
  // Fast path: the whole overlap matches (the common case on a long cached prompt).
  if (std::memcmp(node->key.data(), tokens.data(), n * sizeof(TokenId)) == 0) return n;
  std::size_t m = 0;
  while (m + p <= n && std::memcmp(node->key.data() + m, tokens.data() + m, p * sizeof(TokenId)) == 0) m += p;
  return m;
}

void RadixTree::touch(TreeNode* node) {
  const bool d = node->in_evictable, h = node->in_host_evictable;
  if (d) evictable_.erase(EvictKey{node->last_access, node->id, node});
  if (h) host_evictable_.erase(EvictKey{node->last_access, node->id, node});
  node->last_access = clock_;
  if (d) evictable_.insert(EvictKey{node->last_access, node->id, node});
  if (h) host_evictable_.insert(EvictKey{node->last_access, node->id, node});
}

bool RadixTree::is_candidate(const TreeNode* node) const {
  if (node == root_.get() || node->lock_ref != 0 || node->device.empty()) return false;
  for (const auto& [h, c] : node->children)
    if (!c->device.empty()) return false;
  return true;
}

bool RadixTree::is_host_candidate(const TreeNode* node) const {
  return node != root_.get() && node->lock_ref == 0 && node->device.empty() && !node->host.empty() &&
         node->children.empty();
}

void RadixTree::refresh(TreeNode* node) {
  const bool want = is_candidate(node);
  if (want != node->in_evictable) {
    if (want) evictable_.insert(EvictKey{node->last_access, node->id, node});
    else evictable_.erase(EvictKey{node->last_access, node->id, node});
    node->in_evictable = want;
  }
  const bool want_host = is_host_candidate(node);
  if (want_host != node->in_host_evictable) {
    if (want_host) host_evictable_.insert(EvictKey{node->last_access, node->id, node});
    else host_evictable_.erase(EvictKey{node->last_access, node->id, node});
    node->in_host_evictable = want_host;
  }
}

void RadixTree::delete_leaf(TreeNode* node) {
  KVGRID_CHECK(node != root_.get() && node->children.empty(), "delete of node ", node->id, " with children");
  if (node->in_evictable) evictable_.erase(EvictKey{node->last_access, node->id, node});
  if (node->in_host_evictable) host_evictable_.erase(EvictKey{node->last_access, node->id, node});
  TreeNode* parent = node->parent;
  parent->children.erase(entry_of(node));
  --node_count_;
  refresh(parent);
}

TreeNode* RadixTree::split(TreeNode* child, std::size_t split_tokens) {
  const std::size_t p = static_cast<std::size_t>(cfg_.page_size.value());
  KVGRID_CHECK(split_tokens > 0 && split_tokens < child->key.size() && split_tokens % p == 0,
               "split of a ", child->key.size(), "-token node at ", split_tokens);
  TreeNode* parent = child->parent;
  auto it = entry_of(child);

  auto mid = std::make_unique<TreeNode>();
  mid->id = next_id_++;
  mid->parent = parent;
  mid->key.assign(child->key.begin(), child->key.begin() + static_cast<std::ptrdiff_t>(split_tokens));
  if (!child->device.empty())
    mid->device.assign(child->device.begin(), child->device.begin() + static_cast<std::ptrdiff_t>(split_tokens / p));
  if (!child->host.empty())
    mid->host.assign(child->host.begin(), child->host.begin() + static_cast<std::ptrdiff_t>(split_tokens / p));
  mid->first_page_hash = child->first_page_hash;  // same first page
  mid->lock_ref = child->lock_ref;
  mid->last_access = child->last_access;
  mid->ext = child->ext.split_prefix(Pages(static_cast<std::int64_t>(split_tokens / p)));
  if (!child->page_digests.empty()) {
    const auto cut = child->page_digests.begin() + static_cast<std::ptrdiff_t>(split_tokens / p);
    mid->page_digests.assign(child->page_digests.begin(), cut);
    child->page_digests.erase(child->page_digests.begin(), cut);
  }
  ++node_count_;

  std::unique_ptr<TreeNode> owned = std::move(it->second);
  owned->key.erase(owned->key.begin(), owned->key.begin() + static_cast<std::ptrdiff_t>(split_tokens));
  if (!owned->device.empty())
    owned->device.erase(owned->device.begin(), owned->device.begin() + static_cast<std::ptrdiff_t>(split_tokens / p));
  if (!owned->host.empty())
    owned->host.erase(owned->host.begin(), owned->host.begin() + static_cast<std::ptrdiff_t>(split_tokens / p));
  TreeNode* mid_raw = mid.get();
  it->second = std::move(mid);  // same first page, so the same key in the parent
  add_child(mid_raw, std::move(owned));
  return mid_raw;
}

MatchResult RadixTree::match_prefix(std::span<const TokenId> tokens) {
  if (tokens.size() <= 1) {
    MatchResult r;
    r.last_node = root_.get();
    return r;
  }
  return match_up_to(tokens, tokens.size() - 1);  // reuse at most prompt - 1 tokens
}

MatchResult RadixTree::match_computed(std::span<const TokenId> tokens) { return match_up_to(tokens, tokens.size()); }

MatchResult RadixTree::peek_prefix(std::span<const TokenId> tokens) {
  if (tokens.size() <= 1) {
    MatchResult r;
    r.last_node = root_.get();
    return r;
  }
  return match_up_to(tokens, tokens.size() - 1, false);
}

MatchResult RadixTree::match_up_to(std::span<const TokenId> tokens, std::size_t max_tokens, bool account) {
  const std::size_t p = static_cast<std::size_t>(cfg_.page_size.value());
  MatchResult r;
  r.last_node = root_.get();
  const std::size_t limit = max_tokens / p * p;
  if (limit == 0) return r;
  if (account) ++clock_;

  std::vector<PathStep> path;         // device-resident part
  std::vector<TreeNode*> host_part;   // host-only continuation
  std::size_t host_end = 0;
  TreeNode* node = root_.get();
  std::size_t pos = 0;
  while (pos < limit) {
    auto first = tokens.subspan(pos, p);
    TreeNode* child = find_child(node, first, page_hash(first));
    if (!child) break;
    std::size_t n = common_pages_tokens(child, tokens.subspan(pos, limit - pos));
    const bool partial = n < child->key.size();
    if (partial) child = split(child, n);  // only the matched part counts as accessed
    if (account) touch(child);
    if (child->device.empty() || !host_part.empty()) {
      host_part.push_back(child);  // device-resident nodes form a prefix: the rest is host-only
      host_end = pos + n;
    } else {
      path.push_back({child, Tokens(static_cast<std::int64_t>(pos))});
    }
    node = child;
    pos += n;
    if (partial) break;
  }

  // Components may only shorten the (device) match, to a boundary they can serve.
  const std::size_t device_end =
      path.empty() ? 0 : static_cast<std::size_t>(path.back().start.value()) + path.back().node->key.size();
  Tokens accepted(static_cast<std::int64_t>(device_end));
  for (const auto& c : components_) {
    Tokens a = c->accept_boundary(path, accepted);
    KVGRID_CHECK(a <= accepted && a.value() >= 0 && a.value() % static_cast<std::int64_t>(p) == 0,
                 "component ", c->name(), " returned boundary ", a, " for candidate ", accepted);
    accepted = a;
  }
  const std::size_t acc = static_cast<std::size_t>(accepted.value());
  while (!path.empty() && static_cast<std::size_t>(path.back().start.value()) >= acc) path.pop_back();
  if (!path.empty()) {
    auto* last = const_cast<TreeNode*>(path.back().node);
    const std::size_t end = static_cast<std::size_t>(path.back().start.value()) + last->key.size();
    if (end > acc) last = split(last, acc - static_cast<std::size_t>(path.back().start.value()));
    path.back().node = last;
  }

  r.matched = accepted;
  r.device_pages.reserve(acc / p);
  for (const auto& st : path) {
    auto* n = const_cast<TreeNode*>(st.node);
    r.device_pages.insert(r.device_pages.end(), n->device.begin(), n->device.end());
    if (account) ++n->ext.hit_count;
  }
  r.last_node = path.empty() ? root_.get() : const_cast<TreeNode*>(path.back().node);
  // The host continuation counts only when the device part was accepted whole.
  r.host_matched = accepted;
  if (!host_part.empty() && acc == device_end) {
    for (TreeNode* n : host_part) r.host_pages.insert(r.host_pages.end(), n->host.begin(), n->host.end());
    r.host_path = std::move(host_part);
    r.host_matched = Tokens(static_cast<std::int64_t>(host_end));
  }
  return r;
}

InsertResult RadixTree::insert(std::span<const TokenId> tokens, std::span<const PageId> pages) {
  const std::size_t p = static_cast<std::size_t>(cfg_.page_size.value());
  KVGRID_CHECK(tokens.size() % p == 0, "insert of ", tokens.size(), " tokens, not a multiple of page size ", p);
  KVGRID_CHECK(pages.size() == tokens.size() / p, "insert of ", tokens.size(), " tokens with ", pages.size(), " pages");
  ++clock_;
  InsertResult r;
  TreeNode* node = root_.get();
  std::size_t pos = 0, present = 0;
  bool adopted = false;
  while (pos < tokens.size()) {
    auto first = tokens.subspan(pos, p);
    const std::uint64_t h = page_hash(first);
    TreeNode* child = find_child(node, first, h);
    if (!child) {
      auto leaf = std::make_unique<TreeNode>();
      leaf->id = next_id_++;
      leaf->key.assign(tokens.begin() + static_cast<std::ptrdiff_t>(pos), tokens.end());
      leaf->device.assign(pages.begin() + static_cast<std::ptrdiff_t>(pos / p), pages.end());
      check_rotation(node, leaf->device, "insert");
      leaf->ext.shards = cfg_.shards;
      leaf->ext.rotation_base = cfg_.shards > 1 ? leaf->device.front().value() % cfg_.shards : 0;
      leaf->last_access = clock_;
      TreeNode* raw = leaf.get();
      evictable_pages_ += raw->pages();
      ++node_count_;
      add_child(node, std::move(leaf));
      refresh(node);
      refresh(raw);
      r.prefix_len = Tokens(static_cast<std::int64_t>(adopted ? present : pos));
      r.last_node = raw;
      return r;
    }
    std::size_t n = common_pages_tokens(child, tokens.subspan(pos));
    if (n < child->key.size()) child = split(child, n);
    touch(child);
    if (child->device.empty()) {
      // A host-only node on the path takes the caller's pages for its range (they hold the same KV).
      set_device(child, pages.subspan(pos / p, n / p));
      adopted = true;
    } else if (!adopted) {
      present = pos + n;
    }
    node = child;
    pos += n;
  }
  r.prefix_len = Tokens(static_cast<std::int64_t>(present));
  r.last_node = node;
  return r;
}

void RadixTree::lock(TreeNode* node) {
  for (TreeNode* n = node; n != root_.get(); n = n->parent) {
    if (n->lock_ref == 0) {
      evictable_pages_ -= n->pages();
      protected_pages_ += n->pages();
    }
    ++n->lock_ref;
    refresh(n);
  }
}

void RadixTree::unlock(TreeNode* node) {
  for (TreeNode* n = node; n != root_.get(); n = n->parent) {
    KVGRID_CHECK(n->lock_ref > 0, "unlock of node ", n->id, " with lock_ref 0");
    --n->lock_ref;
    if (n->lock_ref == 0) {
      protected_pages_ -= n->pages();
      evictable_pages_ += n->pages();
    }
    refresh(n);
  }
}

std::vector<PageId> RadixTree::evict(Pages n, const std::function<void(TreeNode*)>& before_drop) {
  std::vector<PageId> freed;
  while (static_cast<std::int64_t>(freed.size()) < n.value() && !evictable_.empty()) {
    TreeNode* victim = evictable_.begin()->node;
    if (victim->host.empty() && before_drop) {
      before_drop(victim);
      // The hook adds host pages (a write-back), or starts a backup that locks the victim until it
      // is published (a write-back across pipeline stages): then it is not evicted now.
      if (evictable_.empty() || evictable_.begin()->node != victim) {
        KVGRID_CHECK(victim->ext.pending_write != 0, "write-back changed the eviction order");
        continue;
      }
    }
    freed.insert(freed.end(), victim->device.begin(), victim->device.end());
    evictable_pages_ -= victim->pages();
    if (!victim->host.empty()) {
      victim->device.clear();  // backed up: stays as a host-only node
      refresh(victim);
      refresh(victim->parent);
    } else {
      delete_leaf(victim);
    }
  }
  return freed;
}

std::vector<PageId> RadixTree::evict_host(Pages n) {
  std::vector<PageId> freed;
  while (static_cast<std::int64_t>(freed.size()) < n.value() && !host_evictable_.empty()) {
    TreeNode* victim = host_evictable_.begin()->node;
    freed.insert(freed.end(), victim->host.begin(), victim->host.end());
    host_pages_ -= Pages(static_cast<std::int64_t>(victim->host.size()));
    delete_leaf(victim);
  }
  return freed;
}

void RadixTree::set_host(TreeNode* node, std::span<const PageId> host_pages) {
  const std::size_t p = static_cast<std::size_t>(cfg_.page_size.value());
  KVGRID_CHECK(node != root_.get() && node->host.empty(), "backup of node ", node->id, " that is the root or backed up");
  KVGRID_CHECK(host_pages.size() == node->key.size() / p, "backup of ", node->key.size() / p, " pages with ",
               host_pages.size(), " host pages");
  KVGRID_CHECK(node->parent == root_.get() || !node->parent->host.empty(), "backup of node ", node->id,
               " whose parent is not backed up");
  node->host.assign(host_pages.begin(), host_pages.end());
  host_pages_ += Pages(static_cast<std::int64_t>(host_pages.size()));
  refresh(node);
}

std::vector<PageId> RadixTree::insert_host(std::span<const TokenId> tokens, Tokens start,
                                           std::span<const PageId> host_pages) {
  const std::size_t p = static_cast<std::size_t>(cfg_.page_size.value());
  const std::size_t from = static_cast<std::size_t>(start.value());
  KVGRID_CHECK(tokens.size() % p == 0 && from % p == 0 && from <= tokens.size() && host_pages.size() == (tokens.size() - from) / p,
               "insert_host of ", tokens.size(), " tokens from ", from, " with ", host_pages.size(), " pages");
  auto slice = [&](std::size_t a, std::size_t b) { return host_pages.subspan((a - from) / p, (b - a) / p); };
  std::vector<PageId> unused;
  ++clock_;
  TreeNode* node = root_.get();
  std::size_t pos = 0;
  while (pos < tokens.size()) {
    auto first = tokens.subspan(pos, p);
    TreeNode* child = find_child(node, first, page_hash(first));
    const bool parent_backed = node == root_.get() || !node->host.empty();
    if (!child) {
      KVGRID_CHECK(pos >= from, "insert_host: the cached prefix [0, ", from, ") is missing at ", pos);
      if (!parent_backed) break;
      auto leaf = std::make_unique<TreeNode>();
      leaf->id = next_id_++;
      leaf->key.assign(tokens.begin() + static_cast<std::ptrdiff_t>(pos), tokens.end());
      auto s = slice(pos, tokens.size());
      leaf->host.assign(s.begin(), s.end());
      leaf->ext.shards = cfg_.shards;
      if (cfg_.shards > 1 && node != root_.get())  // a prefetched continuation keeps the path's rotation
        leaf->ext.rotation_base = static_cast<std::uint32_t>(
            (node->ext.rotation_base + node->key.size() / p) % cfg_.shards);
      leaf->last_access = clock_;
      TreeNode* raw = leaf.get();
      host_pages_ += Pages(static_cast<std::int64_t>(raw->host.size()));
      ++node_count_;
      add_child(node, std::move(leaf));
      refresh(node);
      refresh(raw);
      return unused;
    }
    std::size_t n = common_pages_tokens(child, tokens.subspan(pos));
    if (pos < from && pos + n > from) n = from - pos;  // the prefetched range starts on a node boundary
    if (n < child->key.size()) child = split(child, n);
    touch(child);
    if (pos + n > from) {
      if (!child->host.empty()) {
        auto s = slice(pos, pos + n);
        unused.insert(unused.end(), s.begin(), s.end());  // already backed up: ours are duplicates
      } else if (parent_backed && child->ext.pending_write == 0) {
        set_host(child, slice(pos, pos + n));  // the device node gets its host copy from storage
      } else {
        break;
      }
    }
    node = child;
    pos += n;
  }
  if (pos < tokens.size()) {
    auto s = slice(std::max(pos, from), tokens.size());
    unused.insert(unused.end(), s.begin(), s.end());
  }
  return unused;
}

void RadixTree::set_device(TreeNode* node, std::span<const PageId> device_pages) {
  const std::size_t p = static_cast<std::size_t>(cfg_.page_size.value());
  KVGRID_CHECK(node != root_.get() && node->device.empty() && !node->host.empty(), "load-back into node ", node->id,
               " that is not host-only");
  KVGRID_CHECK(device_pages.size() == node->key.size() / p, "load-back of ", node->key.size() / p, " pages with ",
               device_pages.size(), " device pages");
  KVGRID_CHECK(node->parent == root_.get() || !node->parent->device.empty(), "load-back of node ", node->id,
               " whose parent is not device-resident");
  // Every page restored onto its owner (debug check: the buggy variant any_owner_restore must be
  // caught by the oracle, as in production, when the check is off).
  if (cfg_.shards > 1 && KVGRID_DEBUG_CHECKS_ON()) {
    const CpPlacement pl{cfg_.shards, p};
    std::string why = rotation_error(pl, device_pages);
    if (why.empty() && pl.page_owner(device_pages.front().value()) != node->ext.rotation_base)
      why = "its first page (logical " + std::to_string(device_pages.front().value()) + ") is owned by rank " +
            std::to_string(pl.page_owner(device_pages.front().value())) + ", the node's first page by rank " +
            std::to_string(node->ext.rotation_base);
    KVGRID_CHECK(why.empty(), "load-back into node ", node->id, " would move pages off their owners: ", why);
  }
  node->device.assign(device_pages.begin(), device_pages.end());
  (node->lock_ref > 0 ? protected_pages_ : evictable_pages_) += node->pages();
  refresh(node);
  refresh(node->parent);
}

void RadixTree::verify(VerifyDepth depth) const {
  const std::size_t p = static_cast<std::size_t>(cfg_.page_size.value());
  const bool rolling = depth == VerifyDepth::Rolling;
  const std::uint64_t slice = rolling ? rolling_verifies_++ % kVerifySlices : 0;
  KVGRID_CHECK(root_->key.empty() && root_->device.empty() && root_->host.empty() && root_->parent == nullptr &&
                   root_->lock_ref == 0,
               "root state");
  // Page ids seen, as bitmaps (not hash sets: verify runs on large trees).
  std::vector<std::uint8_t> seen, seen_host;
  auto mark = [](std::vector<std::uint8_t>& bits, PageId pg, const char* tier, std::uint64_t node) {
    KVGRID_CHECK(pg.value() != 0, "node ", node, " holds the padding page");
    if (pg.value() >= bits.size()) bits.resize(std::max<std::size_t>(2 * bits.size(), pg.value() + 1), 0);
    KVGRID_CHECK(!bits[pg.value()], tier, " page ", pg, " appears twice in the tree");
    bits[pg.value()] = 1;
  };
  std::size_t nodes = 0, candidates = 0, host_candidates = 0;
  std::int64_t evictable = 0, prot = 0, host = 0;
  std::vector<const TreeNode*> stack{root_.get()};
  while (!stack.empty()) {
    const TreeNode* n = stack.back();
    stack.pop_back();
    std::int64_t child_locks = 0;
    for (const auto& [h, owned] : n->children) {
      const TreeNode* c = owned.get();
      KVGRID_CHECK(c->parent == n, "node ", c->id, " has a wrong parent pointer");
      KVGRID_CHECK(!c->key.empty() && c->key.size() % p == 0, "node ", c->id, " key of ", c->key.size(), " tokens");
      KVGRID_CHECK(c->device.empty() || c->device.size() == c->key.size() / p, "node ", c->id, " has ", c->device.size(),
                   " device pages for ", c->key.size(), " tokens");
      KVGRID_CHECK(c->host.empty() || c->host.size() == c->key.size() / p, "node ", c->id, " has ", c->host.size(),
                   " host pages for ", c->key.size(), " tokens");
      KVGRID_CHECK(!c->device.empty() || !c->host.empty(), "node ", c->id, " holds no pages in any tier");
      KVGRID_CHECK(c->device.empty() || n == root_.get() || !n->device.empty(), "device-resident node ", c->id,
                   " under a node that is not (device nodes must form a prefix)");
      KVGRID_CHECK(c->host.empty() || n == root_.get() || !n->host.empty(), "backed-up node ", c->id,
                   " under a node that is not (backed-up nodes must form a prefix)");
      KVGRID_CHECK(c->first_page_hash == h, "node ", c->id, " is filed under another hash than its own");
      if (!rolling || c->key_rehashed != c->key.size() || c->id % kVerifySlices == slice) {
        KVGRID_CHECK(h == hash_u32(std::span<const TokenId>(c->key.data(), p)), "node ", c->id,
                     " is filed under a stale first-page hash");
        c->key_rehashed = c->key.size();
      }
      auto [same, end] = n->children.equal_range(h);
      for (; same != end; ++same)
        KVGRID_CHECK(same->second.get() == c ||
                         !std::equal(c->key.begin(), c->key.begin() + static_cast<std::ptrdiff_t>(p), same->second->key.begin()),
                     "children of node ", n->id, " share a first page");
      KVGRID_CHECK(c->lock_ref >= 0, "node ", c->id, " lock_ref ", c->lock_ref);
      child_locks += c->lock_ref;
      for (PageId pg : c->device) mark(seen, pg, "device", c->id);
      for (PageId pg : c->host) mark(seen_host, pg, "host", c->id);
      host += static_cast<std::int64_t>(c->host.size());
      KVGRID_CHECK(c->in_host_evictable == is_host_candidate(c), "node ", c->id, " host-eviction flag is stale");
      if (c->in_host_evictable) {
        ++host_candidates;
        KVGRID_CHECK(host_evictable_.count(EvictKey{c->last_access, c->id, nullptr}) == 1, "host candidate node ", c->id,
                     " missing from the host eviction set");
      }
      (c->lock_ref > 0 ? prot : evictable) += c->pages().value();
      KVGRID_CHECK(c->in_evictable == is_candidate(c), "node ", c->id, " eviction-candidate flag is stale");
      if (c->in_evictable) {
        ++candidates;
        KVGRID_CHECK(evictable_.count(EvictKey{c->last_access, c->id, nullptr}) == 1,
                     "candidate node ", c->id, " missing from the eviction set");
      }
      ++nodes;
      stack.push_back(c);
    }
    if (n != root_.get())
      KVGRID_CHECK(n->lock_ref >= child_locks, "node ", n->id, " lock_ref ", n->lock_ref, " < children's ", child_locks);
  }
  KVGRID_CHECK(nodes == node_count_, "node count ", node_count_, " but ", nodes, " reachable");
  KVGRID_CHECK(candidates == evictable_.size(), "eviction set holds ", evictable_.size(), " but ", candidates,
               " candidates exist");
  KVGRID_CHECK(evictable == evictable_pages_.value() && prot == protected_pages_.value(), "page counters: evictable ",
               evictable_pages_, "/", evictable, " protected ", protected_pages_, "/", prot);
  KVGRID_CHECK(host_candidates == host_evictable_.size(), "host eviction set holds ", host_evictable_.size(), " but ",
               host_candidates, " candidates exist");
  KVGRID_CHECK(host == host_pages_.value(), "host page counter ", host_pages_, " but ", host, " in the tree");
}

std::uint64_t RadixTree::digest() const {
  const std::size_t p = static_cast<std::size_t>(cfg_.page_size.value());
  std::uint64_t acc = mix64(p);
  struct Item {
    const TreeNode* node;
    std::uint64_t chain;
  };
  std::vector<Item> stack{{root_.get(), 0}};
  while (!stack.empty()) {
    auto [n, chain] = stack.back();
    stack.pop_back();
    const std::size_t pages = n->key.size() / p;
    const std::uint64_t tiers = (n->device.empty() ? 0 : 1) | (n->host.empty() ? 0 : 2);
    const std::uint64_t state = mix64(static_cast<std::uint64_t>(n->lock_ref) + 0x5bd1e995ULL + (tiers << 40));
    TreeNode::DigestMemo& m = n->digest_memo;
    if (m.pages != pages || m.chain_in != chain || m.state != state) {  // (new, split, locked, moved tiers)
      auto& pd = n->page_digests;
      if (pd.size() != pages) {  // (new since the last digest)
        pd.resize(pages);
        for (std::size_t i = 0; i < pd.size(); ++i) pd[i] = hash_u32(std::span<const TokenId>(n->key.data() + i * p, p));
      }
      m = TreeNode::DigestMemo{pages, chain, state, 0, chain};
      for (std::size_t i = 0; i < pages; ++i) {
        m.chain_out = hash_combine(m.chain_out, pd[i]);
        m.sum += mix64(m.chain_out ^ state);
      }
    }
    acc += m.sum;  // wrapping sum: independent of traversal order and of where nodes are split
    for (const auto& [h, c] : n->children) stack.push_back({c.get(), m.chain_out});
  }
  return acc;
}

}  // namespace kvgrid::cache
