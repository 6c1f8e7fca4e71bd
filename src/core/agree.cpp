#include "core/agree.hpp"

#include "core/check.hpp"
#include "core/wait.hpp"

namespace kvgrid {

namespace {
template <typename T>
void reduce_in_place(MPI_Comm comm, std::span<T> v, MPI_Datatype type, MPI_Op op, const std::string& what) {
  int size = 1;
  KVGRID_MPI_CHECK(MPI_Comm_size(comm, &size));
  if (size == 1 || v.empty()) return;
  MPI_Request req;
  KVGRID_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, v.data(), static_cast<int>(v.size()), type, op, comm, &req));
  wait_mpi(&req, what);
}
}  // namespace

void agree(MPI_Comm comm, std::span<std::uint64_t> v, MPI_Op op, const std::string& what) {
  reduce_in_place(comm, v, MPI_UINT64_T, op, what);
}
void agree(MPI_Comm comm, std::span<std::int64_t> v, MPI_Op op, const std::string& what) {
  reduce_in_place(comm, v, MPI_INT64_T, op, what);
}

bool all_equal(MPI_Comm comm, std::span<const std::uint64_t> v, const std::string& what) {
  std::vector<std::uint64_t> both;
  both.reserve(2 * v.size());
  for (auto x : v) {
    both.push_back(x);
    both.push_back(~x);
  }
  const std::vector<std::uint64_t> mine = both;
  agree_min(comm, both, what);
  return both == mine;
}

DupComm::DupComm(MPI_Comm c) { KVGRID_MPI_CHECK(MPI_Comm_dup(c, &comm_)); }

DupComm::~DupComm() {
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

}  // namespace kvgrid
