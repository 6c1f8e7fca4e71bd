// The words of a pool (KvPool): a zeroed array in the memory its transfer backend asks for
// (transfer/pool_memory.hpp) — ordinary host memory (anonymous pages, mapped as first touched),
// or GPU / pinned memory for engine.transfer = cuda. Move-only; the pool's layout points into it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <new>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

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
      // Anonymous memory from the kernel, not a value-initialised array: it is zero already and its
      // pages are mapped when first touched, as transparent huge pages where the kernel allows. A
      // pool a run barely uses costs no memset and few page faults (a small run's start-up was
      // mostly those); for_each_touched lets a reader skip what was never touched.
      const std::size_t bytes = n * sizeof(std::uint64_t);
      heap_ = std::unique_ptr<std::uint64_t, Unmap>(static_cast<std::uint64_t*>(map_zeroed(bytes)), Unmap{bytes});
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
  // Calls f(begin, end) on the word ranges that may hold a non-zero word, in increasing order: for
  // the pool's own anonymous memory, the 4 KiB pages the process has touched (present or swapped
  // out, per /proc/self/pagemap) — an untouched page is zero, and reading it would make the kernel
  // map (with huge pages: allocate and clear) memory for nothing. Anywhere else (GPU or pinned
  // memory, no pagemap): the whole array.
  template <class F>
  void for_each_touched(F f) const {
    if (n_ == 0) return;
    if (!heap_ || !touched_ranges(f)) f(std::size_t{0}, n_);
  }
  // Memory a GPU kernel may run over (the pool's kernels then run on the GPU).
  bool gpu() const { return mem_ && mem_->gpu_kernels && kind_ == transfer::PoolKind::Device; }

 private:
  template <class F>
  bool touched_ranges(F& f) const {
    const long page = ::sysconf(_SC_PAGESIZE);
    const int fd = page > 0 && page % 8 == 0 ? ::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC) : -1;
    if (fd < 0) return false;
    const std::size_t per_page = static_cast<std::size_t>(page) / sizeof(std::uint64_t);
    const std::size_t pages = (n_ + per_page - 1) / per_page;
    const std::uintptr_t first = reinterpret_cast<std::uintptr_t>(p_) / static_cast<std::uintptr_t>(page);
    std::uint64_t entry[512];
    std::size_t run_begin = 0;
    bool in_run = false;
    for (std::size_t at = 0; at < pages;) {
      const std::size_t want = std::min<std::size_t>(512, pages - at);
      const ssize_t got = ::pread(fd, entry, want * sizeof(std::uint64_t), static_cast<off_t>((first + at) * sizeof(std::uint64_t)));
      if (got != static_cast<ssize_t>(want * sizeof(std::uint64_t))) {  // unreadable: the rest is read whole
        ::close(fd);
        if (at == 0) return false;
        f((in_run ? run_begin : at) * per_page, n_);
        return true;
      }
      for (std::size_t i = 0; i < want; ++i, ++at) {
        const bool touched = (entry[i] >> 62) != 0;  // bit 63: present, bit 62: swapped
        if (touched && !in_run) run_begin = at, in_run = true;
        if (!touched && in_run) f(run_begin * per_page, at * per_page), in_run = false;
      }
    }
    ::close(fd);
    if (in_run) f(run_begin * per_page, n_);
    return true;
  }
  void swap(PoolWords& o) noexcept {
    std::swap(p_, o.p_), std::swap(n_, o.n_), std::swap(mem_, o.mem_), std::swap(kind_, o.kind_);
    std::swap(heap_, o.heap_);
  }
  std::uint64_t* p_ = nullptr;
  std::size_t n_ = 0;
  const transfer::PoolMemory* mem_ = nullptr;
  transfer::PoolKind kind_ = transfer::PoolKind::Host;
  struct Unmap {
    std::size_t bytes = 0;
    void operator()(std::uint64_t* p) const { ::munmap(p, bytes); }
  };
  static void* map_zeroed(std::size_t bytes) {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    ::madvise(p, bytes, MADV_HUGEPAGE);  // advice only: without THP the pages stay 4 KiB
    return p;
  }
  std::unique_ptr<std::uint64_t, Unmap> heap_{nullptr, Unmap{}};
};

}  // namespace kvgrid::cache
