// Runs the serving loop over the world for an MPI test: the experiment's grid, its failpoints
// configured, no trace, no console output.
#pragma once

#include <mpi.h>

#include "core/decision_log.hpp"
#include "core/failpoint.hpp"
#include "runtime/experiment.hpp"
#include "runtime/serve.hpp"

namespace kvgrid::testing {

inline ServeResult serve(const ExperimentConfig& e, DecisionLog& log) {
  RankGrid grid(e.topology, MPI_COMM_WORLD);
  FailpointRegistry faults(e.engine.seed, grid.world_rank());
  for (const auto& f : e.faults) faults.configure(f);
  return run_serve(e, grid, faults, log, nullptr, false);
}

}  // namespace kvgrid::testing
