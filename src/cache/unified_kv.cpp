#include "cache/unified_kv.hpp"

#include <openssl/evp.h>

#include "core/check.hpp"

namespace kvgrid::cache {

std::string canonical_text(const KvNamespace& ns) {
  std::string s;
  auto field = [&s](const char* name, const std::string& v) { s += std::string(name) + "=" + v + "\n"; };
  field("schema_version", std::to_string(KvNamespace::kSchemaVersion));
  field("model_id", ns.model_id);
  field("dtype", ns.dtype);
  field("page_size", std::to_string(ns.page_size));
  field("rank_replicated", ns.rank_replicated ? "true" : "false");
  field("total_kv_heads", std::to_string(ns.total_kv_heads));
  field("layer_partition", std::to_string(ns.layer_partition));
  field("head_group", std::to_string(ns.head_group));
  field("object_layout", ns.object_layout);
  field("tenant", ns.tenant);
  return s;
}

std::string namespace_digest(const KvNamespace& ns) {
  const std::string text = canonical_text(ns);
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  KVGRID_CHECK(EVP_Digest(text.data(), text.size(), md, &len, EVP_sha256(), nullptr) == 1 && len == 32, "SHA-256 failed");
  PageDigest d{};
  std::copy(md, md + 32, d.begin());
  return "ukv1-" + to_hex(d).substr(0, 16);
}

UnifiedPlan plan_unified_kv(KvNamespace ns, std::uint64_t total_layers, std::uint64_t layer_begin, std::uint64_t layer_end,
                            std::span<const std::uint32_t> heads) {
  auto bad = [](const std::string& m) { throw InputError("cache.storage_key_scheme = unified: " + m); };
  if (ns.model_id.empty()) bad("the namespace needs a model id");
  if (ns.page_size == 0) bad("page_size 0");
  if (layer_begin >= layer_end || layer_end > total_layers) bad("empty layer slice");
  if (heads.empty()) bad("a rank without KV heads");
  for (std::size_t i = 1; i < heads.size(); ++i)
    if (heads[i] != heads[i - 1] + 1) bad("this rank's KV heads are not contiguous");
  UnifiedPlan plan;
  // Heads: groups of head_group heads (0: this rank's own count) over the model's KV heads.
  std::vector<std::pair<std::uint64_t, std::size_t>> groups;  // (group index, first local head)
  std::size_t group_heads = heads.size();
  if (ns.rank_replicated) {
    if (ns.head_group != 0)
      bad("cache.storage_head_partition = " + std::to_string(ns.head_group) + " with a replicated (MLA) KV: it has no heads to partition");
    ns.total_kv_heads = 0;
    groups.push_back({0, 0});
  } else {
    if (ns.head_group == 0) ns.head_group = heads.size();
    const std::uint64_t g = ns.head_group;
    if (ns.total_kv_heads == 0 || ns.total_kv_heads % g != 0)
      bad("cache.storage_head_partition = " + std::to_string(g) + " does not divide the model's " +
          std::to_string(ns.total_kv_heads) + " KV heads");
    if (heads.front() % g != 0 || heads.size() % g != 0)
      bad("this rank holds KV heads " + std::to_string(heads.front()) + "-" + std::to_string(heads.back()) +
          ", not whole groups of cache.storage_head_partition = " + std::to_string(g) + " heads");
    group_heads = static_cast<std::size_t>(g);
    for (std::size_t h = 0; h < heads.size(); h += group_heads) groups.push_back({heads[h] / g, h});
  }
  // Layers: ranges of layer_partition layers from 0 (0: this rank's own range); a rank's slice
  // must start on a range boundary and end on one or at the model's last layer.
  const std::uint64_t lp = ns.layer_partition;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges;  // [first, end)
  if (lp == 0) {
    ranges.push_back({layer_begin, layer_end});
  } else {
    if (layer_begin % lp != 0 || (layer_end % lp != 0 && layer_end != total_layers))
      bad("this rank holds layers " + std::to_string(layer_begin) + "-" + std::to_string(layer_end - 1) + " of " +
          std::to_string(total_layers) + ", not whole ranges of cache.storage_layer_partition = " + std::to_string(lp) +
          " layers");
    for (std::uint64_t a = layer_begin; a < layer_end; a += lp) ranges.push_back({a, std::min(a + lp, layer_end)});
  }
  plan.ns = ns;
  plan.digest = namespace_digest(ns);
  for (const auto& [a, b] : ranges)
    for (const auto& [g, h0] : groups) {
      UnifiedChunk c;
      c.layer_first = a;
      c.layer_last = b - 1;
      if (!ns.rank_replicated) c.head_group = g;
      c.local = {static_cast<std::size_t>(a - layer_begin), static_cast<std::size_t>(b - a), h0, group_heads};
      c.suffix = "_" + plan.digest + "_L" + std::to_string(a) + "-" + std::to_string(b - 1) +
                 (c.head_group ? "_H" + std::to_string(*c.head_group) : "");
      plan.chunks.push_back(c);
    }
  return plan;
}

std::string unified_key(const PageDigest& page, const UnifiedChunk& c) { return to_hex(page) + c.suffix; }

}  // namespace kvgrid::cache
