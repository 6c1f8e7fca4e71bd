// Helpers for MPI tests: a grid shape for any communicator size, and a shared temp directory.
#pragma once

#include <mpi.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "core/topology.hpp"

namespace kvgrid::testing {

inline int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}
inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

// TP fastest, then CP, then PP, each a power of two: 1 -> 1x1x1, 2 -> TP2, 4 -> TP2xCP2,
// 8 -> TP2xCP2xPP2; other sizes put the rest on PP.
inline GridShape shape_for(int n) {
  GridShape s;
  if (n % 2 == 0) s.tp = 2, n /= 2;
  if (n % 2 == 0) s.cp = 2, n /= 2;
  s.pp = n;
  return s;
}

// A fresh directory created by rank 0 and known to all ranks.
inline std::string shared_temp_dir(const std::string& tag) {
  char buf[512] = {};
  if (world_rank() == 0) {
    std::string tmpl = (std::filesystem::temp_directory_path() / ("kvgrid-" + tag + "-XXXXXX")).string();
    std::snprintf(buf, sizeof(buf), "%s", tmpl.c_str());
    if (!mkdtemp(buf)) buf[0] = '\0';
  }
  MPI_Bcast(buf, sizeof(buf), MPI_CHAR, 0, MPI_COMM_WORLD);
  return buf;
}

// Removes a shared_temp_dir once every rank is done with it.
inline void remove_shared(const std::string& dir) {
  MPI_Barrier(MPI_COMM_WORLD);
  std::error_code ec;
  if (world_rank() == 0 && !dir.empty()) std::filesystem::remove_all(dir, ec);
}

}  // namespace kvgrid::testing
