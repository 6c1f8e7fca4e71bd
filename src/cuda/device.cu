#include "cuda/device.hpp"

#include <cuda_runtime.h>

namespace kvgrid::cuda {

namespace {
// One block per page; threads stride over the page's 16-byte words (pages are 16-byte aligned
// multiples in every KV layout kvgrid uses; a byte tail is copied separately).
__global__ void copy_pages_kernel(unsigned char* dst, const unsigned char* src, const std::uint32_t* dst_ids,
                                  const std::uint32_t* src_ids, std::size_t page_bytes) {
  const std::size_t page = blockIdx.x;
  unsigned char* d = dst + static_cast<std::size_t>(dst_ids[page]) * page_bytes;
  const unsigned char* s = src + static_cast<std::size_t>(src_ids[page]) * page_bytes;
  const std::size_t words = page_bytes / 16;
  for (std::size_t i = threadIdx.x; i < words; i += blockDim.x)
    reinterpret_cast<uint4*>(d)[i] = reinterpret_cast<const uint4*>(s)[i];
  for (std::size_t i = words * 16 + threadIdx.x; i < page_bytes; i += blockDim.x) d[i] = s[i];
}
}  // namespace

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

std::string device_name(int device) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) return "";
  return prop.name;
}

bool copy_pages(void* dst, const void* src, const std::uint32_t* dst_ids, const std::uint32_t* src_ids,
                std::size_t n_pages, std::size_t page_bytes, std::string* error) {
  if (n_pages == 0) return true;
  copy_pages_kernel<<<static_cast<unsigned>(n_pages), 256>>>(static_cast<unsigned char*>(dst),
                                                               static_cast<const unsigned char*>(src), dst_ids, src_ids,
                                                               page_bytes);
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  if (e != cudaSuccess) {
    if (error) *error = cudaGetErrorString(e);
    return false;
  }
  return true;
}

#ifndef KVGRID_HAVE_NCCL
std::string nccl_version() { return ""; }
#endif

}  // namespace kvgrid::cuda
