// Choosing and creating the run directory. World rank 0 decides (it reads the clock for the
// default name) and broadcasts the result, so every rank writes to the same place and an error
// is raised on every rank with the same text.
#pragma once

#include <mpi.h>

#include <string>

namespace kvgrid {

// `out` (from --out) wins over `configured` (output.dir); both empty: results/<experiment>/<seed>-<time>.
// An explicit directory's parent must exist and the directory must not already hold a run.
// Collective over `world`; throws InputError on every rank.
std::string prepare_run_dir(const std::string& out, const std::string& configured, const std::string& experiment,
                            std::uint64_t seed, MPI_Comm world);

}  // namespace kvgrid
