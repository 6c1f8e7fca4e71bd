// The small agreements every protocol and the serving loop repeat, written once: a MIN over a
// communicator (a vector of words, in place), "all equal" (the MIN of v and of ~v together: v is
// equal everywhere iff both MINs give back what this rank had), and an owned duplicate of a
// communicator (for a protocol whose collectives must not match anyone else's). Each collective
// is non-blocking and waited for through wait_mpi, so a peer that never joins trips the watchdog
// naming `what`. A communicator of one rank costs nothing.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace kvgrid {

// v[i] = `op` (MPI_MIN, MPI_MAX, MPI_SUM, ...) over the ranks of comm of v[i], in place
// (collective; every rank passes the same length).
void agree(MPI_Comm comm, std::span<std::uint64_t> v, MPI_Op op, const std::string& what);
void agree(MPI_Comm comm, std::span<std::int64_t> v, MPI_Op op, const std::string& what);
inline void agree_min(MPI_Comm comm, std::span<std::uint64_t> v, const std::string& what) { agree(comm, v, MPI_MIN, what); }
inline std::uint64_t agree_min(MPI_Comm comm, std::uint64_t v, const std::string& what) {
  agree_min(comm, std::span<std::uint64_t>(&v, 1), what);
  return v;
}
inline std::int64_t agree_sum(MPI_Comm comm, std::int64_t v, const std::string& what) {
  agree(comm, std::span<std::int64_t>(&v, 1), MPI_SUM, what);
  return v;
}
// Whether every rank of comm passed the same words (collective).
bool all_equal(MPI_Comm comm, std::span<const std::uint64_t> v, const std::string& what);

// An owned duplicate of a communicator (collective to create; freed when destroyed).
class DupComm {
 public:
  explicit DupComm(MPI_Comm c);
  ~DupComm();
  DupComm(const DupComm&) = delete;
  DupComm& operator=(const DupComm&) = delete;
  MPI_Comm get() const { return comm_; }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
};

}  // namespace kvgrid
