// What the cache needs its protocols to agree on, as small interfaces the cache defines itself
// (DESIGN §7): protocols/ implements them with communicators, so cache/ never includes protocols/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

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


// What the host and storage tiers need agreed across pipeline stages (PP > 1): the outcome of
// backups (protocol.pp_sync) and prefetches (protocol.prefetch_consensus). Called at the end of a
// step, after the step's message went out, on every rank.
class CrossStageAgreement {
 public:
  virtual ~CrossStageAgreement() = default;
  virtual std::string_view name() const = 0;
  // Element-wise MIN over every rank that serves the requests (its stage, and every stage).
  virtual void min(std::vector<std::uint64_t>& v) = 0;
  // Does this rank's stage decide when prefetches stop? (PP0; every stage in the buggy variant.)
  virtual bool decides() const = 0;
  // The same MIN, non-blocking: started at the end of one step, finished at the end of the next,
  // so that no stage waits for the others to finish a step (one operation in flight at a time;
  // `v` must stay alive until `min_end`).
  virtual void min_begin(std::vector<std::uint64_t>& v) = 0;
  virtual void min_end() = 0;
};

}  // namespace kvgrid::cache
