// Workload generators. The stage leader of PP0 draws requests from the shared workload stream
// (`shared_stream(seed, "workload")`), so the request sequence depends only on the seed and the
// [workload] table — never on the topology. Other ranks receive requests as messages
// (`encode_requests` / `decode_requests`) and never generate them.
//
// `tree` workload: `prefixes` families of shared prefixes (system prompts) of `prefix_tokens`
// tokens; each request either extends an earlier request (a next turn, probability
// `followup_prob`) or takes part of a family's prefix plus fresh tokens; prompt lengths stay in
// [prompt_tokens_min, prompt_tokens_max]. Each request holds its prefix for 1..hold_steps_max steps.
#pragma once

#include <cstdint>
#include <deque>
#include <span>
#include <vector>

#include "core/ids.hpp"
#include "core/rng.hpp"
#include "runtime/experiment.hpp"

namespace kvgrid {

struct Request {
  RequestId id{0};
  std::int64_t hold_steps = 1;
  std::vector<TokenId> tokens;
};

class TreeWorkload {
 public:
  TreeWorkload(const TreeWorkloadConfig& cfg, std::uint64_t vocab, std::uint64_t seed);
  std::vector<Request> next_step();

 private:
  std::vector<TokenId> random_tokens(std::int64_t n);
  TreeWorkloadConfig cfg_;
  std::uint64_t vocab_;
  Rng rng_;
  std::vector<std::vector<TokenId>> families_;
  std::deque<std::vector<TokenId>> history_;  // recent prompts, for follow-up turns
  std::uint64_t next_id_ = 0;
};

// Flat uint32 encoding: [count, then per request: id_lo, id_hi, hold, len, tokens...].
std::vector<std::uint32_t> encode_requests(std::span<const Request> reqs);
// Throws InternalError on a malformed buffer.
std::vector<Request> decode_requests(std::span<const std::uint32_t> buf);

}  // namespace kvgrid
