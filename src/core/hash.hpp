// Non-cryptographic 64-bit hashing used for digests (tree content, decision log entries) and for
// child lookup in the radix tree. Stable across runs, platforms and rank counts: digests are
// compared between ranks and stored in traces. SHA-256 page keys live in cache/page_hash.hpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>

namespace kvgrid {

// splitmix64 finaliser: a bijective mix of one 64-bit word.
constexpr std::uint64_t mix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Order-dependent combination of a running hash with one more word.
constexpr std::uint64_t hash_combine(std::uint64_t h, std::uint64_t v) {
  return mix64(h ^ (v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2)));
}

// Hash of a word sequence (a page of token ids). Two independent lanes of multiply-xorshift over
// 64-bit words keep it at about one multiply per 8 bytes; a final mix64 spreads the bits.
inline std::uint64_t hash_u32(std::span<const std::uint32_t> words, std::uint64_t seed = 0) {
  std::uint64_t a = mix64(seed) ^ 0x243f6a8885a308d3ULL;
  std::uint64_t b = static_cast<std::uint64_t>(words.size()) * 0xc2b2ae3d27d4eb4fULL + 0x13198a2e03707344ULL;
  const std::size_t n = words.size();
  std::size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    std::uint64_t w0, w1;
    std::memcpy(&w0, words.data() + i, 8);
    std::memcpy(&w1, words.data() + i + 2, 8);
    a = (a ^ w0) * 0x9fb21c651e98df25ULL;
    a ^= a >> 32;
    b = (b ^ w1) * 0xd6e8feb86659fd93ULL;
    b ^= b >> 32;
  }
  for (; i < n; ++i) {
    a = (a ^ words[i]) * 0x9fb21c651e98df25ULL;
    a ^= a >> 32;
  }
  return mix64(a ^ ((b << 31) | (b >> 33)));
}

inline std::uint64_t hash_string(std::string_view s, std::uint64_t seed = 0) {
  std::uint64_t h = mix64(seed ^ s.size());
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  return mix64(h);
}

}  // namespace kvgrid
