// Page pool of one tier (the device pool L1, and the host pool L2): a fixed number of KV pages
// and their allocator.
//
// Unsharded: page ids run from 1 to capacity; page 0 is the padding page (attention kernels point
// unused slots at it) and is never handed out.
// CP-sharded (cp_placement.hpp, N = placement.shards > 1): page ids are *logical*; page q lives on
// rank q mod N at local page ⌊q/N⌋, each rank holds `capacity` local pages 1..capacity (local page
// 0 is its padding page, so logical pages 0..N-1 are never handed out), and `alloc(n, first_owner)`
// returns a chain whose owners run first_owner, first_owner + 1, ... (mod N). Every shard rank runs
// the same pool over the same logical state, so all of them hand out the same ids.
// `alloc` is all-or-nothing and deterministic (the same sequence of calls gives the same ids on
// every rank). Freeing a page twice, or a page outside the pool, is a bug (InternalError).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "cache/cp_placement.hpp"
#include "core/ids.hpp"

namespace kvgrid::cache {

class DevicePool {
 public:
  // `capacity`: pages (per rank when sharded).
  explicit DevicePool(Pages capacity, CpPlacement placement = {});

  // `n` pages, or nothing when they cannot all be found. Sharded: the k-th page is owned by
  // (first_owner + k) mod N (unsharded: first_owner is ignored).
  std::optional<std::vector<PageId>> alloc(Pages n, std::uint32_t first_owner = 0);
  // `n` pages from whichever owners have the most free pages (ties: the lowest rank) — owners are
  // not cyclic. Only the buggy restore variant any_owner_restore allocates like this.
  std::optional<std::vector<PageId>> alloc_any(Pages n);
  // How many pages must be freed (at least) before alloc(n, first_owner) can succeed.
  Pages shortfall(Pages n, std::uint32_t first_owner = 0) const;
  void free(std::span<const PageId> pages);
  // Called with every freed batch before its pages can be handed out again (the KV pools poison
  // them: a read of a page that nobody wrote since must not find the KV it held before).
  void set_on_free(std::function<void(std::span<const PageId>)> f) { on_free_ = std::move(f); }

  // Totals over every owner (logical pages).
  Pages capacity() const { return Pages(capacity_.value() * shards()); }
  Pages free_pages() const;
  Pages free_pages(std::uint32_t owner) const { return Pages(static_cast<std::int64_t>(free_[owner].size())); }
  Pages used_pages() const { return capacity() - free_pages(); }
  // Pages of one owner in use (the high-water mark of an owner is what its memory must hold).
  Pages used_pages(std::uint32_t owner) const { return capacity_ - free_pages(owner); }
  Pages high_water(std::uint32_t owner) const { return high_water_[owner]; }
  std::uint32_t shards() const { return placement_.shards; }
  const CpPlacement& placement() const { return placement_; }
  bool is_allocated(PageId p) const;
  // Checks that the free lists and the allocation bitmap agree, and (sharded) that every page is
  // filed under its owner: each page has exactly one owner (InternalError otherwise).
  void verify() const;

 private:
  std::size_t index_limit() const { return static_cast<std::size_t>(capacity_.value() + 1) * shards(); }
  PageId take(std::uint32_t owner);
  CpPlacement placement_;
  Pages capacity_;                                // per owner
  std::vector<std::vector<std::uint64_t>> free_;  // per owner: free local pages; allocation pops from the back
  std::vector<bool> allocated_;                   // by page id; local page 0 of every owner is padding
  std::vector<Pages> high_water_;
  std::function<void(std::span<const PageId>)> on_free_;
};

}  // namespace kvgrid::cache
