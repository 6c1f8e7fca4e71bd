#include "protocols/prefetch_consensus.hpp"

#include "core/agree.hpp"
#include "core/check.hpp"
#include "core/wait.hpp"

namespace kvgrid::protocols {

namespace {

void min_over(MPI_Comm comm, std::vector<std::uint64_t>& v, const char* what) { agree_min(comm, v, what); }

// A non-blocking MIN over one communicator (one operation in flight).
class Pipelined {
 public:
  explicit Pipelined(MPI_Comm c) : comm_(c) {}
  void begin(std::vector<std::uint64_t>& v) {
    KVGRID_CHECK(req_ == MPI_REQUEST_NULL, "a second pipelined agreement while one is in flight");
    KVGRID_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, v.data(), static_cast<int>(v.size()), MPI_UINT64_T, MPI_MIN, comm_.get(), &req_));
  }
  void end() {
    if (req_ != MPI_REQUEST_NULL) wait_mpi(&req_, "pipelined all-reduce(MIN) of backup outcomes");
  }

 private:
  DupComm comm_;
  MPI_Request req_ = MPI_REQUEST_NULL;
};

class PpConsensus final : public cache::CrossStageAgreement {
 public:
  PpConsensus(MPI_Comm stage, MPI_Comm pp, MPI_Comm group, bool first) : stage_(stage), pp_(pp), first_(first), group_(group) {}
  void min_begin(std::vector<std::uint64_t>& v) override { group_.begin(v); }  // the whole grid: every stage
  void min_end() override { group_.end(); }
  std::string_view name() const override { return "pp_consensus"; }
  void min(std::vector<std::uint64_t>& v) override {
    min_over(stage_.get(), v, "prefetch_consensus all-reduce(MIN) over the stage");
    min_over(pp_.get(), v, "prefetch_consensus all-reduce(MIN) across stages");
  }
  bool decides() const override { return first_; }

 private:
  DupComm stage_, pp_;
  bool first_;
  Pipelined group_;
};

class PerRank final : public cache::CrossStageAgreement {
 public:
  explicit PerRank(MPI_Comm stage) : stage_(stage), pipelined_(stage) {}
  void min_begin(std::vector<std::uint64_t>& v) override { pipelined_.begin(v); }  // the stage only (the bug)
  void min_end() override { pipelined_.end(); }
  std::string_view name() const override { return "per_rank"; }
  void min(std::vector<std::uint64_t>& v) override { min_over(stage_.get(), v, "prefetch_consensus all-reduce(MIN) over the stage"); }
  bool decides() const override { return true; }  // the bug: every stage decides its own stops

 private:
  DupComm stage_;
  Pipelined pipelined_;
};

}  // namespace

std::unique_ptr<cache::CrossStageAgreement> make_prefetch_consensus(const std::string& variant, const RankGrid& grid) {
  if (variant == "pp_consensus") return std::make_unique<PpConsensus>(grid.stage(), grid.pp(), grid.group(), grid.is_first_stage());
  if (variant == "per_rank") return std::make_unique<PerRank>(grid.stage());
  throw InputError("unknown protocol.prefetch_consensus variant '" + variant + "' (pp_consensus, per_rank)");
}

std::unique_ptr<cache::CrossStageAgreement> make_publish_agreement(const std::string& pp_sync_variant, const RankGrid& grid) {
  if (pp_sync_variant == "independent_polling") return std::make_unique<PerRank>(grid.stage());
  return std::make_unique<PpConsensus>(grid.stage(), grid.pp(), grid.group(), grid.is_first_stage());
}

}  // namespace kvgrid::protocols
