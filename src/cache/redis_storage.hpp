// Redis backend of the storage tier (cache.storage = "redis", object_store.hpp): the same objects
// as the file backend, as values under the same keys, on a Redis server every rank and job
// reaches (`cache.storage_url`, redis://HOST:PORT[/DB]).
//
//   set     SET key object NX — immutable objects: an existing key is left as it is
//   get     GET key, validated like a file (magic, key, length, checksum): damage is a miss
//   exists  EXISTS key; batch_exists pipelines one EXISTS per key in one round trip and answers
//           the leading hit; get_batch pipelines a prefetch batch's GETs the same way, and a
//           node's backup is two round trips (present: EXISTS of its objects; set_batch: SETs)
// Capacity is the server's (`maxmemory` with an LRU policy): kvgrid never deletes a key. A lookup
// always sees every job's objects (a Redis store is a shared store by nature).
// Connection errors are storage failures, never a crash or a hang: every command has a timeout;
// a failed command drops the connection, counts a connection error and turns into a miss or a
// failed write; the next command after a pause reconnects. The first failure of an outage is
// logged to stderr, and so is the recovery.
// Thread-safe: one connection under a mutex (the threaded engine's storage workers share it).
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>

#include "cache/object_store.hpp"

struct redisContext;
struct redisReply;

namespace kvgrid::cache {

class RedisStorage final : public ObjectStore {
 public:
  // Throws InputError for a URL that is not redis://HOST:PORT[/DB]. Connects on first use.
  explicit RedisStorage(std::string url);
  ~RedisStorage() override;
  RedisStorage(const RedisStorage&) = delete;
  RedisStorage& operator=(const RedisStorage&) = delete;

  bool set(const std::string& key, std::span<const std::uint8_t> payload) override;
  StorageMiss get(const std::string& key, std::span<std::uint8_t> out) override;
  bool exists(const std::string& key) override;
  std::size_t batch_exists(std::span<const std::string> keys) override;
  std::size_t get_batch(std::span<const std::string> keys, std::span<const std::span<std::uint8_t>> outs) override;
  std::vector<bool> present(std::span<const std::string> keys) override;
  std::vector<bool> set_batch(std::span<const std::string> keys, std::span<const std::span<const std::uint8_t>> payloads) override;
  bool writes_in_batches() const override { return true; }
  StorageStats stats() const override;
  void set_job(std::uint64_t job) override { job_ = job; }
  void set_shared(bool) override {}             // always: every lookup asks the server
  void set_recency_on_disk(bool) override {}    // the server's LRU sees reads itself
  SweepResult sweep(std::uint64_t) override { return {}; }  // the server's maxmemory policy
  void truncate(const std::string& key) override;
  void corrupt(const std::string& key) override;
  std::string where() const override { return url_; }

  // What a run's header says of a server (`kvgrid run`, rank 0, before any rank writes): reachable,
  // keys already in its database (-1: unknown), maxmemory (nullopt: CONFIG refused, as managed
  // services do) and its policy. A server that is empty at the start and never evicts gives a
  // reproducible run as long as no other job uses it.
  struct Probe {
    bool reachable = false;
    std::int64_t keys = -1;
    std::optional<std::uint64_t> maxmemory;
    std::string policy, error;
    bool private_and_keeps() const { return reachable && keys == 0 && maxmemory && *maxmemory == 0; }
  };
  static Probe probe(const std::string& url);

  // redis://HOST:PORT[/DB] → its parts (tests).
  struct Address {
    std::string host;
    int port = 6379;
    int db = 0;
  };
  static Address parse_url(const std::string& url);

 private:
  bool connected_locked();                        // connects when needed (not during a back-off)
  void failed_locked(const char* what);           // drops the connection, counts, logs the outage
  redisReply* command_locked(const char* fmt, ...);  // null on a connection error
  StorageMiss take_reply_locked(redisReply* r, const std::string& key, std::span<std::uint8_t> out);

  std::string url_;
  Address addr_;
  std::uint64_t job_ = 0;
  mutable std::mutex mu_;
  redisContext* ctx_ = nullptr;
  std::chrono::steady_clock::time_point retry_at_{};
  bool down_ = false;  // an outage is being reported
  StorageStats stats_;
};

}  // namespace kvgrid::cache
