// KV payload of the device pool: what a page holds, for the layers and heads this rank owns.
//
// Payload modes (DESIGN §2): `full` stores real KV elements (page_size × dims words per page,
// layer and head); `digest` stores one 64-bit fold per page × layer × head. Both go through the
// same calls, so every code path that moves or reads a page is exercised in both; `digest` needs
// about page_size × dims times less memory, for production-sized traces. Page ids are those of
// DevicePool (row 0 is the padding page).
//
// Position binding (kernels/kv_math.hpp): reads say at which page-table index (`first_index`) or
// position (`first_pos`) they read, and every value enters a fold weighted by its coordinates, so
// the right page at the wrong place is as visible to the oracle as a wrong page.
//
// Freed pages are poisoned (`poison`, called by the tier's allocator hook): digest pages always,
// full pages with debug checks on (tests) — a read of a page before its copy lands then sees
// poison, not the bytes of the prefix the page held before.
//
// CP sharding (`placement.shards` = N > 1): page ids are logical and this pool holds only the
// pages its rank owns (owner q mod N == shard_rank), at row ⌊q/N⌋ — the translation happens here,
// at the copy boundary, and nowhere else. `write` stores only owned pages' tokens and `reset`
// touches only owned pages; reads (`fold_*`, `layer_block`) of pages owned elsewhere are bugs,
// except that `layer_block` translates any id to this rank's row (what a copy that ignores owners
// would touch: the buggy restore variant).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "cache/cp_placement.hpp"
#include "cache/pool_words.hpp"
#include "core/ids.hpp"
#include "core/rng.hpp"
#include "kernels/kv_kernels.hpp"
#include "kernels/relayout.hpp"
#include "transfer/kv_transport.hpp"
#include "transfer/transfer_engine.hpp"

namespace kvgrid::cache {

enum class Payload { Full, Digest };
Payload parse_payload(const std::string& name);  // "full" | "digest"

struct KvPoolConfig {
  Pages capacity{0};
  Tokens page_size{16};
  std::uint64_t layer_base = 0, layers = 1;  // this rank's contiguous layer slice
  std::vector<std::uint32_t> heads;           // global ids of the KV heads this rank stores
  std::uint64_t dims = 1;
  Payload payload = Payload::Digest;
  CpPlacement placement{};      // shards > 1: a sharded pool (capacity is per rank)
  std::uint32_t shard_rank = 0;  // this rank's index in the shard group
  // Where the words live (nullptr: ordinary host memory; transfer/pool_memory.hpp) and which tier's
  // pool this is (engine.transfer = cuda: a device pool is GPU memory, a host pool pinned memory).
  const transfer::PoolMemory* memory = nullptr;
  transfer::PoolKind kind = transfer::PoolKind::Host;
  // Non-empty: a page_unified pool (cache.host_layout = page_unified): each row holds these chunks'
  // storage objects one after another (kernels/relayout.hpp); they must tile every layer and head.
  std::vector<kernels::ChunkSpan> object_chunks{};
};

class KvPool {
 public:
  explicit KvPool(KvPoolConfig cfg);

