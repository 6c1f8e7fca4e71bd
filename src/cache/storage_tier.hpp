// The storage tier (L3) of one rank's cache: write-through of backed-up host copies to the file
// backend, and prefetch of a request's prompt beyond its device/host hit into host slots.
// What is written, read and landed depends on the model: a StorageSite (storage_site.hpp) does
// it — RadixStorageSite for full-attention models (one object per page), HybridStorageSite for
// hybrid models (objects per component); this file is the protocol both share.
//
// Write: when a device→host backup is published, the site writes the node's objects under their
// storage keys (page hash chain + shard suffix).
//
// Prefetch, for a request that has just arrived (every rank of the stage, same point):
//   1. peek at the tree (the site's plan): the prefetch starts after the deepest backed-up node
//      of the hit (the hit's device pages beyond it, if any, are read again and become their host
//      copy);
//   2. hit query: this rank's storage hit from there (the site's); MIN over the stage
//      (agree_min); nothing happens when it adds fewer than `prefetch_threshold` tokens to the hit;
//   3. host slots for the agreed hit (agreed allocation), the anchor pinned;
//   4. reads in batches of `batch_pages` pages; each batch is one ACK carrying how many of its
//      leading pages were read intact — also after a failure (then fewer, or zero); the site
//      says how many leading intact pages may be used (hybrid: all or nothing);
//   5. when the scheduler reaches the request (`try_finish`), the stop policy says whether every
//      rank may stop now — best_effort: always; wait_complete: all ACKs seen; timeout: all seen
//      or the deadline passed (base + per-1024-token time, capped, on the modelled clock) —
//      agreed as a MIN; then the completed length (leading intact pages of the leading seen
//      ACKs) is agreed as a MIN, those pages become host-only nodes, the rest are released.
// A failed, short or corrupt read is a miss: the page and everything after it are not used and
// get recomputed. Time: `simulated` — reads are done at submission (into private host pages) and
// each batch's ACK appears at its modelled completion time (latency + bytes / bandwidth × seeded
// jitter + injected delay); `threaded` — each batch is read by a worker thread, its ACK appears
// when the thread is done. Fault decisions are drawn on the rank's loop, so both are seeded.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cache/agreement.hpp"
#include "cache/object_store.hpp"
#include "cache/host_tier.hpp"
#include "cache/kv_pool.hpp"
#include "cache/radix_tree.hpp"
#include "cache/storage_site.hpp"
#include "cache/storage_writer.hpp"
#include "cache/unified_kv.hpp"
#include "core/decision_log.hpp"
#include "core/rng.hpp"

