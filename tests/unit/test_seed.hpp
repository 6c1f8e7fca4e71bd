// The seed of a randomized unit test: its fixed default, or KVGRID_TEST_SEED to replay or vary
// it. Tests print the seed they ran with.
#pragma once

#include <cstdint>
#include <cstdlib>

namespace kvgrid::testing {

inline std::uint64_t seed_or(std::uint64_t fallback) {
  if (const char* s = std::getenv("KVGRID_TEST_SEED")) return std::strtoull(s, nullptr, 10);
  return fallback;
}

}  // namespace kvgrid::testing
