// One rank's cache stack for the serving loop, built from the experiment: the CP shard group, the
// device KV pool (less the gather slots' charge), the host tier's pool, transfer engine and
// agreement, the storage tier and the cross-stage agreements, the device cache that ties them
// together, and the layer gather. The stack owns all of it, with the rank's modelled clock that
// the engines read and advance; the tiers' callbacks hold references into it, so it never moves.
// `faults` and `log` must outlive it.
#pragma once

#include <cstdint>
#include <memory>

#include "cache/device_cache.hpp"
#include "cache/draft_state.hpp"
#include "cache/kv_pool.hpp"
#include "cache/state_pool.hpp"
#include "core/decision_log.hpp"
#include "core/failpoint.hpp"
#include "core/rng.hpp"
#include "core/topology.hpp"
#include "protocols/cp_sharding.hpp"
#include "protocols/layer_gather.hpp"
#include "protocols/pp_sync.hpp"
#include "runtime/experiment.hpp"
#include "runtime/model.hpp"
#include "transfer/transfer_engine.hpp"

namespace kvgrid {

struct RankStack {
  // Collective over the grid (communicator duplicates). Throws InputError for an unusable storage
  // configuration.
  RankStack(const ExperimentConfig& exp, const RankGrid& grid, FailpointRegistry& faults, DecisionLog& log);
  RankStack(const RankStack&) = delete;
  RankStack& operator=(const RankStack&) = delete;

  ModelGeometry geo;
  std::unique_ptr<protocols::ShardGroup> shard;
  Pages capacity{0};             // KV pages of the device pool (per rank, after the gather slots)
  double kv_bytes_scale = 1.0;   // cost.kv_bytes: modelled bytes per stored byte
  std::uint64_t clock = 0;       // this rank's modelled clock, ns
  std::unique_ptr<cache::KvPool> pool, host_kv;  // pool: the FULL layers
  // Hybrid models: the SWA layers' pool and the MAMBA layers' states (null: none of that kind).
  std::unique_ptr<cache::KvPool> swa_pool;
  std::unique_ptr<cache::StatePool> states;
  // ... and their host copies (hybrid models with a host tier).
  std::unique_ptr<cache::KvPool> swa_host;
  std::unique_ptr<cache::StatePool> states_host;
  std::vector<SidecarConfig> sidecars;  // the sidecars whose payload this stage holds (and folds)
  // Speculative decoding ([model.draft], last stage only): the draft's geometry, its device pool
  // (the target's page ids) and its state in the tiers.
  bool has_draft = false;
  ModelGeometry draft_geo;
  std::unique_ptr<cache::KvPool> draft_pool;
  // A hybrid draft's SWA layers' pool and states (model.draft.layer_types), indexed like the target's.
  std::unique_ptr<cache::KvPool> draft_swa_pool;
  std::unique_ptr<cache::StatePool> draft_states;
  std::unique_ptr<cache::DraftState> draft;
  // A hybrid draft with the host tier: its SWA layers and states moving with the target's.
  std::unique_ptr<cache::DraftState> draft_swa;
  std::unique_ptr<cache::DraftStates> draft_state_slots;
  std::unique_ptr<transfer::TransferEngine> engine;
  std::unique_ptr<cache::AckAgreement> agreement;  // protocol.tp_sync over the stage
  std::unique_ptr<cache::DeviceCache> dc;
  std::unique_ptr<cache::RestorePlacement> restore;
  // engine.transfer = cuda: the GPU this rank runs on ("" otherwise) and its pools' memory.
  std::string gpu;
  const transfer::PoolMemory* memory = nullptr;
  // engine.collectives = nccl: the gathers' data path (both gathers share it; nullptr: MPI).
  std::unique_ptr<transfer::GatherCollective> collective;
  std::unique_ptr<protocols::LayerGather> gather;  // CP sharding only
  // CP sharding with a draft (last stage): the draft's pages, sharded with the target's ownership,
  // are read through their own gather over the same shard group (its slots, like the draft's pool,
  // come on top of cache.device_pages).
  std::unique_ptr<protocols::LayerGather> draft_gather;
  std::unique_ptr<cache::CrossStageAgreement> cross_stage;        // protocol.prefetch_consensus (PP > 1)
  std::unique_ptr<cache::CrossStageAgreement> publish_agreement;  // protocol.pp_sync's publish (PP > 1)
  std::unique_ptr<protocols::PpSync> pp_sync;  // protocol.pp_sync: write ACKs and admissions across stages
  bool private_loads = false;     // load-backs can fail: each waits a step for its agreed outcome (protocol.load_back)
  bool relay_admissions = false;  // device.alloc.fail across stages: PP0 decides, later stages follow
  Rng fault_rng;                  // storage failpoints' targets
  Rng restore_fault_rng;          // pd.restore.fail's first failing layer

 private:
  cache::HybridCacheConfig hybrid_config(const ExperimentConfig& exp, const RankGrid& grid);  // (fills swa_pool, states, sidecars)
  std::vector<kernels::ChunkSpan> host_object_chunks(const ExperimentConfig& exp, LayerKind k, std::size_t target_layers) const;
  void make_host_engine(const ExperimentConfig& exp, const RankGrid& grid);  // (needs kv_bytes_scale, clock)
  void make_draft_pools(const ExperimentConfig& exp, const GridCoord& c, const GridShape& shape,
                        const cache::CpPlacement& placement);
  void hook_pools();
  cache::StorageTierConfig storage_config(const ExperimentConfig& exp, const RankGrid& grid, FailpointRegistry& faults,
                                          DecisionLog& log);  // (needs geo, shard, has_draft, kv_bytes_scale)
};

}  // namespace kvgrid