namespace kvgrid::cache {

// A storage fault drawn for one read batch or one object write (failpoints, decided on the loop).
struct StorageFaults {
  // Read batch: index (within the batch) of the first page whose read fails / whose object is
  // truncated / whose object is corrupted; nullopt: none. Extra completion delay in ns.
  std::function<std::optional<std::size_t>(const char* failpoint, std::size_t batch_pages)> page_fault;
  std::function<std::uint64_t()> read_delay_ns;  // storage.read.slow
  std::function<bool()> write_fail;              // storage.write.fail
};

struct StorageTierConfig {
  std::string backend = "file";    // cache.storage: file | redis
  std::string dir;                 // file: this shard's object directory
  std::string file_layout = "object";  // file: object | segment (cache.storage_file_layout)
  bool fsync = false;              // file: cache.storage_fsync (ObjectStore::set_fsync)
  std::string url;                 // redis: cache.storage_url
  std::uint64_t capacity_bytes = 1ULL << 30;
  std::string key_suffix;          // page_hash.hpp key_suffix()
  // cache.storage_key_scheme = unified: this rank's objects of a page (unified_kv.hpp); empty:
  // rank_suffix keys. Unified objects are shared: no rank evicts them for its own LRU.
  std::vector<UnifiedChunk> unified;
  std::vector<UnifiedChunk> unified_draft;  // a draft model's objects (its own namespace), on the last stage
  // Hybrid models: `unified` holds FULL's objects; SWA window pages and MAMBA states have their own
  // namespaces (chunks over this stage's layers of that kind only; none where it has no such layer).
  std::vector<UnifiedChunk> unified_swa, unified_mamba;
  // A hybrid target's draft (speculative decoding, the last stage): its SWA and MAMBA layers'
  // objects (its FULL layers': unified_draft), each kind in a namespace of its own.
  std::vector<UnifiedChunk> unified_draft_swa, unified_draft_mamba;
  // A hybrid model's sidecars held here (by the tree's sidecar index): one object per source slot,
  // the sidecar's words whole, in a namespace of its own; written by `unified_sidecar_writer` alone
  // (every TP rank of the stage keeps the sidecar whole: the first writes it, the others rely on
  // its lookups, as MLA's replicas do).
  std::vector<UnifiedChunk> unified_sidecars;
  bool unified_sidecar_writer = true;
  bool unified_keys() const { return !unified.empty() || !unified_swa.empty() || !unified_mamba.empty(); }
  bool shared = false;      // other jobs write the store while this one runs (ObjectStore::set_shared)
  std::uint64_t job = 0;    // this job's id in the objects' headers
  bool writer = true;              // false: MLA rank other than TP 0 (reads the writer's objects)
  Tokens prefetch_threshold{64};
  std::string stop_policy = "best_effort";  // best_effort | wait_complete | timeout
  std::uint64_t timeout_base_ns = 5'000'000, timeout_per_1k_ns = 2'000'000, timeout_max_ns = 50'000'000;
  std::size_t batch_pages = 128;
  double bytes_per_ns = 5.0;       // simulated read bandwidth (5 GB/s: NVMe)
  std::uint64_t latency_ns = 100'000;  // simulated per-batch latency
  double jitter = 0.25;
  std::uint64_t seed = 1;
  bool threaded = false;
  std::size_t write_threads = 2;   // threaded: backups' writes run on these (storage_writer.hpp)
  std::function<std::uint64_t()> now;  // the rank's modelled clock
  std::function<void(std::uint64_t)> advance_to;  // waiting for a simulated read moves it on
  StorageFaults faults;
};


struct StorageTierStats {
  std::uint64_t prefetches = 0, prefetch_pages = 0, used_pages = 0, read_pages = 0, failed_pages = 0;
  std::uint64_t written_pages = 0, write_failed = 0, aborted = 0, reread_device = 0;
  std::uint64_t read_ns = 0;  // modelled read time (simulated), summed over batches
  std::uint64_t read_bytes = 0, written_bytes = 0;
  std::uint64_t swept = 0, swept_bytes = 0;  // objects this rank's sweeps removed from a unified store
  std::uint64_t objects_written = 0;  // target objects (unified: one per chunk; objects read: the store's hits)
};

class RadixStorageSite;

class StorageTier {
 public:
  using SiteFactory = std::function<std::unique_ptr<StorageSite>(const StorageContext&)>;
  // A full-attention model's storage tier (RadixStorageSite over `tree` and `host`).
  StorageTier(StorageTierConfig cfg, RadixTree& tree, HostTier& host, KvPool& host_kv, AckAgreement& agreement,
              DecisionLog& log);
  // Any site: `make` builds it with this tier's context.
  StorageTier(StorageTierConfig cfg, AckAgreement& agreement, DecisionLog& log, const SiteFactory& make);
  ~StorageTier();

  // A request arrived: maybe start prefetching (collective over the stage).
  void start_prefetch(RequestId id, std::span<const TokenId> prompt);
  bool prefetching(RequestId id) const {
    if (active_.count(id.value())) return true;
    for (const auto& q : queries_)
      if (q.id == id.value()) return true;
    return false;
  }
  // The scheduler wants to admit `id`: true when it may (no prefetch, or the prefetch ended now
  // and its pages are in the tree). Collective when a prefetch is active.
  bool try_finish(RequestId id);
  // The request went away: wait for its reads, release everything it held.
  void abort(RequestId id);

  // Across pipeline stages (PP > 1). With an agreement set, a query is decided at the end of its
  // arrival step with every stage's hit; PP0 decides at its admission point whether a prefetch
  // stops and after how many ACKs (`take_decisions` → the step message); a later stage, given
  // those (`set_decisions`), follows them at the same point even when it has seen newer ACKs
  // already; the prefetches that stop end at the end of the step, with the MIN of the completed
  // pages over every rank. `end_of_step` is collective across stages, called after the step's
  // message went out.
  void set_cross_stage(CrossStageAgreement* cross) { cross_ = cross; }
  void set_decisions(std::vector<std::pair<std::uint64_t, std::uint64_t>> d) { decisions_in_ = std::move(d); }
  std::vector<std::pair<std::uint64_t, std::uint64_t>> take_decisions();
  void end_of_step();
  // Tokens of `id`'s prompt that its finished prefetch added, as [begin, end); {0,0} when none.
  std::pair<Tokens, Tokens> prefetched_range(RequestId id) const;
  void forget(RequestId id) { finished_.erase(id.value()); }

