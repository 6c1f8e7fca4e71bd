// What the storage tier (storage_tier.hpp) reads into and lands in: the tree and host pools of one
// kind of model. The storage tier owns the protocol — hit queries agreed as a MIN, batches and
// their ACKs, stop policies, cross-stage decisions, the completed length agreed as a MIN — and
// asks its site for everything that depends on what a node holds:
//  * RadixStorageSite (radix_storage_site.hpp): full-attention models (RadixTree + HostTier), one
//    object per page (and a sidecar draft's object beside it);
//  * HybridStorageSite (hybrid_storage_site.hpp): hybrid models (the unified tree + the hybrid
//    host tier), objects per component — FULL pages, SWA window pages, MAMBA states.
// A prefetch reads "items" in order, one per token page from the job's start; a batch's ACK
// reports how many of its leading items were read intact, and the site says how many leading
// intact items may be used (`accept`: FULL every one; a hybrid job all or nothing).
// Every call but `read` is made on the rank's loop; `read` may run on a storage worker thread
// (threaded engine) and must touch only the job's host slots and the object store.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "cache/agreement.hpp"
#include "cache/object_store.hpp"
#include "cache/storage_writer.hpp"
#include "core/decision_log.hpp"
#include "core/ids.hpp"

namespace kvgrid::cache {

struct StorageTierConfig;
struct StorageTierStats;

// What a site may use of its storage tier (owned by the tier, alive as long as the site).
struct StorageContext {
  const StorageTierConfig& cfg;
  ObjectStore& store;
  StorageTierStats& stats;
  StorageWriter& writer;  // a backup's objects are submitted here, not written on the loop
  AckAgreement& agreement;
  DecisionLog& log;
};

class StorageSite {
 public:
  // One prefetch, from its plan to its landing. The tier fills nothing in; the site's subclass
  // adds what it holds (the anchor it hangs below, host slots).
  struct Job {
    virtual ~Job() = default;
    std::vector<TokenId> tokens;     // the prompt's reusable whole pages (after allocate: up to start + hit)
    std::size_t start = 0;           // pages: where the reads start (below the anchor)
    std::size_t cached = 0;          // pages the tree already has (device or host)
    std::size_t local_hit = 0;       // pages from `start` this rank could read (before the MIN)
    std::vector<std::string> keys;   // the primary object of each item from `start` (failpoint damage)
  };

  virtual ~StorageSite() = default;
  virtual Tokens page_size() const = 0;
  // The prefetch a prompt would start (null: none worth it). `prompt` is the whole prompt.
  virtual std::unique_ptr<Job> plan(std::span<const TokenId> prompt) = 0;
  // Keeps the job's anchor in the tree (nests; every pin is undone by one unpin).
  virtual void pin(Job& job) = 0;
  virtual void unpin(Job& job) = 0;
  // Host slots for the first `hit` items, agreed over the stage, or over every rank serving the
  // request when `cross` is set (host.alloc.fail drawn here). False: none taken anywhere.
  virtual bool allocate(Job& job, std::size_t hit, CrossStageAgreement* cross) = 0;
  // Reads items [first, first + count) into the job's host slots; `fail_at`: an injected I/O
  // error from that item on. Returns the number of leading items read intact.
  virtual std::size_t read(Job& job, std::size_t first, std::size_t count, std::optional<std::size_t> fail_at) = 0;
  // The objects item `item` reads (a failpoint's damage picks one of them in turn; empty: none).
  virtual std::vector<std::string> objects(const Job& job, std::size_t item) const { return {job.keys[item]}; }
  // Objects one item reads when it reads all of them (0: it varies — hybrid models): statistics turn
  // objects read into tokens with it.
  virtual std::size_t objects_per_item() const { return 0; }
  // Bytes of items [first, first + count) (modelled read time, statistics).
  virtual std::size_t bytes(const Job& job, std::size_t first, std::size_t count) const = 0;
  // Of `intact` leading intact items of the job's `items`, how many may be used.
  virtual std::size_t accept(const Job& job, std::size_t intact) const = 0;
  // The first `keep` items enter the tree as host copies, everything else goes back to the host
  // pools, the job's anchor is unpinned. Returns how many of the kept slots the tree took (a
  // full-attention model's pages; a hybrid model's slots of every component).
  virtual std::size_t land(Job& job, std::size_t keep) = 0;
};

}  // namespace kvgrid::cache
