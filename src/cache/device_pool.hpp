// Device page pool (L1): a fixed number of KV pages and their allocator.
//
// Page ids run from 1 to capacity; page 0 is the padding page (attention kernels point unused
// slots at it) and is never handed out. `alloc` is all-or-nothing and deterministic (the same
// sequence of calls gives the same ids on every rank), so ranks that take the same decisions hold
// the same pages. Freeing a page twice, or a page outside the pool, is a bug (InternalError).
#pragma once

#include <optional>
#include <span>
#include <vector>

#include "core/ids.hpp"

namespace kvgrid::cache {

class DevicePool {
 public:
  explicit DevicePool(Pages capacity);

  // `n` pages, or nothing when fewer than `n` are free.
  std::optional<std::vector<PageId>> alloc(Pages n);
  void free(std::span<const PageId> pages);

  Pages capacity() const { return capacity_; }
  Pages free_pages() const { return Pages(static_cast<std::int64_t>(free_list_.size())); }
  Pages used_pages() const { return capacity_ - free_pages(); }
  bool is_allocated(PageId p) const;
  // Checks that the free list and the allocation bitmap agree (InternalError otherwise).
  void verify() const;

 private:
  Pages capacity_;
  std::vector<PageId> free_list_;   // allocation pops from the back
  std::vector<bool> allocated_;     // by page id; [0] is the padding page
};

}  // namespace kvgrid::cache
