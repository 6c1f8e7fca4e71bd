// The host tier (L2) of a hybrid model: the host copies of every component of the unified tree
// (unified_tree.hpp), the device→host backups and host→device load-backs that move them through
// the transfer engine, and the write ACK queue the stage agrees on (write_acks.hpp: protocol.tp_sync
// and, across stages, protocol.pp_sync — the same queue, agreements and failure semantics as
// the full-attention host tier, host_tier.hpp).
//
// What moves, per component (the tree says which values a node holds; this moves their bytes):
//  * FULL: a node's pages, every layer of this stage, in both directions;
//  * SWA: the node's live SWA pages only — the tree keeps SWA pages only inside windows, so a
//    backup never copies what the window left behind, and a node whose SWA value is a tombstone
//    has no SWA host copy (a host tombstone). A load-back restores only the rounded window before
//    the boundary (the tree's plan_load cuts a host-only node straddling the window's start);
//  * MAMBA: the state at the node's end depth, as one object;
//  * sidecars: their entries follow their source's slots into a host store and back.
// Write policies: write_through (every inserted node), write_through_selective (a node once
// `write_through_threshold` matches reached it) and write_back (nothing on insert: a device
// eviction victim without its host copies is backed up then, synchronously, with its unbacked
// ancestors — `write_back` —, so that it survives as a host-only node; its allocation and the
// copy's outcome agreed over the stage; PP = 1 only: a stage cannot wait for the others in the
// middle of its step).
// A node's backup is one joined event over its components' copies: its ACK completes only when
// every copy landed, and it is published per component (split fragments included) only when it
// succeeded on every rank of the stage. The node is locked (and marked as being written) until
// its ACK is consumed. Host slots come from one pool per component, evicting host copies (the
// tree's host LRU with its cascade) when short; the allocation is agreed over the stage like the
// full-attention tier's (host.alloc.fail included; across stages a placeholder keeps every
// stage's queue and pools the same and fails everywhere).
//
// Load-backs are published at once: the loaded values enter the tree in reserve(); the request
// waits on FULL's per-layer events before reading layer l, and on the SWA/MAMBA copies before its
// first forward (HybridHold::state_events).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <span>
#include <vector>

#include "cache/draft_state.hpp"
#include "cache/host_tier.hpp"
#include "cache/kv_pool.hpp"
#include "cache/state_pool.hpp"
#include "cache/unified_components.hpp"
#include "cache/unified_tree.hpp"
#include "cache/write_acks.hpp"
#include "core/decision_log.hpp"
#include "transfer/transfer_engine.hpp"

namespace kvgrid::cache {

enum class ComponentKind { Full, Swa, Mamba };

struct HybridHostConfig {
  HostTierConfig tier;               // tier.host_pages: FULL host pages; policy, threshold, failpoints
  std::int64_t swa_pages = 0;        // SWA host pages (a model with SWA layers)
  std::int64_t mamba_slots = 0;      // MAMBA host states (a model with MAMBA layers)
  std::size_t local_layers = 0;      // this stage's layers (a load-back's events, one per layer)
};

// The pools holding the bytes; null where this stage has no layer of that kind (the tree still
// keeps the component, so every stage decides the same; only the bytes stay with the layers).
struct HybridBytes {
  KvPool* full_device = nullptr;
  KvPool* full_host = nullptr;
  KvPool* swa_device = nullptr;
  KvPool* swa_host = nullptr;
  StatePool* state_device = nullptr;
  StatePool* state_host = nullptr;
};

// Speculative decoding (the last stage): the draft's bytes at the target's ids — its FULL layers at
// FULL's pages, its SWA layers at SWA's, its states at MAMBA's slots (draft_state.hpp: packed,
// sidecar or target_only; null: the draft has no layer of that kind). They move with the target's
// copies as one more batch of the same joined event: a backup's ACK, a load-back's last FULL layer
// and its SWA/MAMBA events complete only once the draft's copies landed.
struct HybridDraftBytes {
  DraftState* full = nullptr;
  DraftState* swa = nullptr;
  DraftStates* states = nullptr;
};

class HybridHostTier {
 public:
  static constexpr transfer::StreamId kWriteStream = 0, kLoadStream = 1;

  // `kinds`: the tree's components by ComponentId. `sidecars`: the tree's payload sidecars (by
  // the tree's sidecar index), whose entries follow their source into host stores.
  HybridHostTier(HybridHostConfig cfg, unified::UnifiedTree& tree, std::vector<ComponentKind> kinds, HybridBytes bytes,
                 std::vector<unified::PayloadSidecar*> sidecars, transfer::TransferEngine& engine, AckAgreement& agreement,
                 DecisionLog& log);

  // (checks that the host pools hold the target's bytes plus, packed, the draft's — no more)
  void set_draft(HybridDraftBytes d);
  const HybridDraftBytes& draft() const { return draft_; }

