// The per-layer gather of CP-sharded KV (first article §1.2–1.3; DESIGN §4 "layer gather").
//
// Invariant: attention on layer l reads complete, current KV — every page of the prefix exactly
// once, after its restore landed. Before attention reads layer l of the batch's cached prefixes,
// the shard group's ranks all-gather their own pages of layer l into scratch slot l mod 2: rank r
// contributes its pages (in prefix order, padded with the padding page to equal counts), so the
// slot holds the pages grouped by owner, and a page-table mapping (logical position → slot row)
// lets attention read the prefix in logical order without moving pages. Order per layer:
// restore(l) → gather(l) → attention(l). With overlap, the gather of layer l+1 is posted
// (MPI_Iallgather) before attention on layer l, and attention drives its progress with MPI_Test
// every `test_every` pages: Open MPI progresses non-blocking collectives only inside MPI calls.
//
// Variants (protocol.layer_gather):
//   after_restore         (correct) gather(l) is posted only after layer l's restore copies landed.
//   before_restore_event  (buggy) gather(l) is posted before waiting for layer l's restore event:
//                         owners send what their pages hold before the copy landed — freed pages'
//                         poison, or the previous owner's KV — and attention reads it: oracle
//                         mismatches (the restore → gather ordering bug of the first article §1.3).
//
// Both slots are charged to the device budget by the caller (runtime gather_charge); the scheduler keeps
// a batch's gather within one slot (`padded_pages` per request).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "cache/kv_pool.hpp"
#include "protocols/cp_sharding.hpp"
#include "transfer/gather_collective.hpp"

namespace kvgrid::protocols {

struct GatherItem {
  std::span<const PageId> pages;  // the cached prefix, logical pages in prefix order
  std::span<std::uint64_t> run;   // the request's fold, [local layer][local head]: gathered pages are added
  // > 0: the last page holds only this many tokens (a P/D prompt received whole); full payload
  // folds only those slots (digest: a page's word holds exactly the tokens written to it).
  std::size_t tail_tokens = 0;
};

struct GatherStats {
  std::uint64_t batches = 0, layers = 0, pages = 0, bytes = 0;  // pages/bytes: received, padding included
  std::uint64_t blocked_ns = 0;  // wall time spent waiting for a gather to complete
  std::uint64_t total_ns = 0;    // wall time of the gather-and-fold passes
};

enum class GatherOrder { AfterRestore, BeforeRestoreEvent };
GatherOrder parse_gather_order(const std::string& name);  // "after_restore" | "before_restore_event"

class LayerGather {
 public:
  struct Config {
    Pages slot_pages{1024};    // pages of one layer a slot holds
    bool overlap = true;       // post layer l+1's gather before attention on layer l
    std::size_t test_every = 8;  // pages folded between MPI_Test calls
    GatherOrder order = GatherOrder::AfterRestore;  // protocol.layer_gather
    // engine.collectives = nccl: each layer's all-gather goes through this (NCCL on the GPU) and the
    // fold waits on its event; nullptr: MPI_Iallgather on the group's communicator.
    transfer::GatherCollective* collective = nullptr;
  };
  LayerGather(Config cfg, const ShardGroup& group, const cache::KvPool& pool);

  // Slot pages a prefix of `pages` pages occupies: N·⌈pages/N⌉ (owners are cyclic).
  static std::int64_t padded_pages(std::int64_t pages, std::uint32_t shards) {
    return (pages + shards - 1) / shards * shards;
  }
  // Gathers the items' prefixes layer by layer and adds their folds into each item's `run`;
  // `before_layer(l)` (optional) waits for layer l's restored pages. Collective over the shard
  // group (every rank passes the same pages). Returns the bytes one layer's gather delivered.
  std::uint64_t run(std::span<const GatherItem> items, const std::function<void(std::size_t)>& before_layer);
  const GatherStats& stats() const { return stats_; }
  const Config& config() const { return cfg_; }

 private:
  void post(std::size_t layer);
  // restore(l) → gather(l), in the variant's order: the restore wait first (correct) or after the post (buggy).
  void restore_then_post(std::size_t layer, const std::function<void(std::size_t)>& before_layer);
  void fold(std::span<const GatherItem> items, std::size_t layer, MPI_Request* drive);

  Config cfg_;
  GatherStats stats_;
  const ShardGroup& group_;
  const cache::KvPool& pool_;
  std::vector<cache::KvPool> slots_;       // two single-layer pools; row 0 is the padding page
  std::vector<std::uint64_t> send_[2];
  MPI_Request req_[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  transfer::Event collective_[2];  // the layer's all-gather through cfg_.collective
  // The current batch's plan.
  std::vector<PageId> mine_;               // this rank's pages, in order
  std::vector<std::vector<std::uint32_t>> rows_;  // per item: slot row of each prefix page
  std::size_t block_ = 0;                  // pages per owner in the slot
  std::vector<std::uint64_t> out_;         // one layer's fold, per head
};

}  // namespace kvgrid::protocols
