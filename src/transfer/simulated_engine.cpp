// The `simulated` transfer backend: deterministic, no threads. A batch's completion time is
// max(modelled now, the stream's tail) + bytes / bandwidth × (1 + jitter × U) + injected delay,
// with U from the rank's seeded stream. Copies are performed, in FIFO order per stream, when an
// event is first observed complete (query after the clock passed its time, or synchronize).
#include <cstring>
#include <deque>

#include "core/check.hpp"
#include "core/rng.hpp"
#include "core/schedule.hpp"
#include "transfer/transfer_engine.hpp"

namespace kvgrid::transfer {

namespace {

class SimulatedEngine;

class SimEvent final : public EventState {
 public:
  SimEvent(SimulatedEngine* e, StreamId s, std::uint64_t n) : engine(e), stream(s), seq(n) {}
  bool query() override;
  void synchronize() override;
  SimulatedEngine* engine;
  StreamId stream;
  std::uint64_t seq;              // the engine's n-th batch (names a choice point)
  std::uint64_t submit_step = 0;  // with a choice source: the step it was submitted at
  std::vector<Copy> copies;
  bool performed = false;
};

class SimulatedEngine final : public TransferEngine {
 public:
  explicit SimulatedEngine(const EngineConfig& cfg)
      : cfg_(cfg), rng_(Rng(cfg.seed).fork("transfer.jitter")), tails_(static_cast<std::size_t>(cfg.streams), 0),
        pending_(static_cast<std::size_t>(cfg.streams)) {
    KVGRID_CHECK(cfg_.now && cfg_.advance_to, "the simulated engine needs the modelled clock");
    KVGRID_CHECK(cfg_.bytes_per_ns > 0, "bandwidth must be positive");
  }
  std::string_view name() const override { return "simulated"; }

  Event submit(StreamId stream, std::vector<Copy> batch) override {
    KVGRID_CHECK(stream >= 0 && stream < cfg_.streams, "stream ", stream, " of ", cfg_.streams);
    auto ev = std::make_shared<SimEvent>(this, stream, submitted_++);
    if (const ChoiceSource* c = choice_source()) ev->submit_step = c->step();
    for (const auto& c : batch) ev->bytes += c.bytes;
    const std::uint64_t start = std::max(cfg_.now(), tails_[static_cast<std::size_t>(stream)]);
    const double base = static_cast<double>(ev->bytes) / cfg_.bytes_per_ns;
    const double jitter = 1.0 + cfg_.jitter * rng_.uniform();
    ev->complete_ns = start + static_cast<std::uint64_t>(base * jitter) + next_delay_ + 1;
    ev->start_ns = start;
    ev->failed = next_fail_;
    next_delay_ = 0;
    next_fail_ = false;
    ev->copies = std::move(batch);
    tails_[static_cast<std::size_t>(stream)] = ev->complete_ns;
    pending_[static_cast<std::size_t>(stream)].push_back(ev);
    return Event(ev);
  }

  void inject(std::uint64_t delay_ns, bool fail) override {
    next_delay_ += delay_ns;
    next_fail_ = next_fail_ || fail;
  }

  // Performs, in order, every pending copy of `stream` that completed by the modelled clock.
  void progress(StreamId stream) {
    auto& q = pending_[static_cast<std::size_t>(stream)];
    const std::uint64_t now = cfg_.now();
    while (!q.empty() && q.front()->complete_ns <= now) {
      perform(*q.front());
      q.pop_front();
    }
  }
  // With a choice source (`kvgrid explore`, `--schedule`): whether `ev` has completed is a choice
  // point whose default is the modelled clock's answer; "complete" performs the stream's copies up
  // to and including it (FIFO), "not yet" performs nothing.
  bool choose(SimEvent& ev, ChoiceSource& c) {
    const bool by_clock = ev.complete_ns <= cfg_.now();
    const std::string what = "copy #" + std::to_string(ev.seq) + " (stream " + std::to_string(ev.stream) +
                             ", submitted at step " + std::to_string(ev.submit_step) + ", modelled " +
                             (by_clock ? "complete" : "pending") + ")";
    if (!c.answer(by_clock, what)) return false;
    auto& q = pending_[static_cast<std::size_t>(ev.stream)];
    while (!ev.performed) {
      perform(*q.front());
      q.pop_front();
    }
    return true;
  }
  void perform(SimEvent& ev) {
    if (!ev.failed)
      for (const auto& c : ev.copies) std::memcpy(c.dst, c.src, c.bytes);
    ev.copies.clear();
    ev.performed = true;
  }
  void advance_to(std::uint64_t t) {
    if (cfg_.now() < t) cfg_.advance_to(t);
  }

 private:
  EngineConfig cfg_;
  Rng rng_;
  std::vector<std::uint64_t> tails_;
  std::vector<std::deque<std::shared_ptr<SimEvent>>> pending_;
  std::uint64_t next_delay_ = 0;
  std::uint64_t submitted_ = 0;
  bool next_fail_ = false;
};

bool SimEvent::query() {
  if (performed) return true;
  if (ChoiceSource* c = choice_source()) return engine->choose(*this, *c);
  engine->progress(stream);
  return performed;
}

void SimEvent::synchronize() {
  if (performed) return;
  engine->advance_to(complete_ns);
  engine->progress(stream);
  KVGRID_CHECK(performed, "simulated event not complete after advancing the clock to its time");
}

}  // namespace

std::unique_ptr<TransferEngine> make_simulated_engine(const EngineConfig& cfg) {
  return std::make_unique<SimulatedEngine>(cfg);
}

}  // namespace kvgrid::transfer
