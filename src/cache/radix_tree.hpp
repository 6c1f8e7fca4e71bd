// Paged radix tree of cached prefixes (the FULL component).
//
// What it is: a token-keyed trie whose edges hold whole pages of tokens. Each node's key is a
// multiple of `page_size` tokens and its `device` vector holds one device page per page of key.
// The tree answers "how much of this prompt is cached, and in which pages?" (`match_prefix`),
// records new prefixes (`insert`), protects prefixes in use (`lock`/`unlock`) and gives pages back
// under pressure (`evict`).
//
// Invariants (checked by `verify()`):
//  * every non-root key is a non-empty page multiple; children of a node start with distinct
//    first pages and are filed under the hash of their first page;
//  * a node's lock_ref = locks ending at it + the sum of its children's lock_ref (a lock protects
//    the whole path to the root); locked pages are "protected", the others "evictable";
//  * a node holds device pages, host pages or both (one per page of key each); device-resident
//    nodes form a prefix from the root, and so do backed-up (host) nodes;
//  * a node is a device-eviction candidate iff it is unlocked, device-resident and no child is;
//    a host-eviction candidate iff it is unlocked, host-only and a leaf;
//  * every device page and every host page appears at most once in the tree.
// Eviction order is LRU on a logical access counter bumped by every match and insert, ties broken
// by node id — never wall time — so ranks that take the same calls evict the same nodes.
//
// Extension points: per-node state for later tiers lives in `NodeExt` (split with the node); a
// match boundary is accepted only where every `TreeComponent` accepts it (FULL accepts all;
// SWA/MAMBA components will veto boundaries they cannot serve).
//
// Not thread-safe: one tree per rank, used from the scheduler thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/ids.hpp"

namespace kvgrid::cache {

// Per-node state owned by components beyond the device tier. Later tiers add host pages, storage
// hashes and the CP rotation base here; `split_prefix` says how each field divides on a split.
struct NodeExt {
  std::uint64_t hit_count = 0;      // matches that reached this node (write_through_selective uses it)
  std::uint64_t pending_write = 0;  // id of an unpublished device→host backup of this node (0: none)
  // write_back across stages: this node's write-back was published as failed (on some stage); its
  // next eviction drops it instead of trying again (host_tier.hpp, write_back).
  bool write_back_failed = false;
  // Private restores (P/D decode) of this host-only node in flight: no other request restores it
  // again meanwhile (it reuses only what precedes it).
  std::uint32_t restoring = 0;
  // CP page ownership (cp_placement.hpp): the owner of the node's first page among `shards`; the
  // owners of its pages continue cyclically. Kept while the node is host-only, so a restore
  // puts each page back on its owner.
  std::uint32_t rotation_base = 0, shards = 1;
  // The state of the first `prefix_pages` pages, for the new parent created by a split; `*this`
  // keeps the rest.
  NodeExt split_prefix(Pages prefix_pages);
};

struct TreeNode {
  std::uint64_t id = 0;
  TreeNode* parent = nullptr;
  std::vector<TokenId> key;
  std::vector<PageId> device;  // empty: evicted from the device (host-only)
  std::vector<PageId> host;    // empty: not backed up on the host
  // Keyed by the hash of the child's first page; children of one node have distinct first pages.
  // Iteration order carries no meaning: no decision depends on it (digest and verify are
  // order-independent), so lookups, inserts and erases stay O(1) for wide nodes.
  std::unordered_multimap<std::uint64_t, std::unique_ptr<TreeNode>> children;
  std::uint64_t first_page_hash = 0;
  std::int64_t lock_ref = 0;
  std::uint64_t last_access = 0;
  NodeExt ext;
  bool in_evictable = false;       // a device-eviction candidate
  bool in_host_evictable = false;  // a host-eviction candidate
  // digest()'s hash of each page of `key`, kept between digests (a split divides it).
  mutable std::vector<std::uint64_t> page_digests;
  // digest()'s sum over this node's pages, with what it was summed from (the page count, the chain
  // before the first page, the node's lock and tier state) and the chain after the last page: a node
  // whose inputs are the same adds the same sum, so a digest re-sums only the nodes that changed.
  struct DigestMemo {
    std::size_t pages = static_cast<std::size_t>(-1);
    std::uint64_t chain_in = 0, state = 0, sum = 0, chain_out = 0;
  };
  mutable DigestMemo digest_memo;
  // verify()'s: the key length when it last re-hashed the first page (0: not yet). Keys change only
  // by insert (a new node) and split (a new prefix node; the rest's key shortens).
  mutable std::size_t key_rehashed = 0;

