#include "protocols/pp_sync.hpp"

#include "core/check.hpp"

namespace kvgrid::protocols {

namespace {

class Relay final : public PpSync {
 public:
  std::string_view name() const override { return "pp_sync"; }
  std::size_t write_acks(cache::WriteAcks& acks, std::optional<std::uint64_t> upstream) override {
    if (!upstream) return acks.agreed_ready();  // PP0: the stage's MIN
    return static_cast<std::size_t>(*upstream);        // later stages follow, never query
  }
  bool relays_admissions() const override { return true; }
};

class IndependentPolling final : public PpSync {
 public:
  std::string_view name() const override { return "independent_polling"; }
  std::size_t write_acks(cache::WriteAcks& acks, std::optional<std::uint64_t>) override {
    return acks.agreed_ready();  // the bug: each stage decides from its own events
  }
  bool relays_admissions() const override { return false; }  // each stage its own outcomes, too
};

}  // namespace

std::unique_ptr<PpSync> make_pp_sync(const std::string& variant) {
  if (variant == "pp_sync") return std::make_unique<Relay>();
  if (variant == "independent_polling") return std::make_unique<IndependentPolling>();
  throw InputError("unknown protocol.pp_sync variant '" + variant + "' (pp_sync, independent_polling)");
}

}  // namespace kvgrid::protocols
