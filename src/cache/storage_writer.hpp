// Background writes of the storage tier (L3): a published host backup's objects leave the rank's
// loop as one batch and land in the object store later, so a backup no longer costs the loop its
// file creates or its round trips.
//
// What a batch is: the objects of one backup (keys and their owned payload bytes), grouped by the
// page or slot they belong to; a group counts as written when every one of its objects landed.
// The loop decides everything about a batch when it submits it (which objects are missing, which
// storage.write.fail drew); the store only executes it.
//
// When a batch lands:
//  * threaded engine: on one of the writer's threads, as soon as one is free (the store is
//    thread-safe: a file directory, or one Redis connection under a mutex), together with the
//    batches queued behind it when the store writes in batches (segments, Redis; up to 16 MiB:
//    one store batch, one segment file);
//  * simulated engine: at its drawn tick — the write queue's tail (or now) + latency + bytes /
//    bandwidth × seeded jitter — the first time the loop looks at the store after it, together
//    with the other batches due then (one store batch: the store's outcomes are per object and in
//    order, so this is the same as landing them one by one);
//  * inline (no clock, no threads: unit tests of the sites): at once, as before.
//
// The invariant that keeps decisions reproducible: the store is looked at only after `settle()`,
// and what it then holds does not depend on thread timing. `settle()` lands every batch whose
// tick passed (simulated) or waits for every queued batch (threaded) and then applies the
// outcomes to the statistics in submission order, on the loop. A write still in flight (simulated,
// tick ahead) is invisible to a hit query, as on a real store: that rank's hit is shorter and the
// agreed MIN absorbs it. A backup treats an object in flight as present (`present`), so it is
// never written twice.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "cache/object_store.hpp"
#include "core/rng.hpp"

namespace kvgrid::cache {

struct StorageTierStats;

// One backup's writes. Payload bytes are owned by the batch (spans point into `words`/`bytes`,
// whose elements never move).
struct WriteBatch {
  struct Group {
    bool counts_page = true;  // a written group adds one to written_pages (a FULL page; not a SWA/MAMBA slot)
    std::size_t writes = 0;
  };
  std::vector<std::string> keys;
  std::vector<std::span<const std::uint8_t>> payloads;
  std::vector<std::size_t> group;  // the group of each write
  std::vector<Group> groups;
  std::deque<std::vector<std::uint64_t>> words;
  std::deque<std::vector<std::uint8_t>> bytes;

  std::size_t open_group(bool counts_page) {
    groups.push_back({counts_page, 0});
    return groups.size() - 1;
  }
  void add(std::size_t g, std::string key, std::span<const std::uint8_t> payload) {
    keys.push_back(std::move(key));
    payloads.push_back(payload);
    group.push_back(g);
    ++groups[g].writes;
  }
  std::uint64_t total_bytes() const;
};

struct WriterTiming {
  std::function<std::uint64_t()> now;  // the rank's modelled clock (simulated); empty: inline
  double bytes_per_ns = 5.0;
  std::uint64_t latency_ns = 100'000;
  double jitter = 0.25;
  std::uint64_t seed = 1;
};

// A landed write's record for the trace (simulated: modelled start and end).
struct WriteRecord {
  std::uint64_t start_ns = 0, end_ns = 0, bytes = 0;
};

class StorageWriter {
 public:
  // threads > 0: the threaded engine's writer threads; 0: simulated when timing.now is set, else inline.
  StorageWriter(ObjectStore& store, StorageTierStats& stats, std::size_t threads, WriterTiming timing);
  ~StorageWriter();  // lands everything (drain)
  StorageWriter(const StorageWriter&) = delete;
  StorageWriter& operator=(const StorageWriter&) = delete;

  void submit(WriteBatch batch);
  // Which of `keys` are in the store or in a batch not yet settled (one store round trip).
  std::vector<bool> present(std::span<const std::string> keys);
  // Before the store is looked at: lands what is due (see above) and applies the outcomes.
  void settle();
  // Lands every batch, due or not (end of run, teardown).
  void drain();
  std::size_t in_flight() const { return queue_.size(); }
  std::vector<WriteRecord> take_records() {
    std::vector<WriteRecord> out;
    out.swap(records_);
    return out;
  }

 private:
  struct Entry {
    WriteBatch batch;
    std::uint64_t due_ns = 0;  // simulated
    std::vector<bool> ok;      // filled when landed
    bool landed = false;       // (threaded: under mu_)
  };
  void land(Entry& e);        // the store calls, off or on the loop
  void land(std::span<Entry* const> es);  // several queued batches as one store batch (threaded)
  static constexpr std::uint64_t kCoalesceBytes = 16ULL << 20;
  void apply(Entry& e);       // statistics, on the loop
  void settle_until(bool all);
  void work();

  ObjectStore& store_;
  StorageTierStats& stats_;
  WriterTiming timing_;
  Rng jitter_;
  std::uint64_t tail_ns_ = 0;  // simulated: the write queue's tail
  std::deque<std::unique_ptr<Entry>> queue_;  // submission order; the loop owns it
  std::unordered_set<std::string> pending_;   // keys of batches not yet settled
  std::vector<WriteRecord> records_;
  // threaded
  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<Entry*> todo_;
  std::vector<std::thread> threads_;
  bool stop_ = false;
};

}  // namespace kvgrid::cache
