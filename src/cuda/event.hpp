// A transfer::Event over a CUDA event: query() is cudaEventQuery, synchronize() is
// cudaEventSynchronize. Shared by the cuda engine and the NCCL gather.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>

#include "cuda/check.hpp"
#include "cuda/device.hpp"
#include "transfer/transfer_engine.hpp"

namespace kvgrid::cuda {

class CudaEvent final : public transfer::EventState {
 public:
  CudaEvent() { KVGRID_CUDA_CHECK(cudaEventCreateWithFlags(&ev_, cudaEventDisableTiming)); }
  ~CudaEvent() override {
    if (ev_) cudaEventDestroy(ev_);
  }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  cudaEvent_t get() const { return ev_; }
  bool query() override {
    if (done_) return true;
    const cudaError_t e = cudaEventQuery(ev_);
    if (e == cudaErrorNotReady) return false;
    KVGRID_CUDA_CHECK(e);
    return done_ = true;
  }
  void synchronize() override {
    if (done_) return;
    KVGRID_CUDA_CHECK(cudaEventSynchronize(ev_));
    done_ = true;
  }

 private:
  cudaEvent_t ev_ = nullptr;
  bool done_ = false;
};

// An event recorded on `s` now (after everything queued on it so far).
inline transfer::Event record_event(cudaStream_t s, std::uint64_t bytes) {
  auto ev = std::make_shared<CudaEvent>();
  ev->bytes = bytes;
  KVGRID_CUDA_CHECK(cudaEventRecord(ev->get(), s));
  return transfer::Event(std::move(ev));
}

}  // namespace kvgrid::cuda
