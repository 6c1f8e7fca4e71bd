#include "cuda/nccl.hpp"

#include <nccl.h>

#include <algorithm>
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

namespace {
std::size_t total(const std::vector<HostPart>& parts) {
  std::size_t n = 0;
  for (const auto& p : parts) n += p.bytes;
  return n;
}
transfer::Event holding(cudaStream_t s, std::size_t bytes, Buffer buffer) {
  auto ev = std::make_shared<CudaEvent>();
  ev->bytes = bytes;
  KVGRID_CUDA_CHECK(cudaEventRecord(ev->get(), s));
  return transfer::Event(std::make_shared<HoldingEvent>(std::move(ev), std::move(buffer)));
}

// A staged receive: complete when ncclRecv has landed in the staging buffer and the parts have been
// copied out of it. The copy-out is a plain cudaMemcpy made when the receive is seen complete, so
// posting a receive never blocks the host (an asynchronous copy into pageable memory would wait for
// the receive, i.e. for the peer, inside recv()).
class ScatterEvent final : public transfer::EventState {
 public:
  ScatterEvent(std::shared_ptr<CudaEvent> ev, Buffer staging, std::vector<HostPart> parts)
      : ev_(std::move(ev)), staging_(std::move(staging)), parts_(std::move(parts)) {
    bytes = ev_->bytes;
  }
  ~ScatterEvent() override {
    if (!ev_->query()) cudaEventSynchronize(ev_->get());  // ncclRecv still writes into staging_
  }
  bool query() override {
    if (scattered_) return true;
    if (!ev_->query()) return false;
    scatter();
    return true;
  }
  void synchronize() override {
    if (scattered_) return;
    ev_->synchronize();
    scatter();
  }

 private:
  void scatter() {
    std::size_t at = 0;
    for (const auto& p : parts_) {
      KVGRID_CUDA_CHECK(cudaMemcpy(p.data, staging_.as<char>() + at, p.bytes, cudaMemcpyDefault));
      at += p.bytes;
    }
    scattered_ = true;
  }
  std::shared_ptr<CudaEvent> ev_;
  Buffer staging_;
  std::vector<HostPart> parts_;
  bool scattered_ = false;
};
}  // namespace

StagedPointToPoint::StagedPointToPoint(NcclComm& comm) : comm_(comm) {
  for (cudaStream_t* s : {&stage_, &send_, &recv_}) KVGRID_CUDA_CHECK(cudaStreamCreateWithFlags(s, cudaStreamNonBlocking));
}

StagedPointToPoint::~StagedPointToPoint() {
  for (cudaStream_t s : {stage_, send_, recv_})
    if (s) {
      cudaStreamSynchronize(s);
      cudaStreamDestroy(s);
    }
}

transfer::Event StagedPointToPoint::send(int peer, const std::vector<HostPart>& parts) {
  const std::size_t n = total(parts);
  Buffer staging(std::max<std::size_t>(n, 16), MemoryKind::Scratch);
  // The gather runs on a stream of copies only: a copy from pageable memory waits for its stream,
  // and send_ may hold an earlier ncclSend that waits for its peer.
  std::size_t at = 0;
  for (const auto& p : parts) {
    KVGRID_CUDA_CHECK(cudaMemcpyAsync(staging.as<char>() + at, p.data, p.bytes, cudaMemcpyDefault, stage_));
    at += p.bytes;
  }
  CudaEvent staged;
  KVGRID_CUDA_CHECK(cudaEventRecord(staged.get(), stage_));
  KVGRID_CUDA_CHECK(cudaStreamWaitEvent(send_, staged.get(), 0));
  comm_.send(staging.get(), n, peer, send_);
  return holding(send_, n, std::move(staging));
}

transfer::Event StagedPointToPoint::recv(int peer, const std::vector<HostPart>& parts) {
  const std::size_t n = total(parts);
  Buffer staging(std::max<std::size_t>(n, 16), MemoryKind::Scratch);
  comm_.recv(staging.get(), n, peer, recv_);
  auto ev = std::make_shared<CudaEvent>();
  ev->bytes = n;
  KVGRID_CUDA_CHECK(cudaEventRecord(ev->get(), recv_));
  return transfer::Event(std::make_shared<ScatterEvent>(std::move(ev), std::move(staging), parts));
}

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
