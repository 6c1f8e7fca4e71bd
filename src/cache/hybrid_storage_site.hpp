// The storage site of hybrid models (storage_site.hpp): the unified tree (unified_tree.hpp) and the
// hybrid host tier (hybrid_host_tier.hpp). A component keeps the same prefix identity in L3 as
// on the device and the host: its objects are named by the page hash chain like FULL's.
//
// Objects, per token page i of a path (K_i = the page's storage key: hash chain + shard suffix):
//  * FULL  `K_i`        — the page of every local FULL layer (+ the FULL-sourced sidecars' words);
//  * SWA   `K_i.swa`    — the page of every local SWA layer (+ SWA-sourced sidecars), written only
//                         where the host has a copy: inside windows (elsewhere a host tombstone);
//  * MAMBA `K_i.mamba`  — the recurrent state at the end of page i, written only where the host
//                         has one (checkpoint depths).
// A draft model (speculative decoding) travels inside these objects: packed, its layers and state
// words are in the target's host pools already; sidecar, its host pools' bytes of the same slot
// follow the target's (and the payload sidecars') in each object (the key's model part names the
// draft's layout, so the two never read each other's objects).
// A kind this stage holds no bytes of (no such layer here, no sidecar) has no objects: it counts
// as present, and the stages that do hold its bytes decide through the MIN. Sidecars travel
// inside their source's objects, so a sidecar is never missing where its source is (the MIN the
// reference takes for sidecars is the source's own hit).
//
// Hit (this rank's, before the MIN): the prefetch starts below the anchor — the boundary the tree
// serves with host copies (host_matched), or higher where FULL's host copies end along the walk
// (they form a prefix; device-only FULL pages below it are read again) — and its hit is the
// deepest boundary b every component can serve: FULL objects for every page of [anchor, b) that
// the host does not have (pages above FULL's host end need none: those items bring only the SWA
// pages and MAMBA states the host lost — evicted apart from FULL's); MAMBA: b on
// the checkpoint grid with its state object; SWA: the objects of the rounded window's pages
// before b (those inside [anchor, b)), and, where the window reaches above the anchor, a live or
// backed SWA run there long enough to complete it. A smaller agreed hit is another rank's
// boundary (hits are MINed): a rank that cannot serve it reads a missing object and the
// prefetch completes nothing everywhere.
// Items: item i is page start + i — its FULL object (below FULL's host end), its SWA object
// inside the window, and (the last item) the MAMBA state. Acceptance is all or nothing (SWA's window and MAMBA's state sit at
// the end: a shorter prefix of the items is not a boundary they accept). Landing inserts host
// copies only (UnifiedTree::insert_host): FULL over the pages read, SWA over the window, MAMBA at b;
// a load-back then brings what a request reuses to the device.
// Written when a node's host backup is published (HybridHostTier::on_published); with KV
// replicated over TP (MLA) only TP rank 0 writes.
// Unified keys (cfg.unified_keys(), unified_kv.hpp): each component's slot is one object per chunk
// of the grid, `{page_hash}_{component namespace}_L{a}-{b}[_H{g}]` — FULL's and SWA's packed from
// the host page by the relayout kernel, MAMBA's from the state slot — so a job of any compatible
// layout reads them; the rules above are unchanged (a component's slot counts as stored when every
// one of its chunks' objects exists). A payload sidecar is one object per source slot in a
// namespace of its own (its words whole: they split neither by layer nor by head), after the
// source's chunks, written by the stage's first TP rank. A draft's layers of a kind are objects of the draft's own
// namespace for that kind (cfg.unified_draft*), after the target's chunks in the slot's objects —
// from wherever the draft's host bytes are (packed: the target's host pool past its layers or
// words; sidecar: the draft's own pool), so packed and sidecar jobs read each other's; a slot
// counts as stored only with its draft's objects too.
#pragma once

#include <memory>
#include <vector>

#include "cache/hybrid_host_tier.hpp"
#include "cache/storage_site.hpp"
#include "cache/unified_kv.hpp"
#include "cache/unified_tree.hpp"

namespace kvgrid::cache {

class HybridStorageSite final : public StorageSite {
 public:
  static constexpr const char* kSwaSuffix = ".swa";
  static constexpr const char* kMambaSuffix = ".mamba";

  // `window`: the SWA window (tokens; 0: no SWA component); `mamba_chunk`: the MAMBA checkpoint
  // grid (0: no MAMBA component).
  HybridStorageSite(const StorageContext& ctx, unified::UnifiedTree& tree, HybridHostTier& host, Tokens window,
                    Tokens mamba_chunk);
  ~HybridStorageSite() override { host_.on_published(nullptr); }  // the host tier may outlive the site

  // Writes the objects of `node`'s host copies that storage does not have yet.
  void backup(unified::Node* node);

