#include "protocols/cp_sharding.hpp"

#include "core/check.hpp"

namespace kvgrid::protocols {

namespace {

class OwnerPreserving final : public cache::RestorePlacement {
 public:
  std::string_view name() const override { return "sharded"; }
  std::optional<std::vector<PageId>> alloc(cache::DevicePool& pool, Pages n, std::uint32_t first_owner) const override {
    return pool.alloc(n, first_owner);
  }
  Pages shortfall(const cache::DevicePool& pool, Pages n, std::uint32_t first_owner) const override {
    return pool.shortfall(n, first_owner);
  }
};

class AnyOwner final : public cache::RestorePlacement {
 public:
  std::string_view name() const override { return "any_owner_restore"; }
  std::optional<std::vector<PageId>> alloc(cache::DevicePool& pool, Pages n, std::uint32_t) const override {
    return pool.alloc_any(n);
  }
  Pages shortfall(const cache::DevicePool& pool, Pages n, std::uint32_t) const override {
    return n > pool.free_pages() ? n - pool.free_pages() : Pages(0);
  }
};

}  // namespace

ShardGroup::~ShardGroup() {
  if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
}

std::uint32_t shard_group_size(const GridShape& shape, bool mla) {
  if (shape.cp > 1) return static_cast<std::uint32_t>(shape.cp);
  if (mla && shape.tp > 1) return static_cast<std::uint32_t>(shape.tp);
  return 1;
}

bool shards_pages(const std::string& variant) {
  if (variant == "replicated") return false;
  if (variant == "sharded" || variant == "any_owner_restore") return true;
  throw InputError("cache.cp_sharding: unknown variant '" + variant + "' (replicated, sharded, any_owner_restore)");
}

std::unique_ptr<ShardGroup> make_shard_group(const std::string& variant, const RankGrid& grid, bool mla) {
  auto g = std::make_unique<ShardGroup>();
  if (!shards_pages(variant)) return g;
  g->size = shard_group_size(grid.shape(), mla);
  if (g->size == 1) return g;
  const bool over_cp = grid.shape().cp > 1;
  g->axis = over_cp ? "cp" : "tp";
  g->rank = static_cast<std::uint32_t>(over_cp ? grid.coord().cp : grid.coord().tp);
  KVGRID_MPI_CHECK(MPI_Comm_dup(over_cp ? grid.cp() : grid.tp(), &g->comm));
  return g;
}

std::unique_ptr<cache::RestorePlacement> make_restore_placement(const std::string& variant) {
  if (!shards_pages(variant)) return nullptr;
  if (variant == "any_owner_restore") return std::make_unique<AnyOwner>();
  return std::make_unique<OwnerPreserving>();
}

}  // namespace kvgrid::protocols
