#include "core/check.hpp"

#include <mpi.h>

#include <atomic>

namespace kvgrid {

namespace {
std::atomic<bool> g_debug_checks{false};
}

bool debug_checks_enabled() { return g_debug_checks.load(std::memory_order_relaxed); }
void set_debug_checks(bool on) { g_debug_checks.store(on, std::memory_order_relaxed); }

int check_rank() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (!init || fin) return -1;
  int r = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

void fail_check(const char* file, int line, const std::string& what) {
  throw InternalError(detail::concat(file, ":", line, " [rank ", check_rank(), "] ", what));
}

namespace detail {
std::string mpi_error_string(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, buf, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(buf, static_cast<std::size_t>(len));
}
}  // namespace detail

}  // namespace kvgrid
