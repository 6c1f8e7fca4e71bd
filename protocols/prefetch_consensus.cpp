#include "protocols/prefetch_consensus.hpp"

#include "core/check.hpp"
#include "core/wait.hpp"

namespace kvgrid::protocols {

namespace {

void min_over(MPI_Comm comm, std::vector<std::uint64_t>& v, const char* what) {
  int size = 1;
  KVGRID_MPI_CHECK(MPI_Comm_size(comm, &size));
  if (size == 1 || v.empty()) return;
  MPI_Request req;
  KVGRID_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, v.data(), static_cast<int>(v.size()), MPI_UINT64_T, MPI_MIN, comm, &req));
  wait_mpi(&req, what);
}

class PpConsensus final : public cache::CrossStageAgreement {
 public:
  PpConsensus(MPI_Comm stage, MPI_Comm pp, bool first) : first_(first) {
    KVGRID_MPI_CHECK(MPI_Comm_dup(stage, &stage_));
    KVGRID_MPI_CHECK(MPI_Comm_dup(pp, &pp_));
  }
  ~PpConsensus() override {
    MPI_Comm_free(&stage_);
    MPI_Comm_free(&pp_);
  }
  std::string_view name() const override { return "pp_consensus"; }
  void min(std::vector<std::uint64_t>& v) override {
    min_over(stage_, v, "prefetch_consensus all-reduce(MIN) over the stage");
    min_over(pp_, v, "prefetch_consensus all-reduce(MIN) across stages");
  }
  bool decides() const override { return first_; }

 private:
  MPI_Comm stage_ = MPI_COMM_NULL, pp_ = MPI_COMM_NULL;
  bool first_;
};

class PerRank final : public cache::CrossStageAgreement {
 public:
  explicit PerRank(MPI_Comm stage) { KVGRID_MPI_CHECK(MPI_Comm_dup(stage, &stage_)); }
  ~PerRank() override { MPI_Comm_free(&stage_); }
  std::string_view name() const override { return "per_rank"; }
  void min(std::vector<std::uint64_t>& v) override { min_over(stage_, v, "prefetch_consensus all-reduce(MIN) over the stage"); }
  bool decides() const override { return true; }  // the bug: every stage decides its own stops

 private:
  MPI_Comm stage_ = MPI_COMM_NULL;
};

}  // namespace

std::unique_ptr<cache::CrossStageAgreement> make_prefetch_consensus(const std::string& variant, const RankGrid& grid) {
  if (variant == "pp_consensus") return std::make_unique<PpConsensus>(grid.stage(), grid.pp(), grid.is_first_stage());
  if (variant == "per_rank") return std::make_unique<PerRank>(grid.stage());
  throw InputError("unknown protocol.prefetch_consensus variant '" + variant + "' (pp_consensus, per_rank)");
}

}  // namespace kvgrid::protocols
