// The Redis backend (cache/redis_storage.hpp) against a private server started for the test
// (jobs/redis.sh; skipped without redis-server unless CI=true): round trips, immutable keys,
// damaged values are misses, leading-hit batch existence and batch reads in one pipeline, other jobs' objects,
// concurrent writers of one key, and URL parsing.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include "cache/redis_storage.hpp"
#include "core/check.hpp"
#include "storage_objects.hpp"

namespace kvgrid::cache {
namespace {

struct Server {
  std::string url, dir;
  bool ok = false;
  Server() {
    const std::string cmd = std::string(KVGRID_SOURCE_DIR) + "/jobs/redis.sh start";
    FILE* p = ::popen(cmd.c_str(), "r");
    if (!p) return;
    char buf[512] = {0};
    const bool got = std::fgets(buf, sizeof(buf), p) != nullptr;
    const int rc = ::pclose(p);
    if (!got || rc != 0) return;
    const std::string line(buf);
    const auto sp = line.find(' ');
    url = line.substr(0, sp);
    dir = line.substr(sp + 1, line.find_last_not_of("\n") - sp);
    ok = true;
  }
  ~Server() {
    if (ok) (void)std::system((std::string(KVGRID_SOURCE_DIR) + "/jobs/redis.sh stop " + dir + " >/dev/null 2>&1").c_str());
  }
};

std::unique_ptr<Server> server() {
  auto s = std::make_unique<Server>();
  if (!s->ok) {
    const char* ci = std::getenv("CI");
    if (ci && std::string(ci) == "true") ADD_FAILURE() << "CI=true: a Redis server must start (jobs/setup.sh installs redis-server)";
    return nullptr;
  }
  return s;
}

std::vector<std::uint8_t> payload(std::size_t n, std::uint8_t seed) { return test_objects::payload(n, seed, 13); }

TEST(RedisStorage, RoundTripsImmutableKeysAndLeadingHits) {
  auto srv = server();
  if (!srv) GTEST_SKIP() << "redis-server is not installed";
  RedisStorage s(srv->url);
  const auto a = payload(5000, 1), b = payload(5000, 2);
  ASSERT_TRUE(s.set("k0", a));
  ASSERT_TRUE(s.set("k1", b));
  ASSERT_TRUE(s.set("k1", a));  // an existing key is left as it is
  std::vector<std::uint8_t> out(5000);
  ASSERT_EQ(s.get("k1", out), StorageMiss::None);
  EXPECT_EQ(out, b);
  std::vector<std::string> keys = {"k0", "k1", "k2", "k0"};
  EXPECT_EQ(s.batch_exists(keys), 2u);
  std::vector<std::vector<std::uint8_t>> bufs(4, std::vector<std::uint8_t>(5000));
  std::vector<std::span<std::uint8_t>> outs(bufs.begin(), bufs.end());
  EXPECT_EQ(s.get_batch(keys, outs), 2u);  // one pipelined round trip; the leading intact objects
  EXPECT_EQ(bufs[0], a);
  EXPECT_EQ(bufs[1], b);
  // A backup's two round trips: which objects exist, then the missing ones written in order.
  EXPECT_EQ(s.present(keys), (std::vector<bool>{true, true, false, true}));
  const std::vector<std::string> wkeys = {"k2", "k0"};
  const std::vector<std::span<const std::uint8_t>> wvals = {a, b};
  EXPECT_EQ(s.set_batch(wkeys, wvals), (std::vector<bool>{true, true}));
  ASSERT_EQ(s.get("k0", out), StorageMiss::None);
  EXPECT_EQ(out, a);  // k0 was there already: left as it was
  EXPECT_EQ(s.batch_exists(keys), 4u);
  EXPECT_TRUE(s.exists("k2"));
  EXPECT_FALSE(s.exists("k3"));
  const auto st = s.stats();
  EXPECT_EQ(st.sets, 3u);
  EXPECT_EQ(st.set_skipped, 2u);
  EXPECT_EQ(st.connection_errors, 0u);
}

TEST(RedisStorage, DamagedValuesAreMissesNeverData) {
  auto srv = server();
  if (!srv) GTEST_SKIP() << "redis-server is not installed";
  RedisStorage s(srv->url);
  const auto a = payload(4096, 3);
  std::vector<std::uint8_t> out(4096);
  EXPECT_EQ(s.get("nothing", out), StorageMiss::Missing);
  ASSERT_TRUE(s.set("flip", a));
  s.corrupt("flip");
  EXPECT_EQ(s.get("flip", out), StorageMiss::Corrupt);
  ASSERT_TRUE(s.set("cut", a));
  s.truncate("cut");
  EXPECT_EQ(s.get("cut", out), StorageMiss::Short);
  std::vector<std::uint8_t> small(10);
  ASSERT_TRUE(s.set("other", a));
  EXPECT_EQ(s.get("other", small), StorageMiss::WrongLength);
  const auto st = s.stats();
  EXPECT_EQ(st.hits, 0u);
  EXPECT_EQ(st.missing + st.corrupt + st.short_reads, 4u);
}

TEST(RedisStorage, OtherJobsObjectsAndConcurrentWritersOfOneKey) {
  auto srv = server();
  if (!srv) GTEST_SKIP() << "redis-server is not installed";
  RedisStorage mine(srv->url), theirs(srv->url);
  mine.set_job(1);
  theirs.set_job(2);
  const auto a = payload(65536, 4);
  std::vector<std::thread> writers;
  for (int t = 0; t < 4; ++t)
    writers.emplace_back([&] {
      RedisStorage w(srv->url);
      w.set_job(2);
      for (int i = 0; i < 20; ++i) EXPECT_TRUE(w.set("shared", a));
    });
  for (auto& w : writers) w.join();
  std::vector<std::uint8_t> out(65536);
  ASSERT_EQ(mine.get("shared", out), StorageMiss::None);  // one whole object
  EXPECT_EQ(out, a);
  EXPECT_EQ(mine.stats().other_job_hits, 1u);
  ASSERT_TRUE(mine.set("own", a));
  ASSERT_EQ(mine.get("own", out), StorageMiss::None);
  EXPECT_EQ(mine.stats().other_job_hits, 1u);
}

TEST(RedisStorage, AnUnreachableServerIsMissesAndFailedWritesNotACrash) {
  RedisStorage s("redis://127.0.0.1:1");  // nothing listens on port 1
  const auto a = payload(100, 5);
  std::vector<std::uint8_t> out(100);
  EXPECT_FALSE(s.set("k", a));
  EXPECT_EQ(s.get("k", out), StorageMiss::Missing);
  EXPECT_FALSE(s.exists("k"));
  EXPECT_EQ(s.batch_exists(std::vector<std::string>{"k"}), 0u);
  EXPECT_GE(s.stats().connection_errors, 1u);
}

TEST(RedisStorage, UrlsAreRedisHostPortDb) {
  auto a = RedisStorage::parse_url("redis://127.0.0.1:6380/3");
  EXPECT_EQ(a.host, "127.0.0.1");
  EXPECT_EQ(a.port, 6380);
  EXPECT_EQ(a.db, 3);
  EXPECT_EQ(RedisStorage::parse_url("redis://cache-1.local:6379").db, 0);
  EXPECT_THROW(RedisStorage::parse_url("http://x:1"), InputError);
  EXPECT_THROW(RedisStorage::parse_url("redis://x"), InputError);
  EXPECT_THROW(RedisStorage::parse_url("redis://x:99999"), InputError);
}

}  // namespace
}  // namespace kvgrid::cache
