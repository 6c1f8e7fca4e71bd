#include "app/mpi_main.hpp"

#include <Kokkos_Core.hpp>
#include <iostream>

#include "core/log.hpp"

namespace kvgrid::app {

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
  int rc = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    try {
      rc = body(world_rank, world_size);
    } catch (const InputError& e) {
      if (world_rank == 0) std::cerr << "kvgrid " << command << ": error: " << e.what() << "\n";
      rc = 2;
    } catch (const RunFailure& e) {
      log_all(on_failure(e));
      MPI_Abort(MPI_COMM_WORLD, 1);
    } catch (const std::exception& e) {
      log_all(std::string("internal error: ") + e.what());
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
  }
  MPI_Finalize();
  return rc;
}

}  // namespace kvgrid::app
