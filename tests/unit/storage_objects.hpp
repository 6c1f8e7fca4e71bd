// What the object store tests share: an empty scratch directory per test (under the test binary's
// own TMPDIR, tests/unit/temp_root.cpp) and deterministic payloads.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace kvgrid::cache::test_objects {

// <TMPDIR>/kvgrid-<kind>-<tag>-<pid>, removed first if an earlier run left it.
inline std::string fresh_dir(const std::string& kind, const std::string& tag) {
  auto d = std::filesystem::temp_directory_path() / ("kvgrid-" + kind + "-" + tag + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(d);
  return d.string();
}

// n bytes seed, seed + step, seed + 2 step, ... (mod 256).
inline std::vector<std::uint8_t> payload(std::size_t n, std::uint8_t seed, unsigned step = 7) {
  std::vector<std::uint8_t> p(n);
  for (std::size_t i = 0; i < n; ++i) p[i] = static_cast<std::uint8_t>(seed + i * step);
  return p;
}

}  // namespace kvgrid::cache::test_objects
