// The GPU backend inside kvgrid's own stack (built with -DKVGRID_CUDA=ON at the top level only:
// it links the transfer engines, pools and Kokkos kernels). Skips without a GPU, naming why.
//   * the cuda engine (every copy mode) and the threaded engine perform the same copies, batch for
//     batch, between pools in the memory engine.transfer = cuda gives them;
//   * a KV pool in GPU memory (its kernels on the GPU) holds and folds exactly what a host pool does;
//   * make_engine("cuda") and pool_memory("cuda") are what the rank stack gets.
#include <gtest/gtest.h>

#include "../unit/kokkos_env.hpp"
#include "cache/kv_pool.hpp"
#include "cuda/device.hpp"
#include "transfer/pool_memory.hpp"
#include "transfer/transfer_engine.hpp"

namespace kvgrid {
namespace {

[[maybe_unused]] const bool kokkos_ready = (testing::ensure_kokkos(), true);

#define KVGRID_NEED_GPU()                                                                        \
  do {                                                                                           \
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device: " << cuda::no_device_reason(); \
  } while (0)

cache::KvPoolConfig config(cache::Payload payload, const transfer::PoolMemory* mem, transfer::PoolKind kind) {
  cache::KvPoolConfig c{Pages(32), Tokens(8), 4, 3, {1, 2}, 6, payload};
  c.memory = mem;
  c.kind = kind;
  return c;
}

void fill(cache::KvPool& p, std::uint64_t seed) {
  std::vector<PageId> pages;
  std::vector<std::uint32_t> pg, slot;
  std::vector<std::uint64_t> F;
  for (std::uint32_t q = 1; q < 32; ++q) {
    pages.push_back(PageId(q));
    for (std::uint32_t s = 0; s < 8; ++s) pg.push_back(q), slot.push_back(s), F.push_back(mix64(seed + q * 8 + s));
  }
  p.reset(pages);
  p.write(pg, slot, F);
}

TEST(CudaStack, TheCudaEngineCopiesWhatTheThreadedEngineCopies) {
  KVGRID_NEED_GPU();
  ASSERT_FALSE(transfer::prepare_backend("cuda", 0, 0).empty());
  const transfer::PoolMemory* mem = transfer::pool_memory("cuda");
  ASSERT_NE(mem, nullptr);
  for (const char* mode : {"memcpy", "kernel", "batch"})
    for (const auto payload : {cache::Payload::Full, cache::Payload::Digest}) {
      SCOPED_TRACE(::testing::Message() << mode << (payload == cache::Payload::Full ? " full" : " digest"));
      transfer::EngineConfig cuda_cfg, thr_cfg;
      cuda_cfg.backend = "cuda", cuda_cfg.cuda_copy = mode;
      thr_cfg.backend = "threaded";
      auto cuda_engine = transfer::make_engine(cuda_cfg);
      auto threaded = transfer::make_engine(thr_cfg);
      EXPECT_EQ(cuda_engine->name(), "cuda");
      // device → host and back through each engine, between pools of the same geometry
      cache::KvPool dev_a(config(payload, mem, transfer::PoolKind::Device)), host_a(config(payload, mem, transfer::PoolKind::Host));
      cache::KvPool dev_b(config(payload, nullptr, transfer::PoolKind::Device)), host_b(config(payload, nullptr, transfer::PoolKind::Host));
      fill(dev_a, 5);
      fill(dev_b, 5);
      const std::vector<PageId> src{PageId(3), PageId(17), PageId(9), PageId(30)}, dst{PageId(1), PageId(2), PageId(31), PageId(4)};
      cuda_engine->submit(0, cache::flat(cache::layer_copies(host_a, dst, dev_a, src))).synchronize();
      threaded->submit(0, cache::flat(cache::layer_copies(host_b, dst, dev_b, src))).synchronize();
      EXPECT_EQ(host_a.page_folds(dst), host_b.page_folds(dst));
      EXPECT_EQ(host_a.page_folds(dst), dev_b.page_folds(src));
      // per-layer load events back into other device pages
      const std::vector<PageId> back{PageId(20), PageId(21), PageId(22), PageId(23)};
      for (auto& e : cuda_engine->submit_layers(1, cache::layer_copies(dev_a, back, host_a, dst))) e.synchronize();
      for (auto& e : threaded->submit_layers(1, cache::layer_copies(dev_b, back, host_b, dst))) e.synchronize();
      EXPECT_EQ(dev_a.page_folds(back), dev_b.page_folds(back));
      EXPECT_EQ(dev_a.content_digest(), dev_b.content_digest());
    }
}

TEST(CudaStack, AGpuPoolHoldsAndFoldsWhatAHostPoolDoes) {
  KVGRID_NEED_GPU();
  transfer::prepare_backend("cuda", 0, 0);
  const transfer::PoolMemory* mem = transfer::pool_memory("cuda");
  for (const auto payload : {cache::Payload::Full, cache::Payload::Digest}) {
    cache::KvPool gpu(config(payload, mem, transfer::PoolKind::Device)), host(config(payload, nullptr, transfer::PoolKind::Device));
    fill(gpu, 11);
    fill(host, 11);
    EXPECT_EQ(gpu.content_digest(), host.content_digest());
    const std::vector<std::uint32_t> pages{5, 2, 29, 1};
    std::vector<std::uint64_t> a(gpu.layers() * gpu.heads(), 0), b = a;
    gpu.fold_pages(pages, a, 3);
    host.fold_pages(pages, b, 3);
    EXPECT_EQ(a, b);
  }
}

}  // namespace
}  // namespace kvgrid
