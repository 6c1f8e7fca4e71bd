// engine.collectives = nccl: the CP layer gather's all-gather on NCCL (cuda/nccl.hpp), its
// communicator built from the MPI group (unique id broadcast from the group's rank 0).
#include "core/check.hpp"
#include "transfer/gather_collective.hpp"
#ifdef KVGRID_HAVE_NCCL
#include "cuda/nccl.hpp"
#endif

namespace kvgrid::transfer {

#ifdef KVGRID_HAVE_NCCL
namespace {

class NcclGather final : public GatherCollective {
 public:
  explicit NcclGather(MPI_Comm group) {
    int rank = 0, size = 0;
    KVGRID_MPI_CHECK(MPI_Comm_rank(group, &rank));
    KVGRID_MPI_CHECK(MPI_Comm_size(group, &size));
    cuda::NcclId id{};
    if (rank == 0) id = cuda::nccl_unique_id();
    KVGRID_MPI_CHECK(MPI_Bcast(id.data(), static_cast<int>(id.size()), MPI_BYTE, 0, group));
    comm_ = std::make_unique<cuda::NcclComm>(size, rank, id);
    gather_ = std::make_unique<cuda::StagedAllGather>(*comm_);
  }
  std::string_view name() const override { return "nccl"; }
  Event post(int slot, const void* send, void* recv, std::size_t bytes) override {
    return gather_->post(slot, send, recv, bytes);
  }

 private:
  std::unique_ptr<cuda::NcclComm> comm_;
  std::unique_ptr<cuda::StagedAllGather> gather_;
};

}  // namespace
#endif

std::unique_ptr<GatherCollective> make_gather_collective(const std::string& name, MPI_Comm group) {
  if (name == "mpi") return nullptr;
#ifdef KVGRID_HAVE_NCCL
  if (name == "nccl") return std::make_unique<NcclGather>(group);
#else
  (void)group;
#endif
  throw InputError("engine.collectives = \"" + name + "\" is not available in this build (mpi; nccl needs -DKVGRID_NCCL=ON)");
}

}  // namespace kvgrid::transfer
