#include "cuda/engine.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>
#include <vector>

#include "cuda/check.hpp"
#include "cuda/device.hpp"
#include "cuda/event.hpp"

namespace kvgrid::cuda {

namespace {

constexpr int kCopiesPerLaunch = 128;  // 128 × 24 bytes of copy list: well inside a kernel's parameter space

struct CopyList {
  int n;
  const unsigned char* src[kCopiesPerLaunch];
  unsigned char* dst[kCopiesPerLaunch];
  std::size_t bytes[kCopiesPerLaunch];
};

// One block per copy; 16-byte words when both ends and the length allow, bytes otherwise.
__global__ void copy_list_kernel(CopyList list) {
  const int c = blockIdx.x;
  if (c >= list.n) return;
  const unsigned char* s = list.src[c];
  unsigned char* d = list.dst[c];
  const std::size_t n = list.bytes[c];
  const bool wide = ((reinterpret_cast<std::uintptr_t>(s) | reinterpret_cast<std::uintptr_t>(d)) & 15) == 0;
  std::size_t done = 0;
  if (wide) {
    const std::size_t words = n / 16;
    for (std::size_t i = threadIdx.x; i < words; i += blockDim.x)
      reinterpret_cast<uint4*>(d)[i] = reinterpret_cast<const uint4*>(s)[i];
    done = words * 16;
  }
  for (std::size_t i = done + threadIdx.x; i < n; i += blockDim.x) d[i] = s[i];
}

// Spins until `ns` nanoseconds of the GPU's global timer have passed (an injected transfer delay).
__global__ void delay_kernel(unsigned long long ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}

class CudaEngine final : public transfer::TransferEngine {
 public:
  CudaEngine(const transfer::EngineConfig& cfg, CopyMode mode) : mode_(mode) {
    if (cfg.streams < 1) throw std::invalid_argument("cuda engine: streams must be >= 1");
    for (int i = 0; i < cfg.streams; ++i) {
      cudaStream_t s = nullptr;
      KVGRID_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      streams_.push_back(s);
    }
  }
  ~CudaEngine() override {
    for (auto s : streams_) {
      cudaStreamSynchronize(s);
      cudaStreamDestroy(s);
    }
  }
  std::string_view name() const override { return "cuda"; }

  transfer::Event submit(transfer::StreamId stream, std::vector<transfer::Copy> batch) override {
    cudaStream_t s = streams_.at(static_cast<std::size_t>(stream) % streams_.size());
    auto ev = std::make_shared<CudaEvent>();
    for (const auto& c : batch) ev->bytes += c.bytes;
    if (delay_ns_ > 0) {
      delay_kernel<<<1, 1, 0, s>>>(delay_ns_);
      KVGRID_CUDA_CHECK(cudaGetLastError());
      delay_ns_ = 0;
    }
    if (fail_next_) {
      ev->failed = true;  // nothing copied: the caller treats the pages as misses
      fail_next_ = false;
    } else {
      copy(s, batch);
    }
    KVGRID_CUDA_CHECK(cudaEventRecord(ev->get(), s));
    return transfer::Event(std::move(ev));
  }

  void inject(std::uint64_t delay_ns, bool fail) override {
    delay_ns_ += delay_ns;
    fail_next_ = fail_next_ || fail;
  }

 private:
  void copy(cudaStream_t s, const std::vector<transfer::Copy>& batch) {
    if (batch.empty()) return;
    if (mode_ == CopyMode::Kernel && all_accessible(batch)) {
      for (std::size_t at = 0; at < batch.size(); at += kCopiesPerLaunch) {
        CopyList list{};
        list.n = static_cast<int>(std::min<std::size_t>(kCopiesPerLaunch, batch.size() - at));
        for (int i = 0; i < list.n; ++i) {
          const auto& c = batch[at + static_cast<std::size_t>(i)];
          list.src[i] = static_cast<const unsigned char*>(c.src);
          list.dst[i] = static_cast<unsigned char*>(c.dst);
          list.bytes[i] = c.bytes;
        }
        copy_list_kernel<<<static_cast<unsigned>(list.n), 256, 0, s>>>(list);
        KVGRID_CUDA_CHECK(cudaGetLastError());
      }
      return;
    }
    if (mode_ == CopyMode::Batch) {
      dsts_.clear(), srcs_.clear(), sizes_.clear();
      for (const auto& c : batch) dsts_.push_back(c.dst), srcs_.push_back(c.src), sizes_.push_back(c.bytes);
      cudaMemcpyAttributes attr{};
      attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
      std::size_t attr_index = 0;
      KVGRID_CUDA_CHECK(cudaMemcpyBatchAsync(dsts_.data(), srcs_.data(), sizes_.data(), batch.size(), &attr,
                                             &attr_index, 1, s));
      return;
    }
    for (const auto& c : batch) KVGRID_CUDA_CHECK(cudaMemcpyAsync(c.dst, c.src, c.bytes, cudaMemcpyDefault, s));
  }

  static bool all_accessible(const std::vector<transfer::Copy>& batch) {
    return std::all_of(batch.begin(), batch.end(),
                       [](const transfer::Copy& c) { return device_accessible(c.src) && device_accessible(c.dst); });
  }

  CopyMode mode_;
  std::vector<cudaStream_t> streams_;
  std::uint64_t delay_ns_ = 0;
  bool fail_next_ = false;
  std::vector<void*> dsts_;
  std::vector<const void*> srcs_;
  std::vector<std::size_t> sizes_;
};

}  // namespace

CopyMode parse_copy_mode(const std::string& name) {
  if (name == "memcpy") return CopyMode::Memcpy;
  if (name == "kernel") return CopyMode::Kernel;
  if (name == "batch") return CopyMode::Batch;
  throw std::invalid_argument("unknown CUDA copy mode '" + name + "' (memcpy, kernel, batch)");
}

const char* copy_mode_name(CopyMode m) {
  switch (m) {
    case CopyMode::Memcpy: return "memcpy";
    case CopyMode::Kernel: return "kernel";
    case CopyMode::Batch: return "batch";
  }
  return "?";
}

std::unique_ptr<transfer::TransferEngine> make_cuda_engine(const transfer::EngineConfig& cfg, CopyMode mode) {
  return std::make_unique<CudaEngine>(cfg, mode);
}

}  // namespace kvgrid::cuda
