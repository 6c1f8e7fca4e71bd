// File storage backend: round trip, leading-hit exists, corrupt/short/missing/foreign objects are
// misses (never data), LRU capacity, reuse of a directory, concurrent writers of one key, the
// store-level sweep of a shared directory (least recently read or written first), other jobs'
// objects seen in a shared store.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "cache/file_storage.hpp"
#include "core/check.hpp"
#include "storage_objects.hpp"

namespace kvgrid::cache {
namespace {

namespace fs = std::filesystem;

using test_objects::payload;
std::string fresh_dir(const std::string& tag) { return test_objects::fresh_dir("storage", tag); }

// The object format's payload checksum, pinned: objects written by earlier builds must keep
// validating (bytes i*7+1; lengths that exercise the lanes, the tail and both).
TEST(ObjectFormat, PayloadChecksumKnownVectors) {
  std::vector<std::uint8_t> b(65539);
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<std::uint8_t>(i * 7 + 1);
  const std::pair<std::size_t, std::uint64_t> known[] = {
      {0, 0xf0c1a26f6b6448ddULL}, {5, 0x0a3b547a1e4a30c3ULL}, {64, 0x99996d2c2f3db0e1ULL},
      {100, 0x5b2640f7d6864183ULL}, {65539, 0xf3b5d5a5f61caa06ULL}};
  for (const auto& [n, v] : known) EXPECT_EQ(payload_checksum(std::span<const std::uint8_t>(b).first(n)), v) << n;
}

TEST(FileStorage, RoundTripAndLeadingHits) {
  FileStorage s(fresh_dir("rt"), 1 << 20);
  auto a = payload(1000, 1), b = payload(1000, 2);
  ASSERT_TRUE(s.set("k0", a));
  ASSERT_TRUE(s.set("k1", b));
  ASSERT_TRUE(s.set("k1", a));  // existing key: kept, only refreshed
  std::vector<std::uint8_t> out(1000);
  EXPECT_EQ(s.get("k1", out), StorageMiss::None);
  EXPECT_EQ(out, b);
  std::vector<std::string> keys = {"k0", "k1", "k2", "k0"};
  EXPECT_EQ(s.batch_exists(keys), 2u);
  EXPECT_EQ(s.stats().set_skipped, 1u);
  // No temporary file is left behind.
  for (const auto& e : fs::directory_iterator(s.dir())) EXPECT_EQ(e.path().extension(), ".bin") << e.path();
}

TEST(FileStorage, DamagedObjectsAreMissesNeverData) {
  FileStorage s(fresh_dir("bad"), 1 << 20);
  auto a = payload(4096, 3);
  std::vector<std::uint8_t> out(4096, 0xee);
  const auto untouched = out;
  EXPECT_EQ(s.get("nothing", out), StorageMiss::Missing);
  ASSERT_TRUE(s.set("flip", a));
  {
    std::fstream f(s.path_of("flip"), std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(40 + 4 + 100);  // header, key "flip", then a payload byte
    f.put(static_cast<char>(a[100] ^ 0x10));
  }
  EXPECT_EQ(s.get("flip", out), StorageMiss::Corrupt);
  ASSERT_TRUE(s.set("cut", a));
  fs::resize_file(s.path_of("cut"), 40 + 3 + 2000);
  EXPECT_EQ(s.get("cut", out), StorageMiss::Short);
  ASSERT_TRUE(s.set("head", a));
  fs::resize_file(s.path_of("head"), 10);
  EXPECT_EQ(s.get("head", out), StorageMiss::Short);
  ASSERT_TRUE(s.set("other", a));
  fs::copy_file(s.path_of("other"), s.path_of("renamed"));  // an object stored under another key
  EXPECT_EQ(s.get("renamed", out), StorageMiss::WrongKey);  // a copy of another key's object
  std::vector<std::uint8_t> small(10);
  EXPECT_EQ(s.get("other", small), StorageMiss::WrongLength);
  (void)untouched;  // (a miss leaves unspecified bytes in `out`: callers read into scratch buffers)
  auto st = s.stats();
  EXPECT_EQ(st.hits, 0u);
  EXPECT_EQ(st.corrupt + st.short_reads + st.missing, 6u);
}

TEST(FileStorage, ForeignObjectUnderAKeyIsRejected) {
  FileStorage s(fresh_dir("foreign"), 1 << 20);
  auto a = payload(64, 4);
  ASSERT_TRUE(s.set("alpha", a));
  ASSERT_TRUE(s.set("beta", payload(64, 5)));
  fs::copy_file(s.path_of("alpha"), s.path_of("beta"), fs::copy_options::overwrite_existing);
  std::vector<std::uint8_t> out(64);
  EXPECT_EQ(s.get("beta", out), StorageMiss::WrongKey);
}

TEST(FileStorage, LruCapacityEvictsLeastRecentlyUsed) {
  const std::uint64_t object = 40 + 2 + 100;
  FileStorage s(fresh_dir("lru"), 3 * object);
  for (const char* k : {"k0", "k1", "k2"}) ASSERT_TRUE(s.set(k, payload(100, 1)));
  std::vector<std::uint8_t> out(100);
  EXPECT_EQ(s.get("k0", out), StorageMiss::None);  // k0 becomes the most recent; k1 is now oldest
  ASSERT_TRUE(s.set("k3", payload(100, 2)));
  EXPECT_FALSE(s.exists("k1"));
  EXPECT_FALSE(fs::exists(s.path_of("k1")));
  EXPECT_TRUE(s.exists("k0") && s.exists("k2") && s.exists("k3"));
  EXPECT_EQ(s.used_bytes(), 3 * object);
  EXPECT_EQ(s.stats().evicted, 1u);
  EXPECT_FALSE(s.set("huge", payload(10000, 1)));  // larger than the whole capacity
}

TEST(FileStorage, AnExplicitDirectoryIsReusedAcrossInstances) {
  const auto dir = fresh_dir("reuse");
  {
    FileStorage s(dir, 1 << 20);
    ASSERT_TRUE(s.set("kept", payload(50, 9)));
  }
  FileStorage again(dir, 1 << 20);
  std::vector<std::uint8_t> out(50);
  EXPECT_EQ(again.get("kept", out), StorageMiss::None);
  EXPECT_EQ(out, payload(50, 9));
}

TEST(FileStorage, ConcurrentWritersOfOneKeyLeaveOneWholeObject) {
  const auto dir = fresh_dir("race");
  std::vector<std::thread> writers;
  for (int w = 0; w < 8; ++w)
    writers.emplace_back([&, w] {
      FileStorage s(dir, 1 << 24);  // one instance per writer, as ranks sharing a directory have
      for (int i = 0; i < 20; ++i) s.set("shared", payload(8192, static_cast<std::uint8_t>(w)));
    });
  for (auto& t : writers) t.join();
  FileStorage reader(dir, 1 << 24);
  std::vector<std::uint8_t> out(8192);
  ASSERT_EQ(reader.get("shared", out), StorageMiss::None);
  bool matches_a_writer = false;
  for (int w = 0; w < 8; ++w) matches_a_writer = matches_a_writer || out == payload(8192, static_cast<std::uint8_t>(w));
  EXPECT_TRUE(matches_a_writer);
  for (const auto& e : fs::directory_iterator(dir)) EXPECT_EQ(e.path().extension(), ".bin") << e.path();
}

TEST(FileStorage, SweepRemovesTheLeastRecentlyReadFirstAndNeverAnOpenRead) {
  const std::string dir = fresh_dir("sweep");
  FileStorage s(dir, 1 << 30, /*evicts=*/false);
  s.set_recency_on_disk(true);
  const auto a = payload(1000, 5);
  const auto now = fs::file_time_type::clock::now();
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(s.set("k" + std::to_string(i), a));
    fs::last_write_time(s.path_of("k" + std::to_string(i)), now - std::chrono::hours(10 - i));  // k0 oldest
  }
  std::ofstream(fs::path(dir) / ".tmp.1.2.k9") << "half an object";  // never a sweep's business
  const std::uint64_t one = fs::file_size(s.path_of("k0"));
  std::vector<std::uint8_t> out(1000);
  ASSERT_EQ(s.get("k0", out), StorageMiss::None);  // read now: the most recent
  // A dry run counts; a sweep to three objects removes k1 and k2 (oldest, unread).
  auto r = sweep_directory(dir, 3 * one, /*dry_run=*/true);
  EXPECT_EQ(r.objects, 5u);
  EXPECT_EQ(r.removed, 2u);
  EXPECT_TRUE(fs::exists(s.path_of("k1")));
  r = sweep_directory(dir, 3 * one);
  EXPECT_EQ(r.removed, 2u);
  EXPECT_EQ(r.removed_bytes, 2 * one);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(fs::exists(s.path_of("k" + std::to_string(i))), i == 0 || i >= 3) << i;
  EXPECT_TRUE(fs::exists(fs::path(dir) / ".tmp.1.2.k9"));
  // A read that has opened its object finishes whole although a sweep removes the object.
  std::ifstream open_read(s.path_of("k3"), std::ios::binary);
  EXPECT_EQ(sweep_directory(dir, 0).removed, 3u);
  std::vector<char> bytes((std::istreambuf_iterator<char>(open_read)), std::istreambuf_iterator<char>());
  EXPECT_EQ(bytes.size(), one);
  EXPECT_EQ(s.get("k3", out), StorageMiss::Missing);  // a later read misses (and recomputes)
  EXPECT_THROW(sweep_directory(dir + "/nothing", 0), InputError);
}

TEST(FileStorage, ASharedStoreSeesOtherJobsObjectsAndNamesTheirWriter) {
  const std::string dir = fresh_dir("shared");
  FileStorage mine(dir, 1 << 20, false), other(dir, 1 << 20, false), isolated(dir, 1 << 20, false);
  mine.set_shared(true);
  mine.set_job(1);
  other.set_job(2);
  const auto a = payload(500, 9);
  ASSERT_TRUE(other.set("theirs", a));  // written after `mine` opened the directory
  EXPECT_FALSE(isolated.exists("theirs"));  // not shared: only what was there at the start, or its own
  EXPECT_TRUE(mine.exists("theirs"));
  ASSERT_TRUE(mine.set("ours", a));
  std::vector<std::uint8_t> out(500);
  ASSERT_EQ(mine.get("theirs", out), StorageMiss::None);
  ASSERT_EQ(mine.get("ours", out), StorageMiss::None);
  EXPECT_EQ(mine.stats().hits, 2u);
  EXPECT_EQ(mine.stats().other_job_hits, 1u);
}

TEST(FileStorage, AnObjectASweepRemovedIsForgottenAndWrittenAgain) {
  // Two jobs share a directory; a sweep (another job's end-of-run sweep, `kvgrid store`) removes
  // objects both have indexed. Neither may count them present any longer, and the next set of a
  // removed key writes it again (it was skipped as "already there": lost for every later reader).
  const std::string dir = fresh_dir("swept");
  FileStorage mine(dir, 1 << 20, false), other(dir, 1 << 20, false);
  mine.set_shared(true);
  other.set_shared(true);
  const auto a = payload(700, 3);
  ASSERT_TRUE(mine.set("k0", a));
  ASSERT_TRUE(mine.set("k1", a));
  ASSERT_TRUE(other.exists("k0"));  // adopted by the other job
  ASSERT_TRUE(other.exists("k1"));
  EXPECT_EQ(mine.stats().sets, 2u);
  EXPECT_EQ(sweep_directory(dir, 0).removed, 2u);
  EXPECT_FALSE(other.exists("k0"));  // looked up on disk: gone
  ASSERT_TRUE(mine.set("k0", a));     // written again, not skipped
  EXPECT_EQ(mine.stats().sets, 3u);
  EXPECT_EQ(mine.stats().set_skipped, 0u);
  EXPECT_TRUE(fs::exists(mine.path_of("k0")));
  EXPECT_TRUE(other.exists("k0"));  // and seen again
  std::vector<std::uint8_t> out(700);
  EXPECT_EQ(other.get("k0", out), StorageMiss::None);
  EXPECT_EQ(out, a);
  EXPECT_FALSE(mine.exists("k1"));
  EXPECT_EQ(mine.used_bytes(), fs::file_size(mine.path_of("k0")));  // k1 forgotten, k0 counted once
  ASSERT_TRUE(mine.set("k0", a));  // still there: refreshed, not written
  EXPECT_EQ(mine.stats().set_skipped, 1u);
  // This instance's own sweep forgets what it removed.
  EXPECT_EQ(mine.sweep(0).removed, 1u);
  EXPECT_EQ(mine.used_bytes(), 0u);
  // A store of its own (evicting, not shared) keeps trusting its index: only it removes objects.
  FileStorage own(fresh_dir("own"), 1 << 20);
  ASSERT_TRUE(own.set("k", a));
  fs::remove(own.path_of("k"));
  EXPECT_TRUE(own.exists("k"));
}

}  // namespace
}  // namespace kvgrid::cache
