// Threaded transfer engine bandwidth next to single-threaded memcpy of the same bytes.
// 64 KiB pages, batches of 64 pages, a 256 MiB working set (8× this machine's 32 MiB L3), timed
// from submit to synchronize(). Two shapes: one contiguous batch, and the per-layer load path
// (the same pages split into per-layer slices, one event per layer).
#include <benchmark/benchmark.h>

#include <cstring>
#include <vector>

#include "transfer/transfer_engine.hpp"

namespace kvgrid::transfer {
namespace {

constexpr std::size_t kPage = 64 << 10, kPages = 4096, kBatch = 64, kLayers = 8;

struct Buffers {
  std::vector<std::uint8_t> src = std::vector<std::uint8_t>(kPage * kPages, 1);
  std::vector<std::uint8_t> dst = std::vector<std::uint8_t>(kPage * kPages, 0);
  std::size_t next = 0;  // rotate through the working set so caches do not help
  std::size_t take() {
    const std::size_t first = next;
    next = (next + kBatch) % kPages;
    return first;
  }
};

void BM_Memcpy64Pages(benchmark::State& state) {
  Buffers b;
  for (auto _ : state) {
    const std::size_t first = b.take();
    for (std::size_t p = first; p < first + kBatch; ++p) std::memcpy(&b.dst[p * kPage], &b.src[p * kPage], kPage);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * kBatch * kPage));
}
BENCHMARK(BM_Memcpy64Pages)->Unit(benchmark::kMicrosecond)->UseRealTime();

// The per-layer load's own copies (8 KiB layer slices, layer by layer) done by one thread: the
// baseline of the same bytes in the same access pattern.
void BM_MemcpyPerLayerSlices(benchmark::State& state) {
  Buffers b;
  const std::size_t slice = kPage / kLayers;
  for (auto _ : state) {
    const std::size_t first = b.take();
    for (std::size_t l = 0; l < kLayers; ++l)
      for (std::size_t p = first; p < first + kBatch; ++p)
        std::memcpy(&b.dst[p * kPage + l * slice], &b.src[p * kPage + l * slice], slice);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * kBatch * kPage));
}
BENCHMARK(BM_MemcpyPerLayerSlices)->Unit(benchmark::kMicrosecond)->UseRealTime();

void BM_ThreadedContiguousBatch(benchmark::State& state) {
  Buffers b;
  EngineConfig cfg;
  cfg.backend = "threaded";
  auto e = make_engine(cfg);
  for (auto _ : state) {
    const std::size_t first = b.take();
    std::vector<Copy> batch;
    for (std::size_t p = first; p < first + kBatch; ++p) batch.push_back({&b.dst[p * kPage], &b.src[p * kPage], kPage});
    e->submit(0, std::move(batch)).synchronize();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * kBatch * kPage));
}
BENCHMARK(BM_ThreadedContiguousBatch)->Unit(benchmark::kMicrosecond)->UseRealTime();

void BM_ThreadedPerLayerLoad(benchmark::State& state) {
  Buffers b;
  EngineConfig cfg;
  cfg.backend = "threaded";
  auto e = make_engine(cfg);
  const std::size_t slice = kPage / kLayers;  // each page holds kLayers layer slices
  for (auto _ : state) {
    const std::size_t first = b.take();
    std::vector<std::vector<Copy>> layers(kLayers);
    for (std::size_t l = 0; l < kLayers; ++l)
      for (std::size_t p = first; p < first + kBatch; ++p)
        layers[l].push_back({&b.dst[p * kPage + l * slice], &b.src[p * kPage + l * slice], slice});
    auto evs = e->submit_layers(1, std::move(layers));
    for (auto& ev : evs) ev.synchronize();  // attention would wait layer by layer
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * kBatch * kPage));
}
BENCHMARK(BM_ThreadedPerLayerLoad)->Unit(benchmark::kMicrosecond)->UseRealTime();

}  // namespace
}  // namespace kvgrid::transfer

BENCHMARK_MAIN();
