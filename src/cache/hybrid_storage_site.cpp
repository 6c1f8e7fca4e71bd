#include "cache/hybrid_storage_site.hpp"

#include <algorithm>
#include <cstring>
#include <deque>
#include <limits>

#include "cache/page_hash.hpp"
#include "cache/storage_tier.hpp"
#include "core/check.hpp"

namespace kvgrid::cache {

using unified::ComponentId;
using unified::Slot;

namespace {
const char* suffix_of(ComponentKind k) {
  switch (k) {
    case ComponentKind::Swa: return HybridStorageSite::kSwaSuffix;
    case ComponentKind::Mamba: return HybridStorageSite::kMambaSuffix;
    case ComponentKind::Full: break;
  }
  return "";
}
}  // namespace

HybridStorageSite::HybridStorageSite(const StorageContext& ctx, unified::UnifiedTree& tree, HybridHostTier& host,
                                     Tokens window, Tokens mamba_chunk)
    : ctx_(ctx), tree_(tree), host_(host), window_(window), mamba_chunk_(mamba_chunk) {
  KVGRID_CHECK(has(ComponentKind::Full), "a hybrid storage tier without a FULL component");
  KVGRID_CHECK(has(ComponentKind::Swa) == (window_.value() > 0) && has(ComponentKind::Mamba) == (mamba_chunk_.value() > 0),
               "hybrid storage site: window ", window_, " and checkpoint grid ", mamba_chunk_, " do not match the components");
  host_.on_published([this](unified::Node* n) { backup(n); });
  if (!ctx_.cfg.unified_keys()) return;
  KVGRID_CHECK(ctx_.cfg.unified_sidecars.size() == host_.sidecars(), ctx_.cfg.unified_sidecars.size(),
               " unified sidecar objects for ", host_.sidecars(), " sidecars");
  const HybridBytes& b = host_.bytes();
  parts_.resize(host_.kinds().size());
  for (std::size_t c = 0; c < parts_.size(); ++c) {
    const ComponentKind k = host_.kinds()[c];
    UnifiedPart& u = parts_[c];
    u.chunks = k == ComponentKind::Full ? ctx_.cfg.unified : k == ComponentKind::Swa ? ctx_.cfg.unified_swa : ctx_.cfg.unified_mamba;
    const KvPool* pool = k == ComponentKind::Full ? b.full_host : k == ComponentKind::Swa ? b.swa_host : nullptr;
    KVGRID_CHECK(u.chunks.empty() == (k == ComponentKind::Mamba ? b.state_host == nullptr : pool == nullptr),
                 "hybrid unified objects: ", u.chunks.size(), " chunks of component ", c, " without matching host bytes");
    if (k == ComponentKind::Mamba && !u.chunks.empty()) {  // a slot: [layer][head][word] over every chunk
      // (the target's words: a packed draft's follow them in the host slot)
      state_words_ = state_words_per_head(u.chunks, b.state_device->words_per_slot(), state_heads_);
    }
    for (const auto& ch : u.chunks) {
      u.spans.push_back(ch.local);
      u.offsets.push_back(u.offsets.back() + (pool ? pool->object_words(ch.local) : kernels::state_object_words(state_words_, ch.local)));
    }
    u.target_chunks = u.chunks.size();
    for (std::size_t i = 0; i < host_.sidecars(); ++i) {  // a sidecar's words whole, after its source's chunks
      if (host_.host_sidecar(i).source().value() != c) continue;
      u.chunks.push_back(ctx_.cfg.unified_sidecars[i]);
      u.spans.push_back({});
      u.offsets.push_back(u.offsets.back() + host_.host_sidecar(i).words_per_slot());
      u.sidecars.push_back(i);
    }
    u.draft_first = u.chunks.size();
  }
}

std::size_t HybridStorageSite::state_words_per_head(const std::vector<UnifiedChunk>& chunks, std::size_t slot_words,
                                                    std::size_t& heads) {
  std::size_t layers = 0;
  heads = 0;
  for (const auto& ch : chunks) {
    layers = std::max(layers, ch.local.layer0 + ch.local.layers);
    heads = std::max(heads, ch.local.head0 + ch.local.heads);
  }
  const std::size_t words = slot_words / (layers * heads);
  KVGRID_CHECK(words * layers * heads == slot_words, "MAMBA state slot of ", slot_words, " words is not ", layers, " layers x ",
               heads, " heads");
  return words;
}

void HybridStorageSite::add_draft_parts() {
  if (draft_parts_added_ || parts_.empty()) return;
  draft_parts_added_ = true;
  const HybridDraftBytes& d = host_.draft();
  for (std::size_t c = 0; c < parts_.size(); ++c) {
    const ComponentKind k = host_.kinds()[c];
    UnifiedPart& u = parts_[c];
    const auto& chunks = k == ComponentKind::Full  ? ctx_.cfg.unified_draft
                         : k == ComponentKind::Swa ? ctx_.cfg.unified_draft_swa
                                                   : ctx_.cfg.unified_draft_mamba;
    if (k == ComponentKind::Mamba) {
      if (!d.states || !d.states->host()) continue;  // no draft state here, or target_only: nothing stored
      KVGRID_CHECK(!chunks.empty(), "a draft's MAMBA layers without their unified objects");
      u.draft_states = d.states->host();
      u.draft_word0 = d.states->host_word0();
      u.draft_words = state_words_per_head(chunks, d.states->device_words(), u.draft_heads);
    } else {
      const DraftState* ds = k == ComponentKind::Full ? d.full : d.swa;
      if (!ds || !ds->host()) continue;
      KVGRID_CHECK(!chunks.empty(), "a draft's ", k == ComponentKind::Full ? "FULL" : "SWA", " layers without their unified objects");
      u.draft_kv = ds->host();
    }
    for (const auto& ch : chunks) {
      kernels::ChunkSpan s = ch.local;
      std::size_t words = 0;
      if (u.draft_kv) {
        s.layer0 += (k == ComponentKind::Full ? d.full : d.swa)->host_layer0();
        words = u.draft_kv->object_words(s);
      } else {
        words = kernels::state_object_words(u.draft_words, s);
      }
      u.chunks.push_back(ch);
      u.spans.push_back(s);
      u.offsets.push_back(u.offsets.back() + words);
    }
  }
}

bool HybridStorageSite::has(ComponentKind k) const {
  const auto& kinds = host_.kinds();
  return std::find(kinds.begin(), kinds.end(), k) != kinds.end();
}

ComponentId HybridStorageSite::id_of(ComponentKind k) const {
  const auto& kinds = host_.kinds();
  return ComponentId(static_cast<std::uint32_t>(std::find(kinds.begin(), kinds.end(), k) - kinds.begin()));
}

std::size_t HybridStorageSite::window_pages() const {
  const std::int64_t p = tree_.page_size().value();
  return has(ComponentKind::Swa) ? static_cast<std::size_t>((window_.value() + p - 1) / p) : 0;
}

// ---- objects --------------------------------------------------------------------------------

KvPool* HybridStorageSite::draft_pool(ComponentKind k) const {
  const DraftState* d = k == ComponentKind::Full ? host_.draft().full : k == ComponentKind::Swa ? host_.draft().swa : nullptr;
  return d && d->separate_objects() ? const_cast<DraftState*>(d)->host() : nullptr;
}

StatePool* HybridStorageSite::draft_states() const {
  return host_.draft().states ? host_.draft().states->sidecar() : nullptr;
}

std::size_t HybridStorageSite::object_bytes(ComponentKind k) const {
  if (!parts_.empty()) return has(k) ? part(k).offsets.back() * sizeof(std::uint64_t) : 0;
  const HybridBytes& b = host_.bytes();
  std::size_t n = 0;
  if (k == ComponentKind::Full && b.full_host) n = b.full_host->layer_block_bytes() * b.full_host->layers();
  if (k == ComponentKind::Swa && b.swa_host) n = b.swa_host->layer_block_bytes() * b.swa_host->layers();
  if (k == ComponentKind::Mamba && b.state_host) n = b.state_host->words_per_slot() * sizeof(std::uint64_t);
  if (const KvPool* d = draft_pool(k)) n += d->layer_block_bytes() * d->layers();  // a sidecar draft's, last
  if (k == ComponentKind::Mamba && draft_states()) n += draft_states()->words_per_slot() * sizeof(std::uint64_t);
  if (k == ComponentKind::Mamba || !has(k)) return n;
  const ComponentId c = id_of(k);
  for (std::size_t i = 0; i < host_.sidecars(); ++i)
    if (host_.host_sidecar(i).source() == c) n += host_.host_sidecar(i).words_per_slot() * sizeof(std::uint64_t);
  return n;
}

std::vector<std::uint8_t> HybridStorageSite::pack(ComponentKind k, Slot s) const {
  const HybridBytes& b = host_.bytes();
  if (!parts_.empty()) {  // unified keys: the chunks in object order, one after another (the draft's last)
    const UnifiedPart& u = part(k);
    std::vector<std::uint64_t> w(u.offsets.back());
    const auto mine = u.target_spans(), draft = u.draft_spans();
    std::uint64_t* at = w.data() + u.offsets[u.draft_first];
    const std::vector<PageId> page{PageId(s.value())};
    for (std::size_t j = 0; j < u.sidecars.size(); ++j) {
      const auto words = host_.host_sidecar(u.sidecars[j]).read(s);
      std::copy(words.begin(), words.end(), w.data() + u.offsets[u.target_chunks + j]);
    }
    if (k == ComponentKind::Mamba) {
      if (!mine.empty()) kernels::pack_state_objects(b.state_host->slot(s.value()), state_heads_, state_words_, mine, w.data());
      if (!draft.empty())
        kernels::pack_state_objects(u.draft_states->slot(s.value()).subspan(u.draft_word0), u.draft_heads, u.draft_words, draft, at);
    } else {
      if (!mine.empty()) (k == ComponentKind::Full ? b.full_host : b.swa_host)->pack(page, mine, w.data());
      if (!draft.empty()) u.draft_kv->pack(page, draft, at);
    }
    const auto* p = reinterpret_cast<const std::uint8_t*>(w.data());
    return std::vector<std::uint8_t>(p, p + w.size() * sizeof(std::uint64_t));
  }
  std::vector<std::uint8_t> out;
  out.reserve(object_bytes(k));
  auto put = [&](const void* p, std::size_t n) {
    const auto* q = static_cast<const std::uint8_t*>(p);
    out.insert(out.end(), q, q + n);
  };
  const KvPool* pool = k == ComponentKind::Full ? b.full_host : k == ComponentKind::Swa ? b.swa_host : nullptr;
  if (pool)
    for (std::size_t l = 0; l < pool->layers(); ++l) put(pool->layer_block(PageId(s.value()), l), pool->layer_block_bytes());
  if (k == ComponentKind::Mamba && b.state_host) {
    auto w = b.state_host->slot(s.value());
    put(w.data(), w.size() * sizeof(std::uint64_t));
  }
  if (k != ComponentKind::Mamba)
    for (std::size_t i = 0; i < host_.sidecars(); ++i) {
      unified::PayloadSidecar& sc = host_.host_sidecar(i);
      if (sc.source() != id_of(k)) continue;
      auto w = sc.read(s);
      put(w.data(), w.size() * sizeof(std::uint64_t));
    }
  if (const KvPool* d = draft_pool(k))  // a sidecar draft's bytes of this slot, last
    for (std::size_t l = 0; l < d->layers(); ++l) put(d->layer_block(PageId(s.value()), l), d->layer_block_bytes());
  if (k == ComponentKind::Mamba && draft_states()) {
    auto w = draft_states()->slot(s.value());
    put(w.data(), w.size() * sizeof(std::uint64_t));
  }
  return out;
}

void HybridStorageSite::unpack(ComponentKind k, Slot s, std::span<const std::uint8_t> in, HybridJob& job,
                               std::size_t index) const {
  const HybridBytes& b = host_.bytes();
  if (!parts_.empty()) {  // unified keys: the chunks in object order (copied: `in` need not be word-aligned)
    const UnifiedPart& u = part(k);
    std::vector<std::uint64_t> w(u.offsets.back());
    std::memcpy(w.data(), in.data(), w.size() * sizeof(std::uint64_t));
    const auto mine = u.target_spans(), draft = u.draft_spans();
    const std::uint64_t* at = w.data() + u.offsets[u.draft_first];
    const std::vector<PageId> page{PageId(s.value())};
    for (std::size_t j = 0; j < u.sidecars.size(); ++j) {  // into the job: the sidecar takes them when it lands
      const std::size_t n = host_.host_sidecar(u.sidecars[j]).words_per_slot();
      std::copy_n(w.data() + u.offsets[u.target_chunks + j], n, job.sidecar_words[u.sidecars[j]].data() + index * n);
    }
    if (k == ComponentKind::Mamba) {
      if (!mine.empty()) kernels::unpack_state_objects(b.state_host->slot(s.value()), state_heads_, state_words_, mine, w.data());
      if (!draft.empty())
        kernels::unpack_state_objects(const_cast<StatePool*>(u.draft_states)->slot(s.value()).subspan(u.draft_word0),
                                      u.draft_heads, u.draft_words, draft, at);
    } else {  // (read may run on a storage worker thread: no Kokkos launch there)
      if (!mine.empty())
        (k == ComponentKind::Full ? b.full_host : b.swa_host)->unpack(page, mine, w.data(), /*kokkos=*/!ctx_.cfg.threaded);
      if (!draft.empty()) const_cast<KvPool*>(u.draft_kv)->unpack(page, draft, at, /*kokkos=*/!ctx_.cfg.threaded);
    }
    return;
  }
  std::size_t at = 0;
  auto take = [&](void* p, std::size_t n) {
    std::memcpy(p, in.data() + at, n);
    at += n;
  };
  KvPool* pool = k == ComponentKind::Full ? b.full_host : k == ComponentKind::Swa ? b.swa_host : nullptr;
  if (pool)
    for (std::size_t l = 0; l < pool->layers(); ++l) take(pool->layer_block(PageId(s.value()), l), pool->layer_block_bytes());
  if (k == ComponentKind::Mamba && b.state_host) {
    auto w = b.state_host->slot(s.value());
    take(w.data(), w.size() * sizeof(std::uint64_t));
  }
  if (k != ComponentKind::Mamba)
    for (std::size_t i = 0; i < host_.sidecars(); ++i) {
      const unified::PayloadSidecar& sc = host_.host_sidecar(i);
      if (sc.source() != id_of(k)) continue;
      const std::size_t w = sc.words_per_slot();
      take(job.sidecar_words[i].data() + index * w, w * sizeof(std::uint64_t));
    }
  if (KvPool* d = draft_pool(k))
    for (std::size_t l = 0; l < d->layers(); ++l) take(d->layer_block(PageId(s.value()), l), d->layer_block_bytes());
  if (k == ComponentKind::Mamba && draft_states()) {
    auto w = draft_states()->slot(s.value());
    take(w.data(), w.size() * sizeof(std::uint64_t));
  }
}

std::string HybridStorageSite::base_key(const PageDigest& d) const {
  return parts_.empty() ? storage_key(d, ctx_.cfg.key_suffix) : to_hex(d);
}

std::vector<std::string> HybridStorageSite::names(const std::string& base, ComponentKind k, bool lookup) const {
  if (object_bytes(k) == 0) return {};  // no bytes of this kind here
  if (parts_.empty()) return {base + suffix_of(k)};
  const UnifiedPart& u = part(k);
  const bool skip_sidecars = lookup && !ctx_.cfg.unified_sidecar_writer;
  std::vector<std::string> out;
  for (std::size_t o = 0; o < u.chunks.size(); ++o)
    if (!skip_sidecars || !u.sidecar_chunk(o)) out.push_back(base + u.chunks[o].suffix);
  return out;
}

bool HybridStorageSite::has_object(const std::string& base, ComponentKind k) {
  const auto keys = names(base, k, /*lookup=*/true);
  if (keys.size() == 1) return ctx_.store.exists(keys[0]);
  const std::vector<bool> there = ctx_.store.present(keys);  // unified: every chunk, one round trip
  return std::all_of(there.begin(), there.end(), [](bool b) { return b; });
}

// Write-through of a published host backup: the objects of every backed slot of the node (each
// component's pages; MAMBA's state, named after the node's last page) are looked up at once (one
// round trip on Redis); the missing objects of slots not hit by storage.write.fail are packed and
// go to the writer as one batch (storage_writer.hpp). Objects already there (or in flight) are
// immutable and left alone.
void HybridStorageSite::backup(unified::Node* node) {
  add_draft_parts();
  if (!ctx_.cfg.writer) return;  // MLA: TP rank 0 writes for everyone
  std::vector<const unified::Node*> path;
  for (const unified::Node* n = node; n != tree_.root(); n = n->parent) path.push_back(n);
  std::vector<TokenId> tokens;
  for (auto it = path.rbegin(); it != path.rend(); ++it) tokens.insert(tokens.end(), (*it)->key.begin(), (*it)->key.end());
  const std::size_t p = static_cast<std::size_t>(tree_.page_size().value());
  const auto chain = page_hash_chain(tokens, p);
  const std::size_t first = static_cast<std::size_t>(node->start().value()) / p, pages = node->key.size() / p;
  struct SlotWrite {
    ComponentKind k;
    Slot s;
    std::size_t key0, keys;  // its objects: keys[key0, key0 + keys)
  };
  std::vector<SlotWrite> slots;
  std::vector<std::string> keys;
  auto add = [&](ComponentKind k, Slot s, const PageDigest& d) {
    auto ks = names(base_key(d), k);
    if (ks.empty()) return;  // no bytes of this kind here
    slots.push_back({k, s, keys.size(), ks.size()});
    for (auto& key : ks) keys.push_back(std::move(key));
  };
  for (std::size_t c = 0; c < host_.kinds().size(); ++c) {
    const unified::ComponentData& d = node->comp[c];
    if (!d.backed()) continue;
    const ComponentKind k = host_.kinds()[c];
    if (k == ComponentKind::Mamba) add(k, (*d.host)[0], chain[first + pages - 1]);  // the state at the node's end
    else
      for (std::size_t j = 0; j < pages; ++j) add(k, (*d.host)[j], chain[first + j]);
  }
  if (slots.empty()) return;
  const std::vector<bool> there = ctx_.writer.present(keys);  // in flight counts as there
  WriteBatch batch;
  // Object o of a slot is this rank's to write unless it is a sidecar's and another TP rank writes those.
  auto writes = [&](const SlotWrite& w, std::size_t o) {
    return parts_.empty() || ctx_.cfg.unified_sidecar_writer || !part(w.k).sidecar_chunk(o);
  };
  for (std::size_t i = 0; i < slots.size(); ++i) {
    const SlotWrite& w = slots[i];
    bool missing = false;  // an object of this rank's not stored yet
    for (std::size_t o = 0; o < w.keys && !missing; ++o) missing = writes(w, o) && !there[w.key0 + o];
    if (!missing) continue;
    if (ctx_.cfg.faults.write_fail && ctx_.cfg.faults.write_fail()) {
      ++ctx_.stats.write_failed;  // nothing left behind: a later prefetch misses these objects
      continue;
    }
    const std::size_t g = batch.open_group(w.k == ComponentKind::Full);  // written_pages counts FULL pages
    const std::span<const std::uint8_t> bytes(batch.bytes.emplace_back(pack(w.k, w.s)));
    for (std::size_t o = 0; o < w.keys; ++o) {
      if (there[w.key0 + o] || !writes(w, o)) continue;  // (a sidecar's object: the stage's first TP rank writes it)
      const std::size_t from = parts_.empty() ? 0 : part(w.k).offsets[o] * sizeof(std::uint64_t);
      const std::size_t to = parts_.empty() ? bytes.size() : part(w.k).offsets[o + 1] * sizeof(std::uint64_t);
      batch.add(g, keys[w.key0 + o], bytes.subspan(from, to - from));
    }
  }
  ctx_.writer.submit(std::move(batch));  // lands off the loop (storage_writer.hpp)
}

// ---- prefetch -------------------------------------------------------------------------------

std::unique_ptr<StorageSite::Job> HybridStorageSite::plan(std::span<const TokenId> prompt) {
  add_draft_parts();
  const std::size_t p = static_cast<std::size_t>(tree_.page_size().value());
  const std::size_t threshold = static_cast<std::size_t>(ctx_.cfg.prefetch_threshold.value());
  const std::size_t max_pages = prompt.empty() ? 0 : (prompt.size() - 1) / p;  // reuse at most prompt - 1
  if (max_pages * p < threshold) return nullptr;
  const ComponentId full = id_of(ComponentKind::Full);
  unified::MatchResult m = tree_.peek_prefix(prompt);
  const std::size_t cached = static_cast<std::size_t>(m.host_matched.value()) / p;
  if ((max_pages - cached) * p < threshold) return nullptr;
  auto job = std::make_unique<HybridJob>();
  // The prefetch starts at the boundary the tree can serve with its host copies (host_matched),
  // or higher, where FULL's host copies end along the walk (they form a prefix: nothing below a
  // node without one may take one — its device pages are read again instead). Items above
  // FULL's host end read no FULL object: they bring the SWA pages and MAMBA states the host lost.
  Tokens full_end(0);
  for (const auto& cand : m.candidates) {
    if (!cand.node->at(full).backed()) break;
    full_end = cand.node->end;
  }
  const Tokens anchor_end = std::min(full_end, m.host_matched);
  job->tokens.assign(prompt.begin(), prompt.begin() + static_cast<std::ptrdiff_t>(max_pages * p));
  job->anchor = anchor_end.value() > 0 ? tree_.find_node(job->tokens, anchor_end) : tree_.root();
  KVGRID_CHECK(job->anchor != nullptr, "hybrid prefetch anchor at depth ", anchor_end, " is not on the prompt's path");
  // Pinned: the deepest FULL host copy of the walk — its path lock keeps every host copy above it,
  // the anchor's included, through the host evictions of this and other allocations.
  job->pin_at = full_end.value() > 0 ? tree_.find_node(job->tokens, full_end) : tree_.root();
  job->start = static_cast<std::size_t>(anchor_end.value()) / p;
  job->full_from = static_cast<std::size_t>((full_end - anchor_end).value()) / p;
  job->cached = cached;
  const auto chain = page_hash_chain(job->tokens, p);
  for (std::size_t i = job->start; i < chain.size(); ++i) job->keys.push_back(base_key(chain[i]));
  const std::size_t n = job->keys.size();
  // What the SWA window may take from above the anchor: the live-or-backed SWA run ending there
  // (unbounded when it reaches the root: nothing precedes the first token).
  std::int64_t above = 0;
  if (has(ComponentKind::Swa)) {
    const ComponentId swa = id_of(ComponentKind::Swa);
    const unified::Node* a = job->anchor;
    while (a != tree_.root() && a->at(swa).present(/*with_host=*/true)) {
      above += a->length().value();
      a = a->parent;
    }
    if (a == tree_.root()) above = std::numeric_limits<std::int64_t>::max() / 2;
  }
  const bool writer = ctx_.cfg.writer;  // MLA readers cannot see the writer's objects: it decides
  std::size_t full_hit = n;  // the leading items from full_from whose FULL objects all exist
  if (writer && job->full_from < n && object_bytes(ComponentKind::Full) > 0) {
    std::vector<std::string> keys;  // one batch query (one round trip on Redis)
    for (std::size_t i = job->full_from; i < n; ++i)
      for (auto& name : names(job->keys[i], ComponentKind::Full, /*lookup=*/true)) keys.push_back(std::move(name));
    const std::size_t per = keys.size() / (n - job->full_from);
    full_hit = job->full_from + ctx_.store.batch_exists(keys) / per;
  }
  const std::size_t wp = window_pages();
  std::vector<char> swa_ok(full_hit, 1);
  if (writer && wp > 0)
    for (std::size_t i = 0; i < full_hit; ++i) swa_ok[i] = has_object(job->keys[i], ComponentKind::Swa) ? 1 : 0;
  job->local_hit = 0;
  for (std::size_t b = full_hit; b > 0; --b) {  // the deepest boundary every component can serve
    const std::size_t depth = (job->start + b) * p;
    if (has(ComponentKind::Mamba)) {
      if (depth % static_cast<std::size_t>(mamba_chunk_.value()) != 0) continue;
      if (writer && !has_object(job->keys[b - 1], ComponentKind::Mamba)) continue;
    }
    if (wp > 0) {
      const std::size_t from = b > wp ? b - wp : 0;
      if (!std::all_of(swa_ok.begin() + static_cast<std::ptrdiff_t>(from), swa_ok.begin() + static_cast<std::ptrdiff_t>(b),
                       [](char ok) { return ok != 0; }))
        continue;
      if (from == 0 && static_cast<std::int64_t>(b * p) + above < window_.value()) continue;
    }
    job->local_hit = b;
    break;
  }
  return job;
}

void HybridStorageSite::pin(Job& j) {
  auto& job = static_cast<HybridJob&>(j);
  std::vector<unified::LockHandle> group;
  if (job.pin_at != tree_.root()) group.push_back(tree_.lock_node(job.pin_at));
  if (has(ComponentKind::Swa) && job.anchor != tree_.root()) {  // the anchor's SWA window only
    unified::LockHandle h = tree_.lock(job.anchor);
    for (std::size_t c = 0; c < host_.kinds().size(); ++c)
      if (host_.kinds()[c] != ComponentKind::Swa) tree_.release_component_lock(h, unified::ComponentId(static_cast<std::uint32_t>(c)));
    group.push_back(std::move(h));
  }
  job.pins.push_back(std::move(group));
}

void HybridStorageSite::unpin(Job& j) {
  auto& job = static_cast<HybridJob&>(j);
  KVGRID_CHECK(!job.pins.empty(), "hybrid prefetch unpinned more often than pinned");
  for (auto& h : job.pins.back()) tree_.unlock(h);
  job.pins.pop_back();
}

bool HybridStorageSite::allocate(Job& j, std::size_t hit, CrossStageAgreement* cross) {
  auto& job = static_cast<HybridJob&>(j);
  const std::size_t nc = host_.kinds().size(), wp = window_pages();
  job.window_from = wp > 0 ? (hit > wp ? hit - wp : 0) : hit;
  job.host.assign(nc, {});
  bool ok = true;
  for (std::size_t c = 0; c < nc && ok; ++c) {
    const ComponentKind k = host_.kinds()[c];
    const std::size_t want = k == ComponentKind::Full ? (hit > job.full_from ? hit - job.full_from : 0)
                             : k == ComponentKind::Swa ? hit - job.window_from
                                                       : 1;
    auto got = host_.alloc_host(ComponentId(static_cast<std::uint32_t>(c)), static_cast<std::int64_t>(want));
    if (got) job.host[c] = std::move(*got);
    else ok = false;
  }
  const bool local = ok && !host_.alloc_fault();
  bool agreed = local;
  if (cross) {  // across stages: every rank serving the request must have allocated
    std::vector<std::uint64_t> v{local ? 1u : 0u};
    cross->min(v);
    agreed = v[0] == 1;
  } else {
    agreed = ctx_.agreement.agree_allocation(local);
  }
  for (std::size_t c = 0; c < nc; ++c) {
    const ComponentId id(static_cast<std::uint32_t>(c));
    if (!agreed) host_.free_host(id, job.host[c]);
    else host_.hold(id, static_cast<std::int64_t>(job.host[c].size()));
  }
  if (!agreed) {
    job.host.assign(nc, {});
    return false;
  }
  job.sidecar_words.assign(host_.sidecars(), {});
  for (std::size_t i = 0; i < host_.sidecars(); ++i) {
    const unified::PayloadSidecar& sc = host_.host_sidecar(i);
    job.sidecar_words[i].assign(job.host[sc.source().value()].size() * sc.words_per_slot(), 0);
  }
  return true;
}

std::size_t HybridStorageSite::read(Job& j, std::size_t first, std::size_t count, std::optional<std::size_t> fail_at) {
  auto& job = static_cast<HybridJob&>(j);
  const std::size_t last = job.keys.size() - 1;
  std::vector<std::uint8_t> buf;
  // The objects of item i's component k into host slot s; false when one is missing, short or damaged.
  auto get = [&](std::size_t i, ComponentKind k, Slot s, std::size_t index) {
    const auto keys = names(job.keys[i], k);
    if (keys.empty()) return true;
    buf.resize(object_bytes(k));
    for (std::size_t o = 0, at = 0; o < keys.size(); ++o) {
      const std::size_t n = parts_.empty() ? buf.size() : (part(k).offsets[o + 1] - part(k).offsets[o]) * sizeof(std::uint64_t);
      if (ctx_.store.get(keys[o], std::span<std::uint8_t>(buf).subspan(at, n)) != StorageMiss::None) return false;
      at += n;
    }
    unpack(k, s, buf, job, index);
    return true;
  };
  for (std::size_t n = 0; n < count; ++n) {
    if (fail_at && n >= *fail_at) return n;  // storage.read.fail: an I/O error from here on
    const std::size_t i = first + n;
    for (std::size_t c = 0; c < job.host.size(); ++c) {  // SWA and MAMBA first: FULL's object is the item's own
      const ComponentKind k = host_.kinds()[c];
      if (k == ComponentKind::Swa && i >= job.window_from &&
          !get(i, k, job.host[c][i - job.window_from], i - job.window_from))
        return n;
      if (k == ComponentKind::Mamba && i == last && !get(i, k, job.host[c][0], 0)) return n;
    }
    const std::size_t full = id_of(ComponentKind::Full).value();
    if (i >= job.full_from && !get(i, ComponentKind::Full, job.host[full][i - job.full_from], i - job.full_from)) return n;
  }
  return count;
}

std::vector<std::string> HybridStorageSite::objects(const Job& j, std::size_t i) const {
  const auto& job = static_cast<const HybridJob&>(j);
  std::vector<std::string> out;
  auto add = [&](ComponentKind k) {
    for (auto& name : names(job.keys[i], k)) out.push_back(std::move(name));
  };
  if (i >= job.full_from) add(ComponentKind::Full);
  if (has(ComponentKind::Swa) && i >= job.window_from) add(ComponentKind::Swa);
  if (has(ComponentKind::Mamba) && i + 1 == job.keys.size()) add(ComponentKind::Mamba);
  return out;
}

std::size_t HybridStorageSite::bytes(const Job& j, std::size_t first, std::size_t count) const {
  const auto& job = static_cast<const HybridJob&>(j);
  std::size_t n = 0;
  for (std::size_t i = first; i < first + count; ++i) {
    if (i >= job.full_from) n += object_bytes(ComponentKind::Full);
    if (has(ComponentKind::Swa) && i >= job.window_from) n += object_bytes(ComponentKind::Swa);
    if (has(ComponentKind::Mamba) && i + 1 == job.keys.size()) n += object_bytes(ComponentKind::Mamba);
  }
  return n;
}

std::size_t HybridStorageSite::land(Job& j, std::size_t keep) {
  auto& job = static_cast<HybridJob&>(j);
  const std::size_t nc = job.host.size();
  const std::int64_t p = tree_.page_size().value();
  KVGRID_CHECK(keep == 0 || keep == job.keys.size(), "hybrid prefetch landing ", keep, " of ", job.keys.size(), " pages");
  std::vector<std::vector<Slot>> back = job.host;  // what goes back to the pools
  std::size_t used = 0;
  if (keep > 0) {
    for (std::size_t i = 0; i < host_.sidecars(); ++i) {  // the sidecars' words with their source's slots
      unified::PayloadSidecar& sc = host_.host_sidecar(i);
      const auto& slots = job.host[sc.source().value()];
      const std::size_t w = sc.words_per_slot();
      for (std::size_t s = 0; s < slots.size(); ++s)
        sc.write(slots[s], std::span<const std::uint64_t>(job.sidecar_words[i]).subspan(s * w, w));
    }
    std::vector<unified::InsertValue> offers(nc);
    const Tokens start(static_cast<std::int64_t>(job.start) * p);
    for (std::size_t c = 0; c < nc; ++c) {
      switch (host_.kinds()[c]) {
        case ComponentKind::Full:
          offers[c] = unified::InsertValue::pages(job.host[c], start + Tokens(static_cast<std::int64_t>(job.full_from) * p));
          break;
        case ComponentKind::Swa:
          offers[c] = unified::InsertValue::pages(job.host[c], start + Tokens(static_cast<std::int64_t>(job.window_from) * p));
          break;
        case ComponentKind::Mamba: offers[c] = unified::InsertValue::state(job.host[c][0]); break;
      }
    }
    back = tree_.insert_host(job.anchor, job.tokens, offers);
    for (std::size_t c = 0; c < nc; ++c) used += job.host[c].size() - back[c].size();  // copies the tree took
  }
  for (std::size_t c = 0; c < nc; ++c) {
    const ComponentId id(static_cast<std::uint32_t>(c));
    host_.hold(id, -static_cast<std::int64_t>(job.host[c].size()));
    host_.free_host(id, back[c]);
  }
  job.host.assign(nc, {});
  unpin(job);
  return used;
}

}  // namespace kvgrid::cache
