#include "runtime/prompts_ahead.hpp"

#include "core/any_core.hpp"
#include "core/check.hpp"

namespace kvgrid {

PromptsAhead::PromptsAhead(std::size_t first, std::size_t end, std::size_t depth, Make make)
    : make_(std::move(make)), end_(end), depth_(depth == 0 ? 1 : depth), taken_(first), next_(first), worker_([this] { work(); }) {}

PromptsAhead::~PromptsAhead() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  room_.notify_all();
  worker_.join();
}

MadePrompt PromptsAhead::take(std::size_t i) {
  std::unique_lock lk(mu_);
  KVGRID_CHECK(i == taken_ && i < end_, "prompt ", i, " taken out of order (next: ", taken_, " of ", end_, ")");
  ready_.wait(lk, [this] { return !made_.empty() || error_; });
  if (made_.empty()) std::rethrow_exception(error_);
  auto p = std::move(made_.front());
  made_.pop_front();
  ++taken_;
  lk.unlock();
  room_.notify_one();
  return p;
}

void PromptsAhead::work() {
  allow_any_core();
  std::unique_lock lk(mu_);
  while (next_ < end_) {
    room_.wait(lk, [this] { return stop_ || made_.size() < depth_; });
    if (stop_) return;
    const std::size_t i = next_;
    lk.unlock();
    MadePrompt p;
    std::exception_ptr error;
    try {
      p = make_(i);
    } catch (...) {
      error = std::current_exception();
    }
    lk.lock();
    if (error) {
      error_ = error;
      ready_.notify_all();
      return;
    }
    made_.push_back(std::move(p));
    ++next_;
    ready_.notify_one();
  }
}

}  // namespace kvgrid
