#include "cuda/kv_kernels.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda/check.hpp"
#include "cuda/device.hpp"
#include "kernels/kv_math.hpp"

namespace kvgrid::cuda::kernels {

namespace km = kvgrid::kernels;

namespace {

constexpr int kThreads = 256;
unsigned blocks_for(std::size_t n) { return static_cast<unsigned>(std::max<std::size_t>(1, (n + kThreads - 1) / kThreads)); }

void require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument(what);
}

// The launchers' own stream (per thread, non-blocking): a kernel waits for its arguments' copies and
// nothing else — not for the transfer engine's copies in flight, whose completion the protocols
// must observe through their events, exactly as with the host kernels.
cudaStream_t kstream() {
  static thread_local cudaStream_t s = [] {
    cudaStream_t t = nullptr;
    KVGRID_CUDA_CHECK(cudaStreamCreateWithFlags(&t, cudaStreamNonBlocking));
    return t;
  }();
  return s;
}

// Host arrays copied to the device for one launch; the buffers are kept between launches (a decode
// step writes one token: allocating per call would cost more than the kernel).
class Args {
 public:
  template <typename T>
  const T* put(std::span<const T> host) {
    return static_cast<const T*>(put_bytes(host.data(), host.size_bytes()));
  }
  template <typename T>
  T* put_mut(std::span<T> host) {
    return static_cast<T*>(put_bytes(host.data(), host.size_bytes()));
  }
  void reset() { used_ = 0; }

 private:
  void* put_bytes(const void* src, std::size_t bytes) {
    std::size_t at = (used_ + 15) & ~std::size_t{15};
    if (at + bytes > bufs_.back().bytes()) {
      grow(bytes);
      at = 0;
    }
    void* dst = static_cast<unsigned char*>(bufs_.back().get()) + at;
    if (bytes) KVGRID_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, kstream()));
    used_ = at + bytes;
    return dst;
  }
  void grow(std::size_t need) {
    // A new buffer (the pointers handed out so far stay valid until reset).
    bufs_.emplace_back(std::max<std::size_t>(need * 2, 1 << 16), MemoryKind::Scratch);
    used_ = 0;
  }
  std::vector<Buffer> bufs_ = [] {
    std::vector<Buffer> v;
    v.emplace_back(std::size_t{1} << 16, MemoryKind::Scratch);
    return v;
  }();
  std::size_t used_ = 0;
};

Args& args() {
  static thread_local Args a;
  a.reset();
  return a;
}

void finish(const char* what) {
  KVGRID_CUDA_CHECK(cudaGetLastError());
  const cudaError_t e = cudaStreamSynchronize(kstream());
  if (e != cudaSuccess) fail(what, e, __FILE__, __LINE__);
}

// The layout with its tables on the device.
struct DevLayout {
  std::size_t pages, layers, heads, page_size, dims;
  std::uint64_t layer_base;
  const std::uint32_t* head_ids;
  const std::uint64_t* slot_coef;
  const std::uint64_t* dim_coef;
  const std::uint64_t* kv_coef;
  __device__ std::size_t full_index(std::size_t page, std::size_t l, std::size_t h, std::size_t slot, std::size_t d) const {
    return (((page * layers + l) * heads + h) * page_size + slot) * dims + d;
  }
  __device__ std::size_t digest_index(std::size_t page, std::size_t l, std::size_t h) const {
    return (page * layers + l) * heads + h;
  }
};

void check_layout(const PageLayout& g) {
  require(g.layers > 0 && g.heads > 0 && g.page_size > 0 && g.dims > 0 && g.head_ids && g.slot_coef && g.dim_coef,
          "bad page layout: layers " + std::to_string(g.layers) + " heads " + std::to_string(g.heads) + " page_size " +
              std::to_string(g.page_size) + " dims " + std::to_string(g.dims));
}
void check_pages(const PageLayout& g, std::span<const std::uint32_t> pages) {
  for (auto p : pages)
    require(p >= 1 && p < g.pages, "page " + std::to_string(p) + " outside a pool of " + std::to_string(g.pages) + " rows");
}
void check_slots(const PageLayout& g, std::span<const std::uint32_t> slots) {
  for (auto s : slots) require(s < g.page_size, "slot " + std::to_string(s) + " >= page_size " + std::to_string(g.page_size));
}

