// The synthetic model's arithmetic: verifiable KV as a pure function of the token prefix, bound to
// its logical coordinates.
//
//   ph(t)         rolling prefix hash of tokens[0..t]
//   F(t)          token feature  = mix64(ph(t) ^ kFeature)
//   M(l, h)       odd per (layer, KV head) coefficient
//   w(d)          odd per element coefficient (w(D-1) = 1): elements are bound to their index, so a
//                 value moved inside a head vector (K and V swapped, an element off by one) shows
//   kv(t,l,h,d)   KV element d of token t, layer l, head h: pseudo-random for d < D-1; the last
//                 element is chosen so that  sum_d w(d) * kv(t,l,h,d) == F(t) * M(l,h)  (mod 2^64)
//   P(s), Q(k)    odd coefficients of a slot s inside a page and of the k-th page of a request's
//                 page table; R(t) = Q(t / page_size) * P(t mod page_size) binds position t
//   fold(t)       what token t contributes to attention: R(t) * F(t) * M(l,h). A full page applies
//                 w and P when read (the reader knows which slot it reads); a digest page stores
//                 sum_s P(s) * F * M per (l, h) (the writer knows the slot) — either way the reader
//                 applies Q(k) for the position k it reads the page at
//   G(q), N(l,h)  query weight and odd per (layer, query head) coefficient
//   attention     C_l = sum_h sum_q G(q) * N(l,h) * run_h(q),  run_h(q) = sum_{t<=q} fold(t)
//
// All arithmetic is wrapping uint64, so sums may be split over TP heads, CP query tokens, pages
// and chunks in any order without changing a bit. The oracle needs only S(q) = sum_{t<=q} R(t) F(t):
//   C_l = K(l) * sum_q G(q) * S(q),   K(l) = sum_h N(l,h) * M(l,h)   (MHA)
// so a wrong, stale or corrupt page anywhere changes the checksum — and so does a right value at
// the wrong place: pages swapped or reversed in a page table (Q), slots swapped in a page (P), a
// block of another layer or head (M), elements moved inside a vector (w). A coefficient difference
// is even (both odd), so a misplacement goes unseen only if that difference times the values'
// difference is 0 mod 2^64: the values are pseudo-random words, so practically never.
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
// Coefficient of element d of a head vector of `dims` elements (the last one: 1, which makes the
// vector's last element solvable).
constexpr std::uint64_t dim_coeff(std::uint64_t d, std::uint64_t dims) {
  return d + 1 == dims ? 1ULL : mix64(d * 0xd1b54a32d192ed03ULL + 0x3c6ef372fe94f82bULL) | 1ULL;
}
// Coefficient of slot s inside a page (P) and of the k-th page of a request's page table (Q).
constexpr std::uint64_t slot_coeff(std::uint64_t slot) { return mix64(slot * 0xaef17502108ef2d9ULL + 0x632be59bd9b4e019ULL) | 1ULL; }
constexpr std::uint64_t page_coeff(std::uint64_t page_index) {
  return mix64(page_index * 0x8cb92ba72f3d8dd7ULL + 0x1f83d9abfb41bd6bULL) | 1ULL;
}
// R(t): the coefficient of logical position t.
constexpr std::uint64_t position_coeff(std::uint64_t pos, std::uint64_t page_size) {
  return page_coeff(pos / page_size) * slot_coeff(pos % page_size);
}
// Element d (< dims) of the KV vector of a token with feature F at (layer, head).
constexpr std::uint64_t kv_element(std::uint64_t F, std::uint64_t layer, std::uint64_t head, std::uint64_t d,
                                   std::uint64_t dims) {
  if (d + 1 < dims) return mix64(F + layer * 0x9e3779b97f4a7c15ULL + head * 0xbf58476d1ce4e5b9ULL + d * 0x94d049bb133111ebULL);
  std::uint64_t rest = 0;
  for (std::uint64_t e = 0; e + 1 < dims; ++e) rest += dim_coeff(e, dims) * kv_element(F, layer, head, e, dims);
  return F * kv_coeff(layer, head) - rest;
}
// ---- hybrid layers ----
// Layer ids of the kv math per layer kind: the k-th FULL layer of the model is layer k (so a
// full-attention-only model keeps its ids), the k-th SWA layer kSwaLayer0 + k, the k-th MAMBA
// layer kMambaLayer0 + k. Every kind has its own coefficients, so KV read from another kind's
// pool is a mismatch.
inline constexpr std::uint64_t kSwaLayer0 = 1ULL << 24;
inline constexpr std::uint64_t kMambaLayer0 = 2ULL << 24;
inline constexpr std::uint64_t kSidecarLayer0 = 3ULL << 24;  // the i-th [[model.sidecar]]'s payload
// SWA attention at query q folds exactly the tokens (q - W, q]: run_w(q) = sum of fold(t) over
// them, so the oracle's window sum is S(q) - S(q - W).
//
// MAMBA: a per (layer, head) state of `words` words, advanced once per token:
//   s_t[j] = mix64(s_{t-1}[j] ^ F(t) * A(l, h, j)) + (s_{t-1}[(j + 1) mod words] >> 1)
// — order-dependent (every token's step sees its predecessors' state) and lossy (the shift drops
// a bit of every word: s_{t-1} cannot be recovered from s_t). Its initial state is a function of
// (layer, head, j). The layer's attention analogue: C_l = sum_h N(l,h) * sum_q G(q) * fold(s_q),
// fold(s) = sum_j w(j) * s[j].
constexpr std::uint64_t mamba_coeff(std::uint64_t layer, std::uint64_t head, std::uint64_t j) {
  return mix64(layer * 0xc2b2ae3d27d4eb4fULL + head * 0x165667b19e3779f9ULL + j * 0x27d4eb2f165667c5ULL + 0x4d414d42ULL) | 1ULL;
}
constexpr std::uint64_t mamba_initial(std::uint64_t layer, std::uint64_t head, std::uint64_t j) {
  return mix64(layer * 0x9fb21c651e98df25ULL + head * 0xd6e8feb86659fd93ULL + j + 0x53544154ULL);
}
// One token's step of a state of `words` words, in place (`s` holds s_{t-1} on entry).
inline void mamba_step(std::uint64_t* s, std::uint64_t words, std::uint64_t F, std::uint64_t layer, std::uint64_t head) {
  const std::uint64_t first = s[0];
  for (std::uint64_t j = 0; j < words; ++j) {
    const std::uint64_t next = j + 1 < words ? s[j + 1] : first;
    s[j] = mix64(s[j] ^ (F * mamba_coeff(layer, head, j))) + (next >> 1);
  }
}
inline std::uint64_t mamba_fold(const std::uint64_t* s, std::uint64_t words) {
  std::uint64_t f = 0;
  for (std::uint64_t j = 0; j < words; ++j) f += dim_coeff(j, words) * s[j];
  return f;
}

// The token generated after a prefix whose hash is ph: its hash modulo the vocabulary (a hot loop
// reduces next_token_hash with the divisor precomputed, core/fast_mod.hpp: the same token).
constexpr std::uint64_t next_token_hash(std::uint64_t ph) { return mix64(ph ^ kNextToken); }
constexpr std::uint32_t next_token(std::uint64_t ph, std::uint64_t vocab) {
  return static_cast<std::uint32_t>(next_token_hash(ph) % vocab);
}

}  // namespace kvgrid::kernels
