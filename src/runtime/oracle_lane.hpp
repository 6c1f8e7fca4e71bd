// engine.helper_thread: the oracle's value for a long chunk computed on a thread of its own (the
// helper) while the model computes the same chunk, and compared where it is compared without one.
//
// Invariant: the run is the same as without the helper — every comparison happens in `verify`, in batch
// order, with the same expected value (Oracle::expected is a function of the request's oracle
// state and tokens only), so mismatches, their events, logs and a --strict stop come out at the
// same step in the same order. What makes that safe: between `post` (start of `forward`) and
// `take` (`verify`) nothing writes a request's tokens or its oracle state — tokens grow only in
// the scheduler's step completion and at admission, after `verify` and before `forward` — and the
// lane is emptied (every posted value taken, or the worker joined) before either can happen.
//
// Only chunks with at least kMinTokens positions to hash go to the thread (a decode step's one
// token is cheaper than waking it). Worth it where a core is idle: one rank on a machine of two or
// more cores; eight ranks on two cores have none to give.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <vector>

#include "runtime/model.hpp"

namespace kvgrid {

class OracleLane {
 public:
  static constexpr std::size_t kMinTokens = 4096;

  explicit OracleLane(const Oracle& oracle);
  ~OracleLane();  // stops the worker after the job it is on; values not taken are dropped
  OracleLane(const OracleLane&) = delete;
  OracleLane& operator=(const OracleLane&) = delete;

  // Queues batch entry `entry`'s expected value when it is long enough to be worth a thread (returns
  // whether it did). `st` and `tokens` must stay untouched until take(entry).
  bool post(std::size_t entry, OracleRequestState& st, RequestId id, std::span<const TokenId> tokens, std::size_t start,
            std::size_t end);
  // The value posted for `entry` (waiting for it); nullopt when `entry` was not posted. A failure
  // of the computation (a check in Oracle::expected) is rethrown here.
  std::optional<std::uint64_t> take(std::size_t entry);
  // Nothing posted is left untaken (the step's verify took every entry it posted).
  bool empty() const { return outstanding_ == 0; }
  std::int64_t posted() const { return posted_count_; }  // chunks posted so far

 private:
  struct Job {
    std::size_t entry;
    OracleRequestState* st;
    RequestId id;
    std::span<const TokenId> tokens;
    std::size_t start, end;
    bool done = false;
    std::uint64_t value = 0;
    std::exception_ptr error;
  };
  void work();

  const Oracle& oracle_;
  mutable std::mutex mu_;
  std::condition_variable posted_, finished_;
  std::vector<Job> jobs_;    // this step's, in post order
  std::size_t next_ = 0;     // the first job the worker has not started
  bool stop_ = false;
  std::int64_t posted_count_ = 0;  // (these two: the serving thread's only)
  std::size_t outstanding_ = 0;
  std::thread worker_;       // (last: started once the rest is built)
};

}  // namespace kvgrid
