// The words of a pool (KvPool): a zeroed array in the memory its transfer backend asks for
// (transfer/pool_memory.hpp) — ordinary host memory, or GPU / pinned memory for engine.transfer =
// cuda. Move-only; the pool's layout points into it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>

#include "transfer/pool_memory.hpp"

namespace kvgrid::cache {

class PoolWords {
 public:
  PoolWords() = default;
  PoolWords(std::size_t n, const transfer::PoolMemory* mem, transfer::PoolKind kind) : n_(n), mem_(mem), kind_(kind) {
    if (n == 0) return;
    if (mem_) {
      p_ = static_cast<std::uint64_t*>(mem_->allocate(n * sizeof(std::uint64_t), kind));
    } else {
      heap_ = std::make_unique<std::uint64_t[]>(n);  // value-initialised: zeroes
      p_ = heap_.get();
      return;
    }
    std::fill_n(p_, n, 0);
  }
  PoolWords(PoolWords&& o) noexcept { swap(o); }
  PoolWords& operator=(PoolWords&& o) noexcept {
    PoolWords t(std::move(o));
    swap(t);
    return *this;
  }
  PoolWords(const PoolWords&) = delete;
  PoolWords& operator=(const PoolWords&) = delete;
  ~PoolWords() {
    if (mem_ && p_) mem_->release(p_, kind_);
  }
  std::uint64_t* data() { return p_; }
  const std::uint64_t* data() const { return p_; }
  std::size_t size() const { return n_; }
  std::uint64_t& operator[](std::size_t i) { return p_[i]; }
  const std::uint64_t* begin() const { return p_; }
  const std::uint64_t* end() const { return p_ + n_; }
  // Memory a GPU kernel may run over (the pool's kernels then run on the GPU).
  bool gpu() const { return mem_ && mem_->gpu_kernels && kind_ == transfer::PoolKind::Device; }

 private:
  void swap(PoolWords& o) noexcept {
    std::swap(p_, o.p_), std::swap(n_, o.n_), std::swap(mem_, o.mem_), std::swap(kind_, o.kind_);
    std::swap(heap_, o.heap_);
  }
  std::uint64_t* p_ = nullptr;
  std::size_t n_ = 0;
  const transfer::PoolMemory* mem_ = nullptr;
  transfer::PoolKind kind_ = transfer::PoolKind::Host;
  std::unique_ptr<std::uint64_t[]> heap_;
};

}  // namespace kvgrid::cache
