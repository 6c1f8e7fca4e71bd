// P/D suffix transfer bandwidth: one prefill rank sends a request's KV suffix to its decode peer
// through the KV transport (transfer/kv_transport.hpp), layer by layer, full payload, pages
// scattered over the pool; next to it the plain MPI point-to-point baseline of the same bytes
// (one contiguous buffer per layer, MPI_Isend / MPI_Irecv, MPI_Waitall). The three transport
// modes (mpi_transport.cpp) each run a pass per repeat; median of the repeats.
//   mpirun -np 2 build/kvgrid_bench_pd_transfer [pages] [repeats]
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cache/kv_pool.hpp"
#include "core/check.hpp"
#include "transfer/kv_transport.hpp"

using namespace kvgrid;

namespace {

constexpr std::uint64_t kLayers = 8, kPage = 16, kDims = 128;  // 4 heads: 64 KiB per page and layer

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int me = 0, n = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  const std::int64_t pages = argc > 1 ? std::atoll(argv[1]) : 256;
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 7;
  if (n != 2 || pages < 1 || repeats < 1) {
    if (me == 0) std::fprintf(stderr, "kvgrid_bench_pd_transfer: mpirun -np 2 ... [pages >= 1] [repeats >= 1]\n");
    MPI_Finalize();
    return 2;
  }
  cache::KvPool pool({Pages(2 * pages), Tokens(kPage), 0, kLayers, {0, 1, 2, 3}, kDims, cache::Payload::Full});
  std::vector<PageId> suffix;  // every other page: scattered like a real page table
  for (std::int64_t i = 0; i < pages; ++i) suffix.push_back(PageId(static_cast<std::uint32_t>(2 * i + 1)));
  const std::size_t layer_bytes = static_cast<std::size_t>(pages) * pool.layer_block_bytes();
  std::vector<std::vector<char>> plain(kLayers, std::vector<char>(layer_bytes, 1));
  auto staged = transfer::make_mpi_transport(MPI_COMM_WORLD, transfer::MpiMode::Staged);
  auto per_block = transfer::make_mpi_transport(MPI_COMM_WORLD, transfer::MpiMode::PerBlock);
  auto datatype = transfer::make_mpi_transport(MPI_COMM_WORLD, transfer::MpiMode::Datatype);
  const int peer = 1 - me;
  std::vector<double> st_s, kv_s, dt_s, mpi_s;
  auto suffix_pass = [&](transfer::KvTransport& t) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = now_s();
    std::vector<transfer::Event> ev;
    for (std::size_t l = 0; l < kLayers; ++l) {
      auto blocks = cache::layer_blocks(pool, suffix, l);
      ev.push_back(me == 0 ? t.send(peer, 200 + static_cast<int>(l), blocks) : t.recv(peer, 200 + static_cast<int>(l), blocks));
    }
    for (auto& e : ev) e.synchronize();
    MPI_Barrier(MPI_COMM_WORLD);
    return now_s() - t0;
  };
  for (int r = 0; r < repeats + 1; ++r) {  // the first round warms up
    const double st = suffix_pass(*staged);
    const double kv = suffix_pass(*per_block);
    const double dt = suffix_pass(*datatype);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = now_s();
    std::vector<MPI_Request> req(kLayers);
    for (std::size_t l = 0; l < kLayers; ++l) {
      if (me == 0)
        MPI_Isend(plain[l].data(), static_cast<int>(layer_bytes), MPI_BYTE, peer, 300 + static_cast<int>(l), MPI_COMM_WORLD, &req[l]);
      else
        MPI_Irecv(plain[l].data(), static_cast<int>(layer_bytes), MPI_BYTE, peer, 300 + static_cast<int>(l), MPI_COMM_WORLD, &req[l]);
    }
    MPI_Waitall(static_cast<int>(kLayers), req.data(), MPI_STATUSES_IGNORE);
    MPI_Barrier(MPI_COMM_WORLD);
    const double base = now_s() - t0;
    if (r > 0) {
      st_s.push_back(st);
      kv_s.push_back(kv);
      dt_s.push_back(dt);
      mpi_s.push_back(base);
    }
  }
  if (me == 0) {
    const double bytes = static_cast<double>(layer_bytes * kLayers);
    const double st = median(st_s), kv = median(kv_s), dt = median(dt_s), base = median(mpi_s);
    std::printf("# suffix of %lld pages x %llu layers, %.1f MiB, %d repeats (median)\n", static_cast<long long>(pages),
                static_cast<unsigned long long>(kLayers), bytes / (1 << 20), repeats);
    std::printf("kv transport, staged                      %8.3f ms  %6.2f GB/s\n", st * 1e3, bytes / st / 1e9);
    std::printf("kv transport, one message per block       %8.3f ms  %6.2f GB/s\n", kv * 1e3, bytes / kv / 1e9);
    std::printf("kv transport, hindexed datatype (default) %8.3f ms  %6.2f GB/s\n", dt * 1e3, bytes / dt / 1e9);
    std::printf("MPI point-to-point (contiguous, Waitall)  %8.3f ms  %6.2f GB/s\n", base * 1e3, bytes / base / 1e9);
    std::printf("ratio kv transport / MPI: %.2f datatype (default), %.2f per block, %.2f staged\n", base / dt, base / kv, base / st);
  }
  MPI_Finalize();
  return 0;
}
