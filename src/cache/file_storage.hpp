// File storage backend (L3, object_store.hpp): a directory of objects, one file per key.
//
// Object format (version 2): a 40-byte header — magic "KVGRIDO1", format version, key length,
// payload length, payload checksum (eight multiply-xor lanes), the writing job's id — then the key,
// then the payload. `set` is open (a unique temporary name), one gathered write, close and rename
// into place — no fsync, no buffering layer — so a reader (or another writer of the same key)
// never sees half an object; an existing key only refreshes its LRU position. `get` is open, one
// scattered read straight into the caller's buffer, close, then validation: a missing, short,
// corrupt or foreign object is a miss with a reason (counted, and the caller recomputes), never
// data. Capacity: an LRU limit in bytes per instance (per rank); eviction deletes the least
// recently set or read objects (not in a shared store: see the constructor). `batch_exists`
// answers how many leading keys of a batch exist. In a store others may sweep (shared or
// non-evicting), `exists` and `set` look on disk for an indexed object: one a sweep removed is
// forgotten — a miss, and written again by the next set — instead of being counted present.
// Thread-safe: the index is under a mutex; file I/O happens outside it.
#pragma once

#include <cstdint>
#include <list>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "cache/file_io.hpp"
#include "cache/object_store.hpp"

namespace kvgrid::cache {

class FileStorage final : public ObjectStore {
 public:
  // `dir` is created if missing. Objects already in it are adopted (oldest first in LRU order) so
  // that a directory set explicitly can be reused across runs.
  // `evicts` = false: a store shared with other ranks and jobs (unified keys) — this instance
  // never deletes an object for its own LRU; capacity belongs to the store as a whole.
  FileStorage(std::string dir, std::uint64_t capacity_bytes, bool evicts = true);

  bool set(const std::string& key, std::span<const std::uint8_t> payload) override;
  // (The read goes straight into `out`: callers read into scratch buffers, used only on success.)
  StorageMiss get(const std::string& key, std::span<std::uint8_t> out) override;
  bool exists(const std::string& key) override;

  void set_job(std::uint64_t job) override { job_ = job; }
  // A key missing from the index is looked up in the directory (and adopted when found there).
  void set_shared(bool shared) override { shared_ = shared; }
  // A successful read sets the object's modification time to now, so "least recently read or
  // written" is on disk for any process.
  void set_recency_on_disk(bool on) override { recency_on_disk_ = on; }
  void set_fsync(bool on) override;
  SweepResult sweep(std::uint64_t limit_bytes) override;
  void truncate(const std::string& key) override;  // to half its bytes
  void corrupt(const std::string& key) override;   // one payload bit flipped
  std::string where() const override { return dir_; }

  StorageStats stats() const override;
  std::uint64_t used_bytes() const;
  const std::string& dir() const { return dir_; }
  std::string path_of(const std::string& key) const;

 private:
  void touch_locked(const std::string& key);
  void forget_locked(const std::string& key);
  // A store whose objects others may remove (shared, or a non-evicting one a sweep keeps): whether
  // an indexed object whose write is over is still on disk (a sweep — this job's, another job's or
  // `kvgrid store` — may have removed it; then the index forgets it). Takes mu_ only to forget.
  bool on_disk(const std::string& key);
  std::string dir_;
  std::uint64_t capacity_;
  bool evicts_;
  bool shared_ = false;
  bool recency_on_disk_ = false;
  DirHandle dir_sync_;  // open while cache.storage_fsync is on: the directory, synced after a rename
  std::uint64_t job_ = 0;
  mutable std::mutex mu_;
  std::list<std::string> lru_;  // front: least recently used
  struct Entry {
    std::list<std::string>::iterator pos;
    std::uint64_t bytes;
    bool writing = false;  // reserved by a set whose file is not in place yet (counts as present)
  };
  std::unordered_map<std::string, Entry> index_;
  std::uint64_t used_ = 0, tmp_counter_ = 0;
  StorageStats stats_;
};

// The store-level eviction of a directory shared by ranks and jobs (unified keys): objects
// (*.bin) and segments (*.seg, segment_storage.hpp: a segment goes whole; temporary files are
// never touched) least recently read or written first (modification
// time, then name), removed until the directory holds at most `limit_bytes`. Removing a file never
// disturbs a read in progress (an open file outlives its name); a reader that opens it afterwards
// gets a miss, which it recomputes. `dry_run`: count only. Throws InputError for a missing directory.
SweepResult sweep_directory(const std::string& dir, std::uint64_t limit_bytes, bool dry_run = false);

}  // namespace kvgrid::cache
