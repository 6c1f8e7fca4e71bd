// Typed ids and counts. An id of one kind never converts implicitly to another kind or to an
// integer: mixing a PageId with a LayerId, or a token count with a page count, fails to compile.
// Use `.value()` at the boundaries (array indexing, MPI buffers, HDF5 columns).
#pragma once

#include <compare>
#include <cstdint>
#include <functional>
#include <ostream>

namespace kvgrid {

template <typename Tag, typename Rep>
class StrongId {
 public:
  using rep = Rep;
  constexpr StrongId() = default;
  constexpr explicit StrongId(Rep v) : v_(v) {}
  constexpr Rep value() const { return v_; }
  constexpr auto operator<=>(const StrongId&) const = default;
  friend std::ostream& operator<<(std::ostream& os, StrongId id) { return os << +id.v_; }

 private:
  Rep v_{};
};

// Counts support arithmetic within their own unit only.
template <typename Tag, typename Rep>
class StrongCount {
 public:
  using rep = Rep;
  constexpr StrongCount() = default;
  constexpr explicit StrongCount(Rep v) : v_(v) {}
  constexpr Rep value() const { return v_; }
  constexpr auto operator<=>(const StrongCount&) const = default;
  constexpr StrongCount operator+(StrongCount o) const { return StrongCount(v_ + o.v_); }
  constexpr StrongCount operator-(StrongCount o) const { return StrongCount(v_ - o.v_); }
  constexpr StrongCount& operator+=(StrongCount o) { v_ += o.v_; return *this; }
  constexpr StrongCount& operator-=(StrongCount o) { v_ -= o.v_; return *this; }
  friend std::ostream& operator<<(std::ostream& os, StrongCount c) { return os << c.v_; }

 private:
  Rep v_{};
};

struct PageIdTag {};
struct RankTag {};
struct LayerIdTag {};
struct RequestIdTag {};
struct TokensTag {};
struct PagesTag {};

using PageId = StrongId<PageIdTag, std::uint32_t>;       // a device (or host) pool page
using Rank = StrongId<RankTag, int>;                      // an MPI rank in some communicator
using LayerId = StrongId<LayerIdTag, std::uint32_t>;     // a model layer
using RequestId = StrongId<RequestIdTag, std::uint64_t>;  // a request, unique in a run
using Tokens = StrongCount<TokensTag, std::int64_t>;      // a number of tokens
using Pages = StrongCount<PagesTag, std::int64_t>;        // a number of pages

using TokenId = std::uint32_t;  // a vocabulary id; SGLang hashes token ids as uint32

}  // namespace kvgrid

template <typename Tag, typename Rep>
struct std::hash<kvgrid::StrongId<Tag, Rep>> {
  std::size_t operator()(kvgrid::StrongId<Tag, Rep> id) const noexcept {
    return std::hash<Rep>{}(id.value());
  }
};
