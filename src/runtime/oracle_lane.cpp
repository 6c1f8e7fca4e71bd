#include "runtime/oracle_lane.hpp"

#include <algorithm>

#include "core/any_core.hpp"
#include "core/check.hpp"

namespace kvgrid {

OracleLane::OracleLane(const Oracle& oracle) : oracle_(oracle), worker_([this] { work(); }) {}

OracleLane::~OracleLane() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  posted_.notify_all();
  worker_.join();
}

bool OracleLane::post(std::size_t entry, OracleRequestState& st, RequestId id, std::span<const TokenId> tokens,
                      std::size_t start, std::size_t end) {
  // The oracle hashes from where it stopped (a request's first check: from position 0).
  if (end < st.hashed + kMinTokens) return false;
  {
    std::lock_guard lk(mu_);
    jobs_.push_back(Job{entry, &st, id, tokens, start, end, false, 0, nullptr});
  }
  ++posted_count_;
  ++outstanding_;
  posted_.notify_one();
  return true;
}

std::optional<std::uint64_t> OracleLane::take(std::size_t entry) {
  if (outstanding_ == 0) return std::nullopt;  // (a decode step's verify: no lock taken)
  std::unique_lock lk(mu_);
  const auto it = std::find_if(jobs_.begin(), jobs_.end(), [entry](const Job& j) { return j.entry == entry; });
  if (it == jobs_.end()) return std::nullopt;
  const std::size_t k = static_cast<std::size_t>(it - jobs_.begin());
  finished_.wait(lk, [&] { return jobs_[k].done; });
  const Job j = jobs_[k];
  --outstanding_;
  // The step's last value taken empties the list for the next step.
  jobs_[k].entry = static_cast<std::size_t>(-1);
  if (outstanding_ == 0) {
    jobs_.clear();
    next_ = 0;
  }
  if (j.error) std::rethrow_exception(j.error);
  return j.value;
}

void OracleLane::work() {
  allow_any_core();
  std::unique_lock lk(mu_);
  for (;;) {
    posted_.wait(lk, [this] { return stop_ || next_ < jobs_.size(); });
    if (stop_) return;
    const std::size_t k = next_++;
    Job j = jobs_[k];  // (a copy: posts may reallocate the list while this one runs)
    lk.unlock();
    try {
      j.value = oracle_.expected(*j.st, j.id, j.tokens, j.start, j.end);
    } catch (...) {
      j.error = std::current_exception();
    }
    lk.lock();
    jobs_[k].value = j.value;
    jobs_[k].error = j.error;
    jobs_[k].done = true;
    finished_.notify_all();
  }
}

}  // namespace kvgrid
