// Transfer backends by name.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "core/check.hpp"
#include "transfer/pool_memory.hpp"
#include "transfer/transfer_engine.hpp"
#ifdef KVGRID_HAVE_CUDA
#include "cuda/check.hpp"
#include "cuda/device.hpp"
#include "cuda/engine.hpp"
#include "transfer/polled_event.hpp"
#endif

namespace kvgrid::transfer {

std::unique_ptr<TransferEngine> make_simulated_engine(const EngineConfig& cfg);
std::unique_ptr<TransferEngine> make_threaded_engine(const EngineConfig& cfg);

#ifdef KVGRID_HAVE_CUDA
namespace {
// The cuda engine as the stack sees it: its events wait through core/wait (polled_event.hpp).
class Watched final : public TransferEngine {
 public:
  explicit Watched(std::unique_ptr<TransferEngine> inner) : inner_(std::move(inner)) {}
  std::string_view name() const override { return inner_->name(); }
  Event submit(StreamId stream, std::vector<Copy> batch) override {
    return polled(inner_->submit(stream, std::move(batch)), "a CUDA copy batch on stream " + std::to_string(stream));
  }
  void inject(std::uint64_t delay_ns, bool fail) override { inner_->inject(delay_ns, fail); }

 private:
  std::unique_ptr<TransferEngine> inner_;
};
}  // namespace
#endif

std::unique_ptr<TransferEngine> make_engine(const EngineConfig& cfg) {
  if (cfg.backend == "simulated") return make_simulated_engine(cfg);
  if (cfg.backend == "threaded") return make_threaded_engine(cfg);
#ifdef KVGRID_HAVE_CUDA
  if (cfg.backend == "cuda") {
    try {
      return std::make_unique<Watched>(cuda::make_cuda_engine(cfg, cuda::parse_copy_mode(cfg.cuda_copy)));
    } catch (const std::invalid_argument& e) {
      throw InputError(e.what());
    }
  }
#endif
  throw InputError("unknown transfer engine '" + cfg.backend + "' (simulated, threaded; cuda needs -DKVGRID_CUDA=ON)");
}

std::string backend_refusal(const std::string& backend, const std::string& collectives) {
#ifndef KVGRID_HAVE_CUDA
  if (backend == "cuda")
    return "engine.transfer = \"cuda\" needs kvgrid built with -DKVGRID_CUDA=ON (this build has no CUDA backend; "
           "jobs/gpu-check.sh builds one)";
#endif
  if (collectives == "nccl") {
#ifndef KVGRID_HAVE_NCCL
    return "engine.collectives = \"nccl\" needs kvgrid built with -DKVGRID_CUDA=ON -DKVGRID_NCCL=ON (this build has no NCCL)";
#endif
    if (backend != "cuda")
      return "engine.collectives = \"nccl\" needs engine.transfer = \"cuda\" (NCCL runs on the GPU the cuda backend selects; "
             "engine.transfer is \"" + backend + "\")";
  }
  return "";
}

std::string prepare_backend(const std::string& backend, int local_rank, int world_rank) {
  if (backend != "cuda") return "";
#ifdef KVGRID_HAVE_CUDA
  cuda::set_rank(world_rank);
  if (cuda::device_count() == 0)
    throw InputError("engine.transfer = \"cuda\": no usable GPU on this machine (" + cuda::no_device_reason() + ")");
  const int d = cuda::select_device(local_rank);
  return cuda::device_name(d) + " (device " + std::to_string(d) + ")";
#else
  (void)local_rank, (void)world_rank;
  throw InputError(backend_refusal(backend, "mpi"));
#endif
}

const PoolMemory* pool_memory(const std::string& backend) {
#ifdef KVGRID_HAVE_CUDA
  if (backend == "cuda") {
    static const PoolMemory mem{
        "cuda",
        [](std::size_t bytes, PoolKind kind) {
          return cuda::allocate(bytes, kind == PoolKind::Device ? cuda::MemoryKind::Device : cuda::MemoryKind::Pinned);
        },
        [](void* p, PoolKind kind) {
          cuda::release(p, kind == PoolKind::Device ? cuda::MemoryKind::Device : cuda::MemoryKind::Pinned);
        },
        /*gpu_kernels=*/true};
    return &mem;
  }
#endif
  (void)backend;
  return nullptr;
}

namespace {

class JoinedEvent final : public EventState {
 public:
  explicit JoinedEvent(std::vector<Event> parts) : parts_(std::move(parts)) {
    bool first = true;
    completed();
    for (const auto& p : parts_) {
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
    completed();
    return true;
  }
  void synchronize() override {
    for (const auto& p : parts_) p.synchronize();
    completed();
  }

 private:
  // A part may learn its failure only at completion (transfer/polled_event.hpp).
  void completed() {
    for (const auto& p : parts_) failed = failed || p.failed();
  }
  std::vector<Event> parts_;
};

}  // namespace

Event join(std::vector<Event> parts) {
  if (parts.size() == 1) return parts.front();
  return Event(std::make_shared<JoinedEvent>(std::move(parts)));
}

}  // namespace kvgrid::transfer
