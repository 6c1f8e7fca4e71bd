#include "cache/cp_placement.hpp"


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

}  // namespace kvgrid::cache
