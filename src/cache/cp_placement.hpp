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
// continues the cycle. Every chain that starts at the root starts on rank 0, so the owner of the
// page at position P of any cached prefix is P mod N: two requests that computed the same prefix
// independently hold it with the same owners, and their insertions are always compatible. The
// owner-rotating allocator is DevicePool's sharded mode (device_pool.hpp); every shard rank runs it
// identically on the same logical state, so all of them allocate the same logical pages without
// talking.
#pragma once

#include <cstdint>
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


}  // namespace kvgrid::cache
