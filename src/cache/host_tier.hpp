// The host tier (L2) of one rank's cache: host pages, device→host backups and host→device
// load-backs through the transfer engine, and the ACK queue whose consumption every TP/CP peer
// agrees on (protocol.tp_sync through AckAgreement).
//
// Backups (write_through: every newly inserted node; write_through_selective: once a node's hit
// count reaches the threshold) go top-down along a path, so backed-up nodes keep forming a prefix.
// A node being written is locked (its device pages must stay until the copy is done) and carries
// the write's id; a split copies the id, so when the ACK is consumed every fragment is published
// (set_host) in order, and a failed write publishes nothing and frees its host pages. ACKs are
// consumed only in `writing_check`, FIFO, as many as the agreement says — never by polling alone.
//
// Load-back: the host-only continuation of a match (at least `load_back_threshold` tokens) gets
// device pages (evicting other device pages if needed) and a layer-wise host→device copy; the
// request waits on the per-layer events before reading those pages. A published load-back gives
// the nodes their device pages at once (the request reads them in the step that loaded them); a
// private one (P/D decode, whose request reads them steps later) leaves the nodes host-only and
// the pages the request's own until its restore is confirmed — nobody else can read a copy that
// has not landed or that failed.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "cache/agreement.hpp"
#include "cache/device_pool.hpp"
#include "cache/draft_state.hpp"
#include "cache/kv_pool.hpp"
#include "cache/radix_tree.hpp"
#include "cache/write_acks.hpp"
#include "core/decision_log.hpp"
#include "transfer/transfer_engine.hpp"

namespace kvgrid::cache {

// protocol-free cache policies, parsed once when the tier is built (never compared as strings on
// the hot path).
enum class WritePolicy { WriteThrough, WriteThroughSelective, WriteBack };
WritePolicy parse_write_policy(const std::string& name);  // InternalError for an unknown name

struct HostTierConfig {
  Pages host_pages{0};
  std::string write_policy = "write_through";  // or "write_through_selective", "write_back"
  std::uint64_t write_through_threshold = 2;   // selective: hits before a node is backed up
  Tokens load_back_threshold{16};              // load back only host hits of at least this length
  std::function<bool()> alloc_fault;           // failpoint host.alloc.fail: true = this allocation fails
  std::function<bool()> transfer_fault;        // failpoint transfer.fail: true = this backup's copy fails
  // Failpoint pd.restore.fail (P/D decode): the local layer from which a load-back's copies fail
  // on this rank, or none (unset: load-backs never fail).
  std::function<std::optional<std::size_t>(std::size_t layers)> load_fault;
};

// One copy or ACK for the run's timeline (kvgrid timeline): simulated times, 0 with real copies.
struct TransferRecord {
  const char* kind;  // "d2h", "h2d", "storage_read", "write_ack"
  std::uint64_t id = 0, start_ns = 0, end_ns = 0, bytes = 0;
};

struct HostTierStats {
  std::uint64_t d2h_pages = 0, h2d_pages = 0, writes = 0, writes_failed = 0, host_evicted = 0;
  std::uint64_t d2h_bytes = 0, h2d_bytes = 0, d2h_ns = 0, h2d_ns = 0;  // ns: modelled copy time (simulated)
};

class HostTier {
 public:
  // Streams of the transfer engine used here.
  static constexpr transfer::StreamId kWriteStream = 0, kLoadStream = 1;

  HostTier(HostTierConfig cfg, RadixTree& tree, KvPool& device_kv, KvPool& host_kv, transfer::TransferEngine& engine,
           AckAgreement& agreement, DecisionLog& log);

  // After an insert: back up, top-down, the nodes of the path ending at `node` that are neither
  // backed up nor being written (as the write policy allows and host pages last).
  void backup_path(TreeNode* node);
  // A match reached `node` (its path's hit counts were bumped): under write_through_selective,
  // back up what reached the threshold.
  void on_hit(TreeNode* node) {
    if (policy_ == WritePolicy::WriteThroughSelective) backup_path(node);
  }
  // write_back: a device eviction victim that is not backed up is backed up now, with its
  // unbacked ancestors (top-down, synchronously), so that it survives as a host-only node. Across
  // pipeline stages (cross-stage ACKs) the backup is started instead, like a write-through's, and
  // the victim stays on the device until its publication is agreed over every stage.
  void write_back(TreeNode* victim);
  bool writes_back() const { return policy_ == WritePolicy::WriteBack; }
  // The write ACK queue (write_acks.hpp): its agreed consumption publishes the backups.
  // writing_check = consume_writes(agreed_ready_writes()), once per scheduler round on every rank
  // of the stage, queue empty or not.
  WriteAcks& acks() { return acks_; }
  void writing_check() { acks_.check(); }
  std::size_t agreed_ready_writes() { return acks_.agreed_ready(); }
  void consume_writes(std::size_t n) { acks_.consume(n); }

