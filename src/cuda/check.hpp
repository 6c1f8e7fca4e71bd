// Error checks for every CUDA and NCCL call of the GPU backend. A failed call throws cuda::Error
// whose message names the call, the file and line, the rank (set once at start-up) and CUDA's own
// error name and text, so a failure on rank 5 of 16 reads as such in the job's output.
// This layer depends on the CUDA runtime and the standard library only: the GPU check binary
// builds from it without MPI, HDF5 or Kokkos.
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace kvgrid::cuda {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The rank named in error messages (-1: not set, e.g. the standalone test binary).
void set_rank(int rank);
int rank();

[[noreturn]] void fail(const char* call, const std::string& what, const char* file, int line);
[[noreturn]] void fail(const char* call, cudaError_t e, const char* file, int line);

}  // namespace kvgrid::cuda

#define KVGRID_CUDA_CHECK(call)                                                        \
  do {                                                                                 \
    const cudaError_t kvgrid_cuda_e_ = (call);                                         \
    if (kvgrid_cuda_e_ != cudaSuccess) ::kvgrid::cuda::fail(#call, kvgrid_cuda_e_, __FILE__, __LINE__); \
  } while (0)