  // Token i goes to slot `slot[i]` of `page[i]`; F[i] is its token feature (kernels/kv_math.hpp).
  void write(std::span<const std::uint32_t> page, std::span<const std::uint32_t> slot, std::span<const std::uint64_t> F);
  // Adds the fold of each listed (complete) page to out[l * heads + h]; pages[j] is read as
  // page-table entry first_index + j.
  void fold_pages(std::span<const std::uint32_t> pages, std::span<std::uint64_t> out, std::size_t first_index = 0) const;
  // Each listed page's folds in turn, each read as page-table entry 0: [page][l * heads + h]
  // (tests and tools compare pages).
  std::vector<std::uint64_t> page_folds(std::span<const PageId> pages) const;
  // Only local layer `layer` (out still indexed [l * heads + h]).
  void fold_pages_layer(std::span<const std::uint32_t> pages, std::size_t first_index, std::size_t layer,
                        std::span<std::uint64_t> out) const;
  // The fold of tokens just written, token i read as position first_pos + i: full mode reads them
  // back from the pool; digest mode has no per-token storage and takes them from the caller's
  // scratch features F.
  void fold_tokens(std::span<const std::uint32_t> page, std::span<const std::uint32_t> slot,
                   std::span<const std::uint64_t> F, std::size_t first_pos, std::span<std::uint64_t> out) const;
  // Digest mode's fold of one token is rank one: token_weight(position, slot, F) × fold_coef(k) for
  // k = local layer × heads + head (what fold_tokens writes), so a caller can sum the weights and
  // fold once per chunk.
  std::uint64_t token_weight(std::size_t pos, std::uint32_t slot, std::uint64_t F) const;
  // The weights of consecutive positions first_pos, first_pos + 1, … with features F (into w).
  void token_weights(std::size_t first_pos, std::span<const std::uint64_t> F, std::vector<std::uint64_t>& w) const;
  std::span<const std::uint64_t> fold_coefs() const { return coef_; }
  // Every word of every row (stale rows included): two runs that wrote the same KV agree.
  std::uint64_t content_digest() const;
  // Full payload: adds the fold of slots [0, n) of `page`, read as page-table entry `index`, into
  // out [l * heads + h] — a partial page's written tokens (its other slots may hold a previous
  // owner's KV or poison).
  void fold_slots(std::uint32_t page, std::size_t n, std::size_t index, std::span<std::uint64_t> out) const;
  // Prepares freshly allocated pages for new content (digest mode accumulates).
  void reset(std::span<const PageId> pages);
  // Fills freed pages with a poison pattern (digest always; full with debug checks on).
  // `always`: full pages too (a pool whose stale reads must show in every run: the SWA pool).
  void poison(std::span<const PageId> pages, bool always = false);
  static constexpr std::uint64_t kPoison = 0x5fa1ed5fa1ed5fa1ULL;
  // Zeroes the listed pages' rows in either payload mode (KV nobody wrote).
  void clear(std::span<const PageId> pages);
  // Flips one random bit of the page's storage (failpoint device.page.corrupt).
  void corrupt(PageId page, Rng& rng);

  // One (page, local layer) block: contiguous words, the unit the transfer engine copies
  // (full: heads × page_size × dims words; digest: heads words). Layer-first pools only.
  std::uint64_t* layer_block(PageId page, std::size_t layer);
  const std::uint64_t* layer_block(PageId page, std::size_t layer) const;
  std::size_t layer_block_bytes() const;
  // A page's row: all its words (layer-first: [layer][head][slot][dim]; page_unified: its objects).
  // `owned`: the page must be this rank's (CP sharding); otherwise any id maps to a row of this
  // rank, as the copies' translation does.
  std::uint64_t* row_data(PageId page, bool owned = false);
  const std::uint64_t* row_data(PageId page, bool owned = false) const;
  std::size_t row_words() const { return layout_.layers * layer_block_bytes() / sizeof(std::uint64_t); }
  // page_unified pools: the rows hold objects, not layer blocks; the model's reads and writes
  // (write, fold_*, layer_block) refuse them, copies go through layer_runs.
  bool page_unified() const { return !cfg_.object_chunks.empty(); }
  // Where local layer `layer`'s block lies in a row, as runs (kernels/relayout.hpp; layer-first:
  // one run at layer × block words).
  std::span<const kernels::LayerRun> layer_runs(std::size_t layer) const;
  // page_unified pools: the first word of chunk `c`'s object in a row (`c` one of object_chunks).
  std::size_t object_offset(const kernels::ChunkSpan& c) const;
  // Same geometry and payload (so that pages can be copied between the two pools).
  bool compatible(const KvPool& other) const;
  // Same (page, layer) block shape, payload and placement: layers of one may be copied into
  // layers of the other (a packed host pool holds the draft's layers after the target's).
  bool block_compatible(const KvPool& other) const;

