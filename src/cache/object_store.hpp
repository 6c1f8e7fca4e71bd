// The L3 object stores the storage tier writes to and reads from: a directory of files
// (file_storage.hpp, cache.storage = "file") or a Redis server (redis_storage.hpp,
// cache.storage = "redis"). Both hold the same objects under the same keys (either key scheme,
// page_hash.hpp / unified_kv.hpp) in one format, and both treat anything they cannot validate as
// a miss, never as data:
//
//   object = 40-byte header | key | payload
//   header = magic "KVGRIDO1", format version (2), key length, payload length,
//            payload checksum (payload_checksum), the writing job's id
//
// Objects are immutable (a key's bytes never change once written), so writers of one key race
// only to store identical bytes, and a reader sees a whole object or none.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace kvgrid::cache {

enum class StorageMiss { None, Missing, Short, Corrupt, WrongKey, WrongLength };
const char* storage_miss_name(StorageMiss m);

struct StorageStats {
  std::uint64_t sets = 0, set_skipped = 0, set_failed = 0, evicted = 0;
  std::uint64_t gets = 0, hits = 0, missing = 0, short_reads = 0, corrupt = 0;
  std::uint64_t bytes_written = 0, bytes_read = 0;
  std::uint64_t other_job_hits = 0;     // objects read intact that another job wrote
  std::uint64_t connection_errors = 0;  // a remote store unreachable or failing (each a miss or a failed write)
};

// A store-level eviction's outcome (unified keys).
struct SweepResult {
  std::uint64_t objects = 0, bytes = 0;  // before
  std::uint64_t removed = 0, removed_bytes = 0;
};

// 64-bit checksum of a byte payload (not cryptographic).
std::uint64_t payload_checksum(std::span<const std::uint8_t> bytes);

struct ObjectHeader {
  char magic[8];
  std::uint32_t version;
  std::uint32_t key_len;
  std::uint64_t payload_len;
  std::uint64_t checksum;
  std::uint64_t job;  // the writing job (ObjectStore::set_job; 0: not named)
};
static_assert(sizeof(ObjectHeader) == 40);
ObjectHeader make_header(const std::string& key, std::span<const std::uint8_t> payload, std::uint64_t job);
// A whole object as one value (header, key, payload).
std::vector<std::uint8_t> encode_object(const std::string& key, std::span<const std::uint8_t> payload, std::uint64_t job);
// Validates `value` as the object of `key` with a payload of out.size() bytes; on success the
// payload is copied into `out` and `*job` names its writer.
StorageMiss decode_object(std::span<const std::uint8_t> value, const std::string& key, std::span<std::uint8_t> out,
                          std::uint64_t* job);
// The header checks every store makes: magic, version, key length (before the key is compared).
bool header_ok(const ObjectHeader& h);
// The checks of a read that scattered a stored object into `h`, `stored` (as many bytes as `key`)
// and `out`: `got` bytes arrived of the header + key + out.size() asked for; `longer`: the stored
// object holds more bytes than that. The file layouts' reads (decode_object checks a whole value).
StorageMiss check_scattered_read(const ObjectHeader& h, const std::string& stored, const std::string& key,
                                 std::span<const std::uint8_t> out, std::size_t got, bool longer);
// A read's outcome in `s`: a hit of `bytes` (`other_job`: another job wrote it), or a miss by kind.
void count_read(StorageStats& s, StorageMiss m, std::size_t bytes = 0, bool other_job = false);

class ObjectStore {
 public:
  virtual ~ObjectStore() = default;
  // false when the write failed (store full or unreachable, injected failure): nothing partial is
  // left behind. An existing key is not written again.
  virtual bool set(const std::string& key, std::span<const std::uint8_t> payload) = 0;
  // StorageMiss::None on success (`out` filled); otherwise `out` holds unspecified bytes.
  virtual StorageMiss get(const std::string& key, std::span<std::uint8_t> out) = 0;
  virtual bool exists(const std::string& key) = 0;
  // How many leading keys of a batch exist.
  virtual std::size_t batch_exists(std::span<const std::string> keys);
  // Which of `keys` exist (Redis: one pipelined round trip).
  virtual std::vector<bool> present(std::span<const std::string> keys);
  // Writes of a batch, in order (Redis: one pipelined round trip); element i: set(keys[i], payloads[i]).
  virtual std::vector<bool> set_batch(std::span<const std::string> keys, std::span<const std::span<const std::uint8_t>> payloads);
  // The objects of a batch, keys[i] into outs[i]; the result's length is the number of leading
  // objects read intact. A store may stop at the first miss (the file backend does) or fetch the
  // whole batch in one round trip (Redis pipelines the GETs).
  virtual std::size_t get_batch(std::span<const std::string> keys, std::span<const std::span<std::uint8_t>> outs);
  virtual StorageStats stats() const = 0;

  // This job's id, written into every object (a read counts objects of other jobs).
  virtual void set_job(std::uint64_t job) = 0;
  // Other processes add objects while this one runs (lookups must see them).
  virtual void set_shared(bool shared) = 0;
  // A store whose capacity a sweep enforces: reads refresh an object's recency where the sweep sees it.
  virtual void set_recency_on_disk(bool on) = 0;
  // cache.storage_fsync: a write returns once its bytes and its name are on stable storage (a file
  // store: the file's data synced before its rename, the directory after it). Default off, as
  // HiCache's file backend: the page cache, what `dd` measures. A Redis server keeps its own
  // persistence settings: nothing to do here.
  virtual void set_fsync(bool) {}
  // Whether one set_batch of many objects costs less than their sets one by one (a segment file,
  // a Redis pipeline): the storage writer then hands it the batches queued together.
  virtual bool writes_in_batches() const { return false; }
  // Unified keys: the store-level eviction down to `limit_bytes` (a Redis server evicts by its
  // own maxmemory policy: nothing to do here).
  virtual SweepResult sweep(std::uint64_t limit_bytes) = 0;

  // Failpoints storage.read.short and storage.object.corrupt: damage the stored object before it
  // is read (its reader must detect it).
  virtual void truncate(const std::string& key) = 0;
  virtual void corrupt(const std::string& key) = 0;
  // Where the objects are (a directory, a URL), for messages.
  virtual std::string where() const = 0;
};

}  // namespace kvgrid::cache
