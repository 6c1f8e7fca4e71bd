#include "app/mpi_main.hpp"

#include <Kokkos_Core.hpp>
#include <chrono>
#include <iostream>
#include <thread>

#include "core/log.hpp"

namespace kvgrid::app {

namespace {
// Whether every rank reached its input-error handler too (a barrier of a communicator used for
// nothing else, polled for `grace`). An input error found when the experiment loads is the same
// on every rank; one found while a rank builds its stack (its shard's storage keys, a pool that
// does not fit) may be this rank's alone, while the others wait in a collective this rank will
// never join — they must not wait for ever.
bool all_ranks_failed(MPI_Comm comm, std::chrono::milliseconds grace) {
  MPI_Request req = MPI_REQUEST_NULL;
  if (MPI_Ibarrier(comm, &req) != MPI_SUCCESS) return false;
  const auto until = std::chrono::steady_clock::now() + grace;
  int done = 0;
  while (true) {
    if (MPI_Test(&req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) return false;
    if (done) return true;
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}
}  // namespace

int run_under_mpi(int argc, char** argv, const std::string& command, const std::function<int(int, int)>& body,
                  const std::function<std::string(const RunFailure&)>& on_failure) {
  int provided = 0;
  if (MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
    std::cerr << "kvgrid: MPI_Init_thread failed\n";
    return 2;
  }
  int world_rank = 0, world_size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  log_set_rank(world_rank);
  // Failed MPI calls return their code to KVGRID_MPI_CHECK (file, line, rank) instead of aborting
  // inside the library; communicators split from the world inherit this.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  if (provided < MPI_THREAD_MULTIPLE) {
    if (world_rank == 0)
      std::cerr << "kvgrid: the MPI library does not provide MPI_THREAD_MULTIPLE (got level " << provided
                << "); kvgrid's transfer threads need it. Use an MPI built with thread support (Open MPI 4 does).\n";
    MPI_Finalize();
    return 2;
  }
  MPI_Comm input_errors = MPI_COMM_NULL;  // (all_ranks_failed's own communicator)
  if (MPI_Comm_dup(MPI_COMM_WORLD, &input_errors) != MPI_SUCCESS) {
    std::cerr << "kvgrid: MPI_Comm_dup failed\n";
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  int rc = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    try {
      rc = body(world_rank, world_size);
    } catch (const InputError& e) {
      // Every rank failed alike: one message, exit 2. This rank alone (or a few): each says what
      // it found and the job stops with exit 2 instead of leaving the others waiting.
      if (world_size == 1 || all_ranks_failed(input_errors, std::chrono::seconds(5))) {
        if (world_rank == 0) std::cerr << "kvgrid " << command << ": error: " << e.what() << "\n";
        rc = 2;
      } else {
        log_all("kvgrid " + command + ": error: " + e.what() +
                " (on this rank; not every rank reported an input error within 5 s: stopping the job)");
        MPI_Abort(MPI_COMM_WORLD, 2);
      }
    } catch (const RunFailure& e) {
      log_all(on_failure(e));
      MPI_Abort(MPI_COMM_WORLD, 1);
    } catch (const std::exception& e) {
      log_all(std::string("internal error: ") + e.what());
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
  }
  if (input_errors != MPI_COMM_NULL) MPI_Comm_free(&input_errors);
  MPI_Finalize();
  return rc;
}

}  // namespace kvgrid::app
