// This build's identity — the one source every output reads (the run header, `kvgrid --version`,
// the trace's /meta, hence `kvgrid report`). The generated header (cmake/build_info.hpp.in,
// refreshed at every build) is included by build_info.cpp alone, so no two outputs of one binary
// can carry different revisions.
#pragma once

namespace kvgrid::build {

const char* version();       // the project version
const char* git_revision();  // short revision, "-dirty" when tracked files had uncommitted changes
const char* hdf5_version();  // the HDF5 the build found

}  // namespace kvgrid::build
