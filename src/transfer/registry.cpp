// Transfer backends by name.
#include <algorithm>

#include "core/check.hpp"
#include "transfer/transfer_engine.hpp"

namespace kvgrid::transfer {

std::unique_ptr<TransferEngine> make_simulated_engine(const EngineConfig& cfg);
std::unique_ptr<TransferEngine> make_threaded_engine(const EngineConfig& cfg);

std::unique_ptr<TransferEngine> make_engine(const EngineConfig& cfg) {
  if (cfg.backend == "simulated") return make_simulated_engine(cfg);
  if (cfg.backend == "threaded") return make_threaded_engine(cfg);
  throw InputError("unknown transfer engine '" + cfg.backend + "' (simulated, threaded; cuda needs -DKVGRID_CUDA=ON)");
}

namespace {

class JoinedEvent final : public EventState {
 public:
  explicit JoinedEvent(std::vector<Event> parts) : parts_(std::move(parts)) {
    bool first = true;
    for (const auto& p : parts_) {
      failed = failed || p.failed();
      bytes += p.bytes();
      complete_ns = std::max(complete_ns, p.complete_ns());
      const std::uint64_t s = p.complete_ns() - p.modelled_ns();
      start_ns = first ? s : std::min(start_ns, s);
      first = false;
    }
  }
  bool query() override {
    for (const auto& p : parts_)
      if (!p.query()) return false;
    return true;
  }
  void synchronize() override {
    for (const auto& p : parts_) p.synchronize();
  }

 private:
  std::vector<Event> parts_;
};

}  // namespace

Event join(std::vector<Event> parts) {
  if (parts.size() == 1) return parts.front();
  return Event(std::make_shared<JoinedEvent>(std::move(parts)));
}

}  // namespace kvgrid::transfer
