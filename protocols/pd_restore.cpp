#include "protocols/pd_restore.hpp"

#include "core/agree.hpp"
#include "core/check.hpp"
#include "core/wait.hpp"

namespace kvgrid::protocols {

PdRestore parse_pd_restore(const std::string& name) {
  if (name == "agreed") return PdRestore::Agreed;
  KVGRID_CHECK(name == "unchecked", "unknown protocol.pd_restore variant '", name, "'");
  return PdRestore::Unchecked;
}

RestoreAgreement::RestoreAgreement(const RankGrid& grid)
    : pipelined_(grid.shape().pp > 1), stage_(grid.stage()), group_(grid.group()) {}

RestoreAgreement::~RestoreAgreement() {
  if (req_ != MPI_REQUEST_NULL) MPI_Request_free(&req_);
}

void RestoreAgreement::add(RequestId id, std::uint64_t ready_ns, bool local_ok) { adding_.push_back({id, ready_ns, local_ok}); }

std::vector<RestoreAgreement::Outcome> RestoreAgreement::decided() {
  std::vector<Outcome> out;
  if (pipelined_) {
    if (agreeing_.empty()) return out;
    wait_mpi(&req_, "restore outcomes: all-reduce(MIN) over the group");
    for (std::size_t i = 0; i < agreeing_.size(); ++i) agreeing_[i].ok = agreeing_ok_[i] != 0;
    out.swap(agreeing_);
    agreeing_ok_.clear();
    return out;
  }
  if (adding_.empty()) return out;
  std::vector<std::uint64_t> ok;
  for (const auto& o : adding_) ok.push_back(o.ok ? 1 : 0);
  agree_min(stage_.get(), ok, "restore outcomes: all-reduce(MIN) over the stage");
  for (std::size_t i = 0; i < adding_.size(); ++i) adding_[i].ok = ok[i] != 0;
  out.swap(adding_);
  return out;
}

void RestoreAgreement::end_of_step() {
  if (!pipelined_ || adding_.empty()) return;
  KVGRID_CHECK(agreeing_.empty(), "a restore agreement started before the previous one was read");
  agreeing_.swap(adding_);
  for (const auto& o : agreeing_) agreeing_ok_.push_back(o.ok ? 1 : 0);
  KVGRID_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, agreeing_ok_.data(), static_cast<int>(agreeing_ok_.size()), MPI_UINT64_T,
                                  MPI_MIN, group_.get(), &req_));
}

}  // namespace kvgrid::protocols
