// The file backend's segment layout (cache.storage_file_layout = "segment", object_store.hpp):
// the objects of one write batch packed into one file, a segment, whose index is in its head.
//
// Why: on a real filesystem a file per object costs a directory entry per object, and that entry,
// not the bytes, is most of a write's time (docs/performance.md). A segment costs one entry per
// batch: open, one write of its head, one gathered write per object, close, rename — so a batch
// of n objects is n + 4 system calls, and a reader still sees a whole segment or none.
//
//   segment = 32-byte head | index | objects
//   head    = magic "KVGRIDS1", format version (1), object count, index bytes, index checksum
//   index   = per object: offset, length (u64 each), key length (u32), 4 zero bytes, key
//   object  = the object format of object_store.hpp (header | key | payload), unchanged
//
// Names: "{writer}-{n}.seg", the writer a random 64-bit id per store instance (unique across
// hosts sharing a directory), n its batch counter; the extension keeps them apart from a file per
// object's "{key}.bin".
//
// What is the same as one file per object (file_storage.hpp), so that a run's decisions do not
// depend on the layout: capacity is per object (each object's bytes counted, least recently set
// or read evicted first); an evicted object is gone from the index at once and its segment's file
// is deleted when its last live object goes; a read is validated exactly as there (a missing,
// short, corrupt or foreign object is a miss with a reason); a read (and a failpoint's damage)
// finds objects other processes wrote since this store looked, as opening a file by name does (a
// key it does not know makes it list the directory again, at most when the directory changed),
// and so does a lookup of a shared store (set_shared); set_recency_on_disk touches the segment on
// a read.
// What differs: the unit a store-level sweep removes is a segment (its objects' last read or write
// is the segment's modification time), and a store that swept or found a segment gone forgets its
// objects (a file per object keeps a swept key indexed); an object its writer evicted stays readable by other
// processes until its segment's last object goes (its bytes are the key's, immutable); a batch is
// written whole or not at all, so one I/O error fails all its objects; a directory holds either
// layout's objects and each layout sees only its own.
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

class SegmentStorage final : public ObjectStore {
 public:
  // As FileStorage's: `dir` created if missing, its segments adopted (oldest first in LRU order);
  // `evicts` = false for a store shared by ranks and jobs (a sweep keeps its capacity).
  SegmentStorage(std::string dir, std::uint64_t capacity_bytes, bool evicts = true);

  bool set(const std::string& key, std::span<const std::uint8_t> payload) override;
  // One segment for the batch's new objects.
  std::vector<bool> set_batch(std::span<const std::string> keys, std::span<const std::span<const std::uint8_t>> payloads) override;
  bool writes_in_batches() const override { return true; }
  StorageMiss get(const std::string& key, std::span<std::uint8_t> out) override;
  bool exists(const std::string& key) override;

  void set_job(std::uint64_t job) override { job_ = job; }
  void set_shared(bool shared) override { shared_ = shared; }
  void set_recency_on_disk(bool on) override { recency_on_disk_ = on; }
  void set_fsync(bool on) override;
  SweepResult sweep(std::uint64_t limit_bytes) override;
  void truncate(const std::string& key) override;  // its index entry's length halved (on disk)
  void corrupt(const std::string& key) override;   // its payload's last byte changed
  std::string where() const override { return dir_; }
  StorageStats stats() const override;

  std::uint64_t used_bytes() const;
  std::size_t segments() const;  // segment files holding live objects (as this instance knows)
  const std::string& dir() const { return dir_; }
  // The segment file holding `key` ("" when not stored).
  std::string segment_of(const std::string& key) const;

 private:
  struct Segment {
    std::string name;
    std::vector<std::string> keys;  // the objects it holds that this store points at (index or readable)
    std::size_t live = 0;           // of which not evicted
    bool written = false;           // renamed into place (a batch's own segment: after its write)
  };
  struct Entry {
    std::list<std::string>::iterator pos;
    std::uint64_t bytes;  // capacity accounting: header + key + payload
    std::uint64_t seg;    // Segment id
    std::uint64_t offset, length;  // where it is in the segment
  };
  struct Where {
    std::uint64_t seg, offset, length;
  };
  struct Found {  // an entry's location, copied out of the lock
    std::string path;
    std::uint64_t seg = 0, offset = 0, length = 0;
  };
  // Under the lock; false: not stored (or not yet written). `listed_only`: this store's own index
  // (what a lookup answers), not what a read found of other processes' segments.
  bool locate(const std::string& key, Found* f, bool listed_only = false);
  // locate, else list the directory again (when it changed) and locate: a read finds what other
  // processes wrote since, as a file per object opened by name does.
  bool find(const std::string& key, Found* f);
  void evict_locked(const std::string& key);
  void drop_segment_locked(std::uint64_t seg);   // its file is gone (a sweep)
  void release_locked(Segment& s, std::uint64_t id);  // one object fewer; the file goes with the last
  // Reads a segment's head and index; adopts the keys not yet indexed — `listed`: into the index
  // (lookups, LRU, capacity: at start-up and in a shared store), else as readable only (a read of
  // a store that is not shared finds another process's object, as opening its file would).
  // false: not a whole segment.
  bool adopt(const std::string& name, bool listed);
  // Segments other processes wrote since the last listing (when the directory changed): for a
  // read, and for a lookup of a shared store.
  void refresh();
  std::string path(const std::string& name) const { return dir_ + "/" + name; }

  std::string dir_;
  std::uint64_t capacity_;
  bool evicts_;
  bool shared_ = false;
  bool recency_on_disk_ = false;
  DirHandle dir_sync_;  // open while cache.storage_fsync is on: the directory, synced after a rename
  std::uint64_t job_ = 0;
  std::uint64_t writer_id_;
  mutable std::mutex mu_;
  std::mutex scan_mu_;  // one directory listing at a time
  std::list<std::string> lru_;  // front: least recently used
  std::unordered_map<std::string, Entry> index_;
  std::unordered_map<std::string, Where> readable_;  // other processes' objects a read found (not listed)
  std::unordered_map<std::uint64_t, Segment> segs_;
  std::unordered_map<std::string, std::uint64_t> seg_ids_;  // file name -> id (every segment seen)
  std::uint64_t next_seg_ = 1, batches_ = 0;
  std::int64_t scanned_mtime_ns_ = -1, scanned_at_ns_ = 0;
  std::uint64_t used_ = 0;
  StorageStats stats_;
};

}  // namespace kvgrid::cache
