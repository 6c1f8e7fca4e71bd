#include "runtime/experiment.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <optional>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "cache/component_bugs.hpp"
#include "cache/draft_state.hpp"
#include "core/check.hpp"
#include "protocols/component_boundary.hpp"
#include "protocols/cp_sharding.hpp"
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

Schema build_schema() {
  Schema s;
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
  s.add(skey({"model", "draft", "dtype"}, {"bf16", "fp16", "fp8"},
             "draft KV element type (the target's is bf16; packed needs the same)"));
  s.add(ikey({"cache", "page_size"}, 16, 1, 65536, "tokens per KV page"));
  s.add(ikey({"cache", "device_pages"}, 4096, 1, 2147483647.0, "device (L1) pool capacity, pages, same on every stage"));
  s.add(ikey({"cache", "host_pages"}, 0, 0, 2147483647.0, "host (L2) pool capacity, pages (0: no host tier)"));
  s.add(skey({"cache", "write_policy"}, {"write_through", "write_through_selective", "write_back"},
             "device->host backup: every inserted node, once its hit count reaches write_through_threshold, or on device eviction"));
  s.add(ikey({"cache", "write_through_threshold"}, 2, 1, 1e9, "write_through_selective: hits before a backup"));
  s.add(ikey({"cache", "load_back_threshold"}, 16, 1, 1e9, "load back host hits of at least this many tokens"));
  s.add(skey({"cache", "storage"}, {"none", "file"}, "storage tier (L3): none, or file (one object per page; needs the host tier)"));
  s.add(skey({"cache", "storage_dir"}, {}, "storage directory (empty: <run dir>/storage; a directory set here is reused across runs)"));
  s.add(ikey({"cache", "storage_capacity_mb"}, 1024, 1, 1e9, "storage capacity per rank, MiB (LRU eviction beyond it)"));
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
  {
    KeySpec k = key({"cache", "component_bugs"}, ValueType::StringArray, std::vector<std::string>{},
                    "hybrid models: production bugs of the components planted (bug-catalogue #14-#23; empty: the correct code)");
    k.choices = cache::component_bug_names();
    s.add(std::move(k));
  }
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
  s.add(skey({"workload", "kind"}, {"tree", "gsp", "multiturn", "mooncake", "aba", "cold_prefix"},
             "tree: cache-only loop; gsp, multiturn, mooncake, aba, cold_prefix: the serving loop with the synthetic model"));
  s.add(ikey({"workload", "vocab"}, 32000, 2, 4294967295.0, "vocabulary size (prompt and generated token ids are < vocab)"));
  s.add(fkey({"workload", "request_rate"}, 0.0, 0.0, 1e9, "gsp/multiturn/aba/cold_prefix: Poisson arrivals per modelled second (0: all at t = 0)"));
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
  KeySpec trace = skey({"workload", "mooncake", "trace"}, {}, "Mooncake JSONL trace (relative paths: to the experiment file)");
  s.add(trace);
  s.add(ikey({"workload", "mooncake", "first_n"}, 0, 0, kBig, "replay only the first N requests (0: all)"));
  s.add(fkey({"workload", "mooncake", "time_scale"}, 1.0, 0.0, 1e9, "multiplies the trace's timestamps"));
  s.add(ikey({"engine", "seed"}, 1, 0, kBig, "run seed (--seed overrides); rank streams use seed ^ world_rank"));
  s.add(fkey({"engine", "deadline_s"}, 120.0, 0.01, 864000.0, "watchdog deadline of every blocking wait, wall seconds"));
  s.add(bkey({"engine", "debug_checks"}, false, "run costly invariant checks (tree verify()) after every operation"));
  s.add(ikey({"engine", "check_every"}, 16, 1, kBig, "steps between cross-rank checks (verify + digests)"));
  s.add(ikey({"engine", "chunk_size"}, 512, 1, 1e9, "prefill tokens per step (chunked prefill budget)"));
  s.add(ikey({"engine", "max_running"}, 64, 1, 1e6, "requests in prefill or decode at once"));
  s.add(skey({"engine", "payload"}, {"digest", "full"}, "full: real KV elements; digest: one word per page, layer and head"));
  s.add(bkey({"engine", "strict"}, false, "an oracle mismatch stops the run (also --strict)"));
  s.add(skey({"engine", "transfer"}, {"simulated", "threaded"},
             "transfer engine: simulated (modelled time, seeded jitter, deterministic) or threaded (real copies)"));
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
  for (const auto& fp : failpoint_catalogue()) {
    s.add(optional(fkey({"faults", fp.name, "probability"}, 0.0, 0.0, 1.0, "chance per evaluation: " + fp.doc)));
    s.add(optional(key({"faults", fp.name, "ranks"}, ValueType::IntArray, std::vector<std::int64_t>{},
                       "world ranks where it may fire (empty: all)", 0, 1e7)));
    s.add(optional(ikey({"faults", fp.name, "from_step"}, 0, 0, kBig, "first step at which it may fire")));
    for (const auto& p : fp.params) s.add(optional(fkey({"faults", fp.name, p.name}, p.default_value, p.min, p.max, p.doc)));
  }
  s.add(skey({"output", "dir"}, {}, "run directory (empty: results/<experiment>/<seed>-<time>; --out overrides)"));
  s.add(ikey({"output", "flush_every"}, 8, 1, kBig, "steps between trace flushes"));
  s.add(ikey({"output", "report_every"}, 50, 1, kBig, "steps between console rows (at most; see report_seconds)"));
  s.add(fkey({"output", "report_seconds"}, 1.0, 0.0, 3600.0,
             "serving loop: at least this many wall seconds between console rows (0: every report_every steps); the last row always"));
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
  s.add(ikey({"debug", "shrink_stage"}, -1, -1, 4096, "testing: this PP stage gets debug.shrink_device_pages (-1: off)"));
  s.add(ikey({"debug", "shrink_device_pages"}, 0, 0, 2147483647.0, "testing: the shrunk stage's device pool capacity"));
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

namespace {
// Relations between keys (each key alone was validated when read); throws InputError naming them.
void check_relations(const ExperimentConfig& e, const std::string& src) {
  check_hybrid_model(e, src);
  const auto& d = e.model.draft;
  const auto& w = e.workload;
  for (const auto& g : e.topology.groups) {
    // CP sharding: the two gather slots are charged to every rank's device budget.
    if (e.cache.cp_sharding != "replicated" && protocols::shard_group_size(g.shape, e.model.attention == "mla") > 1 &&
        g.shape.pp <= e.model.layers) {
      const Pages charged = gather_charge(e, static_cast<std::size_t>(e.model.layers / g.shape.pp));
      if (charged >= e.cache.device_pages)
        throw InputError(src + ": cache.device_pages = " + std::to_string(e.cache.device_pages.value()) +
                         " leaves no KV pages once the two gather slots of cache.gather_pages = " +
                         std::to_string(e.cache.gather_pages.value()) + " are charged (" + std::to_string(charged.value()) +
                         " pages at " + std::to_string(e.model.layers / g.shape.pp) +
                         " layers per stage): raise cache.device_pages or lower cache.gather_pages");
    }
    if (g.shape.pp > e.model.layers)
      throw InputError(src + ": topology " + g.name + " has pp = " + std::to_string(g.shape.pp) +
                       " stages but model.layers = " + std::to_string(e.model.layers) + " (each stage needs a layer)");
    if (e.model.attention == "mha" && e.model.kv_heads % g.shape.tp != 0)
      throw InputError(src + ": model.kv_heads = " + std::to_string(e.model.kv_heads) +
                       " is not divisible by the " + g.name + " group's tp = " + std::to_string(g.shape.tp) +
                       " (MHA splits heads over TP)");
    if (d.enabled() && e.model.attention == "mha" && d.kv_heads % g.shape.tp != 0)
      throw InputError(src + ": model.draft.kv_heads = " + std::to_string(d.kv_heads) + " is not divisible by the " +
                       g.name + " group's tp = " + std::to_string(g.shape.tp) + " (the draft splits heads like the target)");
    if (d.enabled() && e.cache.cp_sharding != "replicated" &&
        protocols::shard_group_size(g.shape, e.model.attention == "mla") > 1)
      throw InputError(src + ": model.draft.mode = \"" + d.mode + "\" with cache.cp_sharding = \"" + e.cache.cp_sharding +
                       "\": draft KV over a sharded pool is not supported (use cache.cp_sharding = \"replicated\")");
  }
  // P/D: the groups may differ in tp, cp and pp (runtime/pd.hpp pairs the ranks that hold each
  // layer and head).
  if (e.topology.groups.size() == 2 && w.kind != "tree") {
    auto refuse = [&](bool bad, const std::string& what) {
      if (bad) throw InputError(src + ": " + what + " is not supported in a P/D world yet");
    };
    refuse(d.enabled(), "model.draft.mode = \"" + d.mode + "\" (speculative decoding)");
    // Sharded pools: a page goes from its prefill owner to its decode owner, the same rank index
    // when both shard groups are alike (the owner of position page P is P mod N on both sides).
    const auto& pf = e.topology.groups[0].shape;
    const auto& dc = e.topology.groups[1].shape;
    if (e.cache.cp_sharding != "replicated" && (pf.tp != dc.tp || pf.cp != dc.cp))
      throw InputError(src + ": cache.cp_sharding = \"" + e.cache.cp_sharding + "\" in a P/D world needs equal tp and cp on "
                       "both sides (prefill " + pf.str() + ", decode " + dc.str() +
                       "): each page goes from its owner on prefill to its owner on decode");
    // transfer tags: one slot per request in flight, one tag per layer
    if (e.engine.max_running * e.model.layers > 30000)
      throw InputError(src + ": engine.max_running × model.layers = " + std::to_string(e.engine.max_running * e.model.layers) +
                       " exceeds the 30000 P/D transfer tags (one per request in flight and layer)");
  }
  if (w.tree.prompt_tokens_min > w.tree.prompt_tokens_max)
    throw InputError(src + ": workload.tree.prompt_tokens_min = " + std::to_string(w.tree.prompt_tokens_min) +
                     " exceeds workload.tree.prompt_tokens_max = " + std::to_string(w.tree.prompt_tokens_max));
  if (e.cache.host_pages.value() > 0) {
    if (w.kind == "tree")
      throw InputError(src + ": cache.host_pages: the host tier needs a serving workload (gsp, multiturn, mooncake), not \"tree\"");
  }
  if (e.cache.storage != "none" && e.cache.host_pages.value() == 0)
    throw InputError(src + ": cache.storage = \"" + e.cache.storage +
                     "\" needs the host tier: prefetched pages land in host memory (set cache.host_pages > 0)");
  if (d.enabled()) {
    if (w.kind == "tree")
      throw InputError(src + ": model.draft.mode = \"" + d.mode + "\" needs a serving workload (gsp, multiturn, mooncake), not \"tree\"");
    const std::string why = cache::draft_layout_problem(*protocols::draft_layout(d.mode), {d.kv_heads, d.head_dim, d.dtype},
                                                        {e.model.kv_heads, e.model.head_dim, "bf16"});
    if (!why.empty()) throw InputError(src + ": " + why);
  }
  if (w.kind == "aba" && w.aba.shared_len >= std::min(w.aba.a_len, w.aba.b_len))
    throw InputError(src + ": workload.aba.shared_len = " + std::to_string(w.aba.shared_len) +
                     " must be below workload.aba.a_len = " + std::to_string(w.aba.a_len) + " and workload.aba.b_len = " +
                     std::to_string(w.aba.b_len) + " (B differs from A after the shared part)");
  if (w.kind == "mooncake" && w.mooncake.trace.empty())
    throw InputError(src + ": workload.kind = \"mooncake\" needs workload.mooncake.trace");
}

// [topology]: one group, or a P/D world of two.
void read_topology(const Config& c, ExperimentConfig& e) {
  const bool split = c.table_given("topology.prefill") || c.table_given("topology.decode");
  if (split) {
    for (const char* d : {"tp", "cp", "pp"})
      if (c.given(std::string("topology.") + d))
        throw InputError(c.source() + ": key 'topology." + d +
                         "': a P/D world sets its degrees in [topology.prefill] and [topology.decode], not [topology]");
    for (const char* g : {"prefill", "decode"}) {
      if (!c.table_given(std::string("topology.") + g))
        throw InputError(c.source() + ": table 'topology." + g +
                         "' is missing: a P/D world needs both [topology.prefill] and [topology.decode]");
      GridShape sh;
      auto get = [&](const char* d) {
        std::string k = std::string("topology.") + g + "." + d;
        return c.given(k) ? static_cast<int>(c.get_int(k)) : 1;
      };
      sh.tp = get("tp");
      sh.cp = get("cp");
      sh.pp = get("pp");
      e.topology.groups.push_back({g, sh});
    }
  } else {
    GridShape sh{static_cast<int>(c.get_int("topology.tp")), static_cast<int>(c.get_int("topology.cp")),
                 static_cast<int>(c.get_int("topology.pp"))};
    e.topology.groups.push_back({"main", sh});
  }
}

// [model] and its draft.
void read_model(const Config& c, ExperimentConfig& e) {
  e.model.layers = c.get_int("model.layers");
  e.model.kv_heads = c.get_int("model.kv_heads");
  e.model.head_dim = c.get_int("model.head_dim");
  e.model.attention = c.get_string("model.attention");
  auto& d = e.model.draft;
  d.mode = c.get_string("model.draft.mode");
  d.layers = c.get_int("model.draft.layers");
  d.kv_heads = c.get_int("model.draft.kv_heads");
  if (d.kv_heads == 0) d.kv_heads = e.model.kv_heads;
  d.head_dim = c.get_int("model.draft.head_dim");
  if (d.head_dim == 0) d.head_dim = e.model.head_dim;
  d.steps = c.get_int("model.draft.steps");
  d.accept_prob = c.get_float("model.draft.accept_prob");
  d.dtype = c.get_string("model.draft.dtype");
  e.model.cp_split = c.get_string("model.cp_split");
  e.model.layer_types = c.get_string("model.layer_types");
  if (e.model.layer_types.empty()) e.model.layer_types = "full";
  e.model.swa_window = c.get_int("model.swa_window");
  e.model.mamba_chunk = c.get_int("model.mamba_chunk");
  e.model.mamba_state = c.get_int("model.mamba_state");
  for (std::size_t i = 0; i < c.elements("model.sidecar"); ++i) {
    SidecarConfig sc;
    sc.name = std::get<std::string>(c.element("model.sidecar", i, "name"));
    sc.source = std::get<std::string>(c.element("model.sidecar", i, "source")) == "swa" ? LayerKind::Swa : LayerKind::Full;
    sc.words = std::get<std::int64_t>(c.element("model.sidecar", i, "words"));
    sc.index = i;
    e.model.sidecars.push_back(std::move(sc));
  }
}

// [cache]: tiers, policies, CP sharding.
void read_cache(const Config& c, ExperimentConfig& e) {
  e.cache.page_size = Tokens(c.get_int("cache.page_size"));
  e.cache.device_pages = Pages(c.get_int("cache.device_pages"));
  e.cache.host_pages = Pages(c.get_int("cache.host_pages"));
  e.cache.write_policy = c.get_string("cache.write_policy");
  e.cache.write_through_threshold = c.get_int("cache.write_through_threshold");
  e.cache.load_back_threshold = Tokens(c.get_int("cache.load_back_threshold"));
  e.cache.storage = c.get_string("cache.storage");
  e.cache.cp_sharding = c.get_string("cache.cp_sharding");
  e.cache.gather_pages = Pages(c.get_int("cache.gather_pages"));
  e.cache.gather_overlap = c.get_bool("cache.gather_overlap");
  e.cache.swa_pages = Pages(c.get_int("cache.swa_pages"));
  e.cache.mamba_slots = c.get_int("cache.mamba_slots");
  e.cache.component_bugs = c.get_string_array("cache.component_bugs");
  e.cache.storage_dir = c.get_string("cache.storage_dir");
  e.cache.storage_capacity_mb = c.get_int("cache.storage_capacity_mb");
  e.cache.prefetch_threshold = Tokens(c.get_int("cache.prefetch_threshold"));
  e.cache.prefetch_policy = c.get_string("cache.prefetch_policy");
  e.cache.prefetch_timeout_base_ms = c.get_float("cache.prefetch_timeout_base_ms");
  e.cache.prefetch_timeout_per_1k_ms = c.get_float("cache.prefetch_timeout_per_1k_ms");
  e.cache.prefetch_timeout_max_ms = c.get_float("cache.prefetch_timeout_max_ms");
}

// [protocol]: the variants under test.
void read_protocol(const Config& c, ExperimentConfig& e) {
  e.protocol.tp_sync = c.get_string("protocol.tp_sync");
  e.protocol.pp_sync = c.get_string("protocol.pp_sync");
  e.protocol.prefetch_consensus = c.get_string("protocol.prefetch_consensus");
  e.protocol.consensus_check = c.get_string("protocol.consensus_check");
  e.protocol.consensus_interval = c.get_int("protocol.consensus_interval");
  e.protocol.pd = c.get_string("protocol.pd");
  e.protocol.pd_restore = c.get_string("protocol.pd_restore");
  e.protocol.load_back = c.get_string("protocol.load_back");
  e.protocol.layer_gather = c.get_string("protocol.layer_gather");
  e.protocol.component_boundary = c.get_string("protocol.component_boundary");
}

// [workload] and each kind's table (a Mooncake trace named in the file is relative to it).
void read_workload(const Config& c, ExperimentConfig& e) {
  auto& w = e.workload;
  w.kind = c.get_string("workload.kind");
  w.vocab = c.get_int("workload.vocab");
  w.request_rate = c.get_float("workload.request_rate");
  w.tree.steps = c.get_int("workload.tree.steps");
  w.tree.requests_per_step = c.get_int("workload.tree.requests_per_step");
  w.tree.prompt_tokens_min = c.get_int("workload.tree.prompt_tokens_min");
  w.tree.prompt_tokens_max = c.get_int("workload.tree.prompt_tokens_max");
  w.tree.prefixes = c.get_int("workload.tree.prefixes");
  w.tree.prefix_tokens = c.get_int("workload.tree.prefix_tokens");
  w.tree.followup_prob = c.get_float("workload.tree.followup_prob");
  w.tree.hold_steps_max = c.get_int("workload.tree.hold_steps_max");
  w.gsp.groups = c.get_int("workload.gsp.groups");
  w.gsp.prompts_per_group = c.get_int("workload.gsp.prompts_per_group");
  w.gsp.system_prompt_len = c.get_int("workload.gsp.system_prompt_len");
  w.gsp.question_len = c.get_int("workload.gsp.question_len");
  w.gsp.output_len = c.get_int("workload.gsp.output_len");
  w.gsp.range_ratio = c.get_float("workload.gsp.range_ratio");
  w.gsp.turns = c.get_int("workload.gsp.turns");
  w.gsp.ordered = c.get_bool("workload.gsp.ordered");
  w.multiturn.clients = c.get_int("workload.multiturn.clients");
  w.multiturn.rounds = c.get_int("workload.multiturn.rounds");
  w.multiturn.request_length = c.get_int("workload.multiturn.request_length");
  w.multiturn.output_length = c.get_int("workload.multiturn.output_length");
  w.multiturn.sub_question_length = c.get_int("workload.multiturn.sub_question_length");
  w.multiturn.max_in_flight = c.get_int("workload.multiturn.max_in_flight");
  w.multiturn.round_barrier = c.get_bool("workload.multiturn.round_barrier");
  w.aba = {c.get_int("workload.aba.lanes"),      c.get_int("workload.aba.a_len"),      c.get_int("workload.aba.b_len"),
           c.get_int("workload.aba.shared_len"), c.get_int("workload.aba.output_len"), c.get_int("workload.aba.repeats")};
  w.cold_prefix = {c.get_int("workload.cold_prefix.groups"), c.get_int("workload.cold_prefix.requests"),
                   c.get_int("workload.cold_prefix.prefix_len"), c.get_int("workload.cold_prefix.suffix_len"),
                   c.get_int("workload.cold_prefix.output_len")};
  w.mooncake.trace = c.get_string("workload.mooncake.trace");
  w.mooncake.first_n = c.get_int("workload.mooncake.first_n");
  w.mooncake.time_scale = c.get_float("workload.mooncake.time_scale");
  if (!w.mooncake.trace.empty() && std::filesystem::path(w.mooncake.trace).is_relative() && c.given("workload.mooncake.trace") &&
      !c.source().empty() && c.source().front() != '-') {
    // A trace named in the file is relative to the file; one given by --set is relative to the cwd.
    auto base = std::filesystem::path(c.source()).parent_path();
    auto candidate = base / w.mooncake.trace;
    if (std::filesystem::exists(candidate)) w.mooncake.trace = candidate.string();
  }
}

// [engine], [cost], [output], [debug].
void read_engine_cost_output(const Config& c, ExperimentConfig& e) {
  e.engine.seed = static_cast<std::uint64_t>(c.get_int("engine.seed"));
  e.engine.deadline_s = c.get_float("engine.deadline_s");
  e.engine.debug_checks = c.get_bool("engine.debug_checks");
  e.engine.check_every = c.get_int("engine.check_every");
  e.engine.chunk_size = c.get_int("engine.chunk_size");
  e.engine.max_running = c.get_int("engine.max_running");
  e.engine.payload = c.get_string("engine.payload");
  e.engine.strict = c.get_bool("engine.strict");
  e.engine.transfer = c.get_string("engine.transfer");
  e.cost.prefill_ns_per_token_layer = c.get_float("cost.prefill_ns_per_token_layer");
  e.cost.attention_ns_per_context_token_layer = c.get_float("cost.attention_ns_per_context_token_layer");
  e.cost.decode_ns_per_layer = c.get_float("cost.decode_ns_per_layer");
  e.cost.pp_link_ns = c.get_float("cost.pp_link_ns");
  e.cost.allreduce_ns = c.get_float("cost.allreduce_ns");
  e.cost.host_link_gb_s = c.get_float("cost.host_link_gb_s");
  e.cost.storage_gb_s = c.get_float("cost.storage_gb_s");
  e.cost.stage_skew = c.get_float("cost.stage_skew");
  e.cost.storage_latency_us = c.get_float("cost.storage_latency_us");
  e.cost.gather_gb_s = c.get_float("cost.gather_gb_s");
  e.cost.kv_bytes = c.get_string("cost.kv_bytes");
  e.cost.gather_latency_us = c.get_float("cost.gather_latency_us");
  e.cost.pd_link_gb_s = c.get_float("cost.pd_link_gb_s");
  e.cost.pd_latency_us = c.get_float("cost.pd_latency_us");
  e.output.dir = c.get_string("output.dir");
  e.output.flush_every = c.get_int("output.flush_every");
  e.output.report_every = c.get_int("output.report_every");
  e.output.report_seconds = c.get_float("output.report_seconds");
  e.debug.plant_divergence_rank = c.get_int("debug.plant_divergence_rank");
  e.debug.plant_divergence_step = c.get_int("debug.plant_divergence_step");
  e.debug.plant_divergence_stage = c.get_int("debug.plant_divergence_stage");
  e.debug.plant_divergence_kind = c.get_string("debug.plant_divergence_kind");
  e.debug.kill_rank = c.get_int("debug.kill_rank");
  e.debug.kill_at_step = c.get_int("debug.kill_at_step");
  e.debug.shrink_stage = c.get_int("debug.shrink_stage");
  e.debug.shrink_device_pages = c.get_int("debug.shrink_device_pages");
}

// [faults."NAME"]: the failpoints the file or --set configures.
void read_faults(const Config& c, ExperimentConfig& e) {
  for (const auto& fp : failpoint_catalogue()) {
    const std::string base = key_path_string({"faults", fp.name});
    if (!c.table_given(base)) continue;
    FailpointConfig f;
    f.name = fp.name;
    auto key = [&](const std::string& leaf) { return key_path_string({"faults", fp.name, leaf}); };
    f.probability = c.given(key("probability")) ? c.get_float(key("probability")) : 0.0;
    if (c.given(key("ranks"))) f.ranks = c.get_int_array(key("ranks"));
    if (c.given(key("from_step"))) f.from_step = static_cast<std::uint64_t>(c.get_int(key("from_step")));
    for (const auto& p : fp.params) f.params[p.name] = c.given(key(p.name)) ? c.get_float(key(p.name)) : p.default_value;
    e.faults.push_back(std::move(f));
  }
}

ExperimentConfig from_config(const Config& c, const std::string& name) {
  ExperimentConfig e;
  e.name = name;
  e.source = c.source();
  read_topology(c, e);
  read_model(c, e);
  read_cache(c, e);
  read_protocol(c, e);
  read_workload(c, e);
  read_engine_cost_output(c, e);
  read_faults(c, e);
  if (e.model.mamba_chunk == 0) e.model.mamba_chunk = e.cache.page_size.value();
  if (e.cache.swa_pages.value() == 0) e.cache.swa_pages = Pages(std::max<std::int64_t>(e.cache.device_pages.value() / 4, 1));
  if (e.cache.mamba_slots == 0) e.cache.mamba_slots = std::max<std::int64_t>(e.cache.device_pages.value() / 4, 1);
  check_relations(e, c.source());
  e.effective_toml = c.effective_toml();
  return e;
}

std::vector<std::string> with_seed(std::vector<std::string> ov, std::int64_t seed) {
  if (seed >= 0) ov.push_back("engine.seed=" + std::to_string(seed));
  return ov;
}
}  // namespace


Pages gather_charge(const ExperimentConfig& e, std::size_t local_layers) {
  const std::int64_t p = e.cache.page_size.value();
  // One slot: a layer of the batch's prefix, the current chunk and a padding page.
  const std::int64_t slot = e.cache.gather_pages.value() + (e.engine.chunk_size + p - 1) / p + 1;
  const auto L = static_cast<std::int64_t>(std::max<std::size_t>(local_layers, 1));
  return Pages((2 * slot + L - 1) / L);  // pool pages hold all local layers; a slot page one
}

void ExperimentConfig::validate_for_world(int world_size) const {
  auto rank_ok = [&](std::int64_t r, const std::string& key) {
    if (r >= world_size)
      throw InputError(source + ": key '" + key + "': rank " + std::to_string(r) + " does not exist in a world of " +
                       std::to_string(world_size) + " ranks");
  };
  rank_ok(debug.plant_divergence_rank, "debug.plant_divergence_rank");
  int max_pp = 0;
  for (const auto& g : topology.groups) max_pp = std::max(max_pp, g.shape.pp);
  if (debug.plant_divergence_stage >= max_pp)
    throw InputError(source + ": key 'debug.plant_divergence_stage': stage " + std::to_string(debug.plant_divergence_stage) +
                     " does not exist with pp = " + std::to_string(max_pp));
  rank_ok(debug.kill_rank, "debug.kill_rank");
  for (const auto& f : faults)
    for (auto r : f.ranks) rank_ok(r, key_path_string({"faults", f.name, "ranks"}));
}

ExperimentConfig load_experiment(const std::string& path, const std::vector<std::string>& overrides, std::int64_t seed) {
  Config c = Config::load(experiment_schema(), path, with_seed(overrides, seed));
  return from_config(c, std::filesystem::path(path).stem().string());
}

ExperimentConfig parse_experiment(std::string_view toml, const std::string& name,
                                  const std::vector<std::string>& overrides, std::int64_t seed) {
  Config c = Config::parse(experiment_schema(), toml, name, with_seed(overrides, seed));
  return from_config(c, name);
}

}  // namespace kvgrid
