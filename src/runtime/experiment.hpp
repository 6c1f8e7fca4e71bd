// The experiment file: its schema (every key kvgrid accepts, with defaults, ranges and units) and
// the typed configuration structs the components read. `load_experiment` is the one validation
// pass: schema checks (config.hpp) plus the checks that relate keys to each other. The schema is
// also what the README's configuration table documents (`kvgrid run --help-config` prints it).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/config.hpp"
#include "core/failpoint.hpp"
#include "core/ids.hpp"
#include "core/topology.hpp"

namespace kvgrid {

// The draft model of speculative decoding (`[model.draft]`): layers on the last PP stage, with
// their own KV (cache/draft_state.hpp).
struct DraftConfig {
  std::string mode = "none";  // none | packed | sidecar | target_only
  std::int64_t layers = 1, kv_heads = 0, head_dim = 0;  // 0: the target's
  std::int64_t steps = 3;      // tokens proposed per round
  double accept_prob = 0.7;    // chance that the target accepts each proposed token (draft KV intact)
  std::string dtype = "bf16";
  // Its layers' kinds (hybrid targets): "full", or a pattern like the target's with swa / mamba
  // layers — their KV in SWA pages and states indexed like the target's (draft sidecars).
  std::string layer_types = "full";
  bool enabled() const { return mode != "none"; }
};

// What a layer is (model.layer_types): full attention, sliding-window attention, or a recurrent
// (Mamba-style) layer.
enum class LayerKind : std::uint8_t { Full = 0, Swa = 1, Mamba = 2 };
inline constexpr std::size_t kLayerKinds = 3;
const char* layer_kind_name(LayerKind k);
struct ExperimentConfig;
// Hybrid models: what the hybrid device tier serves today (runtime/experiment_hybrid.cpp); throws
// InputError naming the keys otherwise. Part of load_experiment's checks.
void check_hybrid_model(const ExperimentConfig& e, const std::string& src);

// A payload pool that follows a component's page ids (`[[model.sidecar]]`; the article's
// DeepSeek-V4 shape: indexer and compressor buffers beside the FULL and SWA pools).
struct SidecarConfig {
  std::string name;
  LayerKind source = LayerKind::Full;
  std::int64_t words = 1;  // per token
  std::size_t index = 0;   // its place in the file (its payload's layer id: kSidecarLayer0 + index)
};

struct ModelConfig {
  std::int64_t layers = 8, kv_heads = 8, head_dim = 128;
  std::string attention = "mha";
  std::string cp_split = "interleave";  // how CP ranks split a chunk's query tokens
  // Hybrid models: a comma-separated pattern of full | swa | mamba repeated over the layers.
  std::string layer_types = "full";
  std::int64_t swa_window = 0;   // tokens an SWA layer attends to (q - W, q]
  std::int64_t mamba_chunk = 0;  // MAMBA checkpoint grid, tokens (0: the page size)
  std::int64_t mamba_state = 4;  // words of a MAMBA state per head
  std::vector<SidecarConfig> sidecars;
  DraftConfig draft;
  // The kind of every layer, in order (the pattern repeated).
  std::vector<LayerKind> kinds() const;
  // Any layer that is not full attention, or a sidecar: served by the unified tree core.
  bool hybrid() const;
  bool has(LayerKind k) const;
};

struct CacheConfig {
  Tokens page_size{16};
  Pages device_pages{4096};
  Pages host_pages{0};                   // 0: no host tier
  std::string write_policy = "write_through";
  std::int64_t write_through_threshold = 2;
  Tokens load_back_threshold{16};
  std::string storage = "none";           // "file": the storage tier (L3, needs the host tier)
  std::string cp_sharding = "replicated";  // protocols/cp_sharding.hpp
  Pages gather_pages{1024};               // one gather slot: pages of one layer
  Pages swa_pages{0};                     // SWA pool (hybrid models; 0: a quarter of device_pages)
  std::int64_t mamba_slots = 0;           // MAMBA state slots (hybrid models; 0: a quarter of device_pages)
  Pages host_swa_pages{0};                // hybrid host tier: SWA host pages (0: scaled like host_pages)
  std::int64_t host_mamba_slots = 0;      // hybrid host tier: MAMBA host states (0: scaled like host_pages)
  std::vector<std::string> component_bugs;  // planted component bugs (hybrid models; cache/component_bugs.hpp)
  // lru | session (session-aware eviction, hybrid models) | the planted bugs
  // session_close_resets_recency, session_no_generation (cache/unified_tree.hpp "Sessions")
  std::string eviction = "lru";
  std::int64_t session_tombstones = 8192;  // closed session ids remembered
  bool pd_prefill_sessions = false;        // P/D: prefill tracks sessions too (default: decode only)
  bool gather_overlap = true;
  std::string storage_dir;                // empty: <run dir>/storage
  std::string storage_url = "redis://127.0.0.1:6379";  // cache.storage = "redis"
  // cache.storage = "file": object (one file per object) | segment (a write batch's objects in one
  // file with its index: cache/segment_storage.hpp)
  std::string storage_file_layout = "object";
  bool storage_fsync = false;  // cache.storage = "file": sync each write's file and directory before it counts
  std::int64_t storage_capacity_mb = 1024;  // per rank
  // Storage object names (cache/unified_kv.hpp): rank_suffix (one object per rank and page, read
  // by the same rank of the same layout) | unified (a shared grid of layer ranges × head groups
  // that any aligned layout reads); the grid (0: each rank's own range / heads) and a tenant name.
  std::string storage_key_scheme = "rank_suffix";
  std::int64_t storage_layer_partition = 0, storage_head_partition = 0;
  // Host page layout: layer_first (the device pool's) | page_unified (unified keys: a host page is
  // its storage objects in object order; device<->host copies relayout, storage I/O is in place).
  std::string host_layout = "layer_first";
  std::string storage_namespace;
  // unified keys: other jobs read and write the directory while this one runs (lookups see their
  // objects as they appear; not reproducible). `storage_job` (set by `kvgrid run`, not a key):
  // this run's id in the objects it writes (a hash of its run directory).
  bool storage_shared = false;
  std::uint64_t storage_job = 0;
  Tokens prefetch_threshold{64};
  std::string prefetch_policy = "best_effort";
  double prefetch_timeout_base_ms = 5.0, prefetch_timeout_per_1k_ms = 2.0, prefetch_timeout_max_ms = 50.0;
};

struct TreeWorkloadConfig {  // Foundation I's cache-only workload
  std::int64_t steps = 200, requests_per_step = 4;
  std::int64_t prompt_tokens_min = 64, prompt_tokens_max = 512;
  std::int64_t prefixes = 8, prefix_tokens = 256;
  double followup_prob = 0.3;
  std::int64_t hold_steps_max = 4;
};

struct GspConfig {
  std::int64_t groups = 8, prompts_per_group = 4, system_prompt_len = 512, question_len = 64, output_len = 16;
  double range_ratio = 1.0;
  std::int64_t turns = 1;
  bool ordered = false;
};

struct MultiturnConfig {
  std::int64_t clients = 8, rounds = 3, request_length = 256, output_length = 16, sub_question_length = 0;
  std::int64_t max_in_flight = 8;
  bool round_barrier = false;
};

// A -> B -> A (vLLM #50630): each lane sends A, then B (A's first shared_len tokens, then its
// own), then A again, identical — `repeats` times B then A; a lane's next request is sent when
// its previous one finished, lanes run side by side.
struct AbaConfig {
  std::int64_t lanes = 4, a_len = 512, b_len = 512, shared_len = 200, output_len = 16, repeats = 1;
};

// Concurrent cold prefills: `groups` prefixes nobody has computed, `requests` per group arriving
// together, each the group's prefix and its own suffix.
struct ColdPrefixConfig {
  std::int64_t groups = 2, requests = 4, prefix_len = 1024, suffix_len = 64, output_len = 16;
};

// Agent trajectories in the shape of SWE-bench agent runs: every session starts with the shared
// system prompt and its own task, each turn resends the whole context plus the previous turn's
// output and a tool result of heavy-tailed length, after a think/tool pause; a turn may spawn a
// sub-agent session that starts from the parent's context and closes when done (the parent waits
// for it); a session closes after its last turn, or (abandon_prob) while its last turn runs.
struct AgenticConfig {
  std::int64_t sessions = 16, max_active = 8;      // trajectories; at most this many at once
  std::int64_t system_prompt_len = 2048, task_len = 512;
  std::int64_t turns_min = 4, turns_max = 16;
  std::int64_t tool_output_min = 32, tool_output_max = 8192;
  double tool_output_alpha = 1.2;                  // Pareto shape of a tool result's length
  std::int64_t output_len = 64;                    // generated tokens per turn
  double tool_time_ms = 200.0;                     // mean pause between turns (exponential), modelled
  double subagent_prob = 0.1;                      // per turn
  std::int64_t subagent_turns = 3;
  double abandon_prob = 0.0;                       // the client closes the session while its last turn runs
  double abandon_after_ms = 5.0;                   // ... this long after sending it
  double close_delay_ms = 0.0;                     // a finished trajectory's client closes its session this much later
  std::int64_t max_context = 65536;                // a session ends when its context would pass this
  double session_fraction = 1.0;                   // trajectories whose client passes a session id (the rest: none)
};

struct MooncakeConfig {
  std::string trace;
  std::int64_t first_n = 0;  // 0: all
  double time_scale = 1.0;
};

struct WorkloadConfig {
  std::string kind = "tree";
  std::int64_t vocab = 32000;
  double request_rate = 0.0;  // gsp / multiturn: requests per modelled second (0: all at once)
  TreeWorkloadConfig tree;
  GspConfig gsp;
  MultiturnConfig multiturn;
  AbaConfig aba;
  ColdPrefixConfig cold_prefix;
  AgenticConfig agentic;
  MooncakeConfig mooncake;
  bool sessions = false;  // gsp / multiturn / aba: each conversation is a session (agentic always)
  // Buckets by context length (runtime/routed_workload.hpp): this job serves the requests whose
  // prompt has route_min_prompt <= tokens < route_max_prompt (0: no bound); another job over the
  // same shared store serves the rest. `route_dir` (not a key): <cache.storage_dir>/router.
  std::int64_t route_min_prompt = 0, route_max_prompt = 0;
  double route_wait_s = 60.0;
  std::string route_dir;
};

struct EngineConfig {
  std::uint64_t seed = 1;
  double deadline_s = 120.0;
  bool debug_checks = false;
  std::int64_t check_every = 16;
  std::int64_t chunk_size = 512;    // prefill tokens per step (chunked prefill budget)
  std::int64_t max_running = 64;    // requests in prefill or decode at once
  std::string payload = "digest";   // "full" | "digest"
  bool strict = false;              // an oracle mismatch stops the run
  std::string transfer = "simulated";  // transfer engine backend
  std::string cuda_copy = "memcpy";    // transfer = cuda: how a batch of copies goes out (cuda/engine.hpp)
  std::string collectives = "mpi";     // KV data collectives: "mpi" | "nccl" (the CP layer gather)
  std::string decode = "step";         // "step" | "fused" (runtime/fused_decode.cpp)
  bool helper_thread = false;          // runtime/oracle_lane.hpp
};

// Modelled time (DESIGN §2 "Time"); values and their sources in runtime/cost.cpp.
struct CostConfig {
  double prefill_ns_per_token_layer = 1250.0;
  double attention_ns_per_context_token_layer = 0.041;
  double decode_ns_per_layer = 150000.0;
  double pp_link_ns = 10000.0;
  double allreduce_ns = 20000.0;
  double host_link_gb_s = 25.0;  // device <-> host copies (simulated engine)
  double storage_gb_s = 5.0;     // storage reads (simulated)
  double stage_skew = 0.0;       // stage p's copies take (1 + stage_skew * p) times as long
  double storage_latency_us = 100.0;  // per read batch (simulated)
  double gather_gb_s = 200.0;         // CP-sharded KV all-gather, received bytes
  std::string kv_bytes = "stored";    // "full": digest-mode copies are charged the full payload's bytes
  double gather_latency_us = 10.0;    // per layer
  double pd_link_gb_s = 25.0;         // P/D: prefill -> decode KV link, GB/s per rank pair
  double pd_latency_us = 20.0;        // P/D: one suffix transfer's latency
};

struct ProtocolConfig {
  std::string tp_sync = "min_allreduce";
  std::string pp_sync = "pp_sync";
  std::string prefetch_consensus = "pp_consensus";
  std::string consensus_check = "off";  // "on": the online rank consensus checker
  std::int64_t consensus_interval = 16;  // steps between its checks
  std::string pd = "decode_reuse";       // P/D: decode reuses its own prefix cache, or receives the whole prompt
  std::string pd_restore = "agreed";     // P/D: decode's restores private until agreed, or (buggy) unchecked
  std::string layer_gather = "after_restore";  // CP sharding: gather(l) after restore(l), or (buggy) before its event
  std::string load_back = "agreed";      // failing load-backs: private until agreed, or (buggy) unchecked
  std::string component_boundary = "whole_model";  // hybrid models across PP stages (protocols/component_boundary.hpp)
};

struct OutputConfig {
  std::string dir;  // empty: results/<experiment>/<seed>-<time>
  std::int64_t flush_every = 8, report_every = 50;
  double report_seconds = 1.0;  // serving loop: wall seconds between console rows, at least (0: off)
  std::string steps = "timed";  // the steps table: rows with wall times per phase, model times only, none
  bool quiet = false;           // kvgrid run -q: no progress rows (set by the CLI, not a key)
};

struct DebugConfig {
  std::int64_t plant_divergence_rank = -1, plant_divergence_step = 0;
  std::int64_t plant_divergence_stage = -1;        // every rank of this PP stage plants (-1: off)
  std::string plant_divergence_kind = "extra";     // extra | order | arguments | results
  std::int64_t kill_rank = -1, kill_at_step = 0;
  std::int64_t shrink_stage = -1, shrink_device_pages = 0;  // one stage's pool capacity (shape mismatch)
  std::int64_t input_error_rank = -1;  // this world rank alone finds an input error while it builds its stack
};

struct ExperimentConfig {
  std::string name;    // file stem
  std::string source;  // path as given
  TopologySpec topology;
  ModelConfig model;
  CacheConfig cache;
  WorkloadConfig workload;
  EngineConfig engine;
  CostConfig cost;
  ProtocolConfig protocol;
  OutputConfig output;
  DebugConfig debug;
  std::vector<FailpointConfig> faults;
  std::string effective_toml;

  // Checks that need the world size (rank lists); throws InputError.
  void validate_for_world(int world_size) const;
};

// CP sharding: device pool pages (each holding `local_layers` layers) that the two gather slots
// cost on a rank with that many layers.
Pages gather_charge(const ExperimentConfig& e, std::size_t local_layers);

const Schema& experiment_schema();
// Why engine.decode = fused cannot keep this experiment's decisions (runtime/fused_decode.cpp);
// empty: it can.
std::string fused_decode_refusal(const ExperimentConfig& e);
// Throws InputError (file, key, expected, found). `seed` overrides engine.seed when >= 0.
ExperimentConfig load_experiment(const std::string& path, const std::vector<std::string>& overrides,
                                 std::int64_t seed = -1);
ExperimentConfig parse_experiment(std::string_view toml, const std::string& name,
                                  const std::vector<std::string>& overrides, std::int64_t seed = -1);
// One line per key: "section.key  type  default  doc".
// Every experiment key: "text" (one line each, with type, choices, range, default and meaning),
// "json" (an array of objects), "template" (a commented experiment file at the defaults).
std::string schema_help(const std::string& format = "text");

}  // namespace kvgrid
