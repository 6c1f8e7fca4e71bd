// Seeded random streams. Every random draw in kvgrid comes from one of these, so a run is
// reproducible from its seed (DESIGN §2 "Determinism"):
//  * the shared stream `shared_stream(seed, purpose)` is identical on every rank (workloads);
//  * the rank stream `rank_stream(seed, world_rank)` starts from `seed ^ world_rank` (jitter);
//  * sub-streams `.fork(name)` give each consumer (each failpoint, ...) its own sequence, so
//    enabling one consumer never shifts the draws of another.
// Generator: xoshiro256** seeded through splitmix64. Not thread-safe; one stream per thread.
#pragma once

#include <cstdint>
#include <string_view>

#include "core/hash.hpp"

namespace kvgrid {

class Rng {
 public:
  explicit Rng(std::uint64_t seed) : seed_(seed) {
    std::uint64_t x = seed;
    for (auto& s : s_) {
      x += 0x9e3779b97f4a7c15ULL;
      s = mix64(x);
    }
  }

  std::uint64_t seed() const { return seed_; }

  std::uint64_t next_u64() {
    const std::uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const std::uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }

  // Uniform in [0, n), n > 0 (Lemire's multiply-shift; bias < 2^-64 * n, irrelevant here).
  std::uint64_t below(std::uint64_t n) {
    return static_cast<std::uint64_t>((static_cast<unsigned __int128>(next_u64()) * n) >> 64);
  }
  // Uniform in [lo, hi], lo <= hi.
  std::int64_t between(std::int64_t lo, std::int64_t hi) {
    return lo + static_cast<std::int64_t>(below(static_cast<std::uint64_t>(hi - lo) + 1));
  }
  // Uniform in [0, 1).
  double uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }
  bool bernoulli(double p) { return p > 0.0 && uniform() < p; }

  // An independent stream derived from this stream's seed and a name.
  Rng fork(std::string_view name) const { return Rng(hash_combine(seed_, hash_string(name))); }

 private:
  static std::uint64_t rotl(std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  std::uint64_t seed_;
  std::uint64_t s_[4];
};

inline Rng rank_stream(std::uint64_t seed, int world_rank) {
  return Rng(seed ^ static_cast<std::uint64_t>(world_rank));
}
inline Rng shared_stream(std::uint64_t seed, std::string_view purpose) {
  return Rng(seed).fork(purpose);
}

}  // namespace kvgrid
