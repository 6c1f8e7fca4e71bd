// Where a pool's words live. By default in ordinary host memory; with engine.transfer = cuda
// (transfer/registry.cpp: pool_memory("cuda")) a device pool's pages are GPU memory (managed, so the
// host-side oracle and digests may read them) and a host pool's pages pinned host memory, so the
// engine's copies are real DMA between them. `gpu_kernels`: the device pool's KV kernels run as
// CUDA kernels (cuda/kv_kernels.hpp) instead of the Kokkos host kernels — the same results.
#pragma once

#include <cstddef>
#include <string>

namespace kvgrid::transfer {

enum class PoolKind { Device, Host };

struct PoolMemory {
  std::string name;
  void* (*allocate)(std::size_t bytes, PoolKind kind) = nullptr;
  void (*release)(void* p, PoolKind kind) = nullptr;
  bool gpu_kernels = false;
};

// The memory of a transfer backend's pools: nullptr (ordinary host memory) for simulated and
// threaded; the CUDA memory for cuda (built with -DKVGRID_CUDA=ON).
const PoolMemory* pool_memory(const std::string& backend);

}  // namespace kvgrid::transfer
