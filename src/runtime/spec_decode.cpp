#include "runtime/spec_decode.hpp"

#include <mpi.h>

#include <algorithm>

#include "core/agree.hpp"
#include "core/check.hpp"
#include "core/hash.hpp"
#include "core/wait.hpp"

namespace kvgrid {

std::int64_t draft_round_size(const DraftConfig& d, const BatchEntry& e) {
  const bool yields = !e.prefill || e.end == e.req->prompt_len();
  if (!d.enabled() || !yields) return 0;
  const auto g1 = static_cast<std::int64_t>(e.req->generated) + 1;  // tokens generated once this step's is
  return std::min<std::int64_t>(d.steps, static_cast<std::int64_t>(e.req->spec.output_len) - g1 - 1);
}

std::uint32_t draft_accepted(std::uint64_t seed, RequestId id, std::uint32_t generated, std::int64_t k, double accept_prob,
                             bool intact) {
  std::uint32_t a = 0;
  for (; intact && a < k; ++a) {
    const std::uint64_t x = mix64(hash_combine(hash_combine(hash_combine(seed, 0x7370656364726166ULL), id.value()),
                                               static_cast<std::uint64_t>(generated) * 1024 + a));
    if (static_cast<double>(x >> 11) * 0x1.0p-53 >= accept_prob) break;
  }
  return a;
}

std::uint64_t draft_step_ns(const CostConfig& c, const DraftConfig& d, const StepWork& work, std::span<const BatchEntry> batch,
                            std::size_t draft_layers, int tp, int cp) {
  if (batch.empty()) return 0;
  std::uint64_t ns = compute_ns(c, work, draft_layers, tp, cp);
  if (work.decode_tokens > 0 || std::any_of(batch.begin(), batch.end(), [](const BatchEntry& e) { return e.end == e.req->prompt_len(); }))
    ns += static_cast<std::uint64_t>(static_cast<double>(d.steps - 1) * c.decode_ns_per_layer * static_cast<double>(draft_layers) /
                                     static_cast<double>(tp));
  return ns;
}

void share_spec_counts(const RankGrid& grid, ServeResult& res) {
  std::uint64_t v[5] = {static_cast<std::uint64_t>(res.spec_rounds), static_cast<std::uint64_t>(res.spec_proposed),
                        static_cast<std::uint64_t>(res.spec_accepted), static_cast<std::uint64_t>(res.draft_mismatches),
                        res.spec_digest};
  // The last stage verified the rounds: every rank of it must have counted the same, then the
  // world takes its counts (the other stages hold none).
  if (grid.is_last_stage() && !all_equal(grid.stage(), std::span<const std::uint64_t>(v, 5), "agreement of draft counts"))
    throw RunFailure("the last stage's ranks counted different draft rounds or acceptances: their verification diverged");
  MPI_Request req;
  KVGRID_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, v, 5, MPI_UINT64_T, MPI_MAX, grid.world(), &req));
  wait_mpi(&req, "Iallreduce of speculative decoding counts");
  res.spec_rounds = static_cast<std::int64_t>(v[0]);
  res.spec_proposed = static_cast<std::int64_t>(v[1]);
  res.spec_accepted = static_cast<std::int64_t>(v[2]);
  res.draft_mismatches = static_cast<std::int64_t>(v[3]);
  res.spec_digest = v[4];
}

}  // namespace kvgrid
