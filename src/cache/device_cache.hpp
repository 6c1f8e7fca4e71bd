// The device tier of one rank's prefix cache: radix tree + device page pool, and the decisions
// that tie them (what SGLang's scheduler does around `match_prefix` / `cache_unfinished_req`).
//
// `admit` (the tree loop) takes one request's prompt through: match_prefix → lock the hit → evict
// to make room → allocate the missing pages (all or nothing) → insert the page-aligned prompt →
// free duplicate pages → move the lock to the inserted leaf; it is `reserve` + `insert_computed`. Every decision is recorded in the rank's decision
// log, so ranks that must agree can be compared (`kvgrid check`, the consensus checker).
// Ownership: an admitted request holds one lock (on `Admission::node`) until `release`.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "cache/device_pool.hpp"
#include "cache/host_tier.hpp"
#include "cache/hybrid_cache.hpp"
#include "cache/radix_tree.hpp"
#include "cache/restore_placement.hpp"
#include "cache/storage_tier.hpp"
#include "core/decision_log.hpp"

namespace kvgrid::cache {

struct DeviceCacheConfig {
  Tokens page_size{16};
  Pages device_pages{1024};  // per rank
  // CP page ownership (> 1: logical page ids, pages owned by q mod shards; cp_placement.hpp).
  std::uint32_t shards = 1;
  // Hybrid models: the unified tree core with SWA and MAMBA components (hybrid_cache.hpp) serves
  // every call instead of RadixTree (device tier only).
  std::optional<HybridCacheConfig> hybrid = std::nullopt;
};

struct Admission {
  bool admitted = false;
  Tokens prompt{0};
  Tokens matched{0};        // reused from the cache
  Pages new_pages{0};       // allocated for the uncached part
  Pages evicted{0};         // pages evicted to make room
  TreeNode* node = nullptr;  // locked while the request holds its prefix (null: nothing locked)
};

// Pages held by a running request of the serving loop: the matched prefix (tree pages, locked)
// followed by private pages for everything it will compute.
struct Reservation {
  Tokens matched{0};
  Tokens kv_tokens{0};              // positions the request will hold KV for
  std::vector<PageId> pages;        // page table: ceil(kv_tokens / page_size) pages
  Pages fresh{0};                   // pages allocated for it (the rest came from the tree)
  Pages evicted{0};
  Tokens shared{0};                 // positions [0, shared) are in the tree (matched or inserted)
  Pages private_pages{0};           // pages still held privately
  TreeNode* node = nullptr;         // locked (moves down as chunks are inserted) until commit
  Tokens host_loaded{0};            // of `matched`, the part loaded back from the host tier
  Tokens storage_loaded{0};         // of `host_loaded`, the part its storage prefetch brought in
  std::vector<transfer::Event> load_events;  // wait on these before reading the matched pages
  // Private restores (P/D decode): the host-only node ending the restored range, locked until
  // `confirm_restore` (null: nothing pending). Until then [shared, matched) are private pages.
  TreeNode* restore_hold = nullptr;
  // Hybrid models: its SWA pages, MAMBA slots and lock on the unified tree (the tree's lock then
  // stands for `node`, which stays null).
  std::unique_ptr<HybridHold> hybrid;
  // A private restore whose outcome is not agreed yet (full attention: restore_hold; hybrid:
  // HybridHold::restoring).
  bool restore_pending() const { return restore_hold != nullptr || (hybrid && hybrid->restoring); }
};

class DeviceCache {
 public:
  DeviceCache(const DeviceCacheConfig& cfg, DecisionLog& log);

  Admission admit(RequestId id, std::span<const TokenId> prompt);
  void release(const Admission& a);

