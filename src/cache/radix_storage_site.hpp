// The storage site of full-attention models (storage_site.hpp): the radix tree and its host tier.
// Objects: one per page (all local layers of one host page) under its storage key (page hash
// chain + shard suffix); with a sidecar draft, the draft's object beside it (key +
// DraftState::kObjectSuffix), written first, read first, and required by a hit (the MIN of the
// target's and the draft's leading hits), so an ACK never reports a page whose draft is missing.
// With KV replicated over TP (MLA) only TP rank 0 writes; the others read its objects.
// With CP sharding each page is written, looked up and read by its owner only.
// Unified keys (cfg.unified, unified_kv.hpp): a page is one object per chunk of this rank (layer
// range × head group), packed from the host page in object order by the relayout kernel and
// unpacked on read; a page counts as stored when every one of its chunks' objects exists. With
// page_unified host pages (cache.host_layout) the host row is those objects already: a backup
// copies the row into the write batch as it is (the storage writer's threads write it later, so
// the batch cannot point into a page that may be freed meanwhile) and a read lands each object
// in place in its row, at its offset.
// Prefetched pages hang below the deepest backed-up node of the hit; device pages past it that
// have no host copy are read again and become that copy. Every intact leading page is usable.
#pragma once

#include "cache/draft_state.hpp"
#include "cache/host_tier.hpp"
#include "cache/kv_pool.hpp"
#include "cache/page_hash.hpp"
#include "cache/unified_kv.hpp"
#include "cache/radix_tree.hpp"
#include "cache/storage_site.hpp"

namespace kvgrid::cache {

class RadixStorageSite final : public StorageSite {
 public:
  RadixStorageSite(const StorageContext& ctx, RadixTree& tree, HostTier& host, KvPool& host_kv);

  // Write-through of a node whose host backup was just published (called by the host tier).
  void backup(TreeNode* node);
  void set_draft(DraftState* d);
  // Serialized page (all local layers of one host page), the object payload.
  std::vector<std::uint8_t> page_bytes(PageId page) const;

  Tokens page_size() const override { return tree_.page_size(); }
  std::unique_ptr<Job> plan(std::span<const TokenId> prompt) override;
  void pin(Job& job) override;
  void unpin(Job& job) override;
  bool allocate(Job& job, std::size_t hit, CrossStageAgreement* cross) override;
  std::size_t read(Job& job, std::size_t first, std::size_t count, std::optional<std::size_t> fail_at) override;
  std::size_t bytes(const Job&, std::size_t, std::size_t count) const override { return count * page_object_bytes(); }
  std::size_t accept(const Job&, std::size_t intact) const override { return intact; }
  std::size_t land(Job& job, std::size_t keep) override;
  std::vector<std::string> objects(const Job& job, std::size_t item) const override;
  std::size_t objects_per_item() const override;

 private:
  struct RadixJob : Job {
    TreeNode* anchor = nullptr;  // pinned: the hit's deepest backed-up node
    std::vector<PageId> pages;   // host pages, one per item
    std::vector<PageDigest> digests;  // page hash of each item (unified keys: its chunks' objects)
  };
  std::size_t page_object_bytes() const;  // bytes read or written per page (with its draft object)
  std::vector<PageDigest> digests_for(std::span<const TokenId> tokens, std::size_t from_page) const;
  std::vector<std::string> keys_for(std::span<const PageDigest> digests) const;  // each page's primary object
  bool unified() const;
  std::vector<std::string> chunk_keys(const PageDigest& d) const;  // unified: every object of a page

  StorageContext ctx_;
  RadixTree& tree_;
  HostTier& host_;
  KvPool& host_kv_;
  DraftState* draft_ = nullptr;  // sidecar drafts only
  // Unified keys: a page's objects in parts, each packed from one pool — the draft's (if any:
  // written and read first, so a page whose target objects exist has its draft's), then the target's.
  struct UnifiedPart {
    KvPool* pool = nullptr;
    std::vector<UnifiedChunk> chunks;
    std::vector<kernels::ChunkSpan> spans;  // each chunk's layers (in `pool`) and heads
    std::vector<std::size_t> offsets;       // each chunk's first word in the part's packed page
  };
  UnifiedPart make_part(KvPool& pool, const std::vector<UnifiedChunk>& chunks, std::size_t layer0) const;
  std::vector<UnifiedPart> parts_;
};

}  // namespace kvgrid::cache
