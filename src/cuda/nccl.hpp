// NCCL for KV data (engine.collectives = nccl; built with -DKVGRID_NCCL=ON). MPI stays for
// control: the caller creates the unique id on one rank and broadcasts it over its MPI group
// (runtime/rank_stack.cpp), then every rank of the group builds its NcclComm.
//
// StagedAllGather is the CP layer gather's data path: the gather's send and receive buffers live in
// host memory (the gather slot is a host-side KvPool the model folds), so a post copies the send
// bytes to a device buffer, runs ncclAllGather and copies the result back, all on one stream, and
// returns the event recorded after the last copy: the fold of layer l waits on that event while the
// next layer's gather is already queued behind it (stream order gives the overlap). Two slots, as
// the gather's double buffering needs.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include "cuda/device.hpp"
#include "transfer/transfer_engine.hpp"

namespace kvgrid::cuda {

using NcclId = std::array<char, 128>;
NcclId nccl_unique_id();

struct NcclInit {
  int nranks = 0, rank = 0;
  NcclId id{};
};

class NcclComm {
 public:
  // Collective over the group's `nranks` ranks (each passes its rank and the same id).
  NcclComm(int nranks, int rank, const NcclId& id);
  // Several communicators at once, their ncclCommInitRank in one NCCL group: a rank in several
  // groups (a P/D rank paired with several peers) waits for none of them one by one.
  static std::vector<std::unique_ptr<NcclComm>> create_grouped(const std::vector<NcclInit>& inits);
  ~NcclComm();
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;
  int size() const { return size_; }
  int rank() const { return rank_; }
  // Device buffers; recv holds size() × bytes, rank r's at r × bytes. Stream-ordered.
  void all_gather(const void* send, void* recv, std::size_t bytes, cudaStream_t s);
  // Point-to-point (matched in posting order per peer); bracket several with group_start/group_end.
  void send(const void* buf, std::size_t bytes, int peer, cudaStream_t s);
  void recv(void* buf, std::size_t bytes, int peer, cudaStream_t s);
  void group_start();
  void group_end();

 private:
  NcclComm(void* comm, int nranks, int rank) : comm_(comm), size_(nranks), rank_(rank) {}
  void* comm_ = nullptr;  // ncclComm_t
  int size_ = 0, rank_ = 0;
};

struct HostPart {
  void* data;
  std::size_t bytes;
};

// The P/D transport's data plane on NCCL: a message's host parts gathered into a device buffer (on
// a stream of copies) and sent with ncclSend (a second stream), received with ncclRecv into one (a
// third) and copied out when the receive is seen complete. Neither call blocks the host on a peer:
// staging buffers are stream-ordered allocations (cudaMallocAsync / cudaFreeAsync — a cudaFree would
// wait for the whole device, a pending receive from another peer included), and an event dropped
// before its operation completed frees its buffer behind the operation instead of waiting for it.
// The n-th send to a peer meets the peer's n-th receive from this rank (NCCL has no tags: the ordered
// transport, transfer/ordered_transport.hpp, keeps tags apart). Operations of one communicator are
// serialized by NCCL: give each pair of peers a communicator of its own (transfer/nccl_data.cpp), or
// two peers' operations queued in different orders on different ranks wait for each other.
// The events' synchronize() blocks in CUDA; callers that must keep making progress poll query().
class StagedPointToPoint {
 public:
  explicit StagedPointToPoint(NcclComm& comm);
  ~StagedPointToPoint();
  StagedPointToPoint(const StagedPointToPoint&) = delete;
  StagedPointToPoint& operator=(const StagedPointToPoint&) = delete;
  transfer::Event send(int peer, const std::vector<HostPart>& parts);
  transfer::Event recv(int peer, const std::vector<HostPart>& parts);
  // Sends and receives as one NCCL group (a rank's send to itself needs its receive in the same
  // group). NCCL queues a group's operations at group_end, so their events are recorded then: until
  // group_end they report not complete.
  void group_start();
  void group_end();

  struct Streams;  // (shared with the events: a dropped event frees its staging on them)
  struct Staged;

 private:
  transfer::Event post(bool sending, int peer, const std::vector<HostPart>& parts);
  NcclComm& comm_;
  std::shared_ptr<Streams> streams_;
  bool grouped_ = false;
  std::vector<std::pair<std::shared_ptr<Staged>, cudaStream_t>> deferred_;  // recorded at group_end
};

class StagedAllGather {
 public:
  explicit StagedAllGather(NcclComm& comm);
  ~StagedAllGather();
  StagedAllGather(const StagedAllGather&) = delete;
  StagedAllGather& operator=(const StagedAllGather&) = delete;
  // recv (host, comm.size() × bytes) ← every rank's send (host, bytes), through slot `slot` (0/1).
  // The caller keeps both host buffers untouched until the event completes.
  transfer::Event post(int slot, const void* send, void* recv, std::size_t bytes);

 private:
  NcclComm& comm_;
  cudaStream_t stream_ = nullptr;
  Buffer send_[2], recv_[2];
};

}  // namespace kvgrid::cuda
