// File storage backend throughput (a file per object, and segments): 1,000 objects of 64 KiB (one full-payload page each) written
// (temporary name + rename, header, checksum) and read back (header, key and checksum validated),
// into a directory given by KVGRID_BENCH_DIR (default: the system temp directory). jobs/bench_storage.sh
// runs it next to `dd` of the same bytes.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <filesystem>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "cache/file_storage.hpp"
#include "cache/redis_storage.hpp"
#include "cache/segment_storage.hpp"
#include "cache/storage_tier.hpp"
#include "cache/storage_writer.hpp"

namespace kvgrid::cache {
namespace {

constexpr std::size_t kObject = 64 << 10, kObjects = 1000;

std::string bench_dir(const char* tag) {
  const char* base = std::getenv("KVGRID_BENCH_DIR");
  return (std::filesystem::path(base ? base : std::filesystem::temp_directory_path().string()) /
          ("kvgrid-bench-storage-" + std::string(tag)))
      .string();
}

std::string key(std::size_t i) { return "k" + std::to_string(i) + "_bench"; }

void BM_FileStorageWrite1000(benchmark::State& state) {
  std::vector<std::uint8_t> payload(kObject, 7);
  // A fresh directory per iteration, all removed at the end: deleting files between iterations
  // (with the filesystem discarding their blocks) would slow the next iteration's creates.
  std::size_t round = 0;
  for (auto _ : state) {
    state.PauseTiming();
    FileStorage s(bench_dir("w") + "/" + std::to_string(round++), 1ULL << 40);
    state.ResumeTiming();
    for (std::size_t i = 0; i < kObjects; ++i) {
      payload[0] = static_cast<std::uint8_t>(i);
      if (!s.set(key(i), payload)) state.SkipWithError("set failed");
    }
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * kObjects * kObject));
  std::filesystem::remove_all(bench_dir("w"));
}
BENCHMARK(BM_FileStorageWrite1000)->Unit(benchmark::kMillisecond)->UseRealTime();

// The segment layout (cache.storage_file_layout = "segment") on the caller's thread: batches of
// the argument's size, one segment file each.
void BM_SegmentStorageWrite1000(benchmark::State& state) {
  std::vector<std::uint8_t> payload(kObject, 7);
  const auto per = static_cast<std::size_t>(state.range(0));
  std::vector<std::string> keys(kObjects);
  for (std::size_t i = 0; i < kObjects; ++i) keys[i] = key(i);
  std::size_t round = 0;
  for (auto _ : state) {
    state.PauseTiming();
    SegmentStorage s(bench_dir("g") + "/" + std::to_string(round++), 1ULL << 40);
    std::vector<std::vector<std::uint8_t>> ps(kObjects, payload);
    for (std::size_t i = 0; i < kObjects; ++i) ps[i][0] = static_cast<std::uint8_t>(i);
    std::vector<std::span<const std::uint8_t>> spans(ps.begin(), ps.end());
    state.ResumeTiming();
    for (std::size_t i = 0; i < kObjects; i += per) {
      const std::size_t n = std::min(per, kObjects - i);
      for (const bool ok : s.set_batch(std::span(keys).subspan(i, n), std::span(spans).subspan(i, n)))
        if (!ok) state.SkipWithError("set failed");
    }
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * kObjects * kObject));
  std::filesystem::remove_all(bench_dir("g"));
}
BENCHMARK(BM_SegmentStorageWrite1000)->Arg(8)->Arg(32)->Unit(benchmark::kMillisecond)->UseRealTime();

// The storage tier's path for a backup (storage_writer.hpp, threaded engine): the loop copies each
// node's objects into a batch (8 pages a node here) and hands it to the writer's threads (the
// first argument: how many), which hand the batches queued at the time to the store as one; the
// iteration ends when every object has landed (drain). Second argument: 0 a file per object, 1
// segments.
void BM_StorageWriterWrite1000(benchmark::State& state) {
  std::vector<std::uint8_t> payload(kObject, 7);
  const auto threads = static_cast<std::size_t>(state.range(0));
  constexpr std::size_t kNode = 8;
  std::size_t round = 0;
  for (auto _ : state) {
    state.PauseTiming();
    const std::string dir = bench_dir("sw") + "/" + std::to_string(round++);
    std::unique_ptr<ObjectStore> store;
    if (state.range(1) == 1) store = std::make_unique<SegmentStorage>(dir, 1ULL << 40);
    else store = std::make_unique<FileStorage>(dir, 1ULL << 40);
    ObjectStore& s = *store;
    StorageTierStats stats;
    StorageWriter w(s, stats, threads, WriterTiming{});
    state.ResumeTiming();
    for (std::size_t i = 0; i < kObjects; i += kNode) {
      WriteBatch b;
      for (std::size_t j = i; j < std::min(kObjects, i + kNode); ++j) {
        payload[0] = static_cast<std::uint8_t>(j);
        b.add(b.open_group(true), key(j), b.bytes.emplace_back(payload));
      }
      w.submit(std::move(b));
    }
    w.drain();
    if (stats.objects_written != kObjects) state.SkipWithError("a write failed");
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * kObjects * kObject));
  std::filesystem::remove_all(bench_dir("sw"));
}
BENCHMARK(BM_StorageWriterWrite1000)
    ->ArgsProduct({{1, 2, 4}, {0, 1}})
    ->ArgNames({"threads", "segments"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

void BM_FileStorageRead1000(benchmark::State& state) {
  std::vector<std::uint8_t> payload(kObject, 7), out(kObject);
  const std::string dir = bench_dir("r");
  std::filesystem::remove_all(dir);
  FileStorage s(dir, 1ULL << 40);
  for (std::size_t i = 0; i < kObjects; ++i) s.set(key(i), payload);
  for (auto _ : state)
    for (std::size_t i = 0; i < kObjects; ++i)
      if (s.get(key(i), out) != StorageMiss::None) state.SkipWithError("get missed");
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * kObjects * kObject));
  std::filesystem::remove_all(dir);
}
BENCHMARK(BM_FileStorageRead1000)->Unit(benchmark::kMillisecond)->UseRealTime();

