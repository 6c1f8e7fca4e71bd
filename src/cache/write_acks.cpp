#include "cache/write_acks.hpp"

#include <algorithm>

#include "core/check.hpp"
#include "core/schedule.hpp"

namespace kvgrid::cache {

std::size_t WriteAcks::agreed_ready() {
  ChoiceSource* choices = choice_source();
  const std::size_t mark = choices ? choices->size() : 0;
  std::size_t ready = 0;
  while (ready < queue_.size() && queue_[ready].event.query()) ++ready;
  const std::size_t agreed = std::min(agreement_.agree(ready, queue_.size()), queue_.size());
  // Under `kvgrid explore`: this rank saw more finished than the agreement took, so seeing one
  // more (an early completion of the copy that stopped its count) cannot change the agreement.
  if (choices && ready > agreed) choices->dominate_since(mark);
  return agreed;
}

void WriteAcks::consume(std::size_t n) {
  KVGRID_CHECK(n <= queue_.size(), "asked to consume ", n, " write ACKs of ", queue_.size(),
               " (the stages' backups differ)");
  if (n == 0) return;
  if (cross_) {  // published at the end of the step, with the outcome agreed over every stage
    for (std::size_t i = 0; i < n; ++i) {
      if (!queue_.front().placeholder) queue_.front().event.synchronize();
      consumed_.push_back(std::move(queue_.front()));
      queue_.pop_front();
    }
    KVGRID_CONSENSUS(log_, "writing_check", {static_cast<std::int64_t>(n)}, {});
    return;
  }
  // A copy that failed on any rank is a failure everywhere: one MIN when none failed (the common
  // case), one per ACK otherwise.
  bool any_failed = false;
  for (std::size_t i = 0; i < n; ++i) {
    queue_[i].event.synchronize();  // done already on PP0; a later stage may block here
    any_failed = any_failed || queue_[i].failed();
  }
  const bool all_ok = agreement_.agree_min(any_failed ? 0 : 1) == 1;
  for (std::size_t i = 0; i < n; ++i) {
    const bool ok = all_ok || agreement_.agree_min(queue_.front().failed() ? 0 : 1) == 1;
    const Entry e = std::move(queue_.front());
    queue_.pop_front();
    publish_(e.id, e.placeholder, ok);
  }
  KVGRID_CONSENSUS(log_, "writing_check", {static_cast<std::int64_t>(n)}, {});
}

void WriteAcks::end_of_step() {
  if (!cross_) return;
  finish_cross_stage();
  if (consumed_.empty()) return;  // the same on every rank: the counts were relayed
  agreeing_ = std::move(consumed_);
  consumed_.clear();
  agreeing_ok_.clear();
  for (const auto& w : agreeing_) agreeing_ok_.push_back(w.failed() ? 0 : 1);
  cross_->min_begin(agreeing_ok_);
}

void WriteAcks::finish_cross_stage() {
  if (!cross_ || agreeing_.empty()) return;
  cross_->min_end();
  for (std::size_t i = 0; i < agreeing_.size(); ++i) publish_(agreeing_[i].id, agreeing_[i].placeholder, agreeing_ok_[i] == 1);
  agreeing_.clear();
}

}  // namespace kvgrid::cache
