// CUDA backend checks: skip without a GPU, otherwise the page copy kernel against a host reference.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "cuda/device.hpp"

namespace kvgrid::cuda {
namespace {

TEST(Cuda, CopyPagesMatchesHostReference) {
  if (device_count() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  for (std::size_t page_bytes : {std::size_t(16), std::size_t(4096), std::size_t(4100)}) {
    const std::size_t pages = 64;
    std::vector<unsigned char> host(pages * page_bytes);
    std::iota(host.begin(), host.end(), static_cast<unsigned char>(1));
    std::vector<std::uint32_t> src_ids = {3, 7, 0, 63, 12}, dst_ids = {1, 2, 60, 5, 9};
    void *d_src = nullptr, *d_dst = nullptr;
    std::uint32_t *d_sid = nullptr, *d_did = nullptr;
    ASSERT_EQ(cudaMalloc(&d_src, host.size()), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&d_dst, host.size()), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&d_sid, src_ids.size() * 4), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&d_did, dst_ids.size() * 4), cudaSuccess);
    cudaMemcpy(d_src, host.data(), host.size(), cudaMemcpyHostToDevice);
    cudaMemset(d_dst, 0, host.size());
    cudaMemcpy(d_sid, src_ids.data(), src_ids.size() * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(d_did, dst_ids.data(), dst_ids.size() * 4, cudaMemcpyHostToDevice);
    std::string err;
    ASSERT_TRUE(copy_pages(d_dst, d_src, d_did, d_sid, src_ids.size(), page_bytes, &err)) << err;
    std::vector<unsigned char> got(host.size()), want(host.size(), 0);
    for (std::size_t i = 0; i < src_ids.size(); ++i)
      std::copy_n(host.begin() + static_cast<std::ptrdiff_t>(src_ids[i] * page_bytes), page_bytes,
                  want.begin() + static_cast<std::ptrdiff_t>(dst_ids[i] * page_bytes));
    cudaMemcpy(got.data(), d_dst, got.size(), cudaMemcpyDeviceToHost);
    EXPECT_EQ(got, want) << "page_bytes " << page_bytes;
    cudaFree(d_src);
    cudaFree(d_dst);
    cudaFree(d_sid);
    cudaFree(d_did);
  }
}

TEST(Cuda, DeviceQueryDoesNotAbortWithoutAGpu) {
  const int n = device_count();
  EXPECT_GE(n, 0);
  if (n > 0) EXPECT_FALSE(device_name(0).empty());
#ifdef KVGRID_HAVE_NCCL
  EXPECT_FALSE(nccl_version().empty());
#endif
}

}  // namespace
}  // namespace kvgrid::cuda