DevLayout upload(Args& a, const PageLayout& g) {
  DevLayout d{g.pages, g.layers, g.heads, g.page_size, g.dims, g.layer_base, nullptr, nullptr, nullptr, nullptr};
  d.head_ids = a.put(std::span<const std::uint32_t>(g.head_ids, g.heads));
  d.slot_coef = a.put(std::span<const std::uint64_t>(g.slot_coef, g.page_size));
  d.dim_coef = a.put(std::span<const std::uint64_t>(g.dim_coef, g.dims));
  if (g.kv_coef) d.kv_coef = a.put(std::span<const std::uint64_t>(g.kv_coef, g.layers * g.heads));
  return d;
}

__global__ void write_full_kernel(DevLayout g, std::uint64_t* pool, const std::uint32_t* page, const std::uint32_t* slot,
                                  const std::uint64_t* F, std::size_t n) {
  const std::size_t k = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (k >= n) return;
  const std::size_t h = k % g.heads, l = (k / g.heads) % g.layers, i = k / (g.heads * g.layers);
  const std::uint64_t layer = g.layer_base + l, head = g.head_ids[h];
  std::uint64_t* v = pool + g.full_index(page[i], l, h, slot[i], 0);
  std::uint64_t rest = 0;
  for (std::size_t d = 0; d + 1 < g.dims; ++d) {
    v[d] = km::kv_element(F[i], layer, head, d, g.dims);
    rest += g.dim_coef[d] * v[d];
  }
  v[g.dims - 1] = F[i] * km::kv_coeff(layer, head) - rest;
}

__global__ void write_digest_kernel(DevLayout g, std::uint64_t* pool, const std::uint32_t* run_page,
                                    const std::uint64_t* run_sum, std::size_t runs) {
  const std::size_t k = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (k >= g.layers * g.heads) return;
  const std::size_t h = k % g.heads, l = k / g.heads;
  const std::uint64_t coef = g.kv_coef ? g.kv_coef[k] : km::kv_coeff(g.layer_base + l, g.head_ids[h]);
  for (std::size_t r = 0; r < runs; ++r) pool[g.digest_index(run_page[r], l, h)] += run_sum[r] * coef;
}

__global__ void fold_full_kernel(DevLayout g, const std::uint64_t* pool, const std::uint32_t* pages, std::size_t n_pages,
                                 std::size_t first_index, std::uint64_t* out, std::size_t k0, std::size_t k1) {
  const std::size_t k = k0 + blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (k >= k1) return;
  const std::size_t h = k % g.heads, l = k / g.heads;
  std::uint64_t acc = 0;
  for (std::size_t j = 0; j < n_pages; ++j) {
    const std::uint64_t* v = pool + g.full_index(pages[j], l, h, 0, 0);
    std::uint64_t page = 0;
    for (std::size_t s = 0; s < g.page_size; ++s, v += g.dims) {
      std::uint64_t tok = 0;
      for (std::size_t d = 0; d < g.dims; ++d) tok += g.dim_coef[d] * v[d];
      page += g.slot_coef[s] * tok;
    }
    acc += km::page_coeff(first_index + j) * page;
  }
  out[k] += acc;
}

__global__ void fold_digest_kernel(DevLayout g, const std::uint64_t* pool, const std::uint32_t* pages, std::size_t n_pages,
                                   std::size_t first_index, std::uint64_t* out, std::size_t k0, std::size_t k1) {
  const std::size_t k = k0 + blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (k >= k1) return;
  const std::size_t h = k % g.heads, l = k / g.heads;
  std::uint64_t acc = 0;
  for (std::size_t j = 0; j < n_pages; ++j) acc += km::page_coeff(first_index + j) * pool[g.digest_index(pages[j], l, h)];
  out[k] += acc;
}

