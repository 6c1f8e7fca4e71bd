#include "transfer/polled_event.hpp"

#include <memory>
#include <utility>

#include "core/wait.hpp"

namespace kvgrid::transfer {

namespace {

class Polled final : public EventState {
 public:
  Polled(Event inner, std::string what) : inner_(std::move(inner)), what_(std::move(what)) { copy_state(); }
  bool query() override {
    if (!inner_.query()) return false;
    copy_state();
    return true;
  }
  void synchronize() override {
    if (!inner_.query()) wait_until([this] { return inner_.query(); }, what_);
    copy_state();
  }

 private:
  void copy_state() {
    bytes = inner_.bytes();
    failed = inner_.failed();
    complete_ns = inner_.complete_ns();
    start_ns = complete_ns - inner_.modelled_ns();
  }
  Event inner_;
  std::string what_;
};

}  // namespace

Event polled(Event inner, std::string what) { return Event(std::make_shared<Polled>(std::move(inner), std::move(what))); }

}  // namespace kvgrid::transfer
