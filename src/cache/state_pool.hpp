// Storage of recurrent (MAMBA) states: `capacity` slots (slot 0 is padding) of
// `words_per_slot` words each — one rank's local MAMBA layers × local heads × state words, kept
// whole in both payload modes. Which slots are free is the hybrid cache's business
// (unified::SlotPool); this holds the words: the model advances a request's private slot, the
// cache copies a tree state into one (a match finalizer's copy) and poisons freed slots.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "core/check.hpp"

namespace kvgrid::cache {

class StatePool {
 public:
  static constexpr std::uint64_t kPoison = 0x5fa7e5fa7e5fa7e5ULL;

  StatePool(std::size_t capacity, std::size_t words_per_slot)
      : capacity_(capacity), words_(words_per_slot), data_((capacity + 1) * words_per_slot, kPoison) {}

  std::span<std::uint64_t> slot(std::uint32_t s) {
    check(s);
    return {data_.data() + s * words_, words_};
  }
  std::span<const std::uint64_t> slot(std::uint32_t s) const {
    check(s);
    return {data_.data() + s * words_, words_};
  }
  void copy(std::uint32_t src, std::uint32_t dst) {
    check(src);
    check(dst);
    std::copy_n(data_.data() + src * words_, words_, data_.data() + dst * words_);
  }
  void poison(std::span<const std::uint32_t> slots) {
    for (auto s : slots) {
      auto w = slot(s);
      std::fill(w.begin(), w.end(), kPoison);
    }
  }
  std::size_t capacity() const { return capacity_; }
  std::size_t words_per_slot() const { return words_; }

 private:
  void check(std::uint32_t s) const { KVGRID_CHECK(s >= 1 && s <= capacity_, "state slot ", s, " of ", capacity_); }
  std::size_t capacity_, words_;
  std::vector<std::uint64_t> data_;
};

}  // namespace kvgrid::cache
