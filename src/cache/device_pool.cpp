#include "cache/device_pool.hpp"

#include <algorithm>

#include "core/check.hpp"

namespace kvgrid::cache {

DevicePool::DevicePool(Pages capacity, CpPlacement placement) : placement_(placement), capacity_(capacity) {
  KVGRID_CHECK(capacity.value() >= 0, "negative pool capacity ", capacity);
  KVGRID_CHECK(placement_.shards >= 1, "pool of ", placement_.shards, " shards");
  const auto n = static_cast<std::uint64_t>(capacity.value());
  allocated_.assign(index_limit(), false);
  free_.resize(shards());
  high_water_.assign(shards(), Pages(0));
  for (std::uint32_t r = 0; r < shards(); ++r) {
    allocated_[placement_.logical(r, 0)] = true;  // padding page
    free_[r].reserve(n);
    for (std::uint64_t l = n; l >= 1; --l) free_[r].push_back(l);
  }
}

Pages DevicePool::free_pages() const {
  std::size_t n = 0;
  for (const auto& f : free_) n += f.size();
  return Pages(static_cast<std::int64_t>(n));
}

PageId DevicePool::take(std::uint32_t owner) {
  const std::uint64_t local = free_[owner].back();
  free_[owner].pop_back();
  const PageId p(static_cast<std::uint32_t>(placement_.logical(owner, local)));
  allocated_[p.value()] = true;
  high_water_[owner] = std::max(high_water_[owner], used_pages(owner));
  return p;
}

Pages DevicePool::shortfall(Pages n, std::uint32_t first_owner) const {
  KVGRID_CHECK(n.value() >= 0, "negative allocation ", n);
  const auto k = static_cast<std::uint64_t>(n.value());
  std::int64_t short_by = 0;
  for (std::uint32_t r = 0; r < shards(); ++r) {
    // Pages of the chain owned by r: positions j < k with (first_owner + j) mod N == r.
    const std::uint64_t off = (r + shards() - first_owner % shards()) % shards();
    const std::uint64_t need = k > off ? (k - off + shards() - 1) / shards() : 0;
    if (need > free_[r].size()) short_by += static_cast<std::int64_t>(need - free_[r].size());
  }
  return Pages(short_by);
}

std::optional<std::vector<PageId>> DevicePool::alloc(Pages n, std::uint32_t first_owner) {
  if (shortfall(n, first_owner).value() > 0) return std::nullopt;
  std::vector<PageId> out;
  out.reserve(static_cast<std::size_t>(n.value()));
  for (std::int64_t k = 0; k < n.value(); ++k)
    out.push_back(take(static_cast<std::uint32_t>((first_owner + static_cast<std::uint64_t>(k)) % shards())));
  return out;
}

std::optional<std::vector<PageId>> DevicePool::alloc_any(Pages n) {
  KVGRID_CHECK(n.value() >= 0, "negative allocation ", n);
  if (n > free_pages()) return std::nullopt;
  std::vector<PageId> out;
  for (std::int64_t k = 0; k < n.value(); ++k) {
    std::uint32_t best = 0;
    for (std::uint32_t r = 1; r < shards(); ++r)
      if (free_[r].size() > free_[best].size()) best = r;
    out.push_back(take(best));
  }
  return out;
}

void DevicePool::free(std::span<const PageId> pages) {
  for (PageId p : pages) {
    KVGRID_CHECK(p.value() < allocated_.size() && placement_.local_page(p.value()) >= 1, "free of page ", p,
                 " outside the pool");
    KVGRID_CHECK(allocated_[p.value()], "double free of page ", p);
    allocated_[p.value()] = false;
    free_[placement_.page_owner(p.value())].push_back(placement_.local_page(p.value()));
  }
  if (on_free_ && !pages.empty()) on_free_(pages);
}

bool DevicePool::is_allocated(PageId p) const {
  return p.value() < allocated_.size() && placement_.local_page(p.value()) >= 1 && allocated_[p.value()];
}

void DevicePool::verify() const {
  std::vector<bool> seen(allocated_.size(), false);
  std::size_t free_total = 0;
  for (std::uint32_t r = 0; r < shards(); ++r) {
    for (std::uint64_t local : free_[r]) {
      KVGRID_CHECK(local >= 1 && local <= static_cast<std::uint64_t>(capacity_.value()), "free list of rank ", r,
                   " holds local page ", local);
      const std::uint64_t q = placement_.logical(r, local);
      KVGRID_CHECK(placement_.page_owner(q) == r, "page ", q, " filed under rank ", r, " but owned by rank ",
                   placement_.page_owner(q));
      KVGRID_CHECK(!seen[q], "page ", q, " twice in the free lists");
      KVGRID_CHECK(!allocated_[q], "page ", q, " both free and allocated");
      seen[q] = true;
    }
    free_total += free_[r].size();
  }
  std::size_t allocated = 0;
  for (std::size_t i = 0; i < allocated_.size(); ++i)
    if (placement_.local_page(i) >= 1) allocated += allocated_[i] ? 1 : 0;
  KVGRID_CHECK(allocated + free_total == static_cast<std::size_t>(capacity().value()), "pool accounting: ", allocated,
               " allocated + ", free_total, " free != ", capacity());
}

}  // namespace kvgrid::cache
