// CUDA devices and memory. Queries return a status instead of throwing when no GPU is present, so
// a CUDA build still runs (and its tests skip, naming why) on a machine without one.
//
// Memory kinds of the GPU backend (engine.transfer = cuda):
//   device  — a device pool's pages: cudaMallocManaged, resident on the GPU (preferred location)
//             and readable by the host-side model and oracle (which read pools directly);
//   pinned  — a host pool's pages: cudaHostAlloc (page-locked, mapped), so copies are real DMA
//             and the copy kernel can reach them;
//   scratch — plain cudaMalloc (kernel arguments, NCCL staging).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace kvgrid::cuda {

// Number of visible CUDA devices; 0 when the driver or a device is missing.
int device_count();
std::string device_name(int device);
// Why there is no usable device ("" when there is one): the driver's words.
std::string no_device_reason();
// Picks device `local_rank mod count` for this process; throws Error without a device.
int select_device(int local_rank);

enum class MemoryKind { Device, Pinned, Scratch };
const char* memory_kind_name(MemoryKind k);
void* allocate(std::size_t bytes, MemoryKind kind);
void release(void* p, MemoryKind kind) noexcept;
// True for memory a kernel can read or write (device, managed, pinned mapped).
bool device_accessible(const void* p);

// An owning buffer of one kind (moves, never copies).
class Buffer {
 public:
  Buffer() = default;
  Buffer(std::size_t bytes, MemoryKind kind) : p_(allocate(bytes, kind)), bytes_(bytes), kind_(kind) {}
  Buffer(Buffer&& o) noexcept : p_(o.p_), bytes_(o.bytes_), kind_(o.kind_) { o.p_ = nullptr, o.bytes_ = 0; }
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      release(p_, kind_);
      p_ = o.p_, bytes_ = o.bytes_, kind_ = o.kind_;
      o.p_ = nullptr, o.bytes_ = 0;
    }
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { release(p_, kind_); }
  void* get() const { return p_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }
  std::size_t bytes() const { return bytes_; }
  // Grows (never shrinks) to at least `bytes`; contents are not kept.
  void reserve(std::size_t bytes) {
    if (bytes > bytes_) *this = Buffer(bytes, kind_);
  }

 private:
  void* p_ = nullptr;
  std::size_t bytes_ = 0;
  MemoryKind kind_ = MemoryKind::Scratch;
};

// The NCCL version as "major.minor.patch", or "" when built without NCCL.
std::string nccl_version();

}  // namespace kvgrid::cuda
