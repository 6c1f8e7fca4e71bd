#include "cache/cp_placement.hpp"

#include "core/check.hpp"

namespace kvgrid::cache {

std::string rotation_error(const CpPlacement& placement, std::span<const PageId> pages) {
  for (std::size_t i = 1; i < pages.size(); ++i) {
    const std::uint32_t prev = placement.page_owner(pages[i - 1].value()), cur = placement.page_owner(pages[i].value());
    if (cur != (prev + 1) % placement.shards)
      return "page " + std::to_string(i) + " (logical " + std::to_string(pages[i].value()) + ") is owned by rank " +
             std::to_string(cur) + " but follows a page owned by rank " + std::to_string(prev) + " (expected rank " +
             std::to_string((prev + 1) % placement.shards) + ")";
  }
  return "";
}

ShardedAllocator::ShardedAllocator(CpPlacement placement, std::uint64_t pages_per_rank)
    : placement_(placement), per_rank_(pages_per_rank), free_(placement.shards) {
  KVGRID_CHECK(placement_.shards >= 1 && placement_.page_size >= 1, "placement of ", placement_.shards, " shards, page ",
               placement_.page_size);
  KVGRID_CHECK(pages_per_rank >= 1, "sharded pool of ", pages_per_rank, " pages per rank");
  for (auto& f : free_)
    for (std::uint64_t l = 1; l < pages_per_rank; ++l) f.insert(f.end(), l);
}

std::optional<std::vector<PageId>> ShardedAllocator::alloc_chain(std::uint32_t first_owner, std::uint64_t n) {
  KVGRID_CHECK(first_owner < placement_.shards, "first owner ", first_owner, " of ", placement_.shards, " shards");
  // How many pages each owner must give, before taking any.
  std::vector<std::uint64_t> need(placement_.shards, 0);
  for (std::uint64_t k = 0; k < n; ++k) ++need[(first_owner + k) % placement_.shards];
  for (std::uint32_t r = 0; r < placement_.shards; ++r)
    if (need[r] > free_[r].size()) return std::nullopt;
  std::vector<PageId> out;
  out.reserve(n);
  for (std::uint64_t k = 0; k < n; ++k) {
    const std::uint32_t r = static_cast<std::uint32_t>((first_owner + k) % placement_.shards);
    const std::uint64_t local = *free_[r].begin();
    free_[r].erase(free_[r].begin());
    out.push_back(PageId(static_cast<std::uint32_t>(placement_.logical(r, local))));
  }
  return out;
}

void ShardedAllocator::free(std::span<const PageId> pages) {
  for (PageId q : pages) {
    const std::uint32_t r = placement_.page_owner(q.value());
    const std::uint64_t local = placement_.local_page(q.value());
    KVGRID_CHECK(local >= 1 && local < per_rank_, "free of logical page ", q, " (local page ", local, " of rank ", r, ")");
    KVGRID_CHECK(free_[r].insert(local).second, "double free of logical page ", q);
  }
}

}  // namespace kvgrid::cache
