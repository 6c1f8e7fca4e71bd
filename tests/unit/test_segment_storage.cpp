// The file backend's segment layout (segment_storage.hpp): a batch is one segment file; damaged
// objects and segments are misses, never data; the same answers, evictions and statistics as a
// file per object over a randomized sequence (the layout never changes a decision; the seed is
// printed, KVGRID_TEST_SEED replays it); reuse of a
// directory; concurrent writers; a sweep removes whole segments, least recently read first; a
// shared store sees other writers' segments.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "cache/file_storage.hpp"
#include "cache/segment_storage.hpp"
#include "core/check.hpp"
#include "storage_objects.hpp"

namespace kvgrid::cache {
namespace {

namespace fs = std::filesystem;

using test_objects::payload;
std::string fresh_dir(const std::string& tag) { return test_objects::fresh_dir("segments", tag); }

std::vector<std::string> files(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<bool> put(ObjectStore& s, const std::vector<std::string>& keys, const std::vector<std::vector<std::uint8_t>>& ps) {
  std::vector<std::span<const std::uint8_t>> spans(ps.begin(), ps.end());
  return s.set_batch(keys, spans);
}

TEST(SegmentStorage, ABatchIsOneSegmentFile) {
  SegmentStorage s(fresh_dir("rt"), 1 << 20);
  const std::vector<std::vector<std::uint8_t>> ps = {payload(1000, 1), payload(1000, 2), payload(1000, 3), payload(1000, 4)};
  const auto ok = put(s, {"k0", "k1", "k2", "k1"}, ps);  // k1 twice: the second is an existing key
  EXPECT_EQ(ok, std::vector<bool>(4, true));
  const auto names = files(s.dir());
  ASSERT_EQ(names.size(), 1u);  // no temporary file left behind either
  EXPECT_EQ(names[0].substr(names[0].size() - 4), ".seg");
  EXPECT_EQ(s.segment_of("k2"), names[0]);
  // head 32 + index (24 + 2) x 3 + objects (40 + 2 + 1000) x 3
  EXPECT_EQ(fs::file_size(fs::path(s.dir()) / names[0]), 32u + 3 * 26 + 3 * 1042);
  std::vector<std::uint8_t> out(1000);
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(s.get("k" + std::to_string(i), out), StorageMiss::None) << i;
    EXPECT_EQ(out, ps[static_cast<std::size_t>(i)]);
  }
  EXPECT_EQ(s.batch_exists(std::vector<std::string>{"k0", "k1", "k9", "k2"}), 2u);
  ASSERT_TRUE(s.set("k3", payload(1000, 5)));  // a batch of one: a second segment
  EXPECT_EQ(files(s.dir()).size(), 2u);
  EXPECT_EQ(s.segments(), 2u);
  const auto st = s.stats();
  EXPECT_EQ(st.sets, 4u);
  EXPECT_EQ(st.set_skipped, 1u);
  EXPECT_EQ(st.bytes_written, 4u * 1042);
  EXPECT_EQ(s.used_bytes(), 4u * 1042);
}

TEST(SegmentStorage, DamagedObjectsAndSegmentsAreMissesNeverData) {
  const std::string dir = fresh_dir("bad");
  SegmentStorage s(dir, 1 << 20);
  const auto a = payload(4096, 3);
  std::vector<std::uint8_t> out(4096);
  EXPECT_EQ(s.get("nothing", out), StorageMiss::Missing);
  ASSERT_EQ(put(s, {"flip", "cut", "fine", "last"}, {a, a, a, a}), std::vector<bool>(4, true));
  s.corrupt("flip");
  EXPECT_EQ(s.get("flip", out), StorageMiss::Corrupt);
  s.truncate("cut");
  EXPECT_EQ(s.get("cut", out), StorageMiss::Short);
  EXPECT_EQ(s.get("fine", out), StorageMiss::None);  // its neighbours in the segment are whole
  EXPECT_EQ(out, a);
  std::vector<std::uint8_t> small(10);
  EXPECT_EQ(s.get("fine", small), StorageMiss::WrongLength);
  // The file cut short: the last object is short, the others still whole.
  const auto seg = fs::path(dir) / s.segment_of("last");
  fs::resize_file(seg, fs::file_size(seg) - 100);
  EXPECT_EQ(s.get("last", out), StorageMiss::Short);
  EXPECT_EQ(s.get("fine", out), StorageMiss::None);
  {
    SegmentStorage again(dir, 1 << 20);  // the truncation was written to the segment's index
    EXPECT_EQ(again.get("cut", out), StorageMiss::Short);
    EXPECT_EQ(again.get("fine", out), StorageMiss::None);
  }
  {  // an index byte flipped: the segment is not adopted at all
    std::fstream f(seg, std::ios::binary | std::ios::in | std::ios::out);
    f.seekg(32 + 24);
    const char c = static_cast<char>(f.get());
    f.seekp(32 + 24);
    f.put(static_cast<char>(c ^ 1));
  }
  SegmentStorage damaged(dir, 1 << 20);
  EXPECT_EQ(damaged.get("fine", out), StorageMiss::Missing);
  EXPECT_FALSE(damaged.exists("fine"));
  const auto st = s.stats();
  EXPECT_EQ(st.hits, 2u);
  EXPECT_EQ(st.corrupt + st.short_reads + st.missing, 5u);
}

// The layout is not a decision: a file per object and segments answer every call alike.
TEST(SegmentStorage, SameAnswersEvictionsAndStatisticsAsAFilePerObject) {
  const char* env = std::getenv("KVGRID_TEST_SEED");
  const std::uint64_t seed = env ? std::strtoull(env, nullptr, 10) : std::random_device{}();
  std::printf("seed %llu (KVGRID_TEST_SEED)\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  const std::uint64_t object = 40 + 3 + 200;  // keys "k00".."k39"
  FileStorage files_(fresh_dir("diff-f"), 12 * object);
  SegmentStorage segs(fresh_dir("diff-s"), 12 * object);
  auto key = [&] {
    char b[8];
    std::snprintf(b, sizeof(b), "k%02d", static_cast<int>(rng() % 40));
    return std::string(b);
  };
  std::vector<std::uint8_t> out_f(200), out_s(200);
  for (int step = 0; step < 600; ++step) {
    const int op = static_cast<int>(rng() % 3);
    if (op == 0) {  // a batch of 1..16 writes: more than the capacity's 12 evicts within the batch
      std::vector<std::string> keys;
      std::vector<std::vector<std::uint8_t>> ps;
      for (std::size_t n = 1 + rng() % 16; n > 0; --n) {
        keys.push_back(key());
        ps.push_back(payload(200, static_cast<std::uint8_t>(keys.back()[2])));
      }
      ASSERT_EQ(put(files_, keys, ps), put(segs, keys, ps)) << "step " << step;
    } else if (op == 1) {
      const auto k = key();
      if (rng() % 8 == 0) {  // a reader expecting another length
        std::vector<std::uint8_t> small_f(100), small_s(100);
        ASSERT_EQ(files_.get(k, small_f), segs.get(k, small_s)) << "step " << step << " key " << k;
        continue;
      }
      const auto mf = files_.get(k, out_f), ms = segs.get(k, out_s);
      ASSERT_EQ(mf, ms) << "step " << step << " key " << k;
      if (mf == StorageMiss::None) {
        ASSERT_EQ(out_f, out_s);
      }
    } else {
      const auto k = key();
      ASSERT_EQ(files_.exists(k), segs.exists(k)) << "step " << step << " key " << k;
    }
  }
  const auto f = files_.stats(), s = segs.stats();
  EXPECT_EQ(f.sets, s.sets);
  EXPECT_EQ(f.set_skipped, s.set_skipped);
  EXPECT_EQ(f.evicted, s.evicted);
  EXPECT_EQ(f.hits, s.hits);
  EXPECT_EQ(f.missing, s.missing);
  EXPECT_EQ(files_.used_bytes(), segs.used_bytes());
  EXPECT_GT(s.evicted, 0u);
  // On disk: exactly the segments that hold a live object (the last one evicted takes its file).
  EXPECT_EQ(files(segs.dir()).size(), segs.segments());
}

// A key evicted within its own batch and reserved again is one live object, not two: its segment
// still leaves with its last live object.
TEST(SegmentStorage, AKeyEvictedWithinItsBatchCountsOnce) {
  const std::uint64_t object = 40 + 1 + 100;
  FileStorage f(fresh_dir("twice-f"), 3 * object);
  SegmentStorage s(fresh_dir("twice-s"), 3 * object);
  const std::vector<std::string> keys = {"K", "A", "B", "C", "K"};  // C evicts K, K evicts A
  const std::vector<std::vector<std::uint8_t>> ps(5, payload(100, 1));
  EXPECT_EQ(put(f, keys, ps), put(s, keys, ps));
  EXPECT_EQ(f.stats().evicted, s.stats().evicted);
  std::vector<std::uint8_t> out(100);
  for (const std::string k : {"K", "A", "B", "C"}) EXPECT_EQ(f.get(k, out), s.get(k, out)) << k;
  // Three new objects evict the first batch's three: its file goes.
  const std::vector<std::string> fresh = {"x", "y", "z"};
  EXPECT_EQ(put(f, fresh, {ps[0], ps[0], ps[0]}), put(s, fresh, {ps[0], ps[0], ps[0]}));
  EXPECT_EQ(s.segments(), 1u);
  EXPECT_EQ(files(s.dir()).size(), 1u);
  EXPECT_EQ(f.used_bytes(), s.used_bytes());
}

// Another process's objects (a rank that reads what its stage's writer wrote: MLA's TP replicas,
// CP replicas under unified keys): a read finds them as opening a file by name does, in a store
// that is not shared and was opened before they were written.
TEST(SegmentStorage, AReadFindsAnotherWritersObjectsAsAFilePerObjectDoes) {
  const std::string df = fresh_dir("reader-f"), ds = fresh_dir("reader-s");
  FileStorage fw(df, 1 << 20), fr(df, 1 << 20);
  SegmentStorage sw(ds, 1 << 20), sr(ds, 1 << 20);
  std::vector<std::uint8_t> of(200), os(200);
  for (int round = 0; round < 4; ++round) {
    const std::string n = std::to_string(round);
    EXPECT_EQ(fr.get("a" + n, of), sr.get("a" + n, os)) << "before it is written, round " << n;
    const std::vector<std::vector<std::uint8_t>> ps = {payload(200, static_cast<std::uint8_t>(round)), payload(200, 9)};
    EXPECT_EQ(put(fw, {"a" + n, "b" + n}, ps), put(sw, {"a" + n, "b" + n}, ps));
    ASSERT_EQ(fr.get("a" + n, of), StorageMiss::None) << n;
    ASSERT_EQ(sr.get("a" + n, os), StorageMiss::None) << n;
    EXPECT_EQ(of, os);
    EXPECT_EQ(fr.exists("b" + n), sr.exists("b" + n)) << n;  // (a lookup of a store not shared: its own only)
  }
  // A failpoint's damage on the reader's side reaches the writer's object too.
  sr.corrupt("b0");
  EXPECT_EQ(sw.get("b0", os), StorageMiss::Corrupt);
}

TEST(SegmentStorage, AnExplicitDirectoryIsReusedAcrossInstances) {
  const auto dir = fresh_dir("reuse");
  {
    SegmentStorage s(dir, 1 << 20);
    ASSERT_EQ(put(s, {"kept", "also"}, {payload(50, 9), payload(50, 8)}), std::vector<bool>(2, true));
  }
  SegmentStorage again(dir, 1 << 20);
  std::vector<std::uint8_t> out(50);
  EXPECT_EQ(again.get("kept", out), StorageMiss::None);
  EXPECT_EQ(out, payload(50, 9));
  EXPECT_EQ(again.used_bytes(), 2u * (40 + 4 + 50));
  ASSERT_TRUE(again.set("more", payload(50, 7)));
  EXPECT_EQ(files(dir).size(), 2u);  // another writer's name: no clash with the first instance's
}

TEST(SegmentStorage, ConcurrentWritersLeaveWholeObjectsOnly) {
  const auto dir = fresh_dir("race");
  std::vector<std::thread> writers;
  for (int w = 0; w < 6; ++w)
    writers.emplace_back([&, w] {
      SegmentStorage s(dir, 1 << 24, false);  // one instance per writer, as ranks sharing a directory have
      for (int i = 0; i < 10; ++i) {
        std::vector<std::vector<std::uint8_t>> ps(4, payload(8192, static_cast<std::uint8_t>(w)));
        put(s, {"shared", "k" + std::to_string(i), "w" + std::to_string(w), "k" + std::to_string(i + 1)}, ps);
      }
    });
  for (auto& t : writers) t.join();
  SegmentStorage reader(dir, 1 << 24, false);
  std::vector<std::uint8_t> out(8192);
  for (const std::string k : {"shared", "k0", "k5", "k10", "w0", "w5"}) {
    ASSERT_EQ(reader.get(k, out), StorageMiss::None) << k;
    bool matches_a_writer = false;
    for (int w = 0; w < 6; ++w) matches_a_writer = matches_a_writer || out == payload(8192, static_cast<std::uint8_t>(w));
    EXPECT_TRUE(matches_a_writer) << k;
  }
  for (const auto& n : files(dir)) EXPECT_EQ(n.substr(n.size() - 4), ".seg") << n;
}

TEST(SegmentStorage, ASweepRemovesWholeSegmentsLeastRecentlyReadFirst) {
  const std::string dir = fresh_dir("sweep");
  SegmentStorage s(dir, 1 << 30, /*evicts=*/false);
  s.set_recency_on_disk(true);
  const auto a = payload(1000, 5);
  const auto now = fs::file_time_type::clock::now();
  for (int i = 0; i < 4; ++i) {  // four segments of two objects; s0 oldest
    const std::string n = std::to_string(i);
    ASSERT_EQ(put(s, {"a" + n, "b" + n}, {a, a}), std::vector<bool>(2, true));
    fs::last_write_time(fs::path(dir) / s.segment_of("a" + n), now - std::chrono::hours(10 - i));
  }
  const std::uint64_t one = fs::file_size(fs::path(dir) / s.segment_of("a0"));
  std::vector<std::uint8_t> out(1000);
  ASSERT_EQ(s.get("b0", out), StorageMiss::None);  // read now: s0 is the most recent
  const SweepResult r = s.sweep(2 * one);
  EXPECT_EQ(r.objects, 4u);  // segments, the sweep's unit
  EXPECT_EQ(r.removed, 2u);
  EXPECT_EQ(r.removed_bytes, 2 * one);
  for (int i = 0; i < 4; ++i) {
    const std::string n = std::to_string(i);
    const bool kept = i == 0 || i == 3;
    EXPECT_EQ(s.exists("a" + n), kept) << n;
    EXPECT_EQ(s.get("b" + n, out) == StorageMiss::None, kept) << n;
  }
  EXPECT_EQ(s.segments(), 2u);
}

// cache.storage_fsync: synced writes (file data before the rename, the directory after) read back
// in both layouts; a directory that cannot be opened to sync is an input error naming it.
TEST(SegmentStorage, SyncedWritesRoundTripInBothLayouts) {
  const auto a = payload(3000, 4);
  std::vector<std::uint8_t> out(3000);
  FileStorage f(fresh_dir("sync-f"), 1 << 20);
  SegmentStorage s(fresh_dir("sync-s"), 1 << 20);
  for (ObjectStore* store : {static_cast<ObjectStore*>(&f), static_cast<ObjectStore*>(&s)}) {
    store->set_fsync(true);
    ASSERT_EQ(put(*store, {"x", "y"}, {a, a}), std::vector<bool>(2, true));
    EXPECT_EQ(store->get("y", out), StorageMiss::None);
    EXPECT_EQ(out, a);
    store->set_fsync(false);
    ASSERT_TRUE(store->set("z", a));
  }
  const std::string gone = fresh_dir("sync-gone");
  SegmentStorage g(gone, 1 << 20);
  fs::remove_all(gone);
  try {
    g.set_fsync(true);
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(gone + ": cannot open the storage directory to sync it (cache.storage_fsync)"),
              std::string::npos)
        << e.what();
  }
}

TEST(SegmentStorage, ASharedStoreSeesOtherWritersSegments) {
  const std::string dir = fresh_dir("shared");
  SegmentStorage mine(dir, 1 << 20, false), other(dir, 1 << 20, false), isolated(dir, 1 << 20, false);
  mine.set_shared(true);
  mine.set_job(1);
  other.set_job(2);
  const auto a = payload(500, 9);
  std::vector<std::uint8_t> out(500);
  EXPECT_FALSE(mine.exists("theirs"));  // listed once: nothing yet
  ASSERT_EQ(put(other, {"theirs", "too"}, {a, a}), std::vector<bool>(2, true));  // after `mine` looked
  EXPECT_FALSE(isolated.exists("theirs"));  // not shared: what was there at the start, or its own
  EXPECT_TRUE(mine.exists("theirs"));
  ASSERT_TRUE(mine.set("ours", a));
  ASSERT_EQ(mine.get("too", out), StorageMiss::None);
  ASSERT_EQ(mine.get("ours", out), StorageMiss::None);
  EXPECT_EQ(mine.stats().hits, 2u);
  EXPECT_EQ(mine.stats().other_job_hits, 1u);
  // Another writer's segment swept away: a miss, not stale data.
  fs::remove(fs::path(dir) / other.segment_of("theirs"));
  EXPECT_EQ(mine.get("theirs", out), StorageMiss::Missing);
  EXPECT_FALSE(mine.exists("too"));
}

}  // namespace
}  // namespace kvgrid::cache
