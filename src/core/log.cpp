#include "core/log.hpp"

#include <cstdio>

namespace kvgrid {

namespace {
int g_rank = 0;
}

void log_set_rank(int world_rank) { g_rank = world_rank; }
int log_rank() { return g_rank; }

void log0(const std::string& line) {
  if (g_rank != 0) return;
  std::fwrite(line.data(), 1, line.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

void log_all(const std::string& line) {
  std::fprintf(stderr, "[rank %d] %s\n", g_rank, line.c_str());
  std::fflush(stderr);
}

}  // namespace kvgrid
