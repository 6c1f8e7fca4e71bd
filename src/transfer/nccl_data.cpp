// engine.collectives = nccl: KV data on NCCL (cuda/nccl.hpp), communicators built from MPI groups
// (unique id broadcast from the group's rank 0) — the CP layer gather's all-gather, and the P/D
// transport's data plane (ordered_transport.hpp: NCCL pairs sends and receives by order only).
#include "core/check.hpp"
#include "transfer/gather_collective.hpp"
#include "transfer/ordered_transport.hpp"
#ifdef KVGRID_HAVE_NCCL
#include "cuda/nccl.hpp"
#endif

namespace kvgrid::transfer {

#ifdef KVGRID_HAVE_NCCL
namespace {

// A communicator over the MPI group's ranks (collective over the group).
std::unique_ptr<cuda::NcclComm> nccl_over(MPI_Comm group) {
  int rank = 0, size = 0;
  KVGRID_MPI_CHECK(MPI_Comm_rank(group, &rank));
  KVGRID_MPI_CHECK(MPI_Comm_size(group, &size));
  cuda::NcclId id{};
  if (rank == 0) id = cuda::nccl_unique_id();
  KVGRID_MPI_CHECK(MPI_Bcast(id.data(), static_cast<int>(id.size()), MPI_BYTE, 0, group));
  return std::make_unique<cuda::NcclComm>(size, rank, id);
}

class NcclGather final : public GatherCollective {
 public:
  explicit NcclGather(MPI_Comm group) : comm_(nccl_over(group)), gather_(std::make_unique<cuda::StagedAllGather>(*comm_)) {}
  std::string_view name() const override { return "nccl"; }
  Event post(int slot, const void* send, void* recv, std::size_t bytes) override {
    return gather_->post(slot, send, recv, bytes);
  }

 private:
  std::unique_ptr<cuda::NcclComm> comm_;
  std::unique_ptr<cuda::StagedAllGather> gather_;
};

// The P/D data plane: a message's blocks staged through one device buffer per message (the pools
// are host-readable memory), sent with ncclSend on one stream and received with ncclRecv on another.
class NcclPlane final : public DataPlane {
 public:
  explicit NcclPlane(MPI_Comm comm) : comm_(nccl_over(comm)), plane_(std::make_unique<cuda::StagedPointToPoint>(*comm_)) {}
  std::string_view name() const override { return "nccl"; }
  Event send(int peer, std::span<const Block> blocks) override { return plane_->send(peer, parts(blocks)); }
  Event recv(int peer, std::span<const Block> blocks) override { return plane_->recv(peer, parts(blocks)); }

 private:
  static std::vector<cuda::HostPart> parts(std::span<const Block> blocks) {
    std::vector<cuda::HostPart> p;
    for (const auto& b : blocks) p.push_back({b.data, b.bytes});
    return p;
  }
  std::unique_ptr<cuda::NcclComm> comm_;
  std::unique_ptr<cuda::StagedPointToPoint> plane_;
};

}  // namespace
#endif

std::unique_ptr<DataPlane> make_nccl_plane(MPI_Comm comm) {
#ifdef KVGRID_HAVE_NCCL
  return std::make_unique<NcclPlane>(comm);
#else
  (void)comm;
  throw InputError("engine.collectives = \"nccl\" is not available in this build (it needs -DKVGRID_NCCL=ON)");
#endif
}

std::unique_ptr<GatherCollective> make_gather_collective(const std::string& name, MPI_Comm group) {
  if (name == "mpi" || name == "mpi_ordered") return nullptr;  // (mpi_ordered: the P/D transport only)
#ifdef KVGRID_HAVE_NCCL
  if (name == "nccl") return std::make_unique<NcclGather>(group);
#else
  (void)group;
#endif
  throw InputError("engine.collectives = \"" + name + "\" is not available in this build (mpi; nccl needs -DKVGRID_NCCL=ON)");
}

}  // namespace kvgrid::transfer