  Pages pages() const { return Pages(static_cast<std::int64_t>(device.size())); }  // device pages
  Pages key_pages(std::size_t page_size) const { return Pages(static_cast<std::int64_t>(key.size() / page_size)); }
  bool is_leaf() const { return children.empty(); }
};

// How much of the tree verify() re-reads. Full: every invariant on every node, each node's first page
// re-hashed against the hash it is filed under. Rolling (the periodic check): the same, but a node's
// first page is re-hashed only where its key is new or shortened by a split since verify last
// re-hashed it, and for the nodes of one id slice in kVerifySlices, a different slice each call — a
// key changed in place behind the tree's back is caught within kVerifySlices rolling calls (while the
// node stays in the tree), not at the next.
enum class VerifyDepth { Full, Rolling };
inline constexpr std::uint64_t kVerifySlices = 8;

// One node of a candidate match path, with the token offset where its key starts.
struct PathStep {
  const TreeNode* node;
  Tokens start;
};

// Decides which match boundaries a component can serve. `candidate` is a page multiple; the
// result must be a page multiple <= candidate.
class TreeComponent {
 public:
  virtual ~TreeComponent() = default;
  virtual std::string_view name() const = 0;
  virtual Tokens accept_boundary(std::span<const PathStep> path, Tokens candidate) const = 0;
};

// FULL attention: every cached page is usable, so every boundary is accepted.
class FullComponent final : public TreeComponent {
 public:
  std::string_view name() const override { return "full"; }
  Tokens accept_boundary(std::span<const PathStep>, Tokens candidate) const override { return candidate; }
};

struct MatchResult {
  Tokens matched{0};                 // device hit: page multiple, <= prompt - 1
  std::vector<PageId> device_pages;  // matched / page_size pages, in prefix order
  TreeNode* last_node = nullptr;     // deepest device-resident matched node (the root when none)
  // The host tier continues the match past the device boundary through host-only nodes:
  Tokens host_matched{0};            // total hit (device + host-only part), >= matched
  std::vector<PageId> host_pages;    // host pages of [matched, host_matched)
  std::vector<TreeNode*> host_path;  // the host-only nodes of that range, in order
};

struct InsertResult {
  Tokens prefix_len{0};              // tokens that were already present
  TreeNode* last_node = nullptr;     // the node ending the inserted key
};

struct TreeConfig {
  Tokens page_size{16};
  // CP page ownership: > 1 makes page ids logical (owner = id mod shards) and the tree checks that
  // owners run cyclically along every path (an insertion that would join incompatible rotations
  // is rejected, saying why).
  std::uint32_t shards = 1;
};

class RadixTree {
 public:
  explicit RadixTree(TreeConfig cfg);
  ~RadixTree();
  RadixTree(const RadixTree&) = delete;
  RadixTree& operator=(const RadixTree&) = delete;

  // Adds a component (FULL is always present). Components are asked in order.
  void add_component(std::unique_ptr<TreeComponent> c);

  // Longest cached prefix of `tokens`, reusing at most tokens.size() - 1 tokens (the last prompt
  // token must be computed to produce logits), rounded down to whole pages. Splits a node when
  // the match ends inside it. Bumps the access counter of the matched path.
  MatchResult match_prefix(std::span<const TokenId> tokens);
  // Longest cached page-aligned prefix of `tokens` itself (no prompt − 1 rule): what a request
  // that has computed `tokens` finds after inserting them (chunked prefill re-match).
  MatchResult match_computed(std::span<const TokenId> tokens);
  // match_prefix without counting an access (no LRU touch, no hit count): the storage tier's look
  // at what a just-arrived request would find, before the request is scheduled.
  MatchResult peek_prefix(std::span<const TokenId> tokens);

  // Inserts a page-aligned key with one device page per page. The pages for the part already
  // present are NOT taken: the caller frees those of `pages[0 : prefix_len/page_size]` that are
  // not the tree's own (duplicates). Bumps the access counter of the path.
  InsertResult insert(std::span<const TokenId> tokens, std::span<const PageId> pages);

  // Protects the path from `node` to the root from eviction (counted).
  void lock(TreeNode* node);
  void unlock(TreeNode* node);