  // Serving loop: match the prompt, lock the hit and allocate pages for the rest of `kv_tokens`
  // positions (evicting if needed). Nothing when the pages cannot be found. `max_match` (a page
  // multiple) caps the reused prefix (CP sharding: what one gather slot can hold).
  std::optional<Reservation> reserve(RequestId id, std::span<const TokenId> prompt, Tokens kv_tokens,
                                     Tokens max_match = Tokens(INT64_MAX));
  // Chunked prefill: make the computed page-aligned prefix shareable (SGLang's
  // cache_unfinished_req). Pages another request inserted meanwhile replace ours in the page
  // table (ours are freed); the lock moves to the new end of the prefix.
  void insert_computed(RequestId id, Reservation& r, std::span<const TokenId> computed_tokens);
  // The request finished: insert its page-aligned KV, free the partial tail page, unlock.
  // `session`: the finished request's session and the generation it arrived with (hybrid models
  // with sessions tracked register its reusable regions; otherwise ignored).
  void commit(RequestId id, Reservation& r, std::span<const TokenId> kv_tokens, SessionTag session = {});
  // Sessions (hybrid models; cache/unified_tree.hpp "Sessions"): an open or close the step's
  // inputs carry, and the generation a request of `session` arriving now carries (0: none).
  void session_event(bool open, std::uint64_t session) {
    if (hybrid_) hybrid_->session_event(open, session);
  }
  std::uint64_t session_arrival(RequestId id, std::uint64_t session) {
    return hybrid_ ? hybrid_->session_arrival(id, session) : 0;
  }
  // Private restores (P/D decode: the request reads its restored pages only steps later, once its
  // KV arrived): reserve() leaves the restored nodes host-only and their new device pages the
  // request's; `confirm_restore` publishes them after the restore's outcome was agreed (every rank
  // of the group calls it at the same point, with the agreed outcome). A failed restore is never
  // published: the caller aborts the request, which frees the pages.
  void set_private_restores(bool on) {
    private_restores_ = on;
    if (hybrid_) hybrid_->set_private_restores(on);
  }
  // Whether none of r's load-back copies failed on this rank (the private restore's local outcome).
  static bool restore_intact(const Reservation& r);
  // The agreed outcome of r's restore: ok → the restored range enters the tree (pages another
  // request published meanwhile replace ours, as in insert_computed). Waits for the copies.
  void confirm_restore(RequestId id, Reservation& r, std::span<const TokenId> prompt, bool ok);
  // A failed private restore becomes a miss (protocol.load_back): never published, the request
  // keeps its pages and will compute positions [shared, matched) itself; matched shrinks to shared.
  // Returns those pages (the caller prepares them for new content: KvPool::reset).
  std::vector<PageId> drop_restore(RequestId id, Reservation& r, std::span<const TokenId> prompt);
  // The request goes away before it finished (client abort): its storage prefetch stops and
  // releases its host pages, its load-back copies are waited for (the loaded pages stay cached in
  // the tree), its private pages are freed and its lock released. Nothing is inserted.
  void abort(RequestId id, Reservation& r);
  // Same for a request that was never admitted (waiting, maybe prefetching).
  void abort_waiting(RequestId id) {
    if (storage_) {
      storage_->abort(id);
      storage_->forget(id);
    }
  }
  // What reserve() would reuse at most for `prompt` (device + host hit), without touching LRU.
  Tokens peek_hit(std::span<const TokenId> prompt) {
    return hybrid_ ? hybrid_->peek_hit(prompt) : tree_.peek_prefix(prompt).host_matched;
  }
  // Hybrid models, each step: SWA pages for the positions up to `end` the request computes now
  // (false: none to be had, it sits the step out); after the forward of [start, computed), what
  // it left behind. Nothing to do for full-attention models.
  bool prepare(RequestId id, Reservation& r, Tokens end) { return !hybrid_ || hybrid_->prepare(id, r, end); }
  void advance(Reservation& r, Tokens start, Tokens computed, bool decode = false) {
    if (hybrid_) hybrid_->advance(r, start, computed, decode);
  }
  HybridCache* hybrid() { return hybrid_.get(); }
  const HybridCache* hybrid() const { return hybrid_.get(); }
  // CP sharding: where load-backs put restored pages (default: onto their owners).
  void set_restore_placement(const RestorePlacement* p) { restore_ = p; }
  std::uint32_t shards() const { return pool_.shards(); }
  // Copies both tiers submitted and ACKs they consumed since the last call (the trace's timeline).
  std::vector<TransferRecord> take_transfers() {
    std::vector<TransferRecord> out;
    if (host_) out = host_->take_transfers();
    if (hybrid_ && hybrid_->host_tier()) out = hybrid_->host_tier()->take_transfers();
    if (storage_) {
      auto more = storage_->take_transfers();
      out.insert(out.end(), more.begin(), more.end());
    }
    return out;
  }
  // Freed device pages go through `f` (the KV pools poison them; DevicePool::set_on_free).
  void set_on_free(std::function<void(std::span<const PageId>)> f) { pool_.set_on_free(std::move(f)); }
  // Every cached (tree) page, for fault injection.
  std::vector<PageId> cached_pages() const;