  // Modelled time of the earliest unseen ACK (simulated; 0 when none).
  std::uint64_t next_ack_ns() const;
  Pages held_pages() const { return held_; }
  const StorageTierStats& stats() const { return stats_; }
  std::vector<TransferRecord> take_transfers() {
    std::vector<TransferRecord> out;
    out.swap(transfers_);
    for (const WriteRecord& w : writer_->take_records()) out.push_back({"storage_write", 0, w.start_ns, w.end_ns, w.bytes});
    return out;
  }
  // Unified keys: the store-level eviction (file_storage.hpp sweep_directory) of this tier's
  // directory down to its capacity. One rank of a job calls it (runtime: world rank 0, at the
  // end of the run, and at every check when the store is shared).
  SweepResult sweep_store();
  // Backups' writes (storage_writer.hpp): lands every one, due or not (end of run); `settle` lands
  // what is due, before anyone looks at the store.
  void flush_writes() { writer_->drain(); }
  void settle_writes() { writer_->settle(); }
  std::size_t writes_in_flight() const { return writer_->in_flight(); }
  ObjectStore& storage() { return *store_; }
  const ObjectStore& storage() const { return *store_; }
  StorageSite& site() { return *site_; }
  const StorageSite& site() const { return *site_; }
  // Speculative decoding, sidecar drafts (full-attention models): every page also has a draft
  // object, written with it and required by a hit (radix_storage_site.hpp).
  void set_draft(DraftState* d);

 private:
  struct Batch {
    std::size_t first = 0, count = 0;
    std::uint64_t done_ns = 0;      // simulated
    std::size_t ok = 0;             // leading items read intact (simulated)
    std::shared_future<std::size_t> result;  // threaded
    mutable bool chosen_seen = false;        // under a choice source: reported seen (answers stay so)
    bool seen() const;
    std::size_t intact() const;
  };
  struct Prefetch {
    std::unique_ptr<StorageSite::Job> job;  // pinned, with host slots for every item
    std::vector<Batch> batches;
    std::uint64_t deadline_ns = 0;
  };
  struct Query {
    std::uint64_t id;
    std::vector<TokenId> prompt;
  };
  // Starts the prefetch of `job` for an agreed `hit` (pages): takes the job when it starts.
  void launch(RequestId id, std::unique_ptr<StorageSite::Job>& job, std::size_t hit);
  // The object a storage.read.short / storage.object.corrupt fault damages in `item`.
  std::optional<std::string> damage_target(const StorageSite::Job& job, std::size_t item);
  std::pair<std::size_t, bool> local_progress(const Prefetch& pf) const;  // (ACKs seen, may stop)
  std::size_t done_pages(Prefetch& pf, std::size_t acks);
  void finish(RequestId id, std::size_t agreed);
  bool try_finish_across(RequestId id);
  void release(Prefetch& p, std::size_t keep);

  StorageTierConfig cfg_;
  enum class StopPolicy { BestEffort, WaitComplete, Timeout } stop_;  // cfg_.stop_policy, parsed once
  AckAgreement& agreement_;
  DecisionLog& log_;
  std::unique_ptr<ObjectStore> store_;
  std::size_t damaged_ = 0;  // damage faults so far (which object of an item the next one hits)
  StorageTierStats stats_;
  std::unique_ptr<StorageWriter> writer_;  // before ctx_ (which names it), after store_ and stats_
  StorageContext ctx_;
  std::unique_ptr<StorageSite> site_;
  RadixStorageSite* radix_ = nullptr;  // site_, when it is one
  Rng jitter_;
  std::map<std::uint64_t, Prefetch> active_;  // by request id
  std::map<std::uint64_t, std::pair<Tokens, Tokens>> finished_;
  Pages held_{0};
  CrossStageAgreement* cross_ = nullptr;
  std::vector<TransferRecord> transfers_;
  std::vector<Query> queries_;                                   // arrivals of this step (across stages)
  std::map<std::uint64_t, std::uint64_t> stopping_;               // request -> ACKs consumed, stopping now
  std::vector<std::pair<std::uint64_t, std::uint64_t>> decisions_in_, decisions_out_;
  std::uint64_t next_free_ns_ = 0;  // simulated: the storage queue's tail (batches are read in order)
};

}  // namespace kvgrid::cache
