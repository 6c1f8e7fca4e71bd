#include "runtime/storage_keys.hpp"

#include <algorithm>

#include "cache/redis_storage.hpp"
#include "core/check.hpp"

namespace kvgrid {

cache::KvNamespace storage_namespace(const ExperimentConfig& exp) {
  cache::KvNamespace ns;
  ns.model_id = "synth-l" + std::to_string(exp.model.layers) + "-h" + std::to_string(exp.model.kv_heads) + "-d" +
                std::to_string(exp.model.head_dim) + "-" + exp.model.attention;
  // The logical element: 64-bit words, full KV or one fold per page, layer and head (digest).
  ns.dtype = "u64-" + exp.engine.payload;
  ns.page_size = static_cast<std::uint64_t>(exp.cache.page_size.value());
  ns.rank_replicated = exp.model.attention == "mla";
  ns.total_kv_heads = ns.rank_replicated ? 0 : static_cast<std::uint64_t>(exp.model.kv_heads);
  ns.layer_partition = static_cast<std::uint64_t>(exp.cache.storage_layer_partition);
  ns.head_group = static_cast<std::uint64_t>(exp.cache.storage_head_partition);
  ns.tenant = exp.cache.storage_namespace;
  return ns;
}

cache::UnifiedPlan unified_plan(const ExperimentConfig& exp, const ModelGeometry& geo) {
  return cache::plan_unified_kv(storage_namespace(exp), geo.layers, geo.layer_begin, geo.layer_end, geo.kv_heads);
}

cache::KvNamespace component_namespace(const ExperimentConfig& exp, LayerKind kind) {
  cache::KvNamespace ns = storage_namespace(exp);
  std::string kinds;  // one letter per layer: which of the model's layers each kind's objects hold
  for (LayerKind k : exp.model.kinds()) kinds += layer_kind_name(k)[0];
  ns.model_id += "-kinds-" + kinds;
  if (kind == LayerKind::Swa) ns.object_layout = "swa-page-unified-v1";
  if (kind == LayerKind::Mamba) {
    // [layer in chunk][head in group][word]: whole states in both payload modes
    ns.object_layout = "mamba-state-unified-v1";
    ns.dtype = "u64-state" + std::to_string(exp.model.mamba_state);
  }
  return ns;
}

namespace {
// The chunks of `plan` (over layers [begin, ...) whose kinds are `kinds`) holding layers of `kind`,
// their spans counting that kind's layers only.
cache::UnifiedPlan keep_kind(cache::UnifiedPlan plan, const std::vector<LayerKind>& kinds, std::uint64_t begin, LayerKind kind) {
  std::vector<cache::UnifiedChunk> kept;
  for (cache::UnifiedChunk c : plan.chunks) {
    const auto from = kinds.begin() + static_cast<std::ptrdiff_t>(c.layer_first - begin);
    const auto to = kinds.begin() + static_cast<std::ptrdiff_t>(c.layer_last + 1 - begin);
    const auto n = static_cast<std::size_t>(std::count(from, to, kind));
    if (n == 0) continue;
    c.local.layer0 = static_cast<std::size_t>(std::count(kinds.begin(), from, kind));
    c.local.layers = n;
    kept.push_back(std::move(c));
  }
  plan.chunks = std::move(kept);
  return plan;
}
}  // namespace

cache::UnifiedPlan unified_component_plan(const ExperimentConfig& exp, const ModelGeometry& geo, LayerKind kind) {
  return keep_kind(cache::plan_unified_kv(component_namespace(exp, kind), geo.layers, geo.layer_begin, geo.layer_end, geo.kv_heads),
                   geo.kinds, geo.layer_begin, kind);
}

cache::KvNamespace draft_storage_namespace(const ExperimentConfig& exp) {
  const auto& d = exp.model.draft;
  cache::KvNamespace ns = storage_namespace(exp);
  ns.model_id = "draft-l" + std::to_string(d.layers) + "-h" + std::to_string(d.kv_heads) + "-d" + std::to_string(d.head_dim) +
                "-" + d.dtype + "-of-" + ns.model_id;
  ns.total_kv_heads = ns.rank_replicated ? 0 : static_cast<std::uint64_t>(d.kv_heads);
  ns.layer_partition = 0;  // the whole draft: it is never split over stages
  return ns;
}

cache::UnifiedPlan unified_draft_plan(const ExperimentConfig& exp, const ModelGeometry& draft_geo) {
  const std::uint64_t n = draft_geo.layer_end - draft_geo.layer_begin;
  return cache::plan_unified_kv(draft_storage_namespace(exp), n, 0, n, draft_geo.kv_heads);
}

cache::UnifiedPlan unified_draft_component_plan(const ExperimentConfig& exp, const ModelGeometry& draft_geo, LayerKind kind) {
  if (!draft_geo.hybrid()) return kind == LayerKind::Full ? unified_draft_plan(exp, draft_geo) : cache::UnifiedPlan{};
  cache::KvNamespace ns = draft_storage_namespace(exp);
  const cache::KvNamespace target = component_namespace(exp, kind);
  std::string kinds;  // the draft's layer kinds, then (through the target's component id) the target's
  for (LayerKind k : draft_geo.model_kinds) kinds += layer_kind_name(k)[0];
  ns.model_id = ns.model_id.substr(0, ns.model_id.find("-of-")) + "-kinds-" + kinds + "-of-" + target.model_id;
  ns.object_layout = target.object_layout;
  ns.dtype = target.dtype;
  const std::uint64_t n = draft_geo.layer_end - draft_geo.layer_begin;
  return keep_kind(cache::plan_unified_kv(ns, n, 0, n, draft_geo.kv_heads), draft_geo.kinds, 0, kind);
}

cache::UnifiedPlan unified_sidecar_plan(const ExperimentConfig& exp, const SidecarConfig& sidecar) {
  cache::KvNamespace ns = component_namespace(exp, sidecar.source);
  // (its place in the file is part of its values: the model folds it as layer kSidecarLayer0 + index)
  ns.model_id += "-sidecar" + std::to_string(sidecar.index) + "-" + sidecar.name + "-" + layer_kind_name(sidecar.source) + "-w" +
                 std::to_string(sidecar.words);
  ns.object_layout = "sidecar-words-v1";
  ns.dtype = "u64-words";
  ns.rank_replicated = true;  // every holder keeps it whole
  ns.total_kv_heads = 0;
  ns.layer_partition = 0;
  ns.head_group = 0;
  const std::uint32_t whole[1] = {0};  // (one "head": the words)
  return cache::plan_unified_kv(ns, 1, 0, 1, whole);
}

void check_storage_keys(const ExperimentConfig& exp, const std::string& src) {
  const auto& c = exp.cache;
  const auto& w = exp.workload;
  if ((w.route_min_prompt > 0 || w.route_max_prompt > 0) && !c.storage_shared)
    throw InputError(src + ": workload.route_min_prompt / route_max_prompt (buckets by context length) need "
                     "cache.storage_shared = true: the buckets' jobs meet in the shared store");
  if (w.route_max_prompt > 0 && w.route_min_prompt >= w.route_max_prompt)
    throw InputError(src + ": workload.route_min_prompt = " + std::to_string(w.route_min_prompt) +
                     " must be below workload.route_max_prompt = " + std::to_string(w.route_max_prompt));
  if ((w.route_min_prompt > 0 || w.route_max_prompt > 0) && c.storage_dir.empty())
    throw InputError(src + ": buckets (workload.route_min_prompt / route_max_prompt) need cache.storage_dir: the jobs' "
                     "router/ directory of done markers lives there");
  if (c.storage_shared && c.storage_dir.empty() && c.storage == "file")
    throw InputError(src + ": cache.storage_shared = true needs cache.storage_dir (the directory the jobs share)");
  if (c.storage == "redis") (void)cache::RedisStorage::parse_url(c.storage_url);  // a malformed URL: exit 2 at load
  if (c.storage_fsync && c.storage != "file")
    throw InputError(src + ": cache.storage_fsync = true needs cache.storage = \"file\" (it is \"" + c.storage +
                     "\"; a Redis server keeps its own persistence settings)");
  if (c.storage_file_layout != "object" && c.storage != "file")
    throw InputError(src + ": cache.storage_file_layout = \"" + c.storage_file_layout + "\" needs cache.storage = \"file\" (it is \"" +
                     c.storage + "\")");
  if (c.host_layout == "page_unified") {
    auto refuse = [&](bool bad, const std::string& what, const std::string& why) {
      if (bad) throw InputError(src + ": cache.host_layout = \"page_unified\" with " + what + ": " + why);
    };
    refuse(c.storage_key_scheme != "unified", "cache.storage_key_scheme = \"" + c.storage_key_scheme + "\"",
           "a page_unified host page holds the unified scheme's objects; set cache.storage_key_scheme = \"unified\"");
    refuse(c.host_pages.value() == 0, "cache.host_pages = 0", "there is no host tier to lay out");
  }
  if (c.storage_key_scheme != "unified") {
    if (c.storage_shared)
      throw InputError(src + ": cache.storage_shared = true needs cache.storage_key_scheme = \"unified\" "
                       "(rank_suffix objects belong to one rank of one layout)");
    for (const auto& [key, v] : {std::pair<const char*, std::int64_t>{"cache.storage_layer_partition", c.storage_layer_partition},
                                 {"cache.storage_head_partition", c.storage_head_partition}})
      if (v != 0)
        throw InputError(src + ": " + key + " = " + std::to_string(v) + " needs cache.storage_key_scheme = \"unified\"");
    if (!c.storage_namespace.empty())
      throw InputError(src + ": cache.storage_namespace = \"" + c.storage_namespace +
                       "\" needs cache.storage_key_scheme = \"unified\" (rank_suffix keys name the model and rank)");
    return;
  }
  auto refuse = [&](bool bad, const std::string& what, const std::string& why) {
    if (bad) throw InputError(src + ": cache.storage_key_scheme = \"unified\" with " + what + ": " + why);
  };
  refuse(c.storage == "none", "cache.storage = \"none\"", "unified keys name storage objects; set cache.storage = \"file\"");
  for (const auto& g : exp.topology.groups)
    for (int pp = 0; pp < g.shape.pp; ++pp)
      for (int tp = 0; tp < g.shape.tp; ++tp) {
        GridCoord at;
        at.tp = tp;
        at.pp = pp;
        const ModelGeometry geo = ModelGeometry::for_rank(exp, at, g.shape);
        try {
          (void)unified_plan(exp, geo);
          if (exp.model.draft.enabled() && pp == g.shape.pp - 1)
            for (LayerKind k : {LayerKind::Full, LayerKind::Swa, LayerKind::Mamba})
              (void)unified_draft_component_plan(exp, ModelGeometry::draft_for_rank(exp, at, g.shape), k);
        } catch (const InputError& e) {
          throw InputError(src + ": " + g.name + " group " + g.shape.str() + ", rank tp " + std::to_string(tp) + " pp " +
                           std::to_string(pp) + ": " + e.what());
        }
      }
}

}  // namespace kvgrid
