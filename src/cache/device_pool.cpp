#include "cache/device_pool.hpp"

#include <algorithm>

#include "core/check.hpp"

namespace kvgrid::cache {

DevicePool::DevicePool(Pages capacity) : capacity_(capacity) {
  KVGRID_CHECK(capacity.value() >= 0, "negative pool capacity ", capacity);
  const auto n = static_cast<std::size_t>(capacity.value());
  allocated_.assign(n + 1, false);
  allocated_[0] = true;  // padding page
  free_list_.reserve(n);
  for (std::size_t i = n; i >= 1; --i) free_list_.push_back(PageId(static_cast<std::uint32_t>(i)));
}

std::optional<std::vector<PageId>> DevicePool::alloc(Pages n) {
  KVGRID_CHECK(n.value() >= 0, "negative allocation ", n);
  const auto k = static_cast<std::size_t>(n.value());
  if (k > free_list_.size()) return std::nullopt;
  std::vector<PageId> out(free_list_.end() - static_cast<std::ptrdiff_t>(k), free_list_.end());
  std::reverse(out.begin(), out.end());
  free_list_.resize(free_list_.size() - k);
  for (PageId p : out) allocated_[p.value()] = true;
  return out;
}

void DevicePool::free(std::span<const PageId> pages) {
  for (PageId p : pages) {
    KVGRID_CHECK(p.value() >= 1 && p.value() < allocated_.size(), "free of page ", p, " outside the pool");
    KVGRID_CHECK(allocated_[p.value()], "double free of page ", p);
    allocated_[p.value()] = false;
    free_list_.push_back(p);
  }
}

bool DevicePool::is_allocated(PageId p) const {
  return p.value() >= 1 && p.value() < allocated_.size() && allocated_[p.value()];
}

void DevicePool::verify() const {
  std::vector<bool> seen(allocated_.size(), false);
  for (PageId p : free_list_) {
    KVGRID_CHECK(p.value() >= 1 && p.value() < allocated_.size(), "free list holds page ", p);
    KVGRID_CHECK(!seen[p.value()], "page ", p, " twice in the free list");
    KVGRID_CHECK(!allocated_[p.value()], "page ", p, " both free and allocated");
    seen[p.value()] = true;
  }
  std::size_t allocated = 0;
  for (std::size_t i = 1; i < allocated_.size(); ++i) allocated += allocated_[i] ? 1 : 0;
  KVGRID_CHECK(allocated + free_list_.size() == allocated_.size() - 1, "pool accounting: ", allocated,
               " allocated + ", free_list_.size(), " free != ", allocated_.size() - 1);
}

}  // namespace kvgrid::cache
