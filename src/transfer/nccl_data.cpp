// engine.collectives = nccl: KV data on NCCL (cuda/nccl.hpp), communicators built from MPI groups
// (unique id broadcast from the group's rank 0) — the CP layer gather's all-gather, and the P/D
// transport's data plane (ordered_transport.hpp: NCCL pairs sends and receives by order only), a
// two-rank communicator per pair of peers. Their events wait through core/wait (watchdog, progress).
#include <algorithm>
#include <map>
#include <string>

#include "core/check.hpp"
#include "core/wait.hpp"
#include "transfer/gather_collective.hpp"
#include "transfer/polled_event.hpp"
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
    return polled(gather_->post(slot, send, recv, bytes), "the NCCL layer gather");
  }

 private:
  std::unique_ptr<cuda::NcclComm> comm_;
  std::unique_ptr<cuda::StagedAllGather> gather_;
};

// The P/D data plane: a two-rank communicator per peer (the lower world rank is its rank 0), each
// with its own staged point-to-point (cuda/nccl.hpp: a message staged through a device buffer of
// its own; the pools are host-readable memory).
class NcclPlane final : public DataPlane {
 public:
  NcclPlane(MPI_Comm comm, std::vector<int> peers) {
    std::sort(peers.begin(), peers.end());
    peers.erase(std::unique(peers.begin(), peers.end()), peers.end());
    int me = 0;
    KVGRID_MPI_CHECK(MPI_Comm_rank(comm, &me));
    // Ids: the lower rank of each pair makes it and sends it to the higher, which answers (all at
    // once, then one wait): a peer list that is not symmetric stops here, in a wait the watchdog
    // sees, not in ncclGroupEnd.
    MPI_Comm ids = MPI_COMM_NULL;
    KVGRID_MPI_CHECK(MPI_Comm_dup(comm, &ids));
    std::vector<cuda::NcclInit> inits(peers.size());
    std::vector<MPI_Request> reqs(2 * peers.size(), MPI_REQUEST_NULL);
    std::vector<char> acks(peers.size(), 1);
    for (std::size_t i = 0; i < peers.size(); ++i) {
      KVGRID_CHECK(peers[i] != me, "P/D over NCCL: rank ", me, " paired with itself");
      inits[i].nranks = 2;
      inits[i].rank = me < peers[i] ? 0 : 1;
      const int bytes = static_cast<int>(inits[i].id.size());
      if (inits[i].rank == 0) {
        inits[i].id = cuda::nccl_unique_id();
        KVGRID_MPI_CHECK(MPI_Isend(inits[i].id.data(), bytes, MPI_BYTE, peers[i], 0, ids, &reqs[2 * i]));
        KVGRID_MPI_CHECK(MPI_Irecv(&acks[i], 1, MPI_BYTE, peers[i], 1, ids, &reqs[2 * i + 1]));
      } else {
        KVGRID_MPI_CHECK(MPI_Irecv(inits[i].id.data(), bytes, MPI_BYTE, peers[i], 0, ids, &reqs[2 * i]));
        KVGRID_MPI_CHECK(MPI_Isend(&acks[i], 1, MPI_BYTE, peers[i], 1, ids, &reqs[2 * i + 1]));
      }
    }
    wait_mpi_all(reqs, "the NCCL ids of this rank's P/D peers");
    MPI_Comm_free(&ids);
    auto comms = cuda::NcclComm::create_grouped(inits);
    for (std::size_t i = 0; i < peers.size(); ++i) {
      Pair& p = pairs_[peers[i]];
      p.comm = std::move(comms[i]);
      p.p2p = std::make_unique<cuda::StagedPointToPoint>(*p.comm);
    }
  }
  std::string_view name() const override { return "nccl"; }
  Event send(int peer, std::span<const Block> blocks) override {
    return polled(pair(peer).p2p->send(1 - pair(peer).comm->rank(), parts(blocks)),
                  "an NCCL send of KV to rank " + std::to_string(peer));
  }
  Event recv(int peer, std::span<const Block> blocks) override {
    return polled(pair(peer).p2p->recv(1 - pair(peer).comm->rank(), parts(blocks)),
                  "an NCCL receive of KV from rank " + std::to_string(peer));
  }

 private:
  struct Pair {
    std::unique_ptr<cuda::NcclComm> comm;
    std::unique_ptr<cuda::StagedPointToPoint> p2p;
  };
  Pair& pair(int peer) {
    auto it = pairs_.find(peer);
    KVGRID_CHECK(it != pairs_.end(), "P/D over NCCL: no communicator with rank ", peer, " (not a peer of this rank's legs)");
    return it->second;
  }
  static std::vector<cuda::HostPart> parts(std::span<const Block> blocks) {
    std::vector<cuda::HostPart> p;
    for (const auto& b : blocks) p.push_back({b.data, b.bytes});
    return p;
  }
  std::map<int, Pair> pairs_;
};

}  // namespace
#endif

std::unique_ptr<DataPlane> make_nccl_plane(MPI_Comm comm, std::vector<int> peers) {
#ifdef KVGRID_HAVE_NCCL
  return std::make_unique<NcclPlane>(comm, std::move(peers));
#else
  (void)comm;
  (void)peers;
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
