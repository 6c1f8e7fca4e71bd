// CP page ownership (issue "CP ownership"; first article §1): arithmetic placement of logical KV
// pages on N shard ranks, and the owner-rotating allocator every shard rank runs identically.
//
// Placement, for N shard ranks, page size p and a logical token slot x:
//   logical page q = ⌊x / p⌋, owner r = q mod N, owner-local row ℓ = ⌊q / N⌋·p + (x mod p).
// No lookup table: the tree, request tables and transfer queues keep logical ids; only the copy
// boundary translates. Local page 0 of every rank is its padding page, so logical pages 0..N-1
// are never allocated.
//
// Rotation: along a cached prefix the owners are cyclic — after a page owned by r comes one owned
// by (r + 1) mod N — so every rank holds ⌈n/N⌉ or ⌊n/N⌋ of a prefix's n pages and an extension
// continues the cycle (`alloc_chain(first_owner, n)`). Every shard rank runs the same allocator on
// the same logical state, so all of them allocate the same logical pages without talking.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "core/ids.hpp"

namespace kvgrid::cache {

struct CpPlacement {
  std::uint32_t shards = 1;    // N
  std::uint64_t page_size = 1;  // p, tokens

  std::uint64_t logical_page(std::uint64_t slot) const { return slot / page_size; }
  std::uint32_t owner(std::uint64_t slot) const { return page_owner(logical_page(slot)); }
  std::uint64_t local_row(std::uint64_t slot) const {
    return logical_page(slot) / shards * page_size + slot % page_size;
  }
  std::uint32_t page_owner(std::uint64_t q) const { return static_cast<std::uint32_t>(q % shards); }
  std::uint64_t local_page(std::uint64_t q) const { return q / shards; }
  std::uint64_t logical(std::uint32_t owner, std::uint64_t local_page) const { return local_page * shards + owner; }
};

// Empty when `pages` (in prefix order) have cyclic owners; otherwise why not.
std::string rotation_error(const CpPlacement& placement, std::span<const PageId> pages);

class ShardedAllocator {
 public:
  // `pages_per_rank` includes the padding page: local pages 1..pages_per_rank-1 are allocatable.
  ShardedAllocator(CpPlacement placement, std::uint64_t pages_per_rank);

  // `n` logical pages whose owners are first_owner, first_owner + 1, ... (mod N), each the lowest
  // free local page of its owner; all or nothing.
  std::optional<std::vector<PageId>> alloc_chain(std::uint32_t first_owner, std::uint64_t n);
  void free(std::span<const PageId> pages);

  std::uint64_t free_pages(std::uint32_t owner) const { return free_[owner].size(); }
  std::uint64_t used_pages(std::uint32_t owner) const { return per_rank_ - 1 - free_[owner].size(); }
  const CpPlacement& placement() const { return placement_; }

 private:
  CpPlacement placement_;
  std::uint64_t per_rank_;
  std::vector<std::set<std::uint64_t>> free_;  // per owner: free local pages (lowest first)
};

}  // namespace kvgrid::cache