  // After an insert: back up, top-down, the nodes of the path ending at `node` that hold a device
  // value without its host copy and no write in flight (as host slots last).
  void backup_path(unified::Node* node);
  // A match's device boundary reached `node` (its path's hit counts were bumped): under
  // write_through_selective, back up what reached the threshold.
  void on_hit(unified::Node* node) {
    if (policy_ == WritePolicy::WriteThroughSelective) backup_path(node);
  }
  bool writes_back() const { return policy_ == WritePolicy::WriteBack; }
  // write_back: backs up `victim` (a device eviction victim) and its ancestors that lack host
  // copies, top-down, synchronously; stops at the first whose allocation or copy failed anywhere
  // in the stage (it and what is below are dropped with their device values). Across pipeline
  // stages the backup is started instead, like a write-through's, and the victim stays on the
  // device until its publication is agreed over every stage.
  void write_back(unified::Node* victim);
  // (backup_path whatever the write policy)
  void start_backups(unified::Node* node);
  WriteAcks& acks() { return acks_; }
  const WriteAcks& acks() const { return acks_; }
  Tokens load_back_threshold() const { return cfg_.tier.load_back_threshold; }

  // Submits the copy of a load-back item into `device` (the item's new device slots): FULL one
  // batch per local layer, added to `layer_events` at index l of each group of local_layers
  // entries (FULL layer l at l; the other entries complete at once); SWA and MAMBA copies as one
  // event in `state_events`. Sidecar entries of the source are written at once (host copies are
  // final once published).
  void load(const unified::LoadItem& item, std::span<const unified::Slot> device, std::vector<transfer::Event>& layer_events,
            std::vector<transfer::Event>& state_events);

  // Host slots per component: free + tree + in flight (writes and prefetches) = capacity (for verify()).
  void host_accounts(unified::VerifyAccounts& acc) const;

  // ---- for the storage tier (hybrid_storage_site.hpp) ----
  // Called with each node (split fragments included) whose backup was just published.
  void on_published(std::function<void(unified::Node*)> f) { on_published_ = std::move(f); }
  // Host slots for `n` of component c, evicting host copies when short (not agreed: the caller
  // agrees); host.alloc.fail is drawn apart (`alloc_fault`), once per agreed allocation.
  std::optional<std::vector<unified::Slot>> alloc_host(unified::ComponentId c, std::int64_t n) { return alloc_local(c, n); }
  bool alloc_fault() { return cfg_.tier.alloc_fault && cfg_.tier.alloc_fault(); }
  void free_host(unified::ComponentId c, std::span<const unified::Slot> s);
  // Host slots a prefetch holds (+) or gave back or to the tree (-), for the accounts.
  void hold(unified::ComponentId c, std::int64_t n) { in_flight_[c.value()] += n; }
  const HybridBytes& bytes() const { return bytes_; }
  const std::vector<ComponentKind>& kinds() const { return kinds_; }
  // The host store of the tree's i-th sidecar (indexed by its source's host slots).
  std::size_t sidecars() const { return sidecars_.size(); }
  unified::PayloadSidecar& host_sidecar(std::size_t i) { return *sidecars_[i].host; }
  const unified::SlotPool& pool(unified::ComponentId c) const { return pools_[c.value()]; }
  const HostTierStats& stats() const { return stats_; }
  std::vector<TransferRecord> take_transfers() {
    std::vector<TransferRecord> out;
    out.swap(transfers_);
    return out;
  }

 private:
  struct Write {
    std::uint64_t id;
    unified::Node* node;
    unified::LockHandle lock;
    std::vector<std::vector<unified::Slot>> host;  // by ComponentId (empty: not copied)
  };
  struct HostSidecar {
    unified::PayloadSidecar* device;
    std::unique_ptr<unified::PayloadSidecar> host;  // indexed by the source's host slots
  };
  // Host slots for `n` of component c, evicting host copies when short (nothing agreed here).
  std::optional<std::vector<unified::Slot>> alloc_local(unified::ComponentId c, std::int64_t n);
  void release_evicted(const unified::EvictResult& e);
  transfer::Event submit_backup(const unified::Node& n, const std::vector<std::vector<unified::Slot>>& host);
  void append_draft_backup(ComponentKind k, std::span<const unified::Slot> host, std::span<const unified::Slot> device,
                           std::vector<transfer::Copy>& out);
  void publish(Write& w, bool placeholder, bool ok);

  HybridHostConfig cfg_;
  WritePolicy policy_;
  unified::UnifiedTree& tree_;
  std::vector<ComponentKind> kinds_;
  HybridBytes bytes_;
  HybridDraftBytes draft_;
  std::vector<HostSidecar> sidecars_;
  transfer::TransferEngine& engine_;
  AckAgreement& agreement_;
  DecisionLog& log_;
  std::vector<unified::SlotPool> pools_;    // by ComponentId
  std::vector<std::int64_t> in_flight_;     // host slots of unpublished writes and prefetches, by ComponentId
  std::function<void(unified::Node*)> on_published_;
  std::deque<Write> writes_;
  WriteAcks acks_;
  std::uint64_t next_write_ = 1, next_load_ = 1;
  HostTierStats stats_;
  std::vector<TransferRecord> transfers_;
};

}  // namespace kvgrid::cache
