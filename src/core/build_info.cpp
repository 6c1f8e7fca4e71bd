#include "core/build_info.hpp"

#include <kvgrid/build_info.hpp>

namespace kvgrid::build {

const char* version() { return kVersion; }
const char* git_revision() { return kGitRevision; }
const char* hdf5_version() { return kHdf5Version; }

}  // namespace kvgrid::build
