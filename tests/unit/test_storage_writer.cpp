// The storage tier's background writes (storage_writer.hpp) over an in-memory store: a simulated
// batch lands at its drawn tick (hand-computed, the queue serializing batches) and is invisible to
// the store before it, but present to a backup; threaded batches all land before `settle` returns;
// failed writes count per group; the destructor lands what is left.
#include <gtest/gtest.h>

#include <condition_variable>
#include <map>
#include <mutex>
#include <set>

#include "cache/storage_tier.hpp"
#include "cache/storage_writer.hpp"

namespace kvgrid::cache {
namespace {

// A map of objects. `gate`: set_batch waits until release(); `fail`: keys whose write fails.
class MemStore final : public ObjectStore {
 public:
  bool writes_in_batches() const override { return true; }  // (the coalescing tests count store batches)
  bool gate = false;
  std::set<std::string> fail;
  void release() {
    std::lock_guard<std::mutex> g(mu_);
    gate = false;
    cv_.notify_all();
  }
  bool set(const std::string& key, std::span<const std::uint8_t> payload) override {
    std::lock_guard<std::mutex> g(mu_);
    if (fail.count(key)) return false;
    objects_.emplace(key, std::vector<std::uint8_t>(payload.begin(), payload.end()));
    return true;
  }
  std::vector<bool> set_batch(std::span<const std::string> keys, std::span<const std::span<const std::uint8_t>> payloads) override {
    {
      std::unique_lock<std::mutex> g(mu_);
      cv_.wait(g, [&] { return !gate; });
      ++batches;
    }
    std::vector<bool> ok;
    for (std::size_t i = 0; i < keys.size(); ++i) ok.push_back(set(keys[i], payloads[i]));
    return ok;
  }
  StorageMiss get(const std::string& key, std::span<std::uint8_t> out) override {
    std::lock_guard<std::mutex> g(mu_);
    auto it = objects_.find(key);
    if (it == objects_.end()) return StorageMiss::Missing;
    std::copy(it->second.begin(), it->second.end(), out.begin());
    return StorageMiss::None;
  }
  bool exists(const std::string& key) override {
    std::lock_guard<std::mutex> g(mu_);
    return objects_.count(key) > 0;
  }
  StorageStats stats() const override { return {}; }
  void set_job(std::uint64_t) override {}
  void set_shared(bool) override {}
  void set_recency_on_disk(bool) override {}
  SweepResult sweep(std::uint64_t) override { return {}; }
  void truncate(const std::string&) override {}
  void corrupt(const std::string&) override {}
  std::string where() const override { return "memory"; }
  int batches = 0;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::vector<std::uint8_t>> objects_;
};

// A batch of `groups` groups of `per` objects of `bytes` bytes each, keys "<tag>.<g>.<o>".
WriteBatch batch(const std::string& tag, std::size_t groups, std::size_t per, std::size_t bytes, bool pages = true) {
  WriteBatch b;
  for (std::size_t g = 0; g < groups; ++g) {
    const std::size_t id = b.open_group(pages);
    for (std::size_t o = 0; o < per; ++o) {
      const auto& v = b.bytes.emplace_back(bytes, static_cast<std::uint8_t>(g * per + o));
      b.add(id, tag + "." + std::to_string(g) + "." + std::to_string(o), v);
    }
  }
  return b;
}

TEST(StorageWriter, SimulatedBatchLandsAtItsTickAndTheQueueSerializes) {
  MemStore store;
  StorageTierStats stats;
  std::uint64_t clock = 1'000;
  // No jitter: a batch takes latency + bytes / bandwidth = 100 + 4 × 1000 / 2 = 2,100 ns.
  StorageWriter w(store, stats, 0, WriterTiming{[&] { return clock; }, 2.0, 100, 0.0, 7});
  w.submit(batch("a", 2, 2, 1000));
  w.submit(batch("b", 1, 4, 1000));  // queued behind a: 3,100 → 5,200
  const auto rec = w.take_records();
  ASSERT_EQ(rec.size(), 2u);
  EXPECT_EQ(rec[0].start_ns, 1'000u);
  EXPECT_EQ(rec[0].end_ns, 3'100u);
  EXPECT_EQ(rec[1].start_ns, 3'100u);
  EXPECT_EQ(rec[1].end_ns, 5'200u);
  EXPECT_EQ(rec[1].bytes, 4'000u);
  // Before its tick an object is not in the store, but a backup sees it in flight.
  clock = 3'099;
  w.settle();
  EXPECT_FALSE(store.exists("a.0.0"));
  const std::vector<std::string> keys{"a.0.0", "b.0.3", "c.0.0"};
  EXPECT_EQ(w.present(keys), (std::vector<bool>{true, true, false}));
  EXPECT_EQ(stats.objects_written, 0u);
  EXPECT_EQ(w.in_flight(), 2u);
  clock = 3'100;  // a is due, b is not
  w.settle();
  EXPECT_TRUE(store.exists("a.1.1"));
  EXPECT_FALSE(store.exists("b.0.0"));
  EXPECT_EQ(stats.objects_written, 4u);
  EXPECT_EQ(stats.written_pages, 2u);
  EXPECT_EQ(stats.written_bytes, 4'000u);
  EXPECT_EQ(w.in_flight(), 1u);
  w.drain();  // the end of a run: b lands although its tick is ahead
  EXPECT_TRUE(store.exists("b.0.3"));
  EXPECT_EQ(stats.objects_written, 8u);
  EXPECT_EQ(stats.written_pages, 3u);
  EXPECT_EQ(w.present(keys), (std::vector<bool>{true, true, false}));
  // A later batch starts at now once the queue is empty.
  clock = 10'000;
  w.submit(batch("c", 1, 1, 200));
  EXPECT_EQ(w.take_records().at(0).end_ns, 10'200u);
}

TEST(StorageWriter, SimulatedTicksAreSeeded) {
  auto ticks = [](std::uint64_t seed) {
    MemStore store;
    StorageTierStats stats;
    StorageWriter w(store, stats, 0, WriterTiming{[] { return std::uint64_t{0}; }, 1.0, 0, 0.5, seed});
    for (int i = 0; i < 4; ++i) w.submit(batch("k" + std::to_string(i), 1, 1, 1000));
    std::vector<std::uint64_t> out;
    for (const auto& r : w.take_records()) out.push_back(r.end_ns);
    return out;
  };
  EXPECT_EQ(ticks(3), ticks(3));
  EXPECT_NE(ticks(3), ticks(4));
  for (auto t : ticks(3)) EXPECT_GT(t, 0u);
}

TEST(StorageWriter, ThreadedSettleWaitsForEveryQueuedBatch) {
  MemStore store;
  store.gate = true;  // nothing lands until released
  StorageTierStats stats;
  StorageWriter w(store, stats, 2, WriterTiming{});
  for (int i = 0; i < 6; ++i) w.submit(batch("t" + std::to_string(i), 4, 8, 64));
  EXPECT_FALSE(store.exists("t0.0.0"));  // held at the gate
  EXPECT_EQ(stats.objects_written, 0u);  // outcomes are applied on the loop only
  EXPECT_TRUE(w.present(std::vector<std::string>{"t5.3.7"}).at(0));
  store.release();
  w.settle();
  EXPECT_EQ(w.in_flight(), 0u);
  EXPECT_LE(store.batches, 6);  // queued batches land together (see below)
  for (int i = 0; i < 6; ++i) EXPECT_TRUE(store.exists("t" + std::to_string(i) + ".3.7")) << i;
  EXPECT_EQ(stats.objects_written, 6u * 32u);
  EXPECT_EQ(stats.written_pages, 24u);
}

// A writer thread hands every batch queued behind the one it took to the store as one batch (a
// segment store writes it as one file); each batch keeps its own outcomes.
TEST(StorageWriter, ThreadedQueuedBatchesLandAsOneStoreBatch) {
  MemStore store;
  store.gate = true;  // the thread holds its first batch at the gate while the rest queue
  StorageTierStats stats;
  StorageWriter w(store, stats, 1, WriterTiming{});
  for (int i = 0; i < 6; ++i) w.submit(batch("q" + std::to_string(i), 2, 4, 64));
  store.release();
  w.settle();
  EXPECT_LE(store.batches, 2);  // the first alone (or with the rest, had the thread started late), then the rest
  EXPECT_GE(store.batches, 1);
  EXPECT_EQ(stats.objects_written, 6u * 8u);
  EXPECT_EQ(stats.written_pages, 12u);
  for (int i = 0; i < 6; ++i) EXPECT_TRUE(store.exists("q" + std::to_string(i) + ".1.3")) << i;
}

TEST(StorageWriter, AFailedObjectFailsItsGroupOnly) {
  MemStore store;
  store.fail = {"f.1.0"};
  StorageTierStats stats;
  StorageWriter w(store, stats, 0, WriterTiming{});  // inline: lands at submission
  w.submit(batch("f", 3, 2, 10));
  EXPECT_EQ(stats.objects_written, 5u);
  EXPECT_EQ(stats.written_bytes, 50u);
  EXPECT_EQ(stats.written_pages, 2u);
  EXPECT_EQ(stats.write_failed, 1u);
  EXPECT_FALSE(store.exists("f.1.0"));
  EXPECT_TRUE(store.exists("f.1.1"));
  // Groups that are not pages (a SWA or MAMBA slot) land without counting a page.
  w.submit(batch("s", 2, 1, 10, false));
  EXPECT_EQ(stats.written_pages, 2u);
  EXPECT_EQ(stats.objects_written, 7u);
}

TEST(StorageWriter, TeardownLandsWhatIsLeft) {
  MemStore store;
  StorageTierStats stats;
  {
    std::uint64_t clock = 0;
    StorageWriter w(store, stats, 0, WriterTiming{[&] { return clock; }, 1.0, 1'000'000, 0.0, 1});
    w.submit(batch("d", 1, 1, 8));
    EXPECT_FALSE(store.exists("d.0.0"));
  }
  EXPECT_TRUE(store.exists("d.0.0"));
  EXPECT_EQ(stats.objects_written, 1u);
  {
    StorageWriter w(store, stats, 2, WriterTiming{});
    w.submit(batch("e", 2, 2, 8));
  }
  EXPECT_TRUE(store.exists("e.1.1"));
  EXPECT_EQ(stats.objects_written, 5u);
}

}  // namespace
}  // namespace kvgrid::cache
