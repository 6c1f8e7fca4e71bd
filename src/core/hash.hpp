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

// Hash of a word sequence; processes two 32-bit values per step.
inline std::uint64_t hash_u32(std::span<const std::uint32_t> words, std::uint64_t seed = 0) {
  std::uint64_t h = mix64(seed ^ (words.size() * 0x100000001b3ULL));
  std::size_t i = 0;
  for (; i + 2 <= words.size(); i += 2) {
    std::uint64_t w = static_cast<std::uint64_t>(words[i]) | (static_cast<std::uint64_t>(words[i + 1]) << 32);
    h = (h ^ mix64(w)) * 0x9fb21c651e98df25ULL;
  }
  if (i < words.size()) h = (h ^ mix64(words[i])) * 0x9fb21c651e98df25ULL;
  return mix64(h);
}

inline std::uint64_t hash_string(std::string_view s, std::uint64_t seed = 0) {
  std::uint64_t h = mix64(seed ^ s.size());
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  return mix64(h);
}

}  // namespace kvgrid