  Tokens page_size() const override { return tree_.page_size(); }
  std::unique_ptr<Job> plan(std::span<const TokenId> prompt) override;
  void pin(Job& job) override;
  void unpin(Job& job) override;
  bool allocate(Job& job, std::size_t hit, CrossStageAgreement* cross) override;
  std::size_t read(Job& job, std::size_t first, std::size_t count, std::optional<std::size_t> fail_at) override;
  std::vector<std::string> objects(const Job& job, std::size_t item) const override;
  std::size_t bytes(const Job& job, std::size_t first, std::size_t count) const override;
  std::size_t accept(const Job& job, std::size_t intact) const override { return intact == job.keys.size() ? intact : 0; }
  std::size_t land(Job& job, std::size_t keep) override;

  // Object bytes of one slot of a component kind (0: this stage keeps none of its bytes).
  std::size_t object_bytes(ComponentKind k) const;

 private:
  struct HybridJob : Job {
    unified::Node* anchor = nullptr;  // the landing starts below it
    unified::Node* pin_at = nullptr;  // the deepest FULL host copy of the walk (an anchor's descendant or itself)
    // One group per pin: pin_at's node lock (FULL's path) and, with SWA, the anchor's lock (its
    // window: the SWA run above the anchor that the plan counted on).
    std::vector<std::vector<unified::LockHandle>> pins;
    std::size_t full_from = 0;                   // first item with a FULL page to read (above: the host has it)
    std::size_t window_from = 0;                 // first item with an SWA page (after allocate)
    // Host slots by ComponentId: FULL per item from full_from, SWA per item from window_from, MAMBA one.
    std::vector<std::vector<unified::Slot>> host;
    // Sidecar words read with their source (by sidecar, then slot order of the source's items);
    // written into the host stores when the job lands (PayloadSidecar is not for worker threads).
    std::vector<std::vector<std::uint64_t>> sidecar_words;
  };
  std::vector<std::uint8_t> pack(ComponentKind k, unified::Slot s) const;
  void unpack(ComponentKind k, unified::Slot s, std::span<const std::uint8_t> in, HybridJob& job, std::size_t index) const;
  // The objects of component k of the page whose base key is `base` (rank_suffix: its storage key;
  // unified: its page hash), each with its byte range in the slot's packed payload. `lookup`: the
  // ones this rank looks up before a prefetch (unified: a sidecar's object only where this rank
  // writes it — the others rely on that rank's lookup through the MIN).
  std::vector<std::string> names(const std::string& base, ComponentKind k, bool lookup = false) const;
  std::string base_key(const PageDigest& d) const;
  bool has_object(const std::string& base, ComponentKind k);
  std::size_t window_pages() const;  // the rounded SWA window in pages (0: no SWA)
  // A sidecar draft's host bytes of kind k (speculative decoding; null: none, or packed — then the
  // draft is inside the target's host pools): they travel at the end of k's objects.
  KvPool* draft_pool(ComponentKind k) const;
  StatePool* draft_states() const;
  // Unified keys: appends the draft's chunks to each component's part, once the host tier knows
  // its draft (HybridHostTier::set_draft comes after the site is made); called by backup and plan.
  void add_draft_parts();
  // Words per head of a state slot of `slot_words` cut by `chunks` ([layer][head][word]); `heads`: its heads.
  static std::size_t state_words_per_head(const std::vector<UnifiedChunk>& chunks, std::size_t slot_words, std::size_t& heads);
  bool draft_parts_added_ = false;
  unified::ComponentId id_of(ComponentKind k) const;
  bool has(ComponentKind k) const;

  // Unified keys: per ComponentId, the component's chunks — the target's, then the draft's — their
  // spans and each chunk's first word in the slot's packed payload (offsets.back(): the payload's
  // words). The draft's spans are in its host pool (`draft_kv`, or `draft_states` from word
  // `draft_word0`, `draft_heads` × `draft_words` per layer).
  struct UnifiedPart {
    std::vector<UnifiedChunk> chunks;
    std::vector<kernels::ChunkSpan> spans;
    std::vector<std::size_t> offsets{0};
    std::size_t target_chunks = 0;
    std::vector<std::size_t> sidecars;  // chunks [target_chunks, draft_first): these sidecars' objects (tree index)
    std::size_t draft_first = 0;
    std::span<const kernels::ChunkSpan> target_spans() const { return {spans.data(), target_chunks}; }
    std::span<const kernels::ChunkSpan> draft_spans() const { return {spans.data() + draft_first, spans.size() - draft_first}; }
    bool sidecar_chunk(std::size_t o) const { return o >= target_chunks && o < draft_first; }
    const KvPool* draft_kv = nullptr;
    const StatePool* draft_states = nullptr;
    std::size_t draft_word0 = 0, draft_heads = 0, draft_words = 0;
  };
  const UnifiedPart& part(ComponentKind k) const { return parts_[id_of(k).value()]; }
  std::size_t state_heads_ = 0, state_words_ = 0;  // MAMBA under unified keys: a slot's heads, words per head

  StorageContext ctx_;
  unified::UnifiedTree& tree_;
  HybridHostTier& host_;
  Tokens window_, mamba_chunk_;
  std::vector<UnifiedPart> parts_;  // empty: rank_suffix keys
};

}  // namespace kvgrid::cache
