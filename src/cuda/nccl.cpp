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

std::vector<std::unique_ptr<NcclComm>> NcclComm::create_grouped(const std::vector<NcclInit>& inits) {
  std::vector<ncclComm_t> c(inits.size(), nullptr);
  KVGRID_NCCL_CHECK(ncclGroupStart());
  ncclResult_t first = ncclSuccess;
  for (std::size_t i = 0; i < inits.size() && first == ncclSuccess; ++i) {
    ncclUniqueId uid;
    std::memcpy(&uid, inits[i].id.data(), sizeof uid);
    first = ncclCommInitRank(&c[i], inits[i].nranks, uid, inits[i].rank);
  }
  const ncclResult_t end = ncclGroupEnd();
  if (first != ncclSuccess) fail("ncclCommInitRank (grouped)", std::string("NCCL: ") + ncclGetErrorString(first), __FILE__, __LINE__);
  if (end != ncclSuccess) fail("ncclGroupEnd (communicator creation)", std::string("NCCL: ") + ncclGetErrorString(end), __FILE__, __LINE__);
  std::vector<std::unique_ptr<NcclComm>> out;
  for (std::size_t i = 0; i < inits.size(); ++i)
    out.push_back(std::unique_ptr<NcclComm>(new NcclComm(c[i], inits[i].nranks, inits[i].rank)));
  return out;
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

// The streams and the staging buffers' memory pool of one StagedPointToPoint. The pool is its own,
// and a freed block is not reused behind another stream's pending work: from the device's default
// pool, a buffer freed behind a pending ncclRecv could be handed to the next allocation on the copy
// stream with a wait for that receive — one peer's work held up by another's.
struct StagedPointToPoint::Streams {
  cudaStream_t stage = nullptr, send = nullptr, recv = nullptr;
  cudaMemPool_t pool = nullptr;
  Streams() {
    for (cudaStream_t* s : {&stage, &send, &recv}) KVGRID_CUDA_CHECK(cudaStreamCreateWithFlags(s, cudaStreamNonBlocking));
    int device = 0;
    KVGRID_CUDA_CHECK(cudaGetDevice(&device));
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    KVGRID_CUDA_CHECK(cudaMemPoolCreate(&pool, &props));
    int off = 0;
    KVGRID_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolReuseAllowInternalDependencies, &off));
  }
  ~Streams() {
    for (cudaStream_t s : {stage, send, recv})
      if (s) cudaStreamSynchronize(s);  // (every buffer freed)
    if (pool) cudaMemPoolDestroy(pool);
    for (cudaStream_t s : {stage, send, recv})
      if (s) cudaStreamDestroy(s);
  }
  Streams(const Streams&) = delete;
  Streams& operator=(const Streams&) = delete;
};

// One staged send or receive: complete when its NCCL operation is (recorded as `ev_` on its stream)
// and, for a receive, its parts have been copied out of the staging buffer — a plain cudaMemcpy made
// when the receive is seen complete (an asynchronous copy into pageable memory posted with the
// receive would wait for it, i.e. for the peer, inside recv()). The staging buffer is freed once it
// is no longer read or written: at completion, or, dropped before, on the operation's stream behind it.
struct StagedPointToPoint::Staged final : transfer::EventState {
  Staged(std::shared_ptr<Streams> streams, cudaStream_t op, void* staging, std::size_t n, std::vector<HostPart> out)
      : streams_(std::move(streams)), op_(op), staging_(staging), out_(std::move(out)) {
    bytes = n;
    KVGRID_CUDA_CHECK(cudaEventCreateWithFlags(&ev_, cudaEventDisableTiming));
  }
  ~Staged() override {
    if (staging_) cudaFreeAsync(staging_, recorded_ ? op_ : streams_->stage);  // (not thrown: a destructor)
    if (ev_) cudaEventDestroy(ev_);
  }
  void record(cudaStream_t s) {
    KVGRID_CUDA_CHECK(cudaEventRecord(ev_, s));
    recorded_ = true;
  }
  bool query() override {
    if (done_) return true;
    if (!recorded_) return false;  // in a group not ended yet
    const cudaError_t e = cudaEventQuery(ev_);
    if (e == cudaErrorNotReady) return false;
    KVGRID_CUDA_CHECK(e);
    finish();
    return true;
  }
  void synchronize() override {
    if (done_) return;
    if (!recorded_) throw Error("a staged NCCL operation waited for inside its group (call group_end first)");
    KVGRID_CUDA_CHECK(cudaEventSynchronize(ev_));
    finish();
  }

