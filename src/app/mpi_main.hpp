// What the MPI commands (`kvgrid run`, `kvgrid explore`) share: MPI and Kokkos set-up with the
// error conventions (an input error exits 2: printed once when every rank found it, else by the
// ranks that did, which stop the job with MPI_Abort(2); a run failure or an internal error stops
// the whole job), and agreement on a start-up step's outcome.
#pragma once

#include <mpi.h>

#include <functional>
#include <optional>
#include <string>

#include "core/check.hpp"
#include "runtime/rank_check.hpp"

namespace kvgrid::app {

// Initialises MPI (MPI_THREAD_MULTIPLE, errors returned) and Kokkos, runs `body(world_rank,
// world_size)` and returns its exit code. `command` names the command in messages; `on_failure`
// gives the lines printed (every rank) before MPI_Abort when the body throws RunFailure.
int run_under_mpi(int argc, char** argv, const std::string& command, const std::function<int(int, int)>& body,
                  const std::function<std::string(const RunFailure&)>& on_failure);

// Runs a start-up step on every rank, then agrees on its outcome (one collective either way).
template <typename F>
auto on_every_rank(MPI_Comm world, F&& step) {
  std::optional<decltype(step())> value;
  std::string err;
  try {
    value.emplace(step());
  } catch (const InputError& e) {
    err = e.what();
  }
  agree_or_throw(world, err);
  return std::move(*value);
}

}  // namespace kvgrid::app
