// One pp_sync relay hop next to an MPI ping-pong of the same size on the same two ranks.
//   mpirun -np 2 build/kvgrid_bench_pp_sync [iterations]
// Both bounce a 64-word message between the ranks (one-way time = round trip / 2): the raw one
// with MPI_Isend/MPI_Irecv and the wait primitive, the other as the serving loop's step message —
// packed with the pp_sync write-ACK count, sent through the bounded non-blocking Sender, received
// and unpacked by recv_step, the count read back. The protocol adds no message of its own; this
// measures what its carrier costs.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "core/check.hpp"
#include "core/wait.hpp"
#include "runtime/step_message.hpp"

using namespace kvgrid;

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

double raw_ping_pong(int me, int iters) {
  std::vector<std::uint32_t> buf(kStepHeaderWords, 7);
  const int peer = 1 - me;
  MPI_Barrier(MPI_COMM_WORLD);
  const double t0 = now_s();
  for (int i = 0; i < iters; ++i) {
    MPI_Request req;
    if (me == 0) {
      KVGRID_MPI_CHECK(MPI_Isend(buf.data(), kStepHeaderWords, MPI_UINT32_T, peer, 1, MPI_COMM_WORLD, &req));
      wait_mpi(&req, "ping");
      KVGRID_MPI_CHECK(MPI_Irecv(buf.data(), kStepHeaderWords, MPI_UINT32_T, peer, 1, MPI_COMM_WORLD, &req));
      wait_mpi(&req, "pong");
    } else {
      KVGRID_MPI_CHECK(MPI_Irecv(buf.data(), kStepHeaderWords, MPI_UINT32_T, peer, 1, MPI_COMM_WORLD, &req));
      wait_mpi(&req, "ping");
      KVGRID_MPI_CHECK(MPI_Isend(buf.data(), kStepHeaderWords, MPI_UINT32_T, peer, 1, MPI_COMM_WORLD, &req));
      wait_mpi(&req, "pong");
    }
  }
  return (now_s() - t0) / (2.0 * iters);
}

double step_hops(int me, int iters) {
  Sender sender;
  const int peer = 1 - me;
  StepMessage m;
  m.clock_ns = 1;
  m.entries.push_back({1, 10, 11, 42});  // one decode entry, as in a decode step
  std::uint64_t sum = 0;
  MPI_Barrier(MPI_COMM_WORLD);
  const double t0 = now_s();
  for (int i = 0; i < iters; ++i) {
    if (me == 0) {
      m.write_acks = static_cast<std::uint32_t>(i % 3);
      sender.send(m, peer, MPI_COMM_WORLD);
      sum += recv_step(peer, MPI_COMM_WORLD, "hop back").write_acks;
    } else {
      StepMessage in = recv_step(peer, MPI_COMM_WORLD, "hop");
      sum += in.write_acks;
      sender.send(in, peer, MPI_COMM_WORLD);
    }
  }
  sender.drain(true);
  const double t = (now_s() - t0) / (2.0 * iters);
  if (sum == ~0ULL) std::printf("impossible\n");
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int me = 0, n = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  if (n != 2) {
    if (me == 0) std::fprintf(stderr, "kvgrid_bench_pp_sync: run with mpirun -np 2\n");
    MPI_Finalize();
    return 2;
  }
  const int iters = argc > 1 ? std::atoi(argv[1]) : 20000;
  std::vector<double> raw, hop;
  for (int rep = 0; rep < 5; ++rep) {  // alternate, take medians
    raw.push_back(raw_ping_pong(me, iters));
    hop.push_back(step_hops(me, iters));
  }
  std::sort(raw.begin(), raw.end());
  std::sort(hop.begin(), hop.end());
  if (me == 0)
    std::printf("# %d iterations x 5, medians, one way: MPI ping-pong of 64 words %.2f us; step message with the pp_sync "
                "count %.2f us; ratio %.2f (target <= 2)\n",
                iters, raw[2] * 1e6, hop[2] * 1e6, hop[2] / raw[2]);
  MPI_Finalize();
  return 0;
}
