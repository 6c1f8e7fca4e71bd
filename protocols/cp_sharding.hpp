// cache.cp_sharding — CP page ownership (first article §1; DESIGN §4 "CP page ownership").
//
// Invariant: each KV page is stored once, by its owner (logical page q lives on rank q mod N of
// the shard group), and every copy — backup to the host, restore to the device, storage read or
// write — keeps it there: a restored page may change its row, never its owner. The gather
// (layer_gather.hpp) then sees every page exactly once.
//
//   replicated         (baseline) every rank of the CP group stores every page; no gather
//   sharded            (correct) pages sharded by owner; restores allocate, for a node whose
//                      rotation starts at owner r, pages owned by r, r + 1, ... (mod N)
//   any_owner_restore  (buggy) a restore takes whichever free pages are most plentiful, whatever
//                      their owner: the new owner copies its own host row — another page's KV —
//                      and the gathered prefix is wrong (the oracle catches it; with debug checks
//                      on, the tree's and the copy's owner checks do first)
//
// Shard group: the CP group when CP > 1; otherwise, for MLA, the attention-TP group (the latent
// KV is replicated over TP); otherwise none (a group of one: sharded behaves as replicated).
#pragma once

#include <mpi.h>

#include <memory>
#include <string>

#include "cache/restore_placement.hpp"
#include "core/topology.hpp"

namespace kvgrid::protocols {

struct ShardGroup {
  std::uint32_t size = 1, rank = 0;
  MPI_Comm comm = MPI_COMM_NULL;  // a duplicate (the gather's collectives stay apart); null when size 1
  std::string axis = "none";      // "cp", "tp" (MLA) or "none"
  ShardGroup() = default;
  ShardGroup(const ShardGroup&) = delete;
  ShardGroup& operator=(const ShardGroup&) = delete;
  ~ShardGroup();
};

// Size of the shard group of a grid: CP when CP > 1, else attention-TP for MLA, else 1.
std::uint32_t shard_group_size(const GridShape& shape, bool mla);
// Whether `variant` shards pages (false for "replicated"); throws InputError for an unknown name.
bool shards_pages(const std::string& variant);
// The shard group of this rank (collective over the grid's TP or CP communicator when sharding).
std::unique_ptr<ShardGroup> make_shard_group(const std::string& variant, const RankGrid& grid, bool mla);
// The restore placement of `variant` (null for "replicated": nothing is sharded).
std::unique_ptr<cache::RestorePlacement> make_restore_placement(const std::string& variant);

}  // namespace kvgrid::protocols
