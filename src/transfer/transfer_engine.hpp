// The transfer engine: asynchronous page copies between pools (device ↔ host, host ↔ storage
// buffers), behind one interface so that the cache controller never knows which backend runs.
//
//  * Streams are FIFO: a batch submitted on a stream completes after every batch submitted on it
//    before (as CUDA streams do). Different streams are independent.
//  * An Event reports completion: `query()` never blocks, `synchronize()` blocks through the wait
//    primitive (watchdog included). A copy's destination must not be read before its event
//    completes — the simulated backend makes that visible: it performs the copy only when the
//    event is observed complete, so a reader that jumps ahead sees stale data (and the oracle
//    catches it).
//  * `submit_layers` issues one batch per layer and returns one event per layer, so attention on
//    layer l waits only for layer l's copy.
//  * `inject` applies a failpoint to the next submitted batch: extra delay, or failure (the copies
//    are not done and the event reports failed(); the caller must treat the pages as misses).
//
// Backends (chosen by name, `make_engine`): `simulated` — completion at modelled submit time +
// bytes / bandwidth × seeded jitter + injected delay, no threads, deterministic from the seed;
// `threaded` — one worker thread per stream doing real memcpy, completions in real time. A `cuda`
// backend (streams and events) fits the same interface.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace kvgrid::transfer {

struct Copy {
  void* dst;
  const void* src;
  std::size_t bytes;
};

using StreamId = int;

class EventState {
 public:
  virtual ~EventState() = default;
  virtual bool query() = 0;
  virtual void synchronize() = 0;
  // Withdraws an operation nobody will match (a KV receive whose sender went away); returns when
  // it is settled. Copies of the transfer engines are never cancelled.
  virtual void cancel() { synchronize(); }
  bool failed = false;
  std::uint64_t bytes = 0;
  std::uint64_t complete_ns = 0;  // simulated: modelled completion time; threaded: 0
  std::uint64_t start_ns = 0;     // simulated: when the copy starts on its stream (after those before it)
};

class Event {
 public:
  Event() = default;  // a null event: already complete
  explicit Event(std::shared_ptr<EventState> s) : s_(std::move(s)) {}
  bool query() const { return !s_ || s_->query(); }
  void synchronize() const {
    if (s_) s_->synchronize();
  }
  bool failed() const { return s_ && s_->failed; }
  void cancel() const {
    if (s_) s_->cancel();
  }
  std::uint64_t complete_ns() const { return s_ ? s_->complete_ns : 0; }
  std::uint64_t bytes() const { return s_ ? s_->bytes : 0; }
  // Modelled duration on its stream (simulated; 0 for real backends).
  std::uint64_t modelled_ns() const { return s_ && s_->complete_ns > s_->start_ns ? s_->complete_ns - s_->start_ns : 0; }

 private:
  std::shared_ptr<EventState> s_;
};

struct EngineConfig {
  std::string backend = "simulated";
  int streams = 4;
  double bytes_per_ns = 25.0;    // simulated bandwidth (25 GB/s: a PCIe 5 x16 link, derated)
  double jitter = 0.25;          // simulated: duration × (1 + jitter × U[0,1)) from the seeded stream
  std::uint64_t seed = 1;        // simulated: the rank stream seed
  std::string cuda_copy = "memcpy";  // cuda: memcpy | kernel | batch (cuda/engine.hpp)
  int copy_threads = 2;          // threaded: threads sharing one batch's copies (the stream worker + helpers)
  // Simulated: the rank's modelled clock, and how `synchronize` advances it.
  std::function<std::uint64_t()> now;
  std::function<void(std::uint64_t)> advance_to;
};

class TransferEngine {
 public:
  virtual ~TransferEngine() = default;
  virtual std::string_view name() const = 0;
  virtual Event submit(StreamId stream, std::vector<Copy> batch) = 0;
  std::vector<Event> submit_layers(StreamId stream, std::vector<std::vector<Copy>> per_layer) {
    std::vector<Event> events;
    for (auto& layer : per_layer) events.push_back(submit(stream, std::move(layer)));
    return events;
  }
  // Applies to the next submitted batch only.
  virtual void inject(std::uint64_t delay_ns, bool fail) = 0;
};

// Throws InputError for an unknown backend name.
std::unique_ptr<TransferEngine> make_engine(const EngineConfig& cfg);

// Why this build cannot run `backend` with `collectives` ("" when it can): cuda without
// -DKVGRID_CUDA=ON, nccl without -DKVGRID_NCCL=ON or without the cuda backend.
std::string backend_refusal(const std::string& backend, const std::string& collectives);
// Start-up of a backend on this process before any pool is allocated: cuda picks the GPU
// `local_rank mod count`, names `world_rank` in its error messages and returns the GPU's name;
// InputError naming the driver's reason without one. "" for the host backends.
std::string prepare_backend(const std::string& backend, int local_rank, int world_rank);

// One event for several batches (a target copy and its draft copy): complete when every part is,
// failed when any part failed; bytes summed, modelled start the earliest, completion the latest.
Event join(std::vector<Event> parts);

}  // namespace kvgrid::transfer
