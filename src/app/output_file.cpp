#include "app/output_file.hpp"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/check.hpp"

namespace kvgrid::app {

std::string write_whole_file(const std::string& path, const std::string& text) {
  namespace fs = std::filesystem;
  const fs::path target = fs::absolute(path);
  const fs::path tmp = target.string() + ".tmp";
  std::error_code ec;
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) throw InputError(path + ": cannot write (" + target.string() + ": " + std::strerror(errno) + ")");
    f << text;
    f.close();
    if (!f) {
      fs::remove(tmp, ec);
      throw InputError(path + ": write failed (" + target.string() + ")");
    }
  }
  fs::rename(tmp, target, ec);
  if (ec) {
    const std::string why = ec.message();
    fs::remove(tmp, ec);
    throw InputError(path + ": cannot write (" + target.string() + ": " + why + ")");
  }
  return target.string();
}

}  // namespace kvgrid::app
