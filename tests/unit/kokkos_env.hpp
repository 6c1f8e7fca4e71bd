// Initialises Kokkos once for a unit-test binary whose tests launch kernels.
#pragma once

#include <gtest/gtest.h>

#include <Kokkos_Core.hpp>

namespace kvgrid::testing {

class KokkosEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    if (!Kokkos::is_initialized()) Kokkos::initialize();
  }
  void TearDown() override {
    if (Kokkos::is_initialized()) Kokkos::finalize();
  }
};

inline void ensure_kokkos() {
  static bool registered = [] {
    ::testing::AddGlobalTestEnvironment(new KokkosEnvironment);
    return true;
  }();
  (void)registered;
}

}  // namespace kvgrid::testing
