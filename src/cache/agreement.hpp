// What the cache needs its protocols to agree on, as small interfaces the cache defines itself
// (DESIGN §7): protocols/ implements them with communicators, so cache/ never includes protocols/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace kvgrid::cache {

// "How many of the leading finished ACKs do we all consume now?" Every rank of the agreeing group
// (a stage's TP and CP ranks) calls it at the same points, with the number of leading finished
// ACKs in its own queue and the queue's length; the result is what every rank consumes.
class AckAgreement {
 public:
  virtual ~AckAgreement() = default;
  virtual std::string_view name() const = 0;
  virtual std::size_t agree(std::size_t local_ready, std::size_t queue_length) = 0;
  // "Did the allocation succeed everywhere?" A backup goes ahead only if every rank could allocate
  // its host pages (reserve → agree → commit or abort; SGLang #28429's fix). Same call points on
  // every rank.
  virtual bool agree_allocation(bool local_ok) = 0;
  // "What is the smallest of our values?" — storage hit lengths before a prefetch reads, completed
  // lengths after it, and "can this prefetch stop?" (1/0: all must be able to). Same call points
  // on every rank.
  virtual std::uint64_t agree_min(std::uint64_t local) = 0;
};

}  // namespace kvgrid::cache
