#include "runtime/run_dir.hpp"

#include <ctime>
#include <filesystem>

#include "core/check.hpp"
#include "core/wait.hpp"

namespace kvgrid {

namespace {
namespace fs = std::filesystem;

std::string decide(const std::string& out, const std::string& configured, const std::string& experiment,
                   std::uint64_t seed) {
  std::error_code ec;
  const std::string chosen = !out.empty() ? out : configured;
  const std::string flag = !out.empty() ? "--out " : "output.dir = ";
  if (!chosen.empty()) {
    fs::path dir(chosen);
    fs::path parent = dir.has_parent_path() ? dir.parent_path() : fs::path(".");
    if (!fs::is_directory(parent, ec))
      throw InputError(flag + chosen + ": parent directory '" + parent.string() + "' does not exist");
    if (fs::exists(dir / "run.h5", ec))
      throw InputError(flag + chosen + ": already holds a run (run.h5); choose another directory");
    if (fs::exists(dir, ec) && !fs::is_directory(dir, ec))
      throw InputError(flag + chosen + ": exists and is not a directory");
    fs::create_directory(dir, ec);
    if (ec) throw InputError(flag + chosen + ": cannot create directory: " + ec.message());
    return dir.string();
  }
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M%S", &tm);
  fs::path base = fs::path("results") / experiment;
  fs::create_directories(base, ec);
  if (ec) throw InputError("cannot create '" + base.string() + "': " + ec.message());
  std::string name = std::to_string(seed) + "-" + stamp;
  for (int i = 2; fs::exists(base / name, ec); ++i) name = std::to_string(seed) + "-" + stamp + "-" + std::to_string(i);
  fs::create_directory(base / name, ec);
  if (ec) throw InputError("cannot create '" + (base / name).string() + "': " + ec.message());
  return (base / name).string();
}
}  // namespace

std::string prepare_run_dir(const std::string& out, const std::string& configured, const std::string& experiment,
                            std::uint64_t seed, MPI_Comm world) {
  int rank = 0;
  KVGRID_MPI_CHECK(MPI_Comm_rank(world, &rank));
  std::int64_t status = 0;  // 0: path follows, 1: error text follows
  std::string text;
  if (rank == 0) {
    try {
      text = decide(out, configured, experiment, seed);
    } catch (const InputError& e) {
      status = 1;
      text = e.what();
    }
  }
  std::int64_t head[2] = {status, static_cast<std::int64_t>(text.size())};
  MPI_Request req;
  KVGRID_MPI_CHECK(MPI_Ibcast(head, 2, MPI_INT64_T, 0, world, &req));
  wait_mpi(&req, "Ibcast of the run directory (size)");
  text.resize(static_cast<std::size_t>(head[1]));
  KVGRID_MPI_CHECK(MPI_Ibcast(text.data(), static_cast<int>(head[1]), MPI_CHAR, 0, world, &req));
  wait_mpi(&req, "Ibcast of the run directory");
  if (head[0] != 0) throw InputError(text);
  return text;
}

}  // namespace kvgrid
