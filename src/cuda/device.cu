#include "cuda/device.hpp"

#include <cuda_runtime.h>

#include <sstream>

#include "cuda/check.hpp"

namespace kvgrid::cuda {

namespace {
int g_rank = -1;
}

void set_rank(int r) { g_rank = r; }
int rank() { return g_rank; }

void fail(const char* call, const std::string& what, const char* file, int line) {
  std::ostringstream os;
  os << "CUDA error at " << file << ":" << line;
  if (g_rank >= 0) os << " (rank " << g_rank << ")";
  os << ": " << call << " failed: " << what;
  throw Error(os.str());
}

void fail(const char* call, cudaError_t e, const char* file, int line) {
  fail(call, std::string(cudaGetErrorName(e)) + " (" + cudaGetErrorString(e) + ")", file, line);
}

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

std::string no_device_reason() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
  }
  return n == 0 ? "no CUDA device visible" : "";
}

std::string device_name(int device) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    cudaGetLastError();
    return "";
  }
  return prop.name;
}

int select_device(int local_rank) {
  const int n = device_count();
  if (n == 0) fail("cudaGetDeviceCount", no_device_reason(), __FILE__, __LINE__);
  const int d = (local_rank < 0 ? 0 : local_rank) % n;
  KVGRID_CUDA_CHECK(cudaSetDevice(d));
  return d;
}

const char* memory_kind_name(MemoryKind k) {
  switch (k) {
    case MemoryKind::Device: return "device (managed, GPU-resident)";
    case MemoryKind::Pinned: return "pinned host";
    case MemoryKind::Scratch: return "device scratch";
  }
  return "?";
}

void* allocate(std::size_t bytes, MemoryKind kind) {
  if (bytes == 0) return nullptr;
  void* p = nullptr;
  switch (kind) {
    case MemoryKind::Device: {
      KVGRID_CUDA_CHECK(cudaMallocManaged(&p, bytes, cudaMemAttachGlobal));
      int dev = 0;
      KVGRID_CUDA_CHECK(cudaGetDevice(&dev));
      cudaMemLocation loc{};
      loc.type = cudaMemLocationTypeDevice;
      loc.id = dev;
      // A hint only: a device without it (or a driver that ignores it) still works.
      if (cudaMemAdvise(p, bytes, cudaMemAdviseSetPreferredLocation, loc) != cudaSuccess) cudaGetLastError();
      break;
    }
    case MemoryKind::Pinned:
      KVGRID_CUDA_CHECK(cudaHostAlloc(&p, bytes, cudaHostAllocPortable | cudaHostAllocMapped));
      break;
    case MemoryKind::Scratch:
      KVGRID_CUDA_CHECK(cudaMalloc(&p, bytes));
      break;
  }
  return p;
}

void release(void* p, MemoryKind kind) noexcept {
  if (!p) return;
  if (kind == MemoryKind::Pinned)
    cudaFreeHost(p);
  else
    cudaFree(p);
}

bool device_accessible(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged ||
         (a.type == cudaMemoryTypeHost && a.devicePointer == p);
}

#ifndef KVGRID_HAVE_NCCL
std::string nccl_version() { return ""; }
#endif

}  // namespace kvgrid::cuda
