// Where a CP-sharded cache puts pages it restores from the host tier: the seam through which the
// CP-ownership protocol (protocols/cp_sharding.*) chooses restore targets. The cache stack defines
// the interface; the protocol module implements the correct variant and the buggy one.
#pragma once

#include <optional>
#include <string_view>
#include <vector>

#include "cache/device_pool.hpp"

namespace kvgrid::cache {

class RestorePlacement {
 public:
  virtual ~RestorePlacement() = default;
  virtual std::string_view name() const = 0;
  // Device pages for `n` restored pages whose owners (by the tree's rotation) start at
  // `first_owner` and run cyclically.
  virtual std::optional<std::vector<PageId>> alloc(DevicePool& pool, Pages n, std::uint32_t first_owner) const = 0;
  // Pages that must be freed before alloc can succeed.
  virtual Pages shortfall(const DevicePool& pool, Pages n, std::uint32_t first_owner) const = 0;
};

}  // namespace kvgrid::cache
