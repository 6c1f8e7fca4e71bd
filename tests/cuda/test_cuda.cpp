// The GPU backend's checks (label cuda). Every test skips, naming why, without a GPU; with one they
// compare the backend with a host reference bit for bit:
//   * the cuda transfer engine (each copy mode) with memcpy of the same copies — FIFO per stream,
//     events, injected delay and failure;
//   * the device KV kernels and the relayout with tests/cuda/kv_reference.hpp (which the unit
//     test test_kv_reference.cpp holds to the Kokkos host kernels);
//   * the page gather with a host gather;
//   * NCCL (when built with it) at communicator size 1: all-gather, send/receive to self, the
//     CP gather's staged path, the P/D data plane's staged send and receive.
// Builds without MPI, HDF5 or Kokkos (src/cuda/CMakeLists.txt, jobs/gpu-check.sh).
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <numeric>
#include <thread>
#include <vector>

#include "cuda/check.hpp"
#include "cuda/device.hpp"
#include "cuda/engine.hpp"
#include "cuda/kv_kernels.hpp"
#ifdef KVGRID_HAVE_NCCL
#include "cuda/nccl.hpp"
#endif
#include "kv_reference.hpp"

namespace kvgrid::cuda {
namespace {

#define KVGRID_NEED_GPU()                                                            \
  do {                                                                               \
    if (device_count() == 0) GTEST_SKIP() << "no CUDA device: " << no_device_reason(); \
  } while (0)

std::uint64_t word(std::uint64_t seed, std::size_t i) { return kvgrid::mix64(seed * 0x9e3779b97f4a7c15ULL + i); }

TEST(Cuda, DeviceQueryDoesNotAbortWithoutAGpu) {
  const int n = device_count();
  EXPECT_GE(n, 0);
  if (n > 0) {
    EXPECT_FALSE(device_name(0).empty());
    EXPECT_EQ(no_device_reason(), "");
    std::printf("GPU 0: %s\n", device_name(0).c_str());
  } else {
    EXPECT_NE(no_device_reason(), "");
    EXPECT_THROW(select_device(0), Error);
  }
#ifdef KVGRID_HAVE_NCCL
  EXPECT_FALSE(nccl_version().empty());
#endif
}

TEST(Cuda, CheckMacroNamesFileLineAndRank) {
  set_rank(5);
  try {
    KVGRID_CUDA_CHECK(cudaErrorInvalidValue);
    FAIL() << "no throw";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("test_cuda.cpp:"), std::string::npos) << m;
    EXPECT_NE(m.find("(rank 5)"), std::string::npos) << m;
    EXPECT_NE(m.find("cudaErrorInvalidValue"), std::string::npos) << m;
  }
  set_rank(-1);
}

// Buffers of every kind a copy may touch, filled with distinct words.
struct Buffers {
  static constexpr std::size_t kBytes = 1 << 20;
  Buffer dev_a{kBytes, MemoryKind::Device}, dev_b{kBytes, MemoryKind::Scratch};
  Buffer host_a{kBytes, MemoryKind::Pinned}, host_b{kBytes, MemoryKind::Pinned};
  std::vector<unsigned char> pageable = std::vector<unsigned char>(kBytes);
  void fill(std::uint64_t seed) {
    std::vector<std::uint64_t> w(kBytes / 8);
    for (int b = 0; b < 5; ++b) {
      for (std::size_t i = 0; i < w.size(); ++i) w[i] = word(seed + static_cast<std::uint64_t>(b), i);
      KVGRID_CUDA_CHECK(cudaMemcpy(ptr(b), w.data(), kBytes, cudaMemcpyDefault));
    }
  }
  unsigned char* ptr(int b) {
    switch (b) {
      case 0: return dev_a.as<unsigned char>();
      case 1: return dev_b.as<unsigned char>();
      case 2: return host_a.as<unsigned char>();
      case 3: return host_b.as<unsigned char>();
      default: return pageable.data();
    }
  }
  std::vector<unsigned char> read(int b) {
    std::vector<unsigned char> out(kBytes);
    KVGRID_CUDA_CHECK(cudaMemcpy(out.data(), ptr(b), kBytes, cudaMemcpyDefault));
    return out;
  }
};

TEST(CudaEngine, CopiesEqualMemcpyInEveryMode) {
  KVGRID_NEED_GPU();
  select_device(0);
  for (CopyMode mode : {CopyMode::Memcpy, CopyMode::Kernel, CopyMode::Batch}) {
    SCOPED_TRACE(copy_mode_name(mode));
    transfer::EngineConfig cfg;
    cfg.streams = 3;
    auto engine = make_cuda_engine(cfg, mode);
    EXPECT_EQ(engine->name(), "cuda");
    Buffers buf;
    buf.fill(1);
    std::vector<std::vector<unsigned char>> want;
    for (int b = 0; b < 5; ++b) want.push_back(buf.read(b));
    // Pages of odd sizes and offsets between every pair of kinds (pageable only with memcpy and
    // batch; the kernel mode falls back to memcpy for it), over three streams.
    std::vector<transfer::Event> events;
    for (int round = 0; round < 3; ++round) {
      std::vector<transfer::Copy> batch;
      for (int s = 0; s < 5; ++s)
        for (int d = 0; d < 5; ++d) {
          if (s == d) continue;
          const std::size_t len = 4096 + 16 * static_cast<std::size_t>(s * 5 + d) + static_cast<std::size_t>(round);
          const std::size_t src_at = 8192 * static_cast<std::size_t>(s * 5 + d);
          const std::size_t dst_at = 200000 + 8192 * static_cast<std::size_t>(round * 25 + s * 5 + d) + 3;
          batch.push_back({buf.ptr(d) + dst_at, buf.ptr(s) + src_at, len});
          std::memcpy(want[static_cast<std::size_t>(d)].data() + dst_at, want[static_cast<std::size_t>(s)].data() + src_at, len);
        }
      events.push_back(engine->submit(round, std::move(batch)));
    }
    for (auto& e : events) {
      e.synchronize();
      EXPECT_TRUE(e.query());
      EXPECT_FALSE(e.failed());
      EXPECT_GT(e.bytes(), 0u);
    }
    for (int b = 0; b < 5; ++b) EXPECT_EQ(buf.read(b), want[static_cast<std::size_t>(b)]) << "buffer " << b;
  }
}

TEST(CudaEngine, StreamsAreFifoAndInjectionsApplyToTheNextBatch) {
  KVGRID_NEED_GPU();
  select_device(0);
  for (CopyMode mode : {CopyMode::Memcpy, CopyMode::Kernel, CopyMode::Batch}) {
    SCOPED_TRACE(copy_mode_name(mode));
    transfer::EngineConfig cfg;
    cfg.streams = 2;
    auto engine = make_cuda_engine(cfg, mode);
    Buffers buf;
    buf.fill(7);
    const auto host_a = buf.read(2);
    // A delayed batch, then one on the same stream that copies what the first wrote: FIFO means the
    // second sees the first's bytes, and neither is complete right after submission.
    engine->inject(50'000'000, false);  // 50 ms
    auto first = engine->submit(0, {{buf.ptr(0), buf.ptr(2), 65536}});
    auto second = engine->submit(0, {{buf.ptr(3), buf.ptr(0), 65536}});
    EXPECT_FALSE(first.query());
    EXPECT_FALSE(second.query());
    second.synchronize();
    EXPECT_TRUE(first.query());
    const auto host_b = buf.read(3);
    EXPECT_TRUE(std::equal(host_a.begin(), host_a.begin() + 65536, host_b.begin()));
    // A failed batch copies nothing and says so; the one after it is whole again.
    const auto before = buf.read(1);
    engine->inject(0, true);
    auto failed = engine->submit(1, {{buf.ptr(1), buf.ptr(2), 4096}});
    failed.synchronize();
    EXPECT_TRUE(failed.failed());
    EXPECT_EQ(buf.read(1), before);
    auto ok = engine->submit(1, {{buf.ptr(1), buf.ptr(2), 4096}});
    ok.synchronize();
    EXPECT_FALSE(ok.failed());
    const auto after = buf.read(1);
    EXPECT_TRUE(std::equal(host_a.begin(), host_a.begin() + 4096, after.begin()));
  }
}

TEST(CudaKernels, GatherRowsMatchesAHostGather) {
  KVGRID_NEED_GPU();
  select_device(0);
  for (std::size_t row_bytes : {std::size_t(16), std::size_t(4096), std::size_t(4100)}) {
    const std::size_t rows = 64;
    std::vector<unsigned char> host(rows * row_bytes);
    std::iota(host.begin(), host.end(), static_cast<unsigned char>(1));
    const std::vector<std::uint32_t> src_ids = {3, 7, 0, 63, 12}, dst_ids = {1, 2, 60, 5, 9};
    Buffer src(host.size(), MemoryKind::Scratch), dst(host.size(), MemoryKind::Scratch);
    KVGRID_CUDA_CHECK(cudaMemcpy(src.get(), host.data(), host.size(), cudaMemcpyHostToDevice));
    KVGRID_CUDA_CHECK(cudaMemset(dst.get(), 0, host.size()));
    kernels::gather_rows(dst.get(), src.get(), dst_ids, src_ids, row_bytes);
    std::vector<unsigned char> got(host.size()), want(host.size(), 0);
    for (std::size_t i = 0; i < src_ids.size(); ++i)
      std::copy_n(host.begin() + static_cast<std::ptrdiff_t>(src_ids[i] * row_bytes), row_bytes,
                  want.begin() + static_cast<std::ptrdiff_t>(dst_ids[i] * row_bytes));
    KVGRID_CUDA_CHECK(cudaMemcpy(got.data(), dst.get(), got.size(), cudaMemcpyDeviceToHost));
    EXPECT_EQ(got, want) << "row_bytes " << row_bytes;
  }
}

struct Shape {
  std::size_t layers, heads, page_size, dims;
};

TEST(CudaKernels, KvKernelsAndRelayoutEqualTheHostReference) {
  KVGRID_NEED_GPU();
  select_device(0);
  for (const Shape c : {Shape{1, 1, 1, 1}, Shape{3, 2, 4, 3}, Shape{2, 4, 16, 8}, Shape{5, 3, 7, 2}, Shape{4, 8, 64, 16}}) {
    const std::size_t pages = 9;
    kvref::Geometry geo(pages, c.layers, c.heads, c.page_size, c.dims, 11, 2);
    const auto& g = geo.g;
    std::vector<std::uint32_t> page, slot;
    std::vector<std::uint64_t> F;
    std::size_t i = 0;
    for (std::uint32_t p = 1; p < pages; ++p)
      for (std::uint32_t s = 0; s < c.page_size; ++s) page.push_back(p), slot.push_back(s), F.push_back(word(3, i++));
    for (bool digest : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "layers " << c.layers << " heads " << c.heads << " page " << c.page_size
                                        << " dims " << c.dims << (digest ? " digest" : " full"));
      const std::size_t words = digest ? g.digest_words() : g.full_words();
      std::vector<std::uint64_t> want(words, 0);
      Buffer pool(words * 8, MemoryKind::Device);
      KVGRID_CUDA_CHECK(cudaMemset(pool.get(), 0, words * 8));
      if (digest) {
        kvref::write_tokens_digest(g, want.data(), page, slot, F);
        kernels::write_tokens_digest(g, pool.as<std::uint64_t>(), page, slot, F);
      } else {
        kvref::write_tokens_full(g, want.data(), page, slot, F);
        kernels::write_tokens_full(g, pool.as<std::uint64_t>(), page, slot, F);
      }
      std::vector<std::uint64_t> got(words);
      KVGRID_CUDA_CHECK(cudaMemcpy(got.data(), pool.get(), words * 8, cudaMemcpyDefault));
      ASSERT_EQ(got, want);
      const std::vector<std::uint32_t> read = {5, 2, 8, 1};
      std::vector<std::uint64_t> fw(g.layers * g.heads, 3), fg = fw;
      kvref::fold_pages(g, digest, want.data(), read, 4, fw);
      if (digest)
        kernels::fold_pages_digest(g, pool.as<std::uint64_t>(), read, 4, fg);
      else
        kernels::fold_pages_full(g, pool.as<std::uint64_t>(), read, 4, fg);
      EXPECT_EQ(fg, fw);
      if (!digest) {
        std::vector<std::uint64_t> tw(page.size() * g.layers * g.heads), tg = tw;
        kvref::fold_tokens_full(g, want.data(), page, slot, 11, tw);
        kernels::fold_tokens_full(g, pool.as<std::uint64_t>(), page, slot, 11, tg);
        EXPECT_EQ(tg, tw);
      }
      std::vector<kvgrid::kernels::ChunkSpan> chunks = {{0, c.layers, 0, c.heads}};
      if (c.layers > 1 && c.heads > 1)
        chunks = {{0, 1, 0, c.heads / 2}, {1, c.layers - 1, c.heads / 2, c.heads - c.heads / 2}, {0, 1, c.heads / 2, 1}};
      const std::vector<std::uint32_t> rows = {3, 1, 8};
      const auto objects = kvref::pack_objects(g, digest, want.data(), rows, chunks);
      Buffer staging(objects.size() * 8, MemoryKind::Scratch);
      kernels::pack_objects(g, digest, pool.as<std::uint64_t>(), rows, chunks, staging.as<std::uint64_t>());
      std::vector<std::uint64_t> packed(objects.size());
      KVGRID_CUDA_CHECK(cudaMemcpy(packed.data(), staging.get(), objects.size() * 8, cudaMemcpyDeviceToHost));
      EXPECT_EQ(packed, objects);
      // Unpacking into a zeroed pool restores exactly the packed rows' chunk words.
      KVGRID_CUDA_CHECK(cudaMemset(pool.get(), 0, words * 8));
      kernels::unpack_objects(g, digest, pool.as<std::uint64_t>(), rows, chunks, staging.as<std::uint64_t>());
      Buffer again(objects.size() * 8, MemoryKind::Scratch);
      kernels::pack_objects(g, digest, pool.as<std::uint64_t>(), rows, chunks, again.as<std::uint64_t>());
      KVGRID_CUDA_CHECK(cudaMemcpy(packed.data(), again.get(), objects.size() * 8, cudaMemcpyDeviceToHost));
      EXPECT_EQ(packed, objects);
    }
  }
}

