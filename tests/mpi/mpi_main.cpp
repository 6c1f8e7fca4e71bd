// Shared main for MPI tests: MPI_Init_thread(MULTIPLE) -> Kokkos -> GoogleTest. Rank 0 prints the
// usual report; other ranks report failures on stderr tagged with their rank. The exit code is
// the MAX over ranks, so a failure on any rank fails the ctest entry. Every temporary directory a
// test makes lies under one directory of this run (TMPDIR while the tests run), removed at the end:
// tests need not clean up after themselves, and a run leaves nothing behind.
#include <gtest/gtest.h>
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "core/check.hpp"
#include "core/log.hpp"

namespace {
// Rank 0 makes the run's directory under the temporary directory; every rank's TMPDIR points into it.
std::string make_run_temp_root(int rank) {
  char buf[512] = {};
  if (rank == 0) {
    const std::string tmpl = (std::filesystem::temp_directory_path() / "kvgrid-mpi-tests-XXXXXX").string();
    std::snprintf(buf, sizeof(buf), "%s", tmpl.c_str());
    if (!mkdtemp(buf)) buf[0] = '\0';
  }
  MPI_Bcast(buf, sizeof(buf), MPI_CHAR, 0, MPI_COMM_WORLD);
  if (buf[0] != '\0') setenv("TMPDIR", buf, 1);
  return buf;
}

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed())
      std::fprintf(stderr, "[rank %d] %s:%d: failure\n%s\n", rank_, r.file_name() ? r.file_name() : "?", r.line_number(),
                   r.summary());
  }

 private:
  int rank_;
};
}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  kvgrid::log_set_rank(rank);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  kvgrid::set_debug_checks(true);
  const std::string temp_root = make_run_temp_root(rank);
  int rc = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    ::testing::InitGoogleTest(&argc, argv);
    if (provided < MPI_THREAD_MULTIPLE) {
      if (rank == 0) std::fprintf(stderr, "MPI_THREAD_MULTIPLE not provided\n");
      rc = 1;
    } else {
      auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
      if (rank != 0) {
        delete listeners.Release(listeners.default_result_printer());
        listeners.Append(new RankFailurePrinter(rank));
      }
      rc = RUN_ALL_TESTS();
    }
  }
  int worst = 0;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);  // (also: every rank is done with its files)
  std::error_code ec;
  if (rank == 0 && !temp_root.empty()) std::filesystem::remove_all(temp_root, ec);
  MPI_Finalize();
  return worst;
}
