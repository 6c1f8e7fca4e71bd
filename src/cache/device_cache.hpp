// The device tier of one rank's prefix cache: radix tree + device page pool, and the decisions
// that tie them (what SGLang's scheduler does around `match_prefix` / `cache_unfinished_req`).
//
// `admit` takes one request's prompt through: match_prefix → lock the hit → evict to make room →
// allocate the missing pages (all or nothing) → insert the page-aligned prompt → free duplicate
// pages → move the lock to the inserted leaf. Every decision is recorded in the rank's decision
// log, so ranks that must agree can be compared (`kvgrid check`, the consensus checker).
// Ownership: an admitted request holds one lock (on `Admission::node`) until `release`.
#pragma once

#include <cstdint>
#include <span>

#include "cache/device_pool.hpp"
#include "cache/radix_tree.hpp"
#include "core/decision_log.hpp"

namespace kvgrid::cache {

struct DeviceCacheConfig {
  Tokens page_size{16};
  Pages device_pages{1024};
};

struct Admission {
  bool admitted = false;
  Tokens prompt{0};
  Tokens matched{0};        // reused from the cache
  Pages new_pages{0};       // allocated for the uncached part
  Pages duplicate_pages{0};  // allocated but already present (freed again)
  Pages evicted{0};         // pages evicted to make room
  TreeNode* node = nullptr;  // locked while the request holds its prefix (null: nothing locked)
};

class DeviceCache {
 public:
  DeviceCache(const DeviceCacheConfig& cfg, DecisionLog& log);

  Admission admit(RequestId id, std::span<const TokenId> prompt);
  void release(const Admission& a);

  const RadixTree& tree() const { return tree_; }
  RadixTree& tree() { return tree_; }
  const DevicePool& pool() const { return pool_; }
  // Tree and pool invariants, plus "every allocated page is in the tree or held by nobody":
  // pages in the tree == allocated pages. Throws InternalError.
  void verify() const;
  std::uint64_t digest() const { return tree_.digest(); }

 private:
  void debug_verify() const;
  RadixTree tree_;
  DevicePool pool_;
  DecisionLog& log_;
};

}  // namespace kvgrid::cache