  // Evicts unlocked device leaves (no device-resident child) in LRU order until at least `n`
  // device pages are freed or no candidate is left; returns the freed device pages. A backed-up
  // victim stays as a host-only node; the others leave the tree.
  // `before_drop` (optional) is called for a victim that is not backed up, before it would be
  // deleted: if it gives the node host pages (write_back), the node stays as a host-only node;
  // if it starts a backup that locks the node (write_back across stages), the node is skipped.
  std::vector<PageId> evict(Pages n, const std::function<void(TreeNode*)>& before_drop = {});

  // Host tier. `set_host` publishes a finished device→host backup of a node (its parent must be
  // backed up, or be the root: backed-up nodes form a prefix). `set_device` attaches device pages
  // to a host-only node whose parent is device-resident (a load-back). `evict_host` removes
  // unlocked host-only leaves in LRU order and returns their host pages.
  void set_host(TreeNode* node, std::span<const PageId> host_pages);
  void set_device(TreeNode* node, std::span<const PageId> device_pages);
  std::vector<PageId> evict_host(Pages n);
  // A finished storage prefetch: `tokens` (page-aligned) is cached up to `start` (a backed-up
  // path, or the root); `host_pages` hold pages [start, tokens.size()) read from storage. Adds
  // them as host-only nodes, or as the host copy of device nodes on the path that have none
  // (keeping backed-up nodes a prefix). Returns the pages not used (already cached, or beyond a
  // node that cannot take them); the caller frees them.
  std::vector<PageId> insert_host(std::span<const TokenId> tokens, Tokens start, std::span<const PageId> host_pages);
  Pages host_pages() const { return host_pages_; }

  Tokens page_size() const { return cfg_.page_size; }
  Pages total_pages() const { return evictable_pages_ + protected_pages_; }
  Pages evictable_pages() const { return evictable_pages_; }
  Pages protected_pages() const { return protected_pages_; }
  std::size_t node_count() const { return node_count_; }  // excluding the root
  std::size_t eviction_candidates() const { return evictable_.size(); }
  const TreeNode* root() const { return root_.get(); }
  TreeNode* root() { return root_.get(); }

  // Throws InternalError naming the first broken invariant.
  void verify(VerifyDepth depth = VerifyDepth::Full) const;
  // Digest of the logical content: the set of cached page prefixes with their lock counts.
  // Independent of split points, node ids and child order.
  std::uint64_t digest() const;

 private:
  struct EvictKey {
    std::uint64_t last_access, id;
    TreeNode* node;
    bool operator<(const EvictKey& o) const {
      return last_access != o.last_access ? last_access < o.last_access : id < o.id;
    }
  };

  MatchResult match_up_to(std::span<const TokenId> tokens, std::size_t limit, bool account = true);
  // Throws InternalError when `pages` under `parent` break the cyclic owner sequence (shards > 1).
  void check_rotation(const TreeNode* parent, std::span<const PageId> pages, const char* what) const;
  TreeNode* find_child(TreeNode* node, std::span<const TokenId> first_page, std::uint64_t h) const;
  // The parent's entry that owns `child`.
  std::unordered_multimap<std::uint64_t, std::unique_ptr<TreeNode>>::iterator entry_of(TreeNode* child);
  void add_child(TreeNode* parent, std::unique_ptr<TreeNode> child);
  TreeNode* split(TreeNode* child, std::size_t split_tokens);
  std::size_t common_pages_tokens(const TreeNode* node, std::span<const TokenId> tokens) const;
  void touch(TreeNode* node);
  bool is_candidate(const TreeNode* node) const;
  bool is_host_candidate(const TreeNode* node) const;
  void refresh(TreeNode* node);
  void delete_leaf(TreeNode* node);
  std::uint64_t page_hash(std::span<const TokenId> page) const;

  TreeConfig cfg_;
  std::unique_ptr<TreeNode> root_;
  std::vector<std::unique_ptr<TreeComponent>> components_;
  std::set<EvictKey> evictable_, host_evictable_;
  std::uint64_t clock_ = 0, next_id_ = 1;
  mutable std::uint64_t rolling_verifies_ = 0;  // (picks each rolling verify's slice)
  std::size_t node_count_ = 0;
  Pages evictable_pages_{0}, protected_pages_{0};  // device pages, by lock state
  Pages host_pages_{0};
};

}  // namespace kvgrid::cache
