// The grid layouts the MPI tests run, named once. "Every layout" of a world of n ranks is
// `every_layout(n)`: a bounded list per world size (1, 2, 4 or 8 ranks) that covers TP, CP and PP
// alone and mixed, so a feature tested "at every layout" adds a known cost to the suite. Seeds
// per case come from `suite_seeds`: a few in the suite, more from jobs/mpi_seeds.sh
// (KVGRID_SEEDS).
#pragma once

#include <cstdlib>
#include <string>
#include <vector>

#include "mpi_util.hpp"

namespace kvgrid::testing {

struct Layout {
  int tp = 1, cp = 1, pp = 1;
  std::string str() const {
    return "TP" + std::to_string(tp) + "xCP" + std::to_string(cp) + "xPP" + std::to_string(pp);
  }
  // The experiment keys that select it.
  std::vector<std::string> sets() const {
    return {"topology.tp=" + std::to_string(tp), "topology.cp=" + std::to_string(cp), "topology.pp=" + std::to_string(pp)};
  }
};

inline std::vector<Layout> every_layout(int n) {
  switch (n) {
    case 1: return {{1, 1, 1}};
    case 2: return {{2, 1, 1}, {1, 2, 1}, {1, 1, 2}};
    case 4: return {{2, 2, 1}, {2, 1, 2}, {1, 2, 2}};
    case 8: return {{2, 2, 2}, {2, 1, 4}};
    default: return {{1, 1, n}};
  }
}

// Seeds per case: `in_suite` in the test suite; KVGRID_SEEDS=N (jobs/mpi_seeds.sh) for sweeps.
inline int suite_seeds(int in_suite) {
  if (const char* e = std::getenv("KVGRID_SEEDS")) {
    const int n = std::atoi(e);
    if (n > 0) return n;
  }
  return in_suite;
}

// In the test suite (not a jobs/mpi_seeds.sh sweep): tests may thin their case × layout grids.
inline bool in_suite() { return std::getenv("KVGRID_SEEDS") == nullptr; }

// Suite time: a long case list shared out over the suite's world sizes — in the suite, case i runs
// at 1 and 2 ranks when i mod 3 = 0, at 4 when 1, at 8 when 2, so every case runs in every pass of
// the suite at one world size (of that size's layouts, the caller picks one); a jobs/mpi_seeds.sh
// sweep runs every case at every size.
inline bool suite_share(std::size_t i) {
  if (!in_suite()) return true;
  const int n = world_size();
  const std::size_t slot = n <= 2 ? 0 : n <= 4 ? 1 : 2;
  return i % 3 == slot;
}

}  // namespace kvgrid::testing
