#include "cuda/nccl.hpp"

#include <nccl.h>

#include <cstring>
#include <string>

#include "cuda/check.hpp"
#include "cuda/event.hpp"

#define KVGRID_NCCL_CHECK(call)                                                                         \
  do {                                                                                                  \
    const ncclResult_t kvgrid_nccl_r_ = (call);                                                         \
    if (kvgrid_nccl_r_ != ncclSuccess)                                                                  \
      ::kvgrid::cuda::fail(#call, std::string("NCCL: ") + ncclGetErrorString(kvgrid_nccl_r_), __FILE__, __LINE__); \
  } while (0)

namespace kvgrid::cuda {

namespace {
ncclComm_t as_comm(void* c) { return static_cast<ncclComm_t>(c); }
}  // namespace

std::string nccl_version() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "";
  // NCCL >= 2.9 encodes major*10000 + minor*100 + patch.
  return std::to_string(v / 10000) + "." + std::to_string((v / 100) % 100) + "." + std::to_string(v % 100);
}

NcclId nccl_unique_id() {
  static_assert(sizeof(ncclUniqueId) == sizeof(NcclId));
  ncclUniqueId id;
  KVGRID_NCCL_CHECK(ncclGetUniqueId(&id));
  NcclId out;
  std::memcpy(out.data(), &id, sizeof id);
  return out;
}

NcclComm::NcclComm(int nranks, int rank, const NcclId& id) : size_(nranks), rank_(rank) {
  ncclUniqueId uid;
  std::memcpy(&uid, id.data(), sizeof uid);
  ncclComm_t c = nullptr;
  KVGRID_NCCL_CHECK(ncclCommInitRank(&c, nranks, uid, rank));
  comm_ = c;
}

NcclComm::~NcclComm() {
  if (comm_) ncclCommDestroy(as_comm(comm_));
}

void NcclComm::all_gather(const void* send, void* recv, std::size_t bytes, cudaStream_t s) {
  KVGRID_NCCL_CHECK(ncclAllGather(send, recv, bytes, ncclUint8, as_comm(comm_), s));
}
void NcclComm::send(const void* buf, std::size_t bytes, int peer, cudaStream_t s) {
  KVGRID_NCCL_CHECK(ncclSend(buf, bytes, ncclUint8, peer, as_comm(comm_), s));
}
void NcclComm::recv(void* buf, std::size_t bytes, int peer, cudaStream_t s) {
  KVGRID_NCCL_CHECK(ncclRecv(buf, bytes, ncclUint8, peer, as_comm(comm_), s));
}
void NcclComm::group_start() { KVGRID_NCCL_CHECK(ncclGroupStart()); }
void NcclComm::group_end() { KVGRID_NCCL_CHECK(ncclGroupEnd()); }

StagedAllGather::StagedAllGather(NcclComm& comm) : comm_(comm) {
  KVGRID_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  for (int i = 0; i < 2; ++i) send_[i] = Buffer(16, MemoryKind::Scratch), recv_[i] = Buffer(16, MemoryKind::Scratch);
}

StagedAllGather::~StagedAllGather() {
  if (stream_) {
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
}

transfer::Event StagedAllGather::post(int slot, const void* send, void* recv, std::size_t bytes) {
  Buffer& ds = send_[slot & 1];
  Buffer& dr = recv_[slot & 1];
  const std::size_t total = bytes * static_cast<std::size_t>(comm_.size());
  if (ds.bytes() < bytes || dr.bytes() < total) {
    KVGRID_CUDA_CHECK(cudaStreamSynchronize(stream_));  // the old buffers may still be in use
    ds.reserve(bytes);
    dr.reserve(total);
  }
  KVGRID_CUDA_CHECK(cudaMemcpyAsync(ds.get(), send, bytes, cudaMemcpyDefault, stream_));
  comm_.all_gather(ds.get(), dr.get(), bytes, stream_);
  KVGRID_CUDA_CHECK(cudaMemcpyAsync(recv, dr.get(), total, cudaMemcpyDefault, stream_));
  return record_event(stream_, total);
}

}  // namespace kvgrid::cuda