  // Adds the host tier: backups after inserts, load-backs in reserve(), host pages in verify().
  void attach_host_tier(HostTierConfig cfg, KvPool& device_kv, KvPool& host_kv, transfer::TransferEngine& engine,
                        AckAgreement& agreement);
  HostTier* host_tier() { return host_.get(); }
  const HostTier* host_tier() const { return host_.get(); }
  // The write ACK queue of whichever host tier is attached (null: none) — the radix tree's, or
  // the hybrid cache's (HybridCache::attach_host_tier).
  WriteAcks* write_acks() {
    if (host_) return &host_->acks();
    return hybrid_ && hybrid_->host_tier() ? &hybrid_->host_tier()->acks() : nullptr;
  }
  const WriteAcks* write_acks() const { return const_cast<DeviceCache*>(this)->write_acks(); }
  // The host tier's statistics and FULL host pages in use (null / -1: no host tier).
  const HostTierStats* host_stats() const {
    if (host_) return &host_->stats();
    return hybrid_ && hybrid_->host_tier() ? &hybrid_->host_tier()->stats() : nullptr;
  }
  std::int64_t host_pages_used() const {
    if (host_) return host_->pool().used_pages().value();
    return hybrid_ && hybrid_->host_tier() ? hybrid_->host_tier()->pool(unified::ComponentId(0)).used() : -1;
  }
  // Adds the storage tier (needs the host tier): write-through of published backups, prefetch.
  // Hybrid models: objects per component (hybrid_storage_site.hpp); `host_kv` is not used.
  void attach_storage_tier(StorageTierConfig cfg, KvPool& host_kv, AckAgreement& agreement);
  StorageTier* storage_tier() { return storage_.get(); }
  const StorageTier* storage_tier() const { return storage_.get(); }
  // Speculative decoding: the draft's pages move with the target's through both tiers (attach
  // the tiers first).
  void set_draft(DraftState* d) {
    if (host_) host_->set_draft(d);
    if (storage_) storage_->set_draft(d);
  }
  // Failpoint device.alloc.fail: `fault()` true makes this rank's allocation fail; the outcome
  // of every admission's allocation is then agreed over the stage (all or nobody admits).
  void set_alloc_fault(std::function<bool()> fault, AckAgreement& agreement) {
    alloc_fault_ = std::move(fault);
    alloc_agreement_ = &agreement;
  }
  // Across pipeline stages (protocol.pp_sync, PP > 1): PP0's stage decides every admission's
  // allocation outcome (recorded in order, `take_admissions`, relayed in the step message); a later
  // stage follows them (`follow_admissions`) instead of its own fault draws — its pool holds the
  // same pages as PP0's, so it can.
  void follow_admissions(std::vector<std::uint8_t> decided) {
    follow_ = std::move(decided);
    follow_at_ = 0;
    following_ = true;
  }
  std::vector<std::uint8_t> take_admissions() {
    std::vector<std::uint8_t> out;
    out.swap(admissions_);
    return out;
  }

  // A request arrived (every rank, same order): the storage tier may start its prefetch.
  void on_arrival(RequestId id, std::span<const TokenId> prompt) {
    if (storage_) storage_->start_prefetch(id, prompt);
  }
  // May `id` be admitted now? (Ends its prefetch when the stop policy agrees; collective then.)
  bool prefetch_ready(RequestId id) { return !storage_ || storage_->try_finish(id); }

  const RadixTree& tree() const { return tree_; }
  RadixTree& tree() { return tree_; }
  const DevicePool& pool() const { return pool_; }
  Pages reserved_pages() const { return hybrid_ ? hybrid_->reserved_pages() : reserved_; }
  // Tree and pool invariants, plus "every allocated page is in the tree or reserved by a running
  // request": tree pages + reserved pages == allocated pages. Throws InternalError. `depth`: the
  // radix tree's (a hybrid tree's verify is always full).
  void verify(VerifyDepth depth = VerifyDepth::Full) const;
  std::uint64_t digest() const { return hybrid_ ? hybrid_->digest() : tree_.digest(); }

 private:
  void debug_verify() const;
  // A private restore ends (confirmed, failed or refused): its nodes' marks and lock go.
  void end_restore(TreeNode* hold, TreeNode* boundary);
  RadixTree tree_;
  DevicePool pool_;
  DecisionLog& log_;
  std::unique_ptr<HybridCache> hybrid_;
  // `n` pages whose owners start at `first_owner` (restore: through the restore placement).
  std::optional<std::vector<PageId>> alloc_evicting(Pages n, std::uint32_t first_owner, Pages* evicted,
                                                    const RestorePlacement* restore = nullptr);
  const RestorePlacement* restore_ = nullptr;
  std::unique_ptr<HostTier> host_;
  std::unique_ptr<StorageTier> storage_;
  std::function<bool()> alloc_fault_;
  AckAgreement* alloc_agreement_ = nullptr;
  // An admission's allocation outcome: PP0's relayed one (following), the stage's agreed one
  // (device.alloc.fail, drawn only where the pages were found), or this rank's.
  bool decide_allocation(RequestId id, bool local_ok);
  std::vector<std::uint8_t> admissions_, follow_;
  std::size_t follow_at_ = 0;
  bool following_ = false;
  bool private_restores_ = false;
  Pages reserved_{0};  // pages held privately by reservations
  Tokens last_match_{0};  // of the latest reserve(), for admit()'s report of a refusal
  Pages last_evicted_{0};
};

}  // namespace kvgrid::cache
