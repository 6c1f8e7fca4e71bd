// File storage backend (L3): a directory of objects, one per key.
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
// answers how many leading keys of a batch exist.
// Thread-safe: the index is under a mutex; file I/O happens outside it.
#pragma once

#include <cstdint>
#include <list>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

namespace kvgrid::cache {

enum class StorageMiss { None, Missing, Short, Corrupt, WrongKey, WrongLength };
const char* storage_miss_name(StorageMiss m);

struct StorageStats {
  std::uint64_t sets = 0, set_skipped = 0, set_failed = 0, evicted = 0;
  std::uint64_t gets = 0, hits = 0, missing = 0, short_reads = 0, corrupt = 0;
  std::uint64_t bytes_written = 0, bytes_read = 0;
  std::uint64_t other_job_hits = 0;  // objects read intact that another job wrote
};

class FileStorage {
 public:
  // `dir` is created if missing. Objects already in it are adopted (oldest first in LRU order) so
  // that a directory set explicitly can be reused across runs.
  // `evicts` = false: a store shared with other ranks and jobs (unified keys) — this instance
  // never deletes an object for its own LRU; capacity belongs to the store as a whole.
  FileStorage(std::string dir, std::uint64_t capacity_bytes, bool evicts = true);

  // false when the write failed (disk full, injected failure): nothing partial is left behind.
  bool set(const std::string& key, std::span<const std::uint8_t> payload);
  // StorageMiss::None on success (`out` filled); otherwise `out` holds unspecified bytes (the read
  // goes straight into it: callers read into scratch buffers and use them only on success).
  StorageMiss get(const std::string& key, std::span<std::uint8_t> out);
  bool exists(const std::string& key);
  std::size_t batch_exists(std::span<const std::string> keys);

  // This job's id, written into every object's header (a read counts objects of other jobs).
  void set_job(std::uint64_t job) { job_ = job; }
  // Other processes add objects while this one runs: a key missing from the index is looked up in
  // the directory (and adopted when found there).
  void set_shared(bool shared) { shared_ = shared; }
  // A store whose capacity a sweep enforces (unified keys): a successful read sets the object's
  // modification time to now, so "least recently read or written" is on disk for any process.
  void set_recency_on_disk(bool on) { recency_on_disk_ = on; }

  StorageStats stats() const;
  std::uint64_t used_bytes() const;
  const std::string& dir() const { return dir_; }
  std::string path_of(const std::string& key) const;

 private:
  void touch_locked(const std::string& key);
  std::string dir_;
  std::uint64_t capacity_;
  bool evicts_;
  bool shared_ = false;
  bool recency_on_disk_ = false;
  std::uint64_t job_ = 0;
  mutable std::mutex mu_;
  std::list<std::string> lru_;  // front: least recently used
  struct Entry {
    std::list<std::string>::iterator pos;
    std::uint64_t bytes;
  };
  std::unordered_map<std::string, Entry> index_;
  std::uint64_t used_ = 0, tmp_counter_ = 0;
  StorageStats stats_;
};

// The store-level eviction of a directory shared by ranks and jobs (unified keys): objects
// (*.bin; temporary files are never touched) least recently read or written first (modification
// time, then name), removed until the directory holds at most `limit_bytes`. Removing a file never
// disturbs a read in progress (an open file outlives its name); a reader that opens it afterwards
// gets a miss, which it recomputes. `dry_run`: count only. Throws InputError for a missing directory.
struct SweepResult {
  std::uint64_t objects = 0, bytes = 0;                  // before
  std::uint64_t removed = 0, removed_bytes = 0;
};
SweepResult sweep_directory(const std::string& dir, std::uint64_t limit_bytes, bool dry_run = false);

// 64-bit checksum of a byte payload (not cryptographic).
std::uint64_t payload_checksum(std::span<const std::uint8_t> bytes);

}  // namespace kvgrid::cache
