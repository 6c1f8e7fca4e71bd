// The watchdog across ranks: a rank that waits on a collective its peers have not joined reports
// the wait when the deadline passes. Ordering is by messages, not sleeps: the peers join only
// after rank 0 tells them that its watchdog fired.
#include <gtest/gtest.h>

#include "core/wait.hpp"
#include "mpi_util.hpp"

namespace kvgrid {
namespace {

TEST(Watchdog, WaitOnAnUnjoinedCollectiveTimesOutAndNamesIt) {
  const int n = testing::world_size();
  if (n < 2) GTEST_SKIP() << "needs a peer that is late";
  MPI_Comm comm;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  const int me = testing::world_rank();
  if (me == 0) {
    MPI_Request barrier;
    MPI_Ibarrier(comm, &barrier);
    set_wait_deadline(std::chrono::duration<double>(0.1));
    try {
      wait_mpi(&barrier, "Ibarrier nobody joined");
      ADD_FAILURE() << "the watchdog did not fire";
    } catch (const WatchdogTimeout& e) {
      EXPECT_EQ(e.report.awaited, "Ibarrier nobody joined");
      EXPECT_EQ(e.report.world_rank, 0);
    }
    set_wait_deadline(std::chrono::duration<double>(60.0));
    int go = 1;
    for (int r = 1; r < n; ++r) MPI_Send(&go, 1, MPI_INT, r, 7, comm);
    wait_mpi(&barrier, "Ibarrier after release");
  } else {
    int go = 0;
    MPI_Request rq;
    MPI_Irecv(&go, 1, MPI_INT, 0, 7, comm, &rq);
    wait_mpi(&rq, "release from rank 0");
    MPI_Request barrier;
    MPI_Ibarrier(comm, &barrier);
    wait_mpi(&barrier, "Ibarrier");
  }
  MPI_Comm_free(&comm);
}

}  // namespace
}  // namespace kvgrid
