// The experiment file's schema: every key with its type, default, range and one-line doc, table
// by table, and `kvgrid run --keys` (schema_help). Reading a loaded Config into an
// ExperimentConfig and the relations between keys are in experiment.cpp.
#include "runtime/experiment.hpp"

#include <cmath>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cache/component_bugs.hpp"
#include "core/failpoint.hpp"
#include "protocols/component_boundary.hpp"
#include "protocols/draft_restore.hpp"

namespace kvgrid {

namespace {

KeySpec key(std::vector<std::string> path, ValueType type, Config::Value def, std::string doc,
            std::optional<double> min = std::nullopt, std::optional<double> max = std::nullopt) {
  KeySpec k;
  k.path = std::move(path);
  k.type = type;
  k.default_value = std::move(def);
  k.min = min;
  k.max = max;
  k.doc = std::move(doc);
  return k;
}
KeySpec ikey(std::vector<std::string> path, std::int64_t def, double min, double max, std::string doc) {
  return key(std::move(path), ValueType::Integer, def, std::move(doc), min, max);
}
KeySpec fkey(std::vector<std::string> path, double def, double min, double max, std::string doc) {
  return key(std::move(path), ValueType::Float, def, std::move(doc), min, max);
}
KeySpec skey(std::vector<std::string> path, std::vector<std::string> choices, std::string doc, std::string def = "") {
  KeySpec k = key(std::move(path), ValueType::String, choices.empty() ? def : choices.front(), std::move(doc));
  k.choices = std::move(choices);
  return k;
}
KeySpec bkey(std::vector<std::string> path, bool def, std::string doc) {
  return key(std::move(path), ValueType::Bool, def, std::move(doc));
}
KeySpec optional(KeySpec k) {
  k.optional_table = true;
  return k;
}
KeySpec element(KeySpec k) {  // a key of each table of an array of tables
  k.optional_table = true;
  k.array_element = true;
  return k;
}

constexpr double kBig = 9.0e15;

// The schema, table by table (the order is the order of `effective_toml` and the docs).
void add_topology_and_model_keys(Schema& s) {
  for (const char* d : {"tp", "cp", "pp"})
    s.add(ikey({"topology", d}, 1, 1, 4096, std::string(d) + " degree of the single group"));
  for (const char* g : {"prefill", "decode"})
    for (const char* d : {"tp", "cp", "pp"})
      s.add(optional(ikey({"topology", g, d}, 1, 1, 4096, std::string(d) + " degree of the " + g + " group")));
  s.add(ikey({"model", "layers"}, 8, 1, 4096, "transformer layers, split contiguously over PP stages"));
  s.add(ikey({"model", "kv_heads"}, 8, 1, 4096, "KV heads (MHA: split over TP)"));
  s.add(ikey({"model", "head_dim"}, 128, 1, 65536, "elements per head"));
  s.add(skey({"model", "attention"}, {"mha", "mla"}, "mha: heads split over TP; mla: one latent per token, replicated"));
  s.add(skey({"model", "cp_split"}, {"interleave", "zigzag"}, "how CP ranks split a prefill chunk's query tokens"));
  s.add(skey({"model", "layer_types"}, {},
             "hybrid models: comma-separated full | swa | mamba, repeated over the layers", "full"));
  s.add(ikey({"model", "swa_window"}, 0, 0, 1e9, "swa layers: tokens attended to, (q - W, q] (needed with swa layers)"));
  s.add(ikey({"model", "mamba_chunk"}, 0, 0, 1e9,
             "mamba layers: checkpoint grid in tokens, a multiple of cache.page_size (0: the page size)"));
  s.add(ikey({"model", "mamba_state"}, 4, 1, 4096, "mamba layers: words of recurrent state per head"));
  s.add_table_array({"model", "sidecar"});
  s.add(element(skey({"model", "sidecar", "name"}, {}, "[[model.sidecar]]: its name (unique)")));
  s.add(element(skey({"model", "sidecar", "source"}, {"full", "swa"},
                     "[[model.sidecar]]: the component whose page ids it follows (its payload moves with them)")));
  s.add(element(ikey({"model", "sidecar", "words"}, 1, 1, 64, "[[model.sidecar]]: payload words per token")));
  s.add(skey({"model", "draft", "mode"}, protocols::draft_modes(),
             "speculative decoding's draft state in the cache: no draft; draft layers packed into the target's host "
             "slots; a sidecar draft host pool; or the target's KV alone (the draft reads a blind prefix)"));
  s.add(ikey({"model", "draft", "layers"}, 1, 1, 64, "draft layers (MTP/EAGLE-style, on the last PP stage)"));
  s.add(ikey({"model", "draft", "kv_heads"}, 0, 0, 4096, "draft KV heads (0: model.kv_heads; MHA: split over TP)"));
  s.add(ikey({"model", "draft", "head_dim"}, 0, 0, 65536, "draft elements per head (0: model.head_dim)"));
  s.add(ikey({"model", "draft", "steps"}, 3, 1, 64, "tokens the draft proposes per round"));
  s.add(fkey({"model", "draft", "accept_prob"}, 0.7, 0.0, 1.0,
             "chance that the target accepts each proposed token, when the draft read the right KV"));
  s.add(skey({"model", "draft", "layer_types"}, {},
             "hybrid targets: the draft's layer kinds, comma-separated full | swa | mamba repeated over its layers "
             "(its SWA pages and states follow the target's ids)", "full"));
  s.add(skey({"model", "draft", "dtype"}, {"bf16", "fp16", "fp8"},
             "draft KV element type (the target's is bf16; packed needs the same)"));
}

void add_cache_keys(Schema& s) {
  s.add(ikey({"cache", "page_size"}, 16, 1, 65536, "tokens per KV page"));
  s.add(ikey({"cache", "device_pages"}, 4096, 1, 2147483647.0, "device (L1) pool capacity, pages, same on every stage"));
  s.add(ikey({"cache", "host_pages"}, 0, 0, 2147483647.0, "host (L2) pool capacity, pages (0: no host tier)"));
  s.add(skey({"cache", "write_policy"}, {"write_through", "write_through_selective", "write_back"},
             "device->host backup: every inserted node, once its hit count reaches write_through_threshold, or on device eviction"));
  s.add(ikey({"cache", "write_through_threshold"}, 2, 1, 1e9, "write_through_selective: hits before a backup"));
  s.add(ikey({"cache", "load_back_threshold"}, 16, 1, 1e9, "load back host hits of at least this many tokens"));
  s.add(skey({"cache", "storage"}, {"none", "file", "redis"},
             "storage tier (L3; needs the host tier): none, file (a directory of objects), or redis (a Redis server at cache.storage_url)"));
  s.add(skey({"cache", "storage_url"}, {}, "cache.storage = redis: the server, redis://HOST:PORT[/DB]", "redis://127.0.0.1:6379"));
  s.add(skey({"cache", "storage_file_layout"}, {"object", "segment"},
             "cache.storage = file: object (one file per object, named by its key) or segment (the objects of one "
             "write batch packed into one file whose head indexes them: one directory entry per batch)",
             "object"));
  s.add(bkey({"cache", "storage_fsync"}, false,
             "cache.storage = file: a write counts once its file's data and its directory entry are synced to stable "
             "storage (fdatasync before the rename, fsync of the directory after); off: the page cache, as dd"));
  s.add(skey({"cache", "storage_dir"}, {}, "storage directory (empty: <run dir>/storage; a directory set here is reused across runs)"));
  s.add(ikey({"cache", "storage_capacity_mb"}, 1024, 1, 1e9, "storage capacity, MiB: per rank with rank_suffix keys (LRU eviction beyond it); of the whole directory with unified keys (a sweep keeps it)"));
  s.add(skey({"cache", "storage_key_scheme"}, {"rank_suffix", "unified"},
             "storage object names: rank_suffix (per rank: read by the same rank of the same layout) or unified "
             "(a shared grid of layer ranges x head groups that any aligned layout reads, across jobs)"));
  s.add(skey({"cache", "host_layout"}, {"layer_first", "page_unified"},
             "host (L2) page layout: layer_first (the device pool's) or page_unified (unified keys: a host page holds "
             "its storage objects, written and read in place; device<->host copies relayout)"));
  s.add(ikey({"cache", "storage_layer_partition"}, 0, 0, 1e9,
             "unified keys: layers per object (0: each rank's own layer range; set it to share across PP layouts)"));
  s.add(ikey({"cache", "storage_head_partition"}, 0, 0, 1e9,
             "unified keys: KV heads per object (0: each rank's own heads; set it to share across TP layouts)"));
  s.add(skey({"cache", "storage_namespace"}, {}, "unified keys: a tenant name in the namespace digest (tenants never read each other's objects)"));
  s.add(bkey({"cache", "storage_shared"}, false,
             "unified keys: jobs running at the same time share cache.storage_dir (lookups see their objects as they "
             "appear; runs are marked not reproducible)"));
  s.add(ikey({"cache", "prefetch_threshold"}, 64, 1, 1e9, "prefetch from storage only a hit of at least this many tokens"));
  s.add(skey({"cache", "prefetch_policy"}, {"best_effort", "wait_complete", "timeout"},
             "when a prefetch stops: when the request is scheduled, when all reads are done, or done/timed out"));
  s.add(fkey({"cache", "prefetch_timeout_base_ms"}, 5.0, 0.0, 1e9, "timeout policy: base, modelled ms"));
  s.add(fkey({"cache", "prefetch_timeout_per_1k_ms"}, 2.0, 0.0, 1e9, "timeout policy: added per 1024 prefetched tokens, ms"));
  s.add(fkey({"cache", "prefetch_timeout_max_ms"}, 50.0, 0.0, 1e9, "timeout policy: cap, ms"));
  s.add(skey({"cache", "cp_sharding"}, {"replicated", "sharded", "any_owner_restore"},
             "CP page ownership: every CP rank stores every page, each page stored once by its owner "
             "(shard group: CP, or attention-TP for MLA at CP = 1), or the buggy restore onto any free page"));
  s.add(ikey({"cache", "gather_pages"}, 1024, 1, 2147483647.0,
             "sharded: pages of one layer a gather slot holds (two slots, charged to the device budget)"));
  s.add(bkey({"cache", "gather_overlap"}, true, "sharded: post layer l+1's gather before attention on layer l"));
  s.add(ikey({"cache", "swa_pages"}, 0, 0, 2147483647.0, "hybrid models: SWA pool pages per rank (0: device_pages / 4)"));
  s.add(ikey({"cache", "mamba_slots"}, 0, 0, 2147483647.0, "hybrid models: MAMBA state slots per rank (0: device_pages / 4)"));
  s.add(ikey({"cache", "host_swa_pages"}, 0, 0, 2147483647.0,
             "hybrid models with a host tier: SWA host pages per rank (0: swa_pages scaled by host_pages / device_pages)"));
  s.add(ikey({"cache", "host_mamba_slots"}, 0, 0, 2147483647.0,
             "hybrid models with a host tier: MAMBA host states per rank (0: mamba_slots scaled by host_pages / device_pages)"));
  s.add(skey({"cache", "eviction"}, {"lru", "session", "session_close_resets_recency", "session_no_generation"},
             "device and host eviction order: LRU, or session-aware (hybrid models: referenced KV of open sessions last); "
             "the last two plant bug-catalogue #24 and #25"));
  s.add(bkey({"cache", "pd_prefill_sessions"}, false, "P/D: prefill's cache holds session references too (default: decode holds them, prefill keeps LRU)"));
  s.add(ikey({"cache", "session_tombstones"}, 8192, 1, 1e9, "closed session ids remembered (their late finishers register nothing)"));
  {
    KeySpec k = key({"cache", "component_bugs"}, ValueType::StringArray, std::vector<std::string>{},
                    "hybrid models: production bugs of the components planted (bug-catalogue #14-#23; empty: the correct code)");
    k.choices = cache::component_bug_names();
    s.add(std::move(k));
  }
}

void add_protocol_keys(Schema& s) {
  s.add(skey({"protocol", "pp_sync"}, {"pp_sync", "independent_polling"},
             "agreement of host-tier ACK consumption across PP stages (buggy: independent_polling)"));
  s.add(skey({"protocol", "component_boundary"}, protocols::component_boundary_variants(),
             "hybrid models across PP stages: every stage's tree keeps every component of the model, or (buggy) "
             "only those of its own layers"));
  s.add(skey({"protocol", "prefetch_consensus"}, {"pp_consensus", "per_rank"},
             "storage prefetch decisions across PP stages (buggy: per_rank)"));
  s.add(skey({"protocol", "consensus_check"}, {"off", "on"},
             "online rank consensus checker: compare decision logs every consensus_interval steps, stop at a divergence"));
  s.add(ikey({"protocol", "consensus_interval"}, 16, 1, kBig, "steps between online consensus checks"));
  s.add(skey({"protocol", "pd"}, {"decode_reuse", "full_transfer"},
             "P/D world: decode matches its own radix tree and receives only the suffix, or (baseline) receives the whole prompt"));
  s.add(skey({"protocol", "pd_restore"}, {"agreed", "unchecked"},
             "P/D decode's host restores: private until their outcome is agreed over decode's ranks (a failed one fails "
             "its request), or (buggy) published at once and never checked"));
  s.add(skey({"protocol", "layer_gather"}, {"after_restore", "before_restore_event"},
             "CP-sharded pools: layer l's gather is posted after its restore copies landed, or (buggy) before their event"));
  s.add(skey({"protocol", "load_back"}, {"agreed", "unchecked"},
             "host->device load-backs when they can fail (transfer.load.fail): private until their outcome is agreed "
             "over every rank serving the request (a failed one is recomputed), or (buggy) read at once, never checked"));
  s.add(skey({"protocol", "tp_sync"}, {"min_allreduce", "per_rank", "skip_when_empty"},
             "agreement of ACK consumption in a stage (buggy: per_rank, skip_when_empty)"));
}

void add_workload_keys(Schema& s) {
  s.add(skey({"workload", "kind"}, {"tree", "gsp", "multiturn", "mooncake", "aba", "cold_prefix", "agentic"},
             "tree: cache-only loop; gsp, multiturn, mooncake, aba, cold_prefix, agentic (agent sessions): the serving loop with the synthetic model"));
  s.add(ikey({"workload", "vocab"}, 32000, 2, 4294967295.0, "vocabulary size (prompt and generated token ids are < vocab)"));
  s.add(fkey({"workload", "request_rate"}, 0.0, 0.0, 1e9, "gsp/multiturn/aba/cold_prefix/agentic: Poisson arrivals (agentic: session starts) per modelled second (0: all at t = 0)"));
  s.add(ikey({"workload", "route_min_prompt"}, 0, 0, 1e12,
             "buckets by context length: serve only prompts of at least this many tokens (another job over the same "
             "shared store serves the rest; needs cache.storage_shared)"));
  s.add(ikey({"workload", "route_max_prompt"}, 0, 0, 1e12, "buckets: serve only prompts shorter than this (0: no bound)"));
  s.add(fkey({"workload", "route_wait_s"}, 60.0, 0.001, 1e6,
             "buckets: how long (wall time) to wait for the other job to finish a request whose follow-up this job serves"));
  s.add(bkey({"workload", "sessions"}, false, "gsp / multiturn / aba / cold_prefix: each conversation is a session (opened at its first request, closed after its last)"));
  s.add(ikey({"workload", "tree", "steps"}, 200, 1, kBig, "scheduler steps"));
  s.add(ikey({"workload", "tree", "requests_per_step"}, 4, 1, 1e6, "requests arriving per step"));
  s.add(ikey({"workload", "tree", "prompt_tokens_min"}, 64, 1, 1e9, "shortest prompt, tokens"));
  s.add(ikey({"workload", "tree", "prompt_tokens_max"}, 512, 1, 1e9, "longest prompt, tokens"));
  s.add(ikey({"workload", "tree", "prefixes"}, 8, 1, 1e6, "shared-prefix families (system prompts)"));
  s.add(ikey({"workload", "tree", "prefix_tokens"}, 256, 0, 1e9, "length of a family's shared prefix, tokens"));
  s.add(fkey({"workload", "tree", "followup_prob"}, 0.3, 0.0, 1.0, "probability that a request extends an earlier one"));
  s.add(ikey({"workload", "tree", "hold_steps_max"}, 4, 1, 1e6, "a request keeps its prefix locked for 1..N steps"));
  s.add(ikey({"workload", "gsp", "groups"}, 8, 1, 1e6, "groups sharing a system prompt"));
  s.add(ikey({"workload", "gsp", "prompts_per_group"}, 4, 1, 1e6, "prompts per group"));
  s.add(ikey({"workload", "gsp", "system_prompt_len"}, 512, 0, 1e8, "system prompt tokens"));
  s.add(ikey({"workload", "gsp", "question_len"}, 64, 1, 1e8, "question tokens per turn"));
  s.add(ikey({"workload", "gsp", "output_len"}, 16, 1, 1e6, "generated tokens per request"));
  s.add(fkey({"workload", "gsp", "range_ratio"}, 1.0, 0.0, 1.0, "lengths drawn in [ratio * L, L]"));
  s.add(ikey({"workload", "gsp", "turns"}, 1, 1, 1e4, "turns per prompt (a turn arrives when the previous one finishes)"));
  s.add(bkey({"workload", "gsp", "ordered"}, false, "keep prompts in group order instead of shuffling"));
  s.add(ikey({"workload", "multiturn", "clients"}, 8, 1, 1e6, "conversations"));
  s.add(ikey({"workload", "multiturn", "rounds"}, 3, 1, 1e4, "rounds per client"));
  s.add(ikey({"workload", "multiturn", "request_length"}, 256, 1, 1e8, "first-round prompt tokens"));
  s.add(ikey({"workload", "multiturn", "output_length"}, 16, 1, 1e6, "generated tokens per round"));
  s.add(ikey({"workload", "multiturn", "sub_question_length"}, 0, 0, 1e8, "new tokens per later round (0: request_length)"));
  s.add(ikey({"workload", "multiturn", "max_in_flight"}, 8, 1, 1e6, "requests outstanding at once"));
  s.add(bkey({"workload", "multiturn", "round_barrier"}, false, "round r+1 starts when every client finished round r"));
  s.add(ikey({"workload", "aba", "lanes"}, 4, 1, 1e6, "A -> B -> A sequences run side by side"));
  s.add(ikey({"workload", "aba", "a_len"}, 512, 2, 1e8, "tokens of A (sent again, identical, after B)"));
  s.add(ikey({"workload", "aba", "b_len"}, 512, 2, 1e8, "tokens of B"));
  s.add(ikey({"workload", "aba", "shared_len"}, 200, 0, 1e8, "tokens B shares with A's start (< a_len and b_len)"));
  s.add(ikey({"workload", "aba", "output_len"}, 16, 1, 1e6, "generated tokens per request"));
  s.add(ikey({"workload", "aba", "repeats"}, 1, 1, 1e4, "B then A again, this many times after the first A"));
  s.add(ikey({"workload", "cold_prefix", "groups"}, 2, 1, 1e6, "prefixes nobody has computed"));
  s.add(ikey({"workload", "cold_prefix", "requests"}, 4, 1, 1e6, "requests per group, arriving together"));
  s.add(ikey({"workload", "cold_prefix", "prefix_len"}, 1024, 1, 1e8, "tokens of a group's prefix"));
  s.add(ikey({"workload", "cold_prefix", "suffix_len"}, 64, 1, 1e8, "tokens of each request's own suffix"));
  s.add(ikey({"workload", "cold_prefix", "output_len"}, 16, 1, 1e6, "generated tokens per request"));
  s.add(ikey({"workload", "agentic", "sessions"}, 16, 1, 1e6, "agent trajectories (sessions)"));
  s.add(ikey({"workload", "agentic", "max_active"}, 8, 1, 1e6, "trajectories running at once (sub-agents not counted)"));
  s.add(ikey({"workload", "agentic", "system_prompt_len"}, 2048, 0, 1e8, "system prompt and tool definitions every session starts with, tokens"));
  s.add(ikey({"workload", "agentic", "task_len"}, 512, 1, 1e8, "a session's own task (issue text), tokens"));
  s.add(ikey({"workload", "agentic", "turns_min"}, 4, 1, 1e5, "fewest turns per session"));
  s.add(ikey({"workload", "agentic", "turns_max"}, 16, 1, 1e5, "most turns per session"));
  s.add(ikey({"workload", "agentic", "tool_output_min"}, 32, 1, 1e8, "shortest tool result, tokens"));
  s.add(ikey({"workload", "agentic", "tool_output_max"}, 8192, 1, 1e8, "longest tool result (the heavy tail's cap), tokens"));
  s.add(fkey({"workload", "agentic", "tool_output_alpha"}, 1.2, 0.1, 100.0, "Pareto shape of a tool result's length (smaller: heavier tail)"));
  s.add(ikey({"workload", "agentic", "output_len"}, 64, 1, 1e6, "generated tokens per turn"));
  s.add(fkey({"workload", "agentic", "tool_time_ms"}, 200.0, 0.0, 1e9, "mean think/tool pause between turns (exponential), modelled ms"));
  s.add(fkey({"workload", "agentic", "subagent_prob"}, 0.1, 0.0, 1.0, "chance that a turn spawns a sub-agent (the parent waits for it)"));
  s.add(ikey({"workload", "agentic", "subagent_turns"}, 3, 1, 1e5, "turns of a sub-agent"));
  s.add(fkey({"workload", "agentic", "abandon_prob"}, 0.0, 0.0, 1.0, "chance that a client closes its session while the last turn still runs (a late finisher)"));
  s.add(fkey({"workload", "agentic", "abandon_after_ms"}, 5.0, 0.0, 1e9, "an abandoned session closes this long after its last turn was sent, modelled ms"));
  s.add(fkey({"workload", "agentic", "session_fraction"}, 1.0, 0.0, 1.0,
             "share of trajectories whose client passes a session id (the others' requests belong to no session: plain LRU traffic beside the sessions)"));
  s.add(fkey({"workload", "agentic", "close_delay_ms"}, 0.0, 0.0, 1e9,
             "a finished trajectory's client closes its session this long after its last turn, modelled ms (an idle timeout)"));
  s.add(ikey({"workload", "agentic", "max_context"}, 65536, 1, 1e9, "a session ends before its context would pass this many tokens"));
  KeySpec trace = skey({"workload", "mooncake", "trace"}, {}, "Mooncake JSONL trace (relative paths: to the experiment file)");
  s.add(trace);
  s.add(ikey({"workload", "mooncake", "first_n"}, 0, 0, kBig, "replay only the first N requests (0: all)"));
  s.add(fkey({"workload", "mooncake", "time_scale"}, 1.0, 0.0, 1e9, "multiplies the trace's timestamps"));
}

void add_engine_and_cost_keys(Schema& s) {
  s.add(ikey({"engine", "seed"}, 1, 0, kBig, "run seed (--seed overrides); rank streams use seed ^ world_rank"));
  s.add(fkey({"engine", "deadline_s"}, 120.0, 0.01, 864000.0, "watchdog deadline of every blocking wait, wall seconds"));
  s.add(bkey({"engine", "debug_checks"}, false, "run costly invariant checks (tree verify()) after every operation"));
  s.add(ikey({"engine", "check_every"}, 16, 1, kBig, "steps between cross-rank checks (verify + digests)"));
  s.add(ikey({"engine", "chunk_size"}, 512, 1, 1e9, "prefill tokens per step (chunked prefill budget)"));
  s.add(ikey({"engine", "max_running"}, 64, 1, 1e6, "requests in prefill or decode at once"));
  s.add(skey({"engine", "payload"}, {"digest", "full"}, "full: real KV elements; digest: one word per page, layer and head"));
  s.add(bkey({"engine", "strict"}, false, "an oracle mismatch stops the run (also --strict)"));
  s.add(skey({"engine", "decode"}, {"step", "fused"},
             "step: every decode step runs the whole step; fused: a run of decode steps no cache event can observe (one "
             "request decoding, nothing to admit, arrive, land or check) runs as one span in one call (digest payload: "
             "its KV written at the span's end) — the "
             "same decisions, KV and clocks (one rank, no storage, draft, hybrid model, failpoints or threaded engine: "
             "refused otherwise, with the reason)"));
  s.add(bkey({"engine", "helper_thread"}, false,
             "helper threads on each rank: the oracle's check of a chunk of 4,096 positions or more runs on one while the "
             "model computes the chunk, compared at the same point, and a Mooncake trace's prompts are made on another "
             "ahead of their arrival, with the prefix hash at each whole block's end (the model's chain over a cached "
             "prefix starts there; the oracle hashes every token) — the same run, faster where a core is idle (one "
             "rank on two or more cores), slower where none is"));
  s.add(skey({"engine", "transfer"}, {"simulated", "threaded", "cuda"},
             "transfer engine: simulated (modelled time, seeded jitter, deterministic), threaded (real copies) or cuda "
             "(CUDA streams and events; device pools in GPU memory, host pools pinned; a build with -DKVGRID_CUDA=ON and "
             "a GPU)"));
  s.add(skey({"engine", "cuda_copy"}, {"memcpy", "kernel", "batch"},
             "engine.transfer = cuda: a batch of page copies as one cudaMemcpyAsync per copy, one copy-kernel launch, or "
             "one cudaMemcpyBatchAsync"));
  s.add(skey({"engine", "collectives"}, {"mpi", "nccl", "mpi_ordered"},
             "KV data between ranks (the CP layer gather, the P/D transport): MPI, or NCCL on the GPU (needs "
             "engine.transfer = cuda and a build with -DKVGRID_NCCL=ON; P/D over NCCL's order-matched point-to-point); "
             "mpi_ordered: P/D through the NCCL transport's ordering layer over MPI (testing it without a GPU). MPI stays "
             "for control"));
  s.add(fkey({"cost", "prefill_ns_per_token_layer"}, 1250.0, 0.0, 1e12, "prefill compute per token per layer at TP·CP = 1"));
  s.add(fkey({"cost", "attention_ns_per_context_token_layer"}, 0.041, 0.0, 1e12, "attention per (query, context) token pair per layer"));
  s.add(fkey({"cost", "decode_ns_per_layer"}, 150000.0, 0.0, 1e12, "one decode step per layer (weight reads)"));
  s.add(fkey({"cost", "pp_link_ns"}, 10000.0, 0.0, 1e12, "activation hop between PP stages"));
  s.add(fkey({"cost", "allreduce_ns"}, 20000.0, 0.0, 1e12, "one stage all-reduce of per-request checksums"));
  s.add(fkey({"cost", "host_link_gb_s"}, 25.0, 1e-6, 1e6, "device<->host copy bandwidth, GB/s (simulated engine)"));
  s.add(fkey({"cost", "stage_skew"}, 0.0, 0.0, 1e6, "cross-stage skew: stage p's device<->host copies take (1 + stage_skew * p) times as long"));
  s.add(fkey({"cost", "storage_gb_s"}, 5.0, 1e-6, 1e6, "storage read bandwidth, GB/s (simulated)"));
  s.add(skey({"cost", "kv_bytes"}, {"stored", "full"},
             "bytes modelled copy, storage and gather times charge: what the payload stores, or (digest payload) "
             "what the full payload would move (page_size x head_dim words per page, layer and head)"));
  s.add(fkey({"cost", "gather_gb_s"}, 200.0, 1e-6, 1e6, "CP-sharded KV all-gather: bytes a rank receives per ns, GB/s"));
  s.add(fkey({"cost", "gather_latency_us"}, 10.0, 0.0, 1e9, "latency of one layer's all-gather, us"));
  s.add(fkey({"cost", "pd_link_gb_s"}, 25.0, 1e-6, 1e6, "P/D: prefill -> decode KV link bandwidth per rank pair, GB/s"));
  s.add(fkey({"cost", "pd_latency_us"}, 20.0, 0.0, 1e9, "P/D: latency of one suffix transfer, us"));
  s.add(fkey({"cost", "storage_latency_us"}, 100.0, 0.0, 1e9, "latency of one storage read batch, us (simulated)"));
}

void add_faults_keys(Schema& s) {
  for (const auto& fp : failpoint_catalogue()) {
    s.add(optional(fkey({"faults", fp.name, "probability"}, 0.0, 0.0, 1.0, "chance per evaluation: " + fp.doc)));
    s.add(optional(key({"faults", fp.name, "ranks"}, ValueType::IntArray, std::vector<std::int64_t>{},
                       "world ranks where it may fire (empty: all)", 0, 1e7)));
    s.add(optional(ikey({"faults", fp.name, "from_step"}, 0, 0, kBig, "first step at which it may fire")));
    for (const auto& p : fp.params) s.add(optional(fkey({"faults", fp.name, p.name}, p.default_value, p.min, p.max, p.doc)));
  }
}

void add_output_and_debug_keys(Schema& s) {
  s.add(skey({"output", "dir"}, {}, "run directory (empty: results/<experiment>/<seed>-<time>; --out overrides)"));
  s.add(ikey({"output", "flush_every"}, 8, 1, kBig, "steps between trace flushes"));
  s.add(ikey({"output", "report_every"}, 50, 1, kBig, "steps between console rows (at most; see report_seconds)"));
  s.add(fkey({"output", "report_seconds"}, 1.0, 0.0, 3600.0,
             "serving loop: at least this many wall seconds between console rows (0: every report_every steps); the last row always"));
  s.add(skey({"output", "steps"}, {"timed", "model", "none"},
             "serving loop: the trace's steps table — a row per step with each phase's modelled and wall time (timed), "
             "modelled times only, the wall columns 0 (model: no clock read per phase), or no rows (none: a replay "
             "study of hundreds of thousands of steps writes no table of them)"));
  s.add(ikey({"debug", "plant_divergence_rank"}, -1, -1, 1e7,
             "testing: this world rank takes one extra decision (tree loop: caches an extra prompt) (-1: off)"));
  s.add(ikey({"debug", "plant_divergence_step"}, 0, 0, kBig, "testing: step of the planted divergence"));
  s.add(ikey({"debug", "plant_divergence_stage"}, -1, -1, 4096,
             "testing: every rank of this PP stage plants, so the stage's peers agree and only stages differ (-1: off)"));
  s.add(skey({"debug", "plant_divergence_kind"}, {"extra", "order", "arguments", "results"},
             "testing: the planted ranks take one decision more (extra; the tree loop caches an extra prompt), or every "
             "rank takes the same decisions and the planted ones take two in the other order, with another argument or "
             "with another result (equal log lengths)"));
  s.add(ikey({"debug", "kill_rank"}, -1, -1, 1e7, "testing: this world rank dies by SIGKILL (-1: off)"));
  s.add(ikey({"debug", "kill_at_step"}, 0, 0, kBig, "testing: step at which kill_rank dies"));
  s.add(ikey({"debug", "input_error_rank"}, -1, -1, 1e7,
             "testing: this world rank alone finds an input error while it builds its stack, the others wait in "
             "their start-up collectives (-1: off)"));
  s.add(ikey({"debug", "shrink_stage"}, -1, -1, 4096, "testing: this PP stage gets debug.shrink_device_pages (-1: off)"));
  s.add(ikey({"debug", "shrink_device_pages"}, 0, 0, 2147483647.0, "testing: the shrunk stage's device pool capacity"));
}

Schema build_schema() {
  Schema s;
  add_topology_and_model_keys(s);
  add_cache_keys(s);
  add_protocol_keys(s);
  add_workload_keys(s);
  add_engine_and_cost_keys(s);
  add_faults_keys(s);
  add_output_and_debug_keys(s);
  return s;
}

}  // namespace

const Schema& experiment_schema() {
  static const Schema s = build_schema();
  return s;
}

namespace {
std::string number_text(double v, bool integer) {
  std::ostringstream os;
  if (integer && std::abs(v) < 9.2e18) os << static_cast<long long>(v);
  else os << v;
  return os.str();
}
std::string default_text(const KeySpec& k) {
  return std::visit(
      [](const auto& v) -> std::string {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, std::string>) return "\"" + v + "\"";
        else if constexpr (std::is_same_v<T, bool>) return v ? "true" : "false";
        else if constexpr (std::is_same_v<T, std::vector<std::int64_t>>) return "[]";
        else if constexpr (std::is_same_v<T, std::vector<std::string>>) return "[]";
        else return number_text(static_cast<double>(v), std::is_integral_v<T>);
      },
      k.default_value);
}
std::string range_text(const KeySpec& k) {
  if (!k.min && !k.max) return "";
  const bool integer = k.type == ValueType::Integer || k.type == ValueType::IntArray;
  return "[" + (k.min ? number_text(*k.min, integer) : std::string("-inf")) + ", " +
         (k.max ? number_text(*k.max, integer) : std::string("inf")) + "]";
}
}  // namespace