 private:
  void finish() {
    std::size_t at = 0;
    for (const auto& p : out_) {
      KVGRID_CUDA_CHECK(cudaMemcpy(p.data, static_cast<char*>(staging_) + at, p.bytes, cudaMemcpyDefault));
      at += p.bytes;
    }
    // Nothing reads or writes it any more: freed on the copy stream (never behind a pending NCCL call).
    KVGRID_CUDA_CHECK(cudaFreeAsync(staging_, streams_->stage));
    staging_ = nullptr;
    done_ = true;
  }
  std::shared_ptr<Streams> streams_;
  cudaStream_t op_;
  void* staging_;
  std::vector<HostPart> out_;  // a receive's parts (empty for a send)
  cudaEvent_t ev_ = nullptr;
  bool recorded_ = false, done_ = false;
};

StagedPointToPoint::StagedPointToPoint(NcclComm& comm) : comm_(comm), streams_(std::make_shared<Streams>()) {}

StagedPointToPoint::~StagedPointToPoint() {
  if (!grouped_) return;
  // A group left open by an exception: NCCL queues it now, so its events (and the frees behind
  // them) go after it.
  ncclGroupEnd();
  for (auto& [op, st] : deferred_) try {
      op->record(st);
    } catch (const Error&) {  // (a destructor)
    }
}

void StagedPointToPoint::group_start() {
  if (grouped_) throw Error("StagedPointToPoint: nested group");
  comm_.group_start();
  grouped_ = true;
}

void StagedPointToPoint::group_end() {
  if (!grouped_) throw Error("StagedPointToPoint: group_end without group_start");
  grouped_ = false;
  comm_.group_end();
  for (auto& [op, s] : deferred_) op->record(s);
  deferred_.clear();
}

transfer::Event StagedPointToPoint::send(int peer, const std::vector<HostPart>& parts) { return post(true, peer, parts); }
transfer::Event StagedPointToPoint::recv(int peer, const std::vector<HostPart>& parts) { return post(false, peer, parts); }

transfer::Event StagedPointToPoint::post(bool sending, int peer, const std::vector<HostPart>& parts) {
  std::size_t n = 0;
  for (const auto& p : parts) n += p.bytes;
  Streams& s = *streams_;
  const cudaStream_t op = sending ? s.send : s.recv;
  void* staging = nullptr;
  KVGRID_CUDA_CHECK(cudaMallocFromPoolAsync(&staging, std::max<std::size_t>(n, 16), s.pool, s.stage));
  cudaEvent_t ready = nullptr;
  KVGRID_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
  if (sending) {
    // The gather runs on the copy stream: a copy from pageable memory waits for its stream, and the
    // send stream may hold an earlier ncclSend that waits for its peer.
    std::size_t at = 0;
    for (const auto& p : parts) {
      KVGRID_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(staging) + at, p.data, p.bytes, cudaMemcpyDefault, s.stage));
      at += p.bytes;
    }
  }
  KVGRID_CUDA_CHECK(cudaEventRecord(ready, s.stage));  // the allocation (and a send's gather) before the operation
  KVGRID_CUDA_CHECK(cudaStreamWaitEvent(op, ready, 0));
  cudaEventDestroy(ready);  // (released once it has completed)
  auto staged = std::make_shared<Staged>(streams_, op, staging, n, sending ? std::vector<HostPart>{} : parts);
  if (sending)
    comm_.send(staging, n, peer, op);
  else
    comm_.recv(staging, n, peer, op);
  if (grouped_)
    deferred_.emplace_back(staged, op);
  else
    staged->record(op);
  return transfer::Event(staged);
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