  // Loads the host-only continuation of `m` (whose last_node the caller has locked): device pages
  // come from `alloc_device(pages)` (which may evict). Extends m (matched, device_pages, last_node
  // — the lock moves along) and returns the per-layer events to wait on before reading.
  // CP sharding: `alloc_device(pages, first_owner)` is asked for pages owned, cyclically from
  // first_owner, by the ranks that own the node's host pages (its rotation base).
  // Private (`hold` non-null): the nodes stay host-only and m.last_node stays; m.matched and
  // m.device_pages still grow by what was loaded, and `*hold` is the last loaded node, locked
  // (its path cannot leave the host tier) — the caller unlocks it. A private load-back stops at a
  // node another private restore holds (`ext.restoring`): no second copy of the same pages.
  std::vector<transfer::Event> load_back(
      MatchResult& m, const std::function<std::optional<std::vector<PageId>>(Pages, std::uint32_t)>& alloc_device,
      TreeNode** hold = nullptr);

  // Host pages for someone else (a storage prefetch): evicts host-only leaves if needed; the
  // outcome is agreed like a backup's allocation. Every rank of the stage calls it at the same point.
  // Sharded: the k-th page is owned by (first_owner + k) mod N (a backup keeps the device page's owner).
  std::optional<std::vector<PageId>> alloc_host(Pages n, std::uint32_t first_owner = 0);
  // The same without the stage's agreement (across stages the outcome is agreed later). An
  // injected failure (host.alloc.fail) keeps the pages and sets `*faulted`: the pool stays exactly
  // as on the ranks where it did not fire, and the agreement turns the failure into everyone's.
  std::optional<std::vector<PageId>> alloc_host_local(Pages n, bool* faulted, std::uint32_t first_owner = 0);

  // Across pipeline stages (PP > 1): a backup whose host allocation failed on this rank still
  // takes its place in the ACK queue (a placeholder), so every rank's queue holds the same writes;
  // consumed ACKs are published at the end of the step with their success agreed over every
  // stage (MIN), so a copy or allocation that failed on one stage fails on all.
  void set_cross_stage(CrossStageAgreement* cross) { acks_.set_cross_stage(cross); }
  void end_of_step() { acks_.end_of_step(); }
  void finish_cross_stage() { acks_.finish_cross_stage(); }
  void free_host(std::span<const PageId> pages) { pool_.free(pages); }
  // Speculative decoding: the draft's pages move with the target's (draft_state.hpp).
  void set_draft(DraftState* d) { draft_ = d; }
  // Called for each node whose backup was published (the storage tier writes it through).
  void on_published(std::function<void(TreeNode*)> f) { on_published_ = std::move(f); }

  const HostTierStats& stats() const { return stats_; }
  // Copies submitted and ACKs consumed since the last call (for the trace's timeline events).
  std::vector<TransferRecord> take_transfers() {
    std::vector<TransferRecord> out;
    out.swap(transfers_);
    return out;
  }
  const DevicePool& pool() const { return pool_; }
  std::size_t pending_writes() const { return acks_.pending(); }
  // Modelled completion time of the oldest pending write (simulated engine; 0 when none or unknown).
  std::uint64_t oldest_write_ns() const { return acks_.oldest_ns(); }
  // Host pages of unpublished writes (in the pool but not yet in the tree).
  Pages pending_pages() const { return pending_pages_; }

 private:
  // A backup in flight (its event and outcome are in acks_, in the same order).
  struct WriteAck {
    std::uint64_t id;
    TreeNode* node;
    std::vector<PageId> host_pages;
  };
  void publish(const WriteAck& w, bool placeholder, bool ok);
  void start_backups(TreeNode* node);  // backup_path whatever the policy
  // Queues a backup of `n` into `host_pages` (a placeholder: nothing copied) and locks the node.
  void enqueue(TreeNode* n, std::vector<PageId> host_pages, transfer::Event event, bool placeholder);
  // The backup of device pages into host pages: the target's copies, then the draft's (one event).
  transfer::Event submit_backup(std::span<const PageId> host_pages, std::span<const PageId> device_pages);

  HostTierConfig cfg_;
  WritePolicy policy_;
  RadixTree& tree_;
  KvPool& device_kv_;
  KvPool& host_kv_;
  transfer::TransferEngine& engine_;
  AckAgreement& agreement_;
  DecisionLog& log_;
  DevicePool pool_;  // host page allocator
  std::deque<WriteAck> writes_;
  WriteAcks acks_;
  std::uint64_t next_write_ = 1;
  Pages pending_pages_{0};
  HostTierStats stats_;
  std::function<void(TreeNode*)> on_published_;
  std::vector<TransferRecord> transfers_;
  std::uint64_t next_load_ = 1;
  DraftState* draft_ = nullptr;
};

}  // namespace kvgrid::cache