__global__ void fold_tokens_kernel(DevLayout g, const std::uint64_t* pool, const std::uint32_t* page,
                                   const std::uint32_t* slot, std::size_t first_pos, std::uint64_t* out, std::size_t n) {
  const std::size_t k = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (k >= n) return;
  const std::size_t h = k % g.heads, l = (k / g.heads) % g.layers, i = k / (g.heads * g.layers);
  const std::uint64_t* v = pool + g.full_index(page[i], l, h, slot[i], 0);
  std::uint64_t acc = 0;
  for (std::size_t d = 0; d < g.dims; ++d) acc += g.dim_coef[d] * v[d];
  out[k] = km::page_coeff((first_pos + i) / g.page_size) * g.slot_coef[slot[i]] * acc;
}

// ---- relayout ----
constexpr std::size_t kMaxChunks = 64;  // as kernels/relayout.cpp

struct Plan {
  std::size_t layers = 0, heads = 0, page_size = 0, dims = 0;
  bool digest = false;
  std::size_t count = 0, row_words = 0;
  ChunkSpan chunk[kMaxChunks];
  std::size_t offset[kMaxChunks + 1];
  __device__ std::size_t pool_index(std::uint32_t row, std::size_t w) const {
    std::size_t j = 0;
    while (offset[j + 1] <= w) ++j;
    const ChunkSpan& c = chunk[j];
    std::size_t r = w - offset[j];
    if (digest) {
      const std::size_t h = r % c.heads, l = r / c.heads;
      return (row * layers + c.layer0 + l) * heads + c.head0 + h;
    }
    const std::size_t d = r % dims;
    r /= dims;
    const std::size_t h = r % c.heads;
    r /= c.heads;
    const std::size_t s = r % page_size, l = r / page_size;
    return (((row * layers + c.layer0 + l) * heads + c.head0 + h) * page_size + s) * dims + d;
  }
};

Plan make_plan(const PageLayout& g, bool digest, std::span<const std::uint32_t> rows, std::span<const ChunkSpan> chunks) {
  require(g.layers > 0 && g.heads > 0 && g.page_size > 0 && g.dims > 0, "relayout: bad page layout");
  require(!chunks.empty() && chunks.size() <= kMaxChunks,
          "relayout: " + std::to_string(chunks.size()) + " chunks (1 to " + std::to_string(kMaxChunks) + ")");
  Plan p;
  p.layers = g.layers, p.heads = g.heads, p.page_size = g.page_size, p.dims = g.dims, p.digest = digest;
  p.count = chunks.size();
  p.offset[0] = 0;
  for (std::size_t j = 0; j < chunks.size(); ++j) {
    const ChunkSpan& c = chunks[j];
    require(c.layers > 0 && c.heads > 0 && c.layer0 + c.layers <= g.layers && c.head0 + c.heads <= g.heads,
            "relayout: chunk " + std::to_string(j) + " outside a pool of " + std::to_string(g.layers) + " layers and " +
                std::to_string(g.heads) + " heads");
    p.chunk[j] = c;
    p.offset[j + 1] = p.offset[j] + (digest ? c.layers * c.heads : c.layers * g.page_size * c.heads * g.dims);  // km::object_words
  }
  p.row_words = p.offset[chunks.size()];
  for (auto r : rows) require(r >= 1 && r < g.pages, "relayout: row " + std::to_string(r) + " outside a pool of " + std::to_string(g.pages) + " rows");
  return p;
}

__global__ void pack_kernel(Plan p, const std::uint32_t* rows, const std::uint64_t* pool, std::uint64_t* staging, std::size_t n) {
  const std::size_t k = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (k < n) staging[k] = pool[p.pool_index(rows[k / p.row_words], k % p.row_words)];
}
__global__ void unpack_kernel(Plan p, const std::uint32_t* rows, std::uint64_t* pool, const std::uint64_t* staging, std::size_t n) {
  const std::size_t k = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (k < n) pool[p.pool_index(rows[k / p.row_words], k % p.row_words)] = staging[k];
}

