// The per-layer gather of CP-sharded KV, full payload, on N ranks (run at CP 4: mpirun -np 4).
//   mpirun -np 4 build/kvgrid_bench_gather [prefix_pages] [repeats]
// Each rank holds its share of a cached prefix (8 layers, 4 heads x 16 tokens x 128 dims per
// page); the gather-and-fold pass (protocols/layer_gather) runs with overlap (layer l+1's
// MPI_Iallgather posted before attention on layer l, driven by MPI_Test) and without (post, wait,
// fold). Reported: the wall time blocked on gathers in each mode and the fraction of the gather
// time the overlap hides (1 - blocked with overlap / blocked without); then, for the same prefix
// set, per-rank device bytes from the allocator's high-water mark, sharded / replicated (with and
// without the two gather slots).
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cache/device_pool.hpp"
#include "cache/kv_pool.hpp"
#include "core/check.hpp"
#include "protocols/layer_gather.hpp"

using namespace kvgrid;

namespace {

constexpr std::uint64_t kLayers = 8, kPage = 16, kDims = 128;

cache::KvPoolConfig pool_config(Pages pages, std::uint32_t shards, std::uint32_t rank) {
  return cache::KvPoolConfig{pages, Tokens(kPage), 0, kLayers, {0, 1, 2, 3}, kDims, cache::Payload::Full,
                             cache::CpPlacement{shards, kPage}, rank};
}

struct Pass {
  double blocked_ms = 0, total_ms = 0;
};

Pass run(protocols::LayerGather& g, std::span<const PageId> prefix, std::vector<std::uint64_t>& run_state) {
  const auto before = g.stats();
  protocols::GatherItem item{prefix, run_state};
  MPI_Barrier(MPI_COMM_WORLD);
  g.run(std::span<const protocols::GatherItem>(&item, 1), {});
  return {static_cast<double>(g.stats().blocked_ns - before.blocked_ns) / 1e6,
          static_cast<double>(g.stats().total_ns - before.total_ns) / 1e6};
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int me = 0, n = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  const std::int64_t prefix_pages = argc > 1 ? std::atoll(argv[1]) : 512;
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 5;
  if (n < 2) {
    std::fprintf(stderr, "kvgrid_bench_gather: run with mpirun -np N (N >= 2, the shard group)\n");
    MPI_Finalize();
    return 2;
  }
  const auto N = static_cast<std::uint32_t>(n);
  protocols::ShardGroup group;
  group.size = N;
  group.rank = static_cast<std::uint32_t>(me);
  group.axis = "cp";
  KVGRID_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &group.comm));

  // The prefix: one cyclic chain of logical pages; each rank fills the ones it owns.
  const Pages per_rank((prefix_pages + N - 1) / N + 1);
  cache::DevicePool alloc(per_rank, cache::CpPlacement{N, kPage});
  auto prefix = *alloc.alloc(Pages(prefix_pages), 0);
  cache::KvPool pool(pool_config(per_rank, N, group.rank));
  std::vector<std::uint32_t> pg, slot;
  std::vector<std::uint64_t> F;
  for (std::size_t k = 0; k < prefix.size(); ++k)
    for (std::uint32_t s = 0; s < kPage; ++s) {
      pg.push_back(prefix[k].value());
      slot.push_back(s);
      F.push_back(k * kPage + s + 1);
    }
  pool.write(pg, slot, F);

  const Pages slot_pages(protocols::LayerGather::padded_pages(prefix_pages, N));
  std::vector<Pass> on, off;
  std::vector<std::uint64_t> state_on(kLayers * 4, 0), state_off(kLayers * 4, 0);
  protocols::LayerGather with({slot_pages, true, 8}, group, pool), without({slot_pages, false, 8}, group, pool);
  run(with, prefix, state_on);  // warm-up
  run(without, prefix, state_off);
  for (int r = 0; r < repeats; ++r) {
    on.push_back(run(with, prefix, state_on));
    off.push_back(run(without, prefix, state_off));
  }
  KVGRID_CHECK(state_on == state_off, "the two modes folded different KV");
  auto median = [](std::vector<Pass> v, double Pass::*f) {
    std::sort(v.begin(), v.end(), [f](const Pass& a, const Pass& b) { return a.*f < b.*f; });
    return v[v.size() / 2].*f;
  };
  // The slowest rank decides.
  double m[4] = {median(on, &Pass::blocked_ms), median(on, &Pass::total_ms), median(off, &Pass::blocked_ms),
                 median(off, &Pass::total_ms)};
  KVGRID_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, m, 4, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));

  // Per-rank device bytes for the same prefix set (16 requests sharing nothing), from the
  // allocators' high-water marks.
  const std::int64_t requests = 16;
  cache::DevicePool rep(Pages(requests * prefix_pages)), sh(Pages(requests * prefix_pages), cache::CpPlacement{N, kPage});
  for (std::int64_t i = 0; i < requests; ++i) {
    KVGRID_CHECK(rep.alloc(Pages(prefix_pages)).has_value() && sh.alloc(Pages(prefix_pages), 0).has_value(), "allocation");
  }
  std::int64_t sh_high = 0;
  for (std::uint32_t r = 0; r < N; ++r) sh_high = std::max(sh_high, sh.high_water(r).value());
  const double page_bytes = static_cast<double>(pool.layer_block_bytes() * kLayers);
  const double slots_bytes = 2.0 * static_cast<double>(slot_pages.value()) * static_cast<double>(pool.layer_block_bytes());
  const double rep_bytes = static_cast<double>(rep.high_water(0).value()) * page_bytes;
  const double sh_bytes = static_cast<double>(sh_high) * page_bytes;
  if (me == 0) {
    const double mib = static_cast<double>(slot_pages.value()) * static_cast<double>(pool.layer_block_bytes()) / (1 << 20);
    std::printf("# gather of a %lld-page prefix over %d ranks, %llu layers, %.1f MiB received per layer, %d repeats (medians, "
                "slowest rank)\n",
                static_cast<long long>(prefix_pages), n, static_cast<unsigned long long>(kLayers), mib, repeats);
    std::printf("# without overlap: blocked %.2f ms of %.2f ms; with overlap: blocked %.2f ms of %.2f ms; "
                "gather time hidden by the overlap: %.0f %%\n",
                m[2], m[3], m[0], m[1], 100.0 * (1.0 - m[0] / m[2]));
    std::printf("# device bytes per rank for %lld such prefixes: replicated %.1f MiB, sharded %.1f MiB (%.3f, 1/N = %.3f); "
                "with the two gather slots %.1f MiB (%.3f)\n",
                static_cast<long long>(requests), rep_bytes / (1 << 20), sh_bytes / (1 << 20), sh_bytes / rep_bytes, 1.0 / n,
                (sh_bytes + slots_bytes) / (1 << 20), (sh_bytes + slots_bytes) / rep_bytes);
  }
  KVGRID_MPI_CHECK(MPI_Comm_free(&group.comm));  // before MPI_Finalize (the group's destructor runs later)
  group.comm = MPI_COMM_NULL;
  MPI_Finalize();
  return 0;
}