std::string schema_help(const std::string& format) {
  std::ostringstream os;
  const auto& keys = experiment_schema().keys();
  if (format == "json") {
    nlohmann::json all = nlohmann::json::array();
    for (const auto& k : keys) {
      nlohmann::json x = {{"key", key_path_string(k.path)}, {"type", value_type_name(k.type)}, {"doc", k.doc}};
      if (!k.optional_table) x["default"] = nlohmann::json::parse(default_text(k));
      const bool integer = k.type == ValueType::Integer || k.type == ValueType::IntArray;
      if (k.min) x["min"] = integer ? nlohmann::json(static_cast<long long>(*k.min)) : nlohmann::json(*k.min);
      if (k.max) x["max"] = integer ? nlohmann::json(static_cast<long long>(*k.max)) : nlohmann::json(*k.max);
      if (!k.choices.empty()) x["choices"] = k.choices;
      all.push_back(std::move(x));
    }
    return all.dump(1) + "\n";
  }
  if (format == "template") {
    // A commented experiment file: every table with its keys at their defaults, commented out
    // (uncomment what you change); failpoints are listed, one example shown.
    os << "# kvgrid experiment — every key at its default (kvgrid run --keys --template). Uncomment what you change.\n"
       << "# Keys, types, ranges and meanings: kvgrid run --keys. Run: mpirun -np <tp*cp*pp> build/kvgrid run THIS.toml\n";
    std::string table;
    for (const auto& k : keys) {
      if (k.optional_table || k.path.front() == "faults") continue;
      const std::string t = key_path_string(std::vector<std::string>(k.path.begin(), k.path.end() - 1));
      if (t != table) {
        os << "\n[" << t << "]\n";
        table = t;
      }
      os << "# " << k.doc << " (" << value_type_name(k.type);
      if (!k.choices.empty()) {
        os << ":";
        for (const auto& c : k.choices) os << " " << c;
      }
      if (const auto r = range_text(k); !r.empty()) os << " in " << r;
      os << ")\n# " << k.path.back() << " = " << default_text(k) << "\n";
    }
    os << "\n# Failpoints (each a table [faults.\"NAME\"] with probability, ranks, from_step and its parameters):\n#";
    for (const auto& fp : failpoint_catalogue()) os << " " << fp.name;
    os << "\n# [faults.\"transfer.load.fail\"]\n# probability = 0.05\n";
    return os.str();
  }
  for (const auto& k : keys) {
    os << key_path_string(k.path) << "  (" << value_type_name(k.type);
    if (!k.choices.empty()) {
      os << ":";
      for (const auto& c : k.choices) os << " " << c;
    }
    if (const auto r = range_text(k); !r.empty()) os << " in " << r;
    os << ")";
    if (!k.optional_table) os << "  default " << default_text(k);
    os << "  " << k.doc << "\n";
  }
  return os.str();
}

}  // namespace kvgrid
