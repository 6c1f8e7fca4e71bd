#include "runtime/experiment.hpp"

#include <algorithm>
#include <filesystem>
#include <optional>
#include <stdexcept>

#include "cache/draft_state.hpp"
#include "core/check.hpp"
#include "protocols/cp_sharding.hpp"
#include "protocols/draft_restore.hpp"
#include "runtime/storage_keys.hpp"
#include "transfer/transfer_engine.hpp"

namespace kvgrid {

std::string fused_decode_refusal(const ExperimentConfig& e) {
  // What a fused span cannot see ahead of time, or does not replay (runtime/fused_decode.cpp).
  if (e.workload.kind == "tree") return "the tree workload has no decode steps";
  if (e.topology.world_size() != 1)
    return "it runs on " + std::to_string(e.topology.world_size()) +
           " ranks; a fused span runs on one rank only (across ranks every span would have to be agreed: not built)";
  if (e.model.draft.enabled()) return "speculative decoding's draft rounds act at every step";
  if (e.model.hybrid()) return "a hybrid model's SWA pages and states change at every decode step";
  if (e.cache.storage != "none") return "the storage tier's prefetches and writes are polled at every step";
  if (!e.faults.empty()) return "failpoints draw at every step";
  if (e.engine.transfer != "simulated")
    return "the " + e.engine.transfer + " engine's copies complete in real time, which a span cannot know ahead";
  if (e.protocol.consensus_check != "off") return "the online consensus checker acts at its steps";
  if (e.debug.plant_divergence_rank >= 0 || e.debug.plant_divergence_stage >= 0 || e.debug.kill_rank >= 0)
    return "the debug knobs act at a given step";
  return {};
}

namespace {
// Relations between keys (each key alone was validated when read); throws InputError naming them.
void check_relations(const ExperimentConfig& e, const std::string& src) {
  check_hybrid_model(e, src);
  const auto& d = e.model.draft;
  const auto& w = e.workload;
  if (w.kind == "agentic") {
    const auto& ag = w.agentic;
    if (ag.turns_min > ag.turns_max)
      throw InputError(src + ": workload.agentic.turns_min = " + std::to_string(ag.turns_min) + " exceeds turns_max = " +
                       std::to_string(ag.turns_max));
    if (ag.tool_output_min > ag.tool_output_max)
      throw InputError(src + ": workload.agentic.tool_output_min = " + std::to_string(ag.tool_output_min) +
                       " exceeds tool_output_max = " + std::to_string(ag.tool_output_max));
    if (ag.system_prompt_len + ag.task_len >= ag.max_context)
      throw InputError(src + ": workload.agentic.max_context = " + std::to_string(ag.max_context) +
                       " leaves no room after the system prompt and task (" + std::to_string(ag.system_prompt_len + ag.task_len) + " tokens)");
  }
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
  }
  // P/D: the groups may differ in tp, cp and pp (runtime/pd.hpp pairs the ranks that hold each
  // layer and head).
  if (e.topology.groups.size() == 2 && w.kind != "tree") {
    // Sharded pools: each page goes from its prefill owner to its decode owner (pd_legs), whatever
    // the two shard groups. A draft rides the suffix, a hybrid draft's window and state too.
    // transfer tags: one slot per request in flight, one tag per layer (the target's, then the
    // draft's when the suffix carries it) and per sidecar
    const std::int64_t draft_layers = d.enabled() && d.mode != "target_only" ? d.layers : 0;
    const std::int64_t tags =
        e.engine.max_running * (e.model.layers + draft_layers + static_cast<std::int64_t>(e.model.sidecars.size()));
    if (tags > 30000)
      throw InputError(src + ": engine.max_running × (model.layers + draft layers + sidecars) = " + std::to_string(tags) +
                       " exceeds the 30000 P/D transfer tags (one per request in flight and layer or sidecar)");
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
  check_storage_keys(e, src);
  if (const std::string why = transfer::backend_refusal(e.engine.transfer, e.engine.collectives); !why.empty())
    throw InputError(src + ": " + why);
  if (e.engine.decode == "fused")
    if (const std::string why = fused_decode_refusal(e); !why.empty())
      throw InputError(src + ": engine.decode = \"fused\" is refused for this experiment: " + why +
                       " (engine.decode = \"step\" runs it)");
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
  d.layer_types = c.get_string("model.draft.layer_types");
  if (d.layer_types.empty()) d.layer_types = "full";
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
  e.cache.host_swa_pages = Pages(c.get_int("cache.host_swa_pages"));
  e.cache.host_mamba_slots = c.get_int("cache.host_mamba_slots");
  e.cache.component_bugs = c.get_string_array("cache.component_bugs");
  e.cache.eviction = c.get_string("cache.eviction");
  e.cache.session_tombstones = c.get_int("cache.session_tombstones");
  e.cache.pd_prefill_sessions = c.get_bool("cache.pd_prefill_sessions");
  e.cache.storage_dir = c.get_string("cache.storage_dir");
  e.cache.storage_url = c.get_string("cache.storage_url");
  e.cache.storage_file_layout = c.get_string("cache.storage_file_layout");
  e.cache.storage_fsync = c.get_bool("cache.storage_fsync");
  e.cache.storage_capacity_mb = c.get_int("cache.storage_capacity_mb");
  e.cache.storage_key_scheme = c.get_string("cache.storage_key_scheme");
  e.cache.host_layout = c.get_string("cache.host_layout");
  e.cache.storage_layer_partition = c.get_int("cache.storage_layer_partition");
  e.cache.storage_head_partition = c.get_int("cache.storage_head_partition");
  e.cache.storage_namespace = c.get_string("cache.storage_namespace");
  e.cache.storage_shared = c.get_bool("cache.storage_shared");
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
  w.route_min_prompt = c.get_int("workload.route_min_prompt");
  w.route_max_prompt = c.get_int("workload.route_max_prompt");
  w.route_wait_s = c.get_float("workload.route_wait_s");
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
  w.sessions = c.get_bool("workload.sessions");
  auto& ag = w.agentic;
  ag.sessions = c.get_int("workload.agentic.sessions");
  ag.max_active = c.get_int("workload.agentic.max_active");
  ag.system_prompt_len = c.get_int("workload.agentic.system_prompt_len");
  ag.task_len = c.get_int("workload.agentic.task_len");
  ag.turns_min = c.get_int("workload.agentic.turns_min");
  ag.turns_max = c.get_int("workload.agentic.turns_max");
  ag.tool_output_min = c.get_int("workload.agentic.tool_output_min");
  ag.tool_output_max = c.get_int("workload.agentic.tool_output_max");
  ag.tool_output_alpha = c.get_float("workload.agentic.tool_output_alpha");
  ag.output_len = c.get_int("workload.agentic.output_len");
  ag.tool_time_ms = c.get_float("workload.agentic.tool_time_ms");
  ag.subagent_prob = c.get_float("workload.agentic.subagent_prob");
  ag.subagent_turns = c.get_int("workload.agentic.subagent_turns");
  ag.abandon_prob = c.get_float("workload.agentic.abandon_prob");
  ag.abandon_after_ms = c.get_float("workload.agentic.abandon_after_ms");
  ag.max_context = c.get_int("workload.agentic.max_context");
  ag.session_fraction = c.get_float("workload.agentic.session_fraction");
  ag.close_delay_ms = c.get_float("workload.agentic.close_delay_ms");
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
  e.engine.decode = c.get_string("engine.decode");
  e.engine.helper_thread = c.get_bool("engine.helper_thread");
  e.engine.cuda_copy = c.get_string("engine.cuda_copy");
  e.engine.collectives = c.get_string("engine.collectives");
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
  e.output.steps = c.get_string("output.steps");
  e.debug.plant_divergence_rank = c.get_int("debug.plant_divergence_rank");
  e.debug.plant_divergence_step = c.get_int("debug.plant_divergence_step");
  e.debug.plant_divergence_stage = c.get_int("debug.plant_divergence_stage");
  e.debug.plant_divergence_kind = c.get_string("debug.plant_divergence_kind");
  e.debug.kill_rank = c.get_int("debug.kill_rank");
  e.debug.input_error_rank = c.get_int("debug.input_error_rank");
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
  // The hybrid host tier's SWA and MAMBA pools: by default as large against their device pools as
  // the FULL host pool is against the device's.
  const auto scaled = [&](std::int64_t device) {
    return std::max<std::int64_t>(device * e.cache.host_pages.value() / std::max<std::int64_t>(e.cache.device_pages.value(), 1), 1);
  };
  if (e.cache.host_swa_pages.value() == 0) e.cache.host_swa_pages = Pages(scaled(e.cache.swa_pages.value()));
  if (e.cache.host_mamba_slots == 0) e.cache.host_mamba_slots = scaled(e.cache.mamba_slots);
  if (e.workload.route_min_prompt > 0 || e.workload.route_max_prompt > 0) e.workload.route_dir = e.cache.storage_dir + "/router";
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
  rank_ok(debug.input_error_rank, "debug.input_error_rank");
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
