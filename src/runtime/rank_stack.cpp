#include "runtime/rank_stack.hpp"

#include <algorithm>
#include <cctype>
#include <cstdlib>

#include "cache/page_hash.hpp"
#include "core/check.hpp"
#include "runtime/pd.hpp"
#include "runtime/storage_keys.hpp"
#include "protocols/component_boundary.hpp"
#include "protocols/draft_restore.hpp"
#include "protocols/load_back.hpp"
#include "protocols/pd_restore.hpp"
#include "protocols/pp_sync.hpp"
#include "protocols/prefetch_consensus.hpp"
#include "protocols/tp_sync.hpp"

namespace kvgrid {

namespace {

// This process's index among the ranks on its node (the GPU it takes): Open MPI's or Slurm's
// local rank, else the world rank.
int local_rank(const RankGrid& grid) {
  for (const char* v : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID"})
    if (const char* s = std::getenv(v); s && *s) return std::atoi(s);
  return grid.world_rank();
}
// Which load-backs fail on this rank: P/D decode's restores from a random layer on
// (pd.restore.fail, drawn once per restore), elsewhere — one group, or P/D prefill — each layer
// copy of a load-back (transfer.load.fail, drawn per layer; the load's later layers fail with it).
// None: loads never fail.
std::function<std::optional<std::size_t>(std::size_t)> load_fault(const ExperimentConfig& exp, const RankGrid& grid,
                                                                  FailpointRegistry& faults, DecisionLog& log, Rng& layer_rng) {
  if (pd_role(exp, grid) == PdRole::Decode)
    return [&faults, &log, &layer_rng](std::size_t layers) -> std::optional<std::size_t> {
      if (!faults.evaluate("pd.restore.fail", log.step())) return std::nullopt;
      return static_cast<std::size_t>(layer_rng.below(layers));
    };
  if (!faults.configured("transfer.load.fail")) return {};
  return [&faults, &log](std::size_t layers) -> std::optional<std::size_t> {
    for (std::size_t l = 0; l < layers; ++l)
      if (faults.evaluate("transfer.load.fail", log.step())) return l;
    return std::nullopt;
  };
}
}  // namespace

// Hybrid models: the unified tree's configuration for this stage, and the byte pools of its own
// layers — the SWA layers' pool (per-token values in either payload: one word per head in digest
// runs), the MAMBA layers' states, the sidecars it folds.
cache::HybridCacheConfig RankStack::hybrid_config(const ExperimentConfig& exp, const RankGrid& grid) {
  // Which components this stage's tree keeps: protocol.component_boundary (every component of
  // the model, or — buggy — those of its own layers); the bytes only for its own layers.
  cache::HybridCacheConfig hc;
  hc.page_size = exp.cache.page_size;
  hc.chunk_tokens = Tokens(exp.engine.chunk_size);
  hc.bugs = cache::ComponentBugs::parse(exp.cache.component_bugs);
  // Sessions: cache.eviction (its planted bugs included); P/D prefill tracks none (decode holds the
  // references) unless cache.pd_prefill_sessions.
  const std::string& ev = exp.cache.eviction;
  hc.sessions.order = ev != "lru";
  hc.sessions.tombstones = static_cast<std::size_t>(exp.cache.session_tombstones);
  hc.sessions.close_resets_recency = ev == "session_close_resets_recency";
  hc.sessions.no_generation = ev == "session_no_generation";
  hc.track_sessions = pd_role(exp, grid) != PdRole::Prefill || exp.cache.pd_prefill_sessions;
  const std::string& boundary = exp.protocol.component_boundary;
  hc.swa = protocols::stage_keeps_component(boundary, exp.model.has(LayerKind::Swa), geo.local_of(LayerKind::Swa) > 0);
  hc.window = Tokens(exp.model.swa_window);
  hc.swa_pages = exp.cache.swa_pages;
  if (const std::size_t n = geo.local_of(LayerKind::Swa); n > 0) {
    const bool full = exp.engine.payload == "full";
    swa_pool = std::make_unique<cache::KvPool>(cache::KvPoolConfig{exp.cache.swa_pages, exp.cache.page_size,
                                                                   geo.layer_id(LayerKind::Swa, 0), n, geo.kv_heads,
                                                                   full ? geo.head_dim : 1, cache::Payload::Full});
  }
  hc.mamba = protocols::stage_keeps_component(boundary, exp.model.has(LayerKind::Mamba), geo.local_of(LayerKind::Mamba) > 0);
  hc.mamba_chunk = Tokens(exp.model.mamba_chunk);
  hc.mamba_slots = exp.cache.mamba_slots;
  if (const std::size_t n = geo.local_of(LayerKind::Mamba); n > 0)
    states = std::make_unique<cache::StatePool>(static_cast<std::size_t>(exp.cache.mamba_slots),
                                                n * geo.kv_heads.size() * geo.mamba_state);
  // A sidecar's payload lives on the stage that folds it: the one holding its source kind's first layer.
  for (const auto& sc : exp.model.sidecars)
    if (geo.local_of(sc.source) > 0 && geo.kind_first[static_cast<std::size_t>(sc.source)] == 0) {
      hc.sidecars.push_back({sc.name, sc.source == LayerKind::Swa, static_cast<std::size_t>(sc.words)});
      sidecars.push_back(sc);
    }
  return hc;
}

// The storage tier (L3) of this rank: its object keys (the model, the draft's layout and this
// rank's shard), directory, capacity, prefetch policy, modelled bandwidth and its failpoints.
cache::StorageTierConfig RankStack::storage_config(const ExperimentConfig& exp, const RankGrid& grid, FailpointRegistry& faults,
                                                   DecisionLog& log) {
  const auto& c = grid.coord();
  const auto& shape = grid.shape();
  cache::ShardKey sk;
  sk.model = "synth-l" + std::to_string(exp.model.layers) + "-h" + std::to_string(exp.model.kv_heads) + "-d" +
             std::to_string(exp.model.head_dim) + "-" + exp.model.attention + "-" + exp.engine.payload;
  auto name_of = [](std::string pattern) {  // a layer pattern as a key part
    for (char& ch : pattern)
      if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '+';
    return pattern;
  };
  if (has_draft) {  // objects of another draft layout must not be read as this one's
    sk.model += "-draft" + std::to_string(exp.model.draft.layers) + "x" + std::to_string(exp.model.draft.kv_heads) + "x" +
                std::to_string(exp.model.draft.head_dim) + "-" + exp.model.draft.mode;
    // a hybrid object carries the draft's layers of each kind: its pattern names them
    if (geo.hybrid()) sk.model += "-" + name_of(exp.model.draft.layer_types);
  }
  if (geo.hybrid()) {  // objects of another layer pattern, window, grid or sidecar set must not be read as these
    sk.model += "-hybrid-" + name_of(exp.model.layer_types) + "-w" + std::to_string(exp.model.swa_window) + "-c" +
                std::to_string(exp.model.mamba_chunk) + "-s" + std::to_string(exp.model.mamba_state);
    for (const auto& scc : exp.model.sidecars)  // a sidecar's words travel in its source's objects
      sk.model += "-" + scc.name + "." + layer_kind_name(scc.source) + std::to_string(scc.words);
  }
  sk.tp_rank = c.tp;
  sk.tp_size = shape.tp;
  sk.pp_rank = c.pp;
  sk.pp_size = shape.pp;
  sk.cp_rank = c.cp;
  sk.cp_size = shape.cp;
  sk.replicated_over_tp = geo.mla && shard->axis != "tp";  // MLA sharded over TP: each TP rank its own pages
  cache::StorageTierConfig sc;
  sc.key_suffix = cache::key_suffix(sk);
  sc.dir = exp.cache.storage_dir + "/" + sc.key_suffix.substr(1);  // one directory per shard (MLA: shared over TP)
  sc.backend = exp.cache.storage;
  sc.file_layout = exp.cache.storage_file_layout;
  sc.fsync = exp.cache.storage_fsync;
  sc.url = exp.cache.storage_url;
  sc.capacity_bytes = static_cast<std::uint64_t>(exp.cache.storage_capacity_mb) << 20;
  sc.job = exp.cache.storage_job;
  sc.writer = !sk.replicated_over_tp || c.tp == 0;  // one writer per replica set; sharded: every owner
  if (exp.cache.storage_key_scheme == "unified") {
    // One directory shared by every rank and every job of any compatible layout; one writer per
    // object: CP replicas (and MLA's TP replicas) defer to the first.
    if (geo.hybrid()) {  // one namespace per component kind
      sc.unified = unified_component_plan(exp, geo, LayerKind::Full).chunks;
      sc.unified_swa = unified_component_plan(exp, geo, LayerKind::Swa).chunks;
      sc.unified_mamba = unified_component_plan(exp, geo, LayerKind::Mamba).chunks;
    } else {
      sc.unified = unified_plan(exp, geo).chunks;
    }
    for (const auto& s : sidecars) sc.unified_sidecars.push_back(unified_sidecar_plan(exp, s).chunks.at(0));
    if (has_draft && geo.hybrid()) {  // the draft's kinds, each in a namespace of its own
      sc.unified_draft = unified_draft_component_plan(exp, draft_geo, LayerKind::Full).chunks;
      sc.unified_draft_swa = unified_draft_component_plan(exp, draft_geo, LayerKind::Swa).chunks;
      sc.unified_draft_mamba = unified_draft_component_plan(exp, draft_geo, LayerKind::Mamba).chunks;
    } else if (has_draft) {
      sc.unified_draft = unified_draft_plan(exp, draft_geo).chunks;
    }
    sc.dir = exp.cache.storage_dir + "/unified";
    sc.writer = sc.writer && (c.cp == 0 || shard->axis == "cp");  // sharded over CP: every owner
    sc.unified_sidecar_writer = sc.writer && c.tp == 0;  // a sidecar is whole on every TP rank: the first writes it
    sc.shared = exp.cache.storage_shared;
  }
  sc.prefetch_threshold = exp.cache.prefetch_threshold;
  sc.stop_policy = exp.cache.prefetch_policy;
  sc.timeout_base_ns = static_cast<std::uint64_t>(exp.cache.prefetch_timeout_base_ms * 1e6);
  sc.timeout_per_1k_ns = static_cast<std::uint64_t>(exp.cache.prefetch_timeout_per_1k_ms * 1e6);
  sc.timeout_max_ns = static_cast<std::uint64_t>(exp.cache.prefetch_timeout_max_ms * 1e6);
  sc.bytes_per_ns = exp.cost.storage_gb_s / kv_bytes_scale;
  sc.latency_ns = static_cast<std::uint64_t>(exp.cost.storage_latency_us * 1e3);
  sc.seed = exp.engine.seed ^ static_cast<std::uint64_t>(grid.world_rank());
  sc.threaded = exp.engine.transfer != "simulated";  // threaded and cuda: real time
  sc.now = [this] { return clock; };
  sc.advance_to = [this](std::uint64_t t) { clock = std::max(clock, t); };
  auto step_now = [&log] { return log.step(); };
  sc.faults.page_fault = [&faults, this, step_now](const char* name, std::size_t n) -> std::optional<std::size_t> {
    if (!faults.evaluate(name, step_now())) return std::nullopt;
    return static_cast<std::size_t>(fault_rng.below(n));
  };
  sc.faults.read_delay_ns = [&faults, step_now]() -> std::uint64_t {
    auto hit = faults.evaluate("storage.read.slow", step_now());
    return hit ? static_cast<std::uint64_t>(hit->param("delay_ms") * 1e6) : 0;
  };
  sc.faults.write_fail = [&faults, step_now] { return faults.evaluate("storage.write.fail", step_now()).has_value(); };
  return sc;
}

// cache.host_layout = page_unified: the chunks a host pool of kind `k` holds in each row — this
// rank's objects of that kind, then (a packed draft) the draft's, its layers after the target's
// `target_layers`. Empty: layer-first rows.
std::vector<kernels::ChunkSpan> RankStack::host_object_chunks(const ExperimentConfig& exp, LayerKind k,
                                                              std::size_t target_layers) const {
  std::vector<kernels::ChunkSpan> out;
  if (exp.cache.host_layout != "page_unified") return out;  // (storage_keys.cpp checks the rest)
  const bool hybrid = geo.hybrid();
  for (const auto& chunk : (hybrid ? unified_component_plan(exp, geo, k) : unified_plan(exp, geo)).chunks)
    out.push_back(chunk.local);
  if (has_draft && exp.model.draft.mode == "packed") {
    const auto draft = hybrid ? unified_draft_component_plan(exp, draft_geo, k) : unified_draft_plan(exp, draft_geo);
    for (const auto& chunk : draft.chunks) {
      out.push_back(chunk.local);
      out.back().layer0 += target_layers;
    }
  }
  return out;
}

// The host tier's transfer engine on this rank's modelled clock, and the stage's agreement on ACK
// consumption (protocol.tp_sync).
void RankStack::make_host_engine(const ExperimentConfig& exp, const RankGrid& grid) {
  transfer::EngineConfig ec;
  ec.backend = exp.engine.transfer;
  ec.cuda_copy = exp.engine.cuda_copy;
  // GB/s == bytes/ns; later stages' copies may be slower (cost.stage_skew: cross-stage skew)
  ec.bytes_per_ns = exp.cost.host_link_gb_s / (1.0 + exp.cost.stage_skew * grid.coord().pp) / kv_bytes_scale;
  ec.seed = exp.engine.seed ^ static_cast<std::uint64_t>(grid.world_rank());
  ec.now = [this] { return clock; };
  ec.advance_to = [this](std::uint64_t t) { clock = std::max(clock, t); };
  engine = transfer::make_engine(ec);
  agreement = protocols::make_tp_sync(exp.protocol.tp_sync, grid.stage());
}

// The draft's device pools on the last stage: its FULL layers' KV at the target's page ids and, for
// a hybrid draft, its SWA pages and states at the target's SWA pages and state slots.
void RankStack::make_draft_pools(const ExperimentConfig& exp, const GridCoord& c, const GridShape& shape,
                                 const cache::CpPlacement& placement) {
  draft_geo = ModelGeometry::draft_for_rank(exp, c, shape);
  draft_pool = std::make_unique<cache::KvPool>(cache::KvPoolConfig{capacity, exp.cache.page_size,
                                                                   draft_geo.layer_id(LayerKind::Full, 0),
                                                                   draft_geo.local_of(LayerKind::Full), draft_geo.kv_heads,
                                                                   draft_geo.head_dim, pool->payload(), placement, shard->rank,
                                                                   memory, transfer::PoolKind::Device});
  // A hybrid draft's SWA layers and states: indexed by the target's SWA page ids and state slots
  // (their tree moves them with the target's: poisoned when freed, copied when a state is).
  if (const std::size_t n = draft_geo.local_of(LayerKind::Swa); n > 0)
    draft_swa_pool = std::make_unique<cache::KvPool>(cache::KvPoolConfig{
        exp.cache.swa_pages, exp.cache.page_size, draft_geo.layer_id(LayerKind::Swa, 0), n, draft_geo.kv_heads,
        exp.engine.payload == "full" ? draft_geo.head_dim : 1, cache::Payload::Full});
  if (const std::size_t n = draft_geo.local_of(LayerKind::Mamba); n > 0)
    draft_states = std::make_unique<cache::StatePool>(static_cast<std::size_t>(exp.cache.mamba_slots),
                                                      n * draft_geo.kv_heads.size() * draft_geo.mamba_state);
}

// What the cache frees or copies, the pools follow: freed pages and states are poisoned (their
// old KV must not pass for a copy's), a copied state moves with the draft's.
void RankStack::hook_pools() {
  if (auto* h = dc->hybrid()) {
    // (the last stage may hold a hybrid draft's kind without a target layer of it)
    if (swa_pool || draft_swa_pool)
      h->set_on_swa_free([this](std::span<const PageId> pages) {
        if (swa_pool) swa_pool->poison(pages, /*always=*/true);
        if (draft_swa_pool) draft_swa_pool->poison(pages, /*always=*/true);
      });
    if (states || draft_states) {
      h->set_on_state_free([this](std::span<const std::uint32_t> s) {
        if (states) states->poison(s);
        if (draft_states) draft_states->poison(s);
      });
      h->set_copy_state([this](std::uint32_t src, std::uint32_t dst) {
        if (states) states->copy(src, dst);
        if (draft_states) draft_states->copy(src, dst);  // the draft's recurrent state moves with the target's
      });
    }
  }
  dc->set_on_free([this](std::span<const PageId> pages) {  // a freed page's old KV must not pass for a copy's
    pool->poison(pages);
    if (draft_pool) draft_pool->poison(pages);
  });
}

RankStack::RankStack(const ExperimentConfig& exp, const RankGrid& grid, FailpointRegistry& faults, DecisionLog& log)
    : fault_rng(rank_stream(exp.engine.seed, grid.world_rank()).fork("storage.fault.target")),
      restore_fault_rng(rank_stream(exp.engine.seed, grid.world_rank()).fork("pd.restore.fail.layer")) {
  const auto& c = grid.coord();
  const auto& shape = grid.shape();
  if (exp.debug.input_error_rank == grid.world_rank())  // testing knob: a rank-local start-up error
    throw InputError("debug.input_error_rank = " + std::to_string(grid.world_rank()) + ": this rank's stack cannot be built");
  // The backend's device before any pool exists (cuda: GPU local_rank mod count; pools in its memory).
  gpu = transfer::prepare_backend(exp.engine.transfer, local_rank(grid), grid.world_rank());
  memory = transfer::pool_memory(exp.engine.transfer);
  geo = ModelGeometry::for_rank(exp, c, shape);
  capacity = exp.cache.device_pages;
  if (exp.debug.shrink_stage == c.pp) capacity = Pages(exp.debug.shrink_device_pages);  // testing knob
  // CP page ownership (cache.cp_sharding): the shard group, and the two gather slots (each one
  // layer of the batch's prefix, next to the current chunk and a padding page) charged to the
  // device budget.
  shard = protocols::make_shard_group(exp.cache.cp_sharding, grid, geo.mla);
  const cache::CpPlacement placement{shard->size, static_cast<std::uint64_t>(exp.cache.page_size.value())};
  if (shard->size > 1) {
    const Pages charged = gather_charge(exp, geo.local_layers());
    KVGRID_CHECK(charged < capacity, "gather slots of ", charged, " pages exceed the device pool of ", capacity,
                 " (load_experiment checks this)");
    capacity -= charged;
  }
  auto kv_config = [&](Pages pages) {
    return cache::KvPoolConfig{pages,        exp.cache.page_size, geo.layer_id(LayerKind::Full, 0), geo.local_of(LayerKind::Full),
                               geo.kv_heads, geo.head_dim, cache::parse_payload(exp.engine.payload), placement, shard->rank,
                               memory,       transfer::PoolKind::Device};
  };
  pool = std::make_unique<cache::KvPool>(kv_config(capacity));
  has_draft = exp.model.draft.enabled() && grid.is_last_stage();
  if (has_draft) make_draft_pools(exp, c, shape, placement);
  // The host tier (L2): its pool, the transfer engine on this rank's modelled clock, and the
  // stage's agreement on ACK consumption (protocol.tp_sync). Declared before the cache that uses them.
  // cost.kv_bytes = "full": a digest page stands for page_size × head_dim times more bytes.
  kv_bytes_scale = exp.cost.kv_bytes == "full" && exp.engine.payload == "digest"
                                    ? static_cast<double>(exp.cache.page_size.value() * exp.model.head_dim)
                                    : 1.0;
  if (exp.cache.host_pages.value() > 0) {
    auto hc = kv_config(exp.cache.host_pages);  // per rank (sharded: its pages)
    hc.kind = transfer::PoolKind::Host;
    hc.object_chunks = host_object_chunks(exp, LayerKind::Full, pool->layers());
    if (has_draft)  // (packed: the draft's FULL layers after the target's)
      hc.layers = cache::draft_host_layers(*protocols::draft_layout(exp.model.draft.mode), hc.layers, draft_pool->layers());
    host_kv = std::make_unique<cache::KvPool>(hc);
    make_host_engine(exp, grid);
  }
  cache::DeviceCacheConfig dcc{exp.cache.page_size, capacity, shard->size, std::nullopt};
  if (geo.hybrid()) dcc.hybrid = hybrid_config(exp, grid);
  dc = std::make_unique<cache::DeviceCache>(dcc, log);
  hook_pools();
  restore = protocols::make_restore_placement(exp.cache.cp_sharding);
  if (shard->size > 1) dc->set_restore_placement(restore.get());
  if (shard->size > 1) {
    collective = transfer::make_gather_collective(exp.engine.collectives, shard->comm);
    const protocols::LayerGather::Config gc{exp.cache.gather_pages, exp.cache.gather_overlap, 8,
                                            protocols::parse_gather_order(exp.protocol.layer_gather), collective.get()};
    gather = std::make_unique<protocols::LayerGather>(gc, *shard, *pool);
    if (has_draft) draft_gather = std::make_unique<protocols::LayerGather>(gc, *shard, *draft_pool);
  }
  if (host_kv) {
    cache::HostTierConfig htc{exp.cache.host_pages, exp.cache.write_policy,
                              static_cast<std::uint64_t>(exp.cache.write_through_threshold), exp.cache.load_back_threshold,
                              [&faults, &log] { return faults.evaluate("host.alloc.fail", log.step()).has_value(); },
                              [&faults, &log, this] {
                                if (auto d = faults.evaluate("transfer.delay", log.step()))
                                  engine->inject(static_cast<std::uint64_t>(d->param("delay_us") * 1e3), false);
                                return faults.evaluate("transfer.fail", log.step()).has_value();
                              },
                              load_fault(exp, grid, faults, log, restore_fault_rng)};
    if (auto* h = dc->hybrid()) {
      // Every component's host copies: the SWA layers' pages and the MAMBA layers' states too
      // (a packed draft's SWA layers and state words after the target's).
      const bool packed = has_draft && *protocols::draft_layout(exp.model.draft.mode) == cache::DraftLayout::Packed;
      if (swa_pool) {
        cache::KvPoolConfig sc = swa_pool->config();
        sc.capacity = exp.cache.host_swa_pages;
        if (packed && draft_swa_pool) sc.layers += draft_swa_pool->layers();
        sc.object_chunks = host_object_chunks(exp, LayerKind::Swa, swa_pool->layers());
        swa_host = std::make_unique<cache::KvPool>(sc);
      }
      if (states)
        states_host = std::make_unique<cache::StatePool>(static_cast<std::size_t>(exp.cache.host_mamba_slots),
                                                         states->words_per_slot() + (packed && draft_states ? draft_states->words_per_slot() : 0));
      h->attach_host_tier({std::move(htc), exp.cache.host_swa_pages.value(), exp.cache.host_mamba_slots, geo.local_layers()},
                          {pool.get(), host_kv.get(), swa_pool.get(), swa_host.get(), states.get(), states_host.get()}, *engine,
                          *agreement);
    } else {
      dc->attach_host_tier(std::move(htc), *pool, *host_kv, *engine, *agreement);
    }
  }
  if (host_kv && shape.pp > 1) {
    publish_agreement = protocols::make_publish_agreement(exp.protocol.pp_sync, grid);
    dc->write_acks()->set_cross_stage(publish_agreement.get());
  }
  if (host_kv && exp.cache.storage != "none") {
    KVGRID_CHECK(!exp.cache.storage_dir.empty(), "cache.storage_dir is unset (kvgrid run sets <run dir>/storage)");
    dc->attach_storage_tier(storage_config(exp, grid, faults, log), *host_kv, *agreement);
    if (shape.pp > 1) {
      cross_stage = protocols::make_prefetch_consensus(exp.protocol.prefetch_consensus, grid);
      dc->storage_tier()->set_cross_stage(cross_stage.get());
    }
  }
  if (has_draft) {
    const cache::DraftLayout layout = *protocols::draft_layout(exp.model.draft.mode);
    draft = std::make_unique<cache::DraftState>(layout, *draft_pool, host_kv.get(), pool->layers());
    if (auto* h = dc->hybrid(); h && h->host_tier()) {  // the draft's kinds move with the target's
      // (a kind the target has no layer of here: the draft's host copies in a pool of their own)
      if (draft_swa_pool)
        draft_swa = std::make_unique<cache::DraftState>(layout, *draft_swa_pool, swa_host.get(), swa_pool ? swa_pool->layers() : 0,
                                                        exp.cache.host_swa_pages.value());
      if (draft_states)
        draft_state_slots = std::make_unique<cache::DraftStates>(layout, *draft_states, states_host.get(),
                                                                 states ? states->words_per_slot() : 0, exp.cache.host_mamba_slots);
      h->host_tier()->set_draft({draft.get(), draft_swa.get(), draft_state_slots.get()});
    } else if (!dc->hybrid()) {
      dc->set_draft(draft.get());
    }
  }
  // P/D decode reads a restore steps after it started: its restores stay private until agreed.
  // protocol.pd_restore = unchecked (the bug): published at once, their outcome never looked at.
  // Hybrid models at decode PP = 1: the restore's outcome is agreed inside the admission instead,
  // before decode_prefix_len is answered — a broken restore is taken back and the suffix grows.
  if (pd_role(exp, grid) == PdRole::Decode && protocols::private_restores(protocols::parse_pd_restore(exp.protocol.pd_restore))) {
    if (dc->hybrid() && shape.pp == 1) dc->hybrid()->set_agreed_loads(true);
    else dc->set_private_restores(true);
  }
  // Load-backs that can fail (transfer.load.fail) stay private until their outcome is agreed
  // (protocols/load_back.hpp); protocol.load_back = unchecked (the bug): read at once.
  // (P/D decode: its restores are private anyway, and fail with pd.restore.fail.)
  private_loads = pd_role(exp, grid) != PdRole::Decode &&
                  protocols::private_load_backs(protocols::parse_load_back(exp.protocol.load_back),
                                                faults.configured("transfer.load.fail"));
  if (private_loads && dc->hybrid() && shape.pp == 1) {  // hybrid models, one stage: agreed inside the admission
    dc->hybrid()->set_agreed_loads(true);
    private_loads = false;
  }
  if (private_loads) dc->set_private_restores(true);
  // device.alloc.fail across stages under pp_sync: PP0's stage decides, later stages follow.
  pp_sync = protocols::make_pp_sync(exp.protocol.pp_sync);
  relay_admissions = faults.configured("device.alloc.fail") && shape.pp > 1 && pp_sync->relays_admissions();
  if (faults.configured("device.alloc.fail")) {
    if (!agreement) agreement = protocols::make_tp_sync(exp.protocol.tp_sync, grid.stage());
    dc->set_alloc_fault([&faults, &log] { return faults.evaluate("device.alloc.fail", log.step()).has_value(); }, *agreement);
  }
}

}  // namespace kvgrid
