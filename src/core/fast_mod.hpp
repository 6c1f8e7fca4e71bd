// x % d for a divisor fixed at run time, without a division instruction: the same value as the
// `%` operator for every 64-bit x (Granlund and Montgomery's method for invariant divisors, with
// the "add back" step that keeps it exact for a 65-bit multiplier). A hardware 64-bit division
// costs tens of cycles; this is two multiplies, a subtraction and shifts. Used where a hot loop
// reduces hashes modulo a configured vocabulary (Mooncake block tokens).
#pragma once

#include <cstdint>

namespace kvgrid {

class FastMod64 {
 public:
  explicit FastMod64(std::uint64_t d) : d_(d == 0 ? 1 : d) {
    // l = ceil(log2 d); m = floor(2^64 (2^l - d) / d) + 1, which fits in 64 bits.
    while (l_ < 64 && (std::uint64_t{1} << l_) < d_) ++l_;
    const std::uint64_t two_l_minus_d = l_ == 64 ? std::uint64_t{0} - d_ : (std::uint64_t{1} << l_) - d_;
    m_ = static_cast<std::uint64_t>((static_cast<unsigned __int128>(two_l_minus_d) << 64) / d_) + 1;
  }
  std::uint64_t divisor() const { return d_; }
  std::uint64_t quotient(std::uint64_t x) const {
    if (l_ == 0) return x;  // d = 1
    const auto t = static_cast<std::uint64_t>((static_cast<unsigned __int128>(m_) * x) >> 64);
    return (t + ((x - t) >> 1)) >> (l_ - 1);
  }
  std::uint64_t mod(std::uint64_t x) const { return x - quotient(x) * d_; }

 private:
  std::uint64_t d_;
  std::uint64_t m_ = 0;
  unsigned l_ = 0;
};

}  // namespace kvgrid
