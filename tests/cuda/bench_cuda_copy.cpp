// Device↔host copy bandwidth through the cuda transfer engine (each copy mode) next to one
// cudaMemcpyAsync of the same bytes — the peak the engine is measured against (target: >= 80 %).
// Pages of 64 KiB between a device pool (managed, GPU-resident) and a pinned host pool, in both
// directions, batches of 256 pages, median of 5 timed repetitions after a warm-up. Prints one line
// per (direction, way) with GB/s and the ratio to the plain copy. Exit 77 without a GPU.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#include "cuda/check.hpp"
#include "cuda/device.hpp"
#include "cuda/engine.hpp"

using namespace kvgrid;

namespace {

constexpr std::size_t kPage = 64 << 10, kPages = 256, kReps = 5;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <typename F>
double seconds(F&& f) {
  f();  // warm-up
  std::vector<double> t;
  for (std::size_t r = 0; r < kReps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return median(t);
}

}  // namespace

int main() {
  if (cuda::device_count() == 0) {
    std::printf("no CUDA device: %s — copy benchmark skipped\n", cuda::no_device_reason().c_str());
    return 77;
  }
  cuda::select_device(0);
  std::printf("GPU: %s; %zu pages of %zu KiB per batch, median of %zu\n", cuda::device_name(0).c_str(), kPages,
              kPage >> 10, kReps);
  cuda::Buffer dev(kPage * kPages, cuda::MemoryKind::Device), host(kPage * kPages, cuda::MemoryKind::Pinned);
  KVGRID_CUDA_CHECK(cudaMemset(dev.get(), 1, dev.bytes()));
  std::memset(host.get(), 2, host.bytes());
  cudaStream_t s = nullptr;
  KVGRID_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const double gb = static_cast<double>(kPage * kPages) / 1e9;
  for (int dir = 0; dir < 2; ++dir) {
    auto* src = static_cast<unsigned char*>(dir == 0 ? host.get() : dev.get());
    auto* dst = static_cast<unsigned char*>(dir == 0 ? dev.get() : host.get());
    const char* name = dir == 0 ? "host->device" : "device->host";
    const double peak = seconds([&] {
      KVGRID_CUDA_CHECK(cudaMemcpyAsync(dst, src, kPage * kPages, cudaMemcpyDefault, s));
      KVGRID_CUDA_CHECK(cudaStreamSynchronize(s));
    });
    std::printf("%-13s %-28s %8.2f GB/s  1.00x\n", name, "cudaMemcpyAsync (one copy)", gb / peak);
    for (auto mode : {cuda::CopyMode::Memcpy, cuda::CopyMode::Kernel, cuda::CopyMode::Batch}) {
      transfer::EngineConfig cfg;
      cfg.streams = 1;
      auto engine = cuda::make_cuda_engine(cfg, mode);
      // Pages in reverse order: a page list, not one contiguous range.
      const double t = seconds([&] {
        std::vector<transfer::Copy> batch;
        for (std::size_t p = 0; p < kPages; ++p) batch.push_back({dst + p * kPage, src + (kPages - 1 - p) * kPage, kPage});
        engine->submit(0, std::move(batch)).synchronize();
      });
      std::printf("%-13s engine, %-20s %8.2f GB/s  %.2fx\n", name, cuda::copy_mode_name(mode), gb / t, peak / t);
    }
  }
  cudaStreamDestroy(s);
  return 0;
}