TEST(CudaKernels, LaunchersRefuseBadArguments) {
  KVGRID_NEED_GPU();
  select_device(0);
  kvref::Geometry geo(4, 2, 2, 4, 2, 0, 0);
  Buffer pool(geo.g.full_words() * 8, MemoryKind::Device);
  const std::vector<std::uint32_t> page = {4}, slot = {0};
  const std::vector<std::uint64_t> F = {1};
  EXPECT_THROW(kernels::write_tokens_full(geo.g, pool.as<std::uint64_t>(), page, slot, F), std::invalid_argument);
  const std::vector<std::uint32_t> page1 = {1}, slot9 = {9};
  EXPECT_THROW(kernels::write_tokens_full(geo.g, pool.as<std::uint64_t>(), page1, slot9, F), std::invalid_argument);
}

#ifdef KVGRID_HAVE_NCCL
TEST(CudaNccl, SizeOneCommunicatorGathersAndSendsToItself) {
  KVGRID_NEED_GPU();
  select_device(0);
  NcclComm comm(1, 0, nccl_unique_id());
  EXPECT_EQ(comm.size(), 1);
  cudaStream_t s = nullptr;
  KVGRID_CUDA_CHECK(cudaStreamCreate(&s));
  std::vector<std::uint64_t> host(4096);
  for (std::size_t i = 0; i < host.size(); ++i) host[i] = word(9, i);
  Buffer a(host.size() * 8, MemoryKind::Scratch), b(host.size() * 8, MemoryKind::Scratch);
  KVGRID_CUDA_CHECK(cudaMemcpy(a.get(), host.data(), host.size() * 8, cudaMemcpyHostToDevice));
  comm.all_gather(a.get(), b.get(), host.size() * 8, s);
  KVGRID_CUDA_CHECK(cudaStreamSynchronize(s));
  std::vector<std::uint64_t> got(host.size());
  KVGRID_CUDA_CHECK(cudaMemcpy(got.data(), b.get(), host.size() * 8, cudaMemcpyDeviceToHost));
  EXPECT_EQ(got, host);
  KVGRID_CUDA_CHECK(cudaMemset(b.get(), 0, host.size() * 8));
  comm.group_start();
  comm.send(a.get(), host.size() * 8, 0, s);
  comm.recv(b.get(), host.size() * 8, 0, s);
  comm.group_end();
  KVGRID_CUDA_CHECK(cudaStreamSynchronize(s));
  KVGRID_CUDA_CHECK(cudaMemcpy(got.data(), b.get(), host.size() * 8, cudaMemcpyDeviceToHost));
  EXPECT_EQ(got, host);
  KVGRID_CUDA_CHECK(cudaStreamDestroy(s));
  // The CP gather's path: host send → device → ncclAllGather → host receive, two slots in flight.
  StagedAllGather gather(comm);
  std::vector<std::uint64_t> r0(host.size()), r1(512);
  auto e0 = gather.post(0, host.data(), r0.data(), host.size() * 8);
  auto e1 = gather.post(1, host.data() + 7, r1.data(), 512 * 8);
  e0.synchronize();
  e1.synchronize();
  EXPECT_EQ(r0, host);
  EXPECT_TRUE(std::equal(r1.begin(), r1.end(), host.begin() + 7));
  // The P/D data plane's path: three host parts gathered, sent to itself, received and scattered
  // into two parts of other sizes (send and receive in one NCCL group: a rank's send to itself
  // needs its receive posted with it; their events are recorded when the group ends).
  // Over a communicator of its own, created with another in one NCCL group (as the P/D plane
  // creates one per peer).
  auto pair = NcclComm::create_grouped({{1, 0, nccl_unique_id()}, {1, 0, nccl_unique_id()}});
  ASSERT_EQ(pair.size(), 2u);
  EXPECT_EQ(pair[1]->size(), 1);
  StagedPointToPoint p2p(*pair[1]);
  std::vector<std::uint64_t> x(1000), y(3096);
  std::vector<HostPart> out{{host.data(), 100 * 8}, {host.data() + 100, 3000 * 8}, {host.data() + 3100, 996 * 8}};
  std::vector<HostPart> in{{x.data(), x.size() * 8}, {y.data(), y.size() * 8}};
  p2p.group_start();
  auto sent = p2p.send(0, out);
  auto received = p2p.recv(0, in);
  EXPECT_FALSE(received.query());  // recorded at group_end, after NCCL queued the group
  p2p.group_end();
  received.synchronize();
  sent.synchronize();
  EXPECT_TRUE(std::equal(x.begin(), x.end(), host.begin()));
  EXPECT_TRUE(std::equal(y.begin(), y.end(), host.begin() + 1000));
}
#endif

}  // namespace
}  // namespace kvgrid::cuda