// Reads of the segment layout: 1,000 objects written 32 to a segment, read one by one (open,
// one scattered read at the object's offset, close; validated).
void BM_SegmentStorageRead1000(benchmark::State& state) {
  std::vector<std::uint8_t> payload(kObject, 7), out(kObject);
  const std::string dir = bench_dir("gr");
  std::filesystem::remove_all(dir);
  SegmentStorage s(dir, 1ULL << 40);
  std::vector<std::string> keys;
  std::vector<std::span<const std::uint8_t>> spans;
  for (std::size_t i = 0; i < kObjects; ++i) {
    keys.push_back(key(i));
    spans.push_back(payload);
    if (keys.size() == 32 || i + 1 == kObjects) {
      s.set_batch(keys, spans);
      keys.clear();
      spans.clear();
    }
  }
  for (auto _ : state)
    for (std::size_t i = 0; i < kObjects; ++i)
      if (s.get(key(i), out) != StorageMiss::None) state.SkipWithError("get missed");
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * kObjects * kObject));
  std::filesystem::remove_all(dir);
}
BENCHMARK(BM_SegmentStorageRead1000)->Unit(benchmark::kMillisecond)->UseRealTime();

// The storage tier's read path (threaded engine, storage_tier.cpp): a prefetch's pages in batches
// of cache.storage batch size (128 here), each batch read by `get_batch` on a thread of its own,
// all at once; the iteration ends when every batch is in. Argument: 0 a file per object, 1
// segments (written 32 to a segment).
void BM_StorageTierRead1000(benchmark::State& state) {
  constexpr std::size_t kBatch = 128;
  std::vector<std::uint8_t> payload(kObject, 7);
  const std::string dir = bench_dir("tr");
  std::filesystem::remove_all(dir);
  std::unique_ptr<ObjectStore> store;
  if (state.range(0) == 1) store = std::make_unique<SegmentStorage>(dir, 1ULL << 40);
  else store = std::make_unique<FileStorage>(dir, 1ULL << 40);
  std::vector<std::string> keys;
  for (std::size_t i = 0; i < kObjects; ++i) keys.push_back(key(i));
  for (std::size_t i = 0; i < kObjects; i += 32) {
    const std::size_t n = std::min<std::size_t>(32, kObjects - i);
    std::vector<std::span<const std::uint8_t>> spans(n, payload);
    store->set_batch(std::span(keys).subspan(i, n), spans);
  }
  std::vector<std::vector<std::uint8_t>> outs(kObjects, std::vector<std::uint8_t>(kObject));
  std::vector<std::span<std::uint8_t>> out_spans(outs.begin(), outs.end());
  for (auto _ : state) {
    std::vector<std::future<std::size_t>> reads;
    for (std::size_t i = 0; i < kObjects; i += kBatch) {
      const std::size_t n = std::min(kBatch, kObjects - i);
      reads.push_back(std::async(std::launch::async, [&, i, n] {
        return store->get_batch(std::span(keys).subspan(i, n), std::span(out_spans).subspan(i, n));
      }));
    }
    std::size_t intact = 0;
    for (auto& r : reads) intact += r.get();
    if (intact != kObjects) state.SkipWithError("get missed");
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * kObjects * kObject));
  std::filesystem::remove_all(dir);
}
BENCHMARK(BM_StorageTierRead1000)->ArgName("segments")->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

// The Redis backend on the server named by KVGRID_BENCH_REDIS (jobs/bench_storage.sh starts a
// private one); skipped without it. Keys are fresh per iteration (objects are immutable).
void BM_RedisWrite1000(benchmark::State& state) {
  const char* url = std::getenv("KVGRID_BENCH_REDIS");
  if (!url) {
    state.SkipWithError("KVGRID_BENCH_REDIS unset");
    return;
  }
  RedisStorage s(url);
  std::vector<std::uint8_t> payload(kObject, 7);
  std::size_t round = 0;
  for (auto _ : state) {
    ++round;
    for (std::size_t i = 0; i < kObjects; ++i)
      if (!s.set(key(i) + "_w" + std::to_string(round), payload)) state.SkipWithError("set failed");
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * kObjects * kObject));
}
BENCHMARK(BM_RedisWrite1000)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_RedisRead1000(benchmark::State& state) {
  const char* url = std::getenv("KVGRID_BENCH_REDIS");
  if (!url) {
    state.SkipWithError("KVGRID_BENCH_REDIS unset");
    return;
  }
  RedisStorage s(url);
  std::vector<std::uint8_t> payload(kObject, 7), out(kObject);
  for (std::size_t i = 0; i < kObjects; ++i) s.set(key(i) + "_r", payload);
  for (auto _ : state)
    for (std::size_t i = 0; i < kObjects; ++i)
      if (s.get(key(i) + "_r", out) != StorageMiss::None) state.SkipWithError("get missed");
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * kObjects * kObject));
}
BENCHMARK(BM_RedisRead1000)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace kvgrid::cache

BENCHMARK_MAIN();