__global__ void gather_kernel(unsigned char* dst, const unsigned char* src, const std::uint32_t* dst_rows,
                              const std::uint32_t* src_rows, std::size_t row_bytes) {
  unsigned char* d = dst + static_cast<std::size_t>(dst_rows[blockIdx.x]) * row_bytes;
  const unsigned char* s = src + static_cast<std::size_t>(src_rows[blockIdx.x]) * row_bytes;
  const bool wide = ((reinterpret_cast<std::uintptr_t>(s) | reinterpret_cast<std::uintptr_t>(d)) & 15) == 0;
  std::size_t done = 0;
  if (wide) {
    const std::size_t words = row_bytes / 16;
    for (std::size_t i = threadIdx.x; i < words; i += blockDim.x)
      reinterpret_cast<uint4*>(d)[i] = reinterpret_cast<const uint4*>(s)[i];
    done = words * 16;
  }
  for (std::size_t i = done + threadIdx.x; i < row_bytes; i += blockDim.x) d[i] = s[i];
}

std::span<std::uint64_t> fold_range(const PageLayout& g, std::size_t& layer_begin, std::size_t& layer_end,
                                    std::span<std::uint64_t> out) {
  layer_end = std::min(layer_end, g.layers);
  require(out.size() == g.layers * g.heads, "fold output of " + std::to_string(out.size()) + " words");
  return out;
}

void copy_back(std::span<std::uint64_t> out, const std::uint64_t* dev) {
  KVGRID_CUDA_CHECK(cudaMemcpyAsync(out.data(), dev, out.size_bytes(), cudaMemcpyDefault, kstream()));
  KVGRID_CUDA_CHECK(cudaStreamSynchronize(kstream()));
}

}  // namespace

void write_tokens_full(const PageLayout& g, std::uint64_t* pool, std::span<const std::uint32_t> page,
                       std::span<const std::uint32_t> slot, std::span<const std::uint64_t> F) {
  check_layout(g);
  require(page.size() == slot.size() && page.size() == F.size(), "write_tokens_full: " + std::to_string(page.size()) +
                                                                     " pages, " + std::to_string(slot.size()) + " slots, " +
                                                                     std::to_string(F.size()) + " features");
  check_pages(g, page);
  check_slots(g, slot);
  if (page.empty()) return;
  Args& a = args();
  const DevLayout d = upload(a, g);
  const std::size_t n = page.size() * g.layers * g.heads;
  write_full_kernel<<<blocks_for(n), kThreads, 0, kstream()>>>(d, pool, a.put(page), a.put(slot), a.put(F), n);
  finish("write_tokens_full");
}

void write_tokens_digest(const PageLayout& g, std::uint64_t* pool, std::span<const std::uint32_t> page,
                         std::span<const std::uint32_t> slot, std::span<const std::uint64_t> F) {
  check_layout(g);
  require(page.size() == F.size() && page.size() == slot.size(), "write_tokens_digest: " + std::to_string(page.size()) +
                                                                     " pages, " + std::to_string(slot.size()) + " slots, " +
                                                                     std::to_string(F.size()) + " features");
  check_pages(g, page);
  check_slots(g, slot);
  if (page.empty()) return;
  // Runs of consecutive tokens of one page summed on the host (Σ P(s) F, as the host launcher does).
  std::vector<std::uint32_t> run_page;
  std::vector<std::uint64_t> run_sum;
  for (std::size_t i = 0; i < page.size();) {
    const std::uint32_t p = page[i];
    std::uint64_t sum = 0;
    for (; i < page.size() && page[i] == p; ++i) sum += g.slot_coef[slot[i]] * F[i];
    run_page.push_back(p);
    run_sum.push_back(sum);
  }
  Args& a = args();
  const DevLayout d = upload(a, g);
  write_digest_kernel<<<blocks_for(g.layers * g.heads), kThreads, 0, kstream()>>>(
      d, pool, a.put(std::span<const std::uint32_t>(run_page)), a.put(std::span<const std::uint64_t>(run_sum)), run_page.size());
  finish("write_tokens_digest");
}

