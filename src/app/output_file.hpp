// Files the CLI writes for the user (timeline -o, workload --export): whole or not at all.
#pragma once

#include <string>

namespace kvgrid::app {

// Writes `text` to a temporary file beside `path`, then renames it over `path`, so that a reader
// never sees half a file and a failure leaves nothing behind. Throws InputError naming `path`, the
// resolved path and the OS error. Returns the resolved path.
std::string write_whole_file(const std::string& path, const std::string& text);

}  // namespace kvgrid::app
