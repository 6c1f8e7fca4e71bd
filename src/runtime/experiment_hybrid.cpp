// The hybrid model's settings (model.layer_types, its windows and pools, [[model.sidecar]]): the
// layer kinds a pattern gives, and the relations load_experiment checks for a hybrid run.
#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "cache/component_bugs.hpp"
#include "core/check.hpp"
#include "runtime/experiment.hpp"

namespace kvgrid {

const char* layer_kind_name(LayerKind k) {
  switch (k) {
    case LayerKind::Full: return "full";
    case LayerKind::Swa: return "swa";
    case LayerKind::Mamba: return "mamba";
  }
  return "?";
}

std::vector<LayerKind> ModelConfig::kinds() const {
  std::vector<LayerKind> pattern;
  std::size_t at = 0;
  while (at <= layer_types.size()) {
    const std::size_t comma = std::min(layer_types.find(',', at), layer_types.size());
    std::string t = layer_types.substr(at, comma - at);
    t.erase(0, t.find_first_not_of(" \t"));
    t.erase(t.find_last_not_of(" \t") + 1);
    if (t == "full") pattern.push_back(LayerKind::Full);
    else if (t == "swa") pattern.push_back(LayerKind::Swa);
    else if (t == "mamba") pattern.push_back(LayerKind::Mamba);
    else throw std::invalid_argument("\"" + t + "\" is not a layer type (full, swa, mamba)");
    at = comma + 1;
  }
  std::vector<LayerKind> out(static_cast<std::size_t>(std::max<std::int64_t>(layers, 0)));
  for (std::size_t l = 0; l < out.size(); ++l) out[l] = pattern[l % pattern.size()];
  return out;
}

bool ModelConfig::has(LayerKind k) const {
  for (LayerKind x : kinds())
    if (x == k) return true;
  return false;
}

bool ModelConfig::hybrid() const { return has(LayerKind::Swa) || has(LayerKind::Mamba) || !sidecars.empty(); }

// Hybrid models (model.layer_types): what the hybrid device tier (cache/hybrid_cache.hpp) serves
// today; the rest is refused by name.
void check_hybrid_model(const ExperimentConfig& e, const std::string& src) {
  const auto& m = e.model;
  std::vector<LayerKind> kinds;
  try {
    kinds = m.kinds();
  } catch (const std::invalid_argument& x) {
    throw InputError(src + ": model.layer_types = \"" + m.layer_types + "\": " + x.what());
  }
  // A hybrid draft (model.draft.layer_types): its kinds must be the target's (their pages and
  // states sit at the target's ids) and include a full layer (its pool follows FULL's pages).
  ModelConfig draft = m;
  draft.layer_types = m.draft.layer_types;
  draft.layers = m.draft.layers;
  draft.sidecars.clear();
  std::vector<LayerKind> draft_kinds;
  try {
    draft_kinds = draft.kinds();
  } catch (const std::invalid_argument& x) {
    throw InputError(src + ": model.draft.layer_types = \"" + m.draft.layer_types + "\": " + x.what());
  }
  if (draft.hybrid()) {
    const std::string at = src + ": model.draft.layer_types = \"" + m.draft.layer_types + "\"";
    if (!m.draft.enabled()) throw InputError(at + " without a draft (model.draft.mode = \"none\")");
    if (!draft.has(LayerKind::Full)) throw InputError(at + " has no full layer (the draft's pool follows FULL's pages)");
    for (LayerKind k : {LayerKind::Swa, LayerKind::Mamba})
      if (draft.has(k) && !m.has(k))
        throw InputError(at + " has " + layer_kind_name(k) + " layers, but model.layer_types = \"" + m.layer_types +
                         "\" has none (the draft's " + layer_kind_name(k) + " data sits at the target's ids)");
  }
  if (!m.hybrid() && e.cache.eviction != "lru")
    throw InputError(src + ": cache.eviction = \"" + e.cache.eviction + "\" orders eviction by session references on the "
                     "unified tree, which serves hybrid models; model.layer_types = \"" + m.layer_types +
                     "\" is a full-attention model (RadixTree, LRU only): give swa or mamba layers, or cache.eviction = \"lru\"");
  if (!m.hybrid()) {
    if (!e.cache.component_bugs.empty())
      throw InputError(src + ": cache.component_bugs = [\"" + e.cache.component_bugs.front() +
                       "\", ...] plants bugs in the hybrid cache's components, but model.layer_types = \"" + m.layer_types +
                       "\" is a full-attention model (give swa or mamba layers)");
    return;
  }
  const std::string what = "model.layer_types = \"" + m.layer_types + "\"";
  for (const auto& name : e.cache.component_bugs) {  // a bug planted in a component the model lacks would do nothing
    const auto bug = cache::parse_component_bug(name);
    const bool mamba_bug = bug == cache::ComponentBug::SplitTruncatesState || bug == cache::ComponentBug::StateAtFloor ||
                           bug == cache::ComponentBug::SharedStateSlot || bug == cache::ComponentBug::MtpStateAtFloor;
    if (bug == cache::ComponentBug::MtpStateAtFloor && !m.draft.enabled())
      throw InputError(src + ": cache.component_bugs: \"" + name + "\" is planted in speculative decoding's multi-token "
                       "steps, but model.draft.mode = \"none\" (it would change nothing)");
    const bool swa_bug = !mamba_bug && bug != cache::ComponentBug::ReadPastBoundary;
    if (bug == cache::ComponentBug::SwaLoadWholeNode && e.cache.host_pages.value() == 0)
      throw InputError(src + ": cache.component_bugs: \"" + name + "\" is planted in the host tier's load-back, but "
                       "cache.host_pages = 0 (it would change nothing)");
    if ((mamba_bug && !m.has(LayerKind::Mamba)) || (swa_bug && !m.has(LayerKind::Swa)))
      throw InputError(src + ": cache.component_bugs: \"" + name + "\" is planted in the " + (mamba_bug ? "MAMBA" : "SWA") +
                       " component, but " + what + " has no " + (mamba_bug ? "mamba" : "swa") + " layers (it would change nothing)");
  }
  if (!m.has(LayerKind::Full))
    throw InputError(src + ": " + what + " has no full layer (a hybrid model keeps at least one full-attention layer)");
  if (m.has(LayerKind::Swa) && m.swa_window < 1)
    throw InputError(src + ": " + what + " has swa layers: set model.swa_window (tokens, >= 1)");
  const std::int64_t p = e.cache.page_size.value();
  if (m.has(LayerKind::Mamba) && m.mamba_chunk != 0 && m.mamba_chunk % p != 0)
    throw InputError(src + ": model.mamba_chunk = " + std::to_string(m.mamba_chunk) + " is not a multiple of cache.page_size = " +
                     std::to_string(p));
  for (std::size_t i = 0; i < m.sidecars.size(); ++i) {
    const auto& sc = m.sidecars[i];
    const std::string at = src + ": [[model.sidecar]] #" + std::to_string(i + 1) + " (\"" + sc.name + "\")";
    if (sc.name.empty()) throw InputError(at + ": needs a name");
    for (std::size_t j = 0; j < i; ++j)
      if (m.sidecars[j].name == sc.name) throw InputError(at + ": the name is taken by sidecar #" + std::to_string(j + 1));
    if (!m.has(sc.source))
      throw InputError(at + ": source = \"" + layer_kind_name(sc.source) + "\" but " + what + " has no such layer");
  }
  if (m.has(LayerKind::Mamba) && e.cache.mamba_slots < 3)
    throw InputError(src + ": cache.mamba_slots = " + std::to_string(e.cache.mamba_slots) +
                     ": a request holds two MAMBA slots (its state and a checkpoint) next to the state it reuses; "
                     "give at least 3");
  auto refuse = [&](bool bad, const std::string& why) {
    if (bad) throw InputError(src + ": " + what + " with " + why + " is not supported yet (hybrid models run at the device, host and storage tiers)");
  };
  refuse(e.workload.kind == "tree", "workload.kind = \"tree\" (the hybrid model needs the serving loop)");
  refuse(e.cache.cp_sharding != "replicated", "cache.cp_sharding = \"" + e.cache.cp_sharding + "\" (CP replicated only)");
  for (const auto& g : e.topology.groups) {  // every stage keeps a full layer (its FULL pool holds the prefix)
    const auto pp = static_cast<std::int64_t>(g.shape.pp), base = m.layers / pp, extra = m.layers % pp;
    for (std::int64_t st = 0; st < pp && pp <= m.layers; ++st) {
      const std::int64_t begin = st * base + std::min(st, extra), end = begin + base + (st < extra ? 1 : 0);
      bool full = false;
      for (std::int64_t l = begin; l < end; ++l) full = full || kinds[static_cast<std::size_t>(l)] == LayerKind::Full;
      if (!full)
        throw InputError(src + ": " + what + " over pp = " + std::to_string(pp) + " leaves stage " + std::to_string(st) +
                         " (layers " + std::to_string(begin) + ".." + std::to_string(end - 1) +
                         ") without a full layer; every stage needs one (reorder model.layer_types)");
    }
  }
  // The host tier: write-through backups and published load-backs of every component.
  if (e.cache.host_pages.value() > 0) {
    for (const auto& name : e.cache.component_bugs)
      refuse(name != "swa_load_whole_node",
             "cache.component_bugs = \"" + name + "\" (the record's device-tier bugs run without a host tier)");
  }
  // Speculative decoding with the host tier: the draft's bytes move with the target's copies
  // (cache/hybrid_host_tier.hpp HybridDraftBytes; a draft kind the last stage holds no target layer
  // of keeps its host copies in a pool of its own, cache/draft_state.hpp); in storage the draft
  // travels inside the target's objects (rank_suffix keys) or as objects of its own namespaces
  // (unified keys, cache/hybrid_storage_site.hpp).
}

}  // namespace kvgrid
