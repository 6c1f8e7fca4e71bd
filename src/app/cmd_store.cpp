// `kvgrid store DIR --limit-mb N [--dry-run]`: the store-level eviction of a unified storage
// directory (cache/file_storage.hpp sweep_directory), for whoever owns a store shared by jobs. Its
// unit is a file: an object, or a segment of objects (cache.storage_file_layout = segment).
#include <filesystem>
#include <iostream>

#include "app/commands.hpp"
#include "cache/file_storage.hpp"
#include "core/check.hpp"

namespace kvgrid::app {

int cmd_store(const StoreArgs& a) {
  namespace fs = std::filesystem;
  std::string dir = a.dir;
  if (fs::is_directory(fs::path(dir) / "unified")) dir = (fs::path(dir) / "unified").string();
  try {
    const auto limit = static_cast<std::uint64_t>(a.limit_mb * 1024.0 * 1024.0);
    const auto r = cache::sweep_directory(dir, limit, a.dry_run);
    std::cout << "# store " << dir << ": " << r.objects << " files (objects or segments), " << r.bytes << " bytes; "
              << (a.dry_run ? "would remove " : "removed ") << r.removed << " files (" << r.removed_bytes
              << " bytes), least recently read or written first, to stay within " << limit << " bytes\n";
    return 0;
  } catch (const InputError& e) {
    std::cerr << "kvgrid store: error: " << e.what() << "\n";
    return 2;
  }
}

}  // namespace kvgrid::app
