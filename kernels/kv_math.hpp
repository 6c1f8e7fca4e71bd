// The synthetic model's arithmetic: verifiable KV as a pure function of the token prefix.
//
//   ph(t)         rolling prefix hash of tokens[0..t]
//   F(t)          token feature  = mix64(ph(t) ^ kFeature)
//   M(l, h)       odd per (layer, KV head) coefficient
//   kv(t,l,h,d)   KV element d of token t, layer l, head h: pseudo-random for d < D-1; the last
//                 element is chosen so that  sum_d kv(t,l,h,d) == F(t) * M(l,h)  (mod 2^64)
//   fold(page)    sum of a page's elements for one (l, h): sum over its tokens of F(t) * M(l,h);
//                 in `digest` payload mode the pool stores exactly this one word per page×l×h
//   G(q), N(l,h)  query weight and odd per (layer, query head) coefficient
//   attention     C_l = sum_h sum_q G(q) * N(l,h) * run_h(q),  run_h(q) = sum_{t<=q} fold of t
//
// All arithmetic is wrapping uint64, so sums may be split over TP heads, CP query tokens, pages
// and chunks in any order without changing a bit. The oracle needs only S(q) = sum_{t<=q} F(t):
//   C_l = K(l) * sum_q G(q) * S(q),   K(l) = sum_h N(l,h) * M(l,h)   (MHA)
// so a wrong, stale or corrupt page anywhere changes the checksum.
#pragma once

#include <cstdint>

#include "core/hash.hpp"

namespace kvgrid::kernels {

inline constexpr std::uint64_t kPrefixSeed = 0x6b76677269642121ULL;  // "kvgrid!!"
inline constexpr std::uint64_t kFeature = 0xa0761d6478bd642fULL;
inline constexpr std::uint64_t kQuery = 0xe7037ed1a0b428dbULL;
inline constexpr std::uint64_t kNextToken = 0x8ebc6af09c88c6e3ULL;

constexpr std::uint64_t prefix_hash_step(std::uint64_t prev, std::uint32_t token) {
  return hash_combine(prev, token);
}
constexpr std::uint64_t token_feature(std::uint64_t ph) { return mix64(ph ^ kFeature); }
constexpr std::uint64_t query_weight(std::uint64_t ph) { return mix64(ph ^ kQuery); }
constexpr std::uint64_t kv_coeff(std::uint64_t layer, std::uint64_t head) {
  return mix64(layer * 0x100000001b3ULL + head * 0x9e3779b97f4a7c15ULL + 0x51ed2701ULL) | 1ULL;
}
constexpr std::uint64_t query_coeff(std::uint64_t layer, std::uint64_t head) {
  return mix64(layer * 0x2545f4914f6cdd1dULL + head * 0x94d049bb133111ebULL + 0x7f4a7c15ULL) | 1ULL;
}
// Element d (< dims) of the KV vector of a token with feature F at (layer, head).
constexpr std::uint64_t kv_element(std::uint64_t F, std::uint64_t layer, std::uint64_t head, std::uint64_t d,
                                   std::uint64_t dims) {
  if (d + 1 < dims) return mix64(F + layer * 0x9e3779b97f4a7c15ULL + head * 0xbf58476d1ce4e5b9ULL + d * 0x94d049bb133111ebULL);
  std::uint64_t rest = 0;
  for (std::uint64_t e = 0; e + 1 < dims; ++e) rest += kv_element(F, layer, head, e, dims);
  return F * kv_coeff(layer, head) - rest;
}
// The token generated after a prefix whose hash is ph.
constexpr std::uint32_t next_token(std::uint64_t ph, std::uint64_t vocab) {
  return static_cast<std::uint32_t>(mix64(ph ^ kNextToken) % vocab);
}

}  // namespace kvgrid::kernels