  // Unified storage objects (cache/unified_kv.hpp, kernels/relayout.hpp): the listed pages' chunks
  // packed in object order into `staging` (page after page), or unpacked from it. Owned pages
  // only; `kokkos` = false on a storage worker thread. A page_unified pool holds them in that
  // order already: each of `chunks` must be one of its own, copied from (or to) its offset in the row.
  std::size_t object_words(const kernels::ChunkSpan& c) const;
  void pack(std::span<const PageId> pages, std::span<const kernels::ChunkSpan> chunks, std::uint64_t* staging,
            bool kokkos = true) const;
  void unpack(std::span<const PageId> pages, std::span<const kernels::ChunkSpan> chunks, const std::uint64_t* staging,
              bool kokkos = true);

  const KvPoolConfig& config() const { return cfg_; }
  bool owns(PageId page) const { return cfg_.placement.page_owner(page.value()) == cfg_.shard_rank; }
  bool sharded() const { return cfg_.placement.shards > 1; }
  const CpPlacement& placement() const { return cfg_.placement; }
  std::uint32_t shard_rank() const { return cfg_.shard_rank; }
  Payload payload() const { return cfg_.payload; }
  std::size_t layers() const { return layout_.layers; }
  std::size_t heads() const { return layout_.heads; }
  const std::vector<std::uint32_t>& head_ids() const { return cfg_.heads; }
  std::uint64_t layer_base() const { return cfg_.layer_base; }
  std::size_t bytes() const { return data_.size() * sizeof(std::uint64_t); }

 private:
  KvPoolConfig cfg_;
  kernels::PageLayout layout_;
  PoolWords data_;
  std::vector<std::uint64_t> coef_;  // kv_coeff per [local layer][local head]
  std::vector<std::uint64_t> slot_coef_, dim_coef_;  // P(s), w(d) (the layout points at them)
  // Row of a logical page (sharded: ⌊q/N⌋); `owned` checks that this rank owns it.
  std::uint32_t row(std::uint32_t page, bool owned) const;
  std::span<const std::uint32_t> rows(std::span<const std::uint32_t> pages) const;  // owned pages' rows
  void fill(std::span<const PageId> pages, std::uint64_t word, const char* what);  // owned pages' rows, every word
  void require_layer_first(const char* what) const;
  std::vector<std::vector<kernels::LayerRun>> runs_;  // per local layer (page_unified: layer_runs)
  std::vector<std::size_t> object_offsets_;           // page_unified: each chunk's first word in a row
  mutable std::vector<std::uint32_t> rows_, slots_;
  mutable std::vector<std::uint64_t> F_;
};

// The copies that move `src_pages` of `src` to `dst_pages` of `dst`, one batch per local layer
// (for a layer-wise load: submit with TransferEngine::submit_layers; for a backup, flatten).
// Sharded pools: only the pairs whose destination this rank owns; each reads this rank's row of
// its source page (with debug checks on, a source owned elsewhere is a broken-ownership bug).
std::vector<std::vector<transfer::Copy>> layer_copies(KvPool& dst, std::span<const PageId> dst_pages, const KvPool& src,
                                                      std::span<const PageId> src_pages);
// The same between block-compatible pools: src's layers [0, src.layers()) into dst's layers
// [dst_layer0, dst_layer0 + src.layers()) — or the reverse direction with `src_layer0` (a restore
// from a packed host pool): `layers` layers from each offset.
std::vector<std::vector<transfer::Copy>> layer_copies_at(KvPool& dst, std::span<const PageId> dst_pages,
                                                         std::size_t dst_layer0, const KvPool& src,
                                                         std::span<const PageId> src_pages, std::size_t src_layer0,
                                                         std::size_t layers);
// The (page, layer) blocks of local layer `layer` of `pages`, in order (what a KV transport sends
// or receives into; sharded pools: owned pages only).
std::vector<transfer::Block> layer_blocks(KvPool& pool, std::span<const PageId> pages, std::size_t layer);
// Flattened (one batch for every layer).
std::vector<transfer::Copy> flat(std::vector<std::vector<transfer::Copy>> per_layer);

}  // namespace kvgrid::cache