void fold_pages_full(const PageLayout& g, const std::uint64_t* pool, std::span<const std::uint32_t> pages,
                     std::size_t first_index, std::span<std::uint64_t> out, std::size_t layer_begin, std::size_t layer_end) {
  check_layout(g);
  check_pages(g, pages);
  fold_range(g, layer_begin, layer_end, out);
  if (layer_begin >= layer_end) return;
  Args& a = args();
  const DevLayout d = upload(a, g);
  std::uint64_t* o = a.put_mut(out);
  const std::size_t k0 = layer_begin * g.heads, k1 = layer_end * g.heads;
  fold_full_kernel<<<blocks_for(k1 - k0), kThreads, 0, kstream()>>>(d, pool, a.put(pages), pages.size(), first_index, o, k0, k1);
  finish("fold_pages_full");
  copy_back(out, o);
}

void fold_pages_digest(const PageLayout& g, const std::uint64_t* pool, std::span<const std::uint32_t> pages,
                       std::size_t first_index, std::span<std::uint64_t> out, std::size_t layer_begin, std::size_t layer_end) {
  check_layout(g);
  check_pages(g, pages);
  fold_range(g, layer_begin, layer_end, out);
  if (layer_begin >= layer_end) return;
  Args& a = args();
  const DevLayout d = upload(a, g);
  std::uint64_t* o = a.put_mut(out);
  const std::size_t k0 = layer_begin * g.heads, k1 = layer_end * g.heads;
  fold_digest_kernel<<<blocks_for(k1 - k0), kThreads, 0, kstream()>>>(d, pool, a.put(pages), pages.size(), first_index, o, k0, k1);
  finish("fold_pages_digest");
  copy_back(out, o);
}

void fold_tokens_full(const PageLayout& g, const std::uint64_t* pool, std::span<const std::uint32_t> page,
                      std::span<const std::uint32_t> slot, std::size_t first_pos, std::span<std::uint64_t> out) {
  check_layout(g);
  check_pages(g, page);
  require(page.size() == slot.size() && out.size() == page.size() * g.layers * g.heads, "fold_tokens_full sizes");
  check_slots(g, slot);
  if (page.empty()) return;
  Args& a = args();
  const DevLayout d = upload(a, g);
  std::uint64_t* o = a.put_mut(out);
  const std::size_t n = out.size();
  fold_tokens_kernel<<<blocks_for(n), kThreads, 0, kstream()>>>(d, pool, a.put(page), a.put(slot), first_pos, o, n);
  finish("fold_tokens_full");
  copy_back(out, o);
}

void pack_objects(const PageLayout& g, bool digest, const std::uint64_t* pool, std::span<const std::uint32_t> rows,
                  std::span<const ChunkSpan> chunks, std::uint64_t* staging) {
  if (rows.empty()) return;
  const Plan p = make_plan(g, digest, rows, chunks);
  const std::size_t n = rows.size() * p.row_words;
  Args& a = args();
  pack_kernel<<<blocks_for(n), kThreads, 0, kstream()>>>(p, a.put(rows), pool, staging, n);
  finish("pack_objects");
}

void unpack_objects(const PageLayout& g, bool digest, std::uint64_t* pool, std::span<const std::uint32_t> rows,
                    std::span<const ChunkSpan> chunks, const std::uint64_t* staging) {
  if (rows.empty()) return;
  const Plan p = make_plan(g, digest, rows, chunks);
  const std::size_t n = rows.size() * p.row_words;
  Args& a = args();
  unpack_kernel<<<blocks_for(n), kThreads, 0, kstream()>>>(p, a.put(rows), pool, staging, n);
  finish("unpack_objects");
}

void gather_rows(void* dst, const void* src, std::span<const std::uint32_t> dst_rows,
                 std::span<const std::uint32_t> src_rows, std::size_t row_bytes) {
  require(dst_rows.size() == src_rows.size(), "gather_rows: " + std::to_string(dst_rows.size()) + " destination rows for " +
                                                  std::to_string(src_rows.size()) + " sources");
  if (dst_rows.empty() || row_bytes == 0) return;
  Args& a = args();
  gather_kernel<<<static_cast<unsigned>(dst_rows.size()), kThreads, 0, kstream()>>>(static_cast<unsigned char*>(dst),
                                                                      static_cast<const unsigned char*>(src),
                                                                      a.put(dst_rows), a.put(src_rows), row_bytes);
  finish("gather_rows");
}

}  // namespace kvgrid::cuda::kernels
