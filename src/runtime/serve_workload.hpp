// Workloads of the serving loop. Only PP0's stage leader owns a Workload; every other rank learns
// requests from messages. Everything is deterministic from the seed; time is the leader's modelled
// clock (never wall time).
//
//   gsp        SGLang's generated-shared-prefix benchmark: groups sharing a system prompt, each
//              prompt = system prompt + question; with turns > 1 a prompt's next turn (history +
//              the model's own output + a new question) arrives when the previous turn finishes
//   multiturn  SGLang's bench_multiturn: clients × rounds, every round resends the whole history
//              plus a sub-question; at most max_in_flight requests outstanding; optional round
//              barrier (round r+1 starts when every client finished round r)
//   aba        A -> B -> A (vLLM #50630): lanes of identical requests A with B (sharing A's start)
//              in between, each sent when the lane's previous request finished
//   cold_prefix concurrent cold prefills: groups of requests sharing a prefix nobody has computed,
//              a group arriving together
//   mooncake   replay of a Mooncake JSONL trace: each 512-token hash block maps to fixed token ids,
//              timestamps (ms) are arrivals on the modelled clock, scaled by time_scale
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/ids.hpp"
#include "runtime/experiment.hpp"

namespace kvgrid {

struct RequestSpec {
  RequestId id{0};
  std::uint64_t arrival_ns = 0;  // modelled
  std::uint32_t round = 0;       // conversation turn (0 for single-turn workloads)
  std::uint32_t output_len = 1;  // tokens to generate (>= 1)
  std::vector<TokenId> prompt;
};

class ServeWorkload {
 public:
  virtual ~ServeWorkload() = default;
  // Requests that have arrived by `now_ns`, in arrival order (removed from the workload).
  virtual std::vector<RequestSpec> arrivals(std::uint64_t now_ns) = 0;
  // The earliest arrival not yet returned, if one is known.
  virtual std::optional<std::uint64_t> next_arrival_ns() const = 0;
  // No request will ever arrive again.
  virtual bool exhausted() const = 0;
  // Closed-loop workloads release follow-ups when a request finishes.
  virtual void finished(RequestId /*id*/, std::uint64_t /*now_ns*/) {}
  virtual std::uint64_t total_requests() const = 0;
};

// Throws InputError for a bad trace (file, line).
std::unique_ptr<ServeWorkload> make_serve_workload(const WorkloadConfig& cfg, std::uint64_t seed);

// The output the synthetic model generates after `prompt` (next token = function of the prefix),
// so that workloads can rebuild a conversation's history without asking the model.
std::vector<TokenId> model_output(std::span<const TokenId> prompt, std::uint32_t output_len, std::uint64_t vocab);

// Mooncake: the 512 token ids of hash block `hash_id`.
void mooncake_block_tokens(std::uint64_t hash_id, std::span<TokenId> out, std::uint64_t vocab);

// Flat uint32 encoding of request specs for the stage broadcast and the PP forwarding.
std::vector<std::uint32_t> encode_specs(std::span<const RequestSpec> reqs);
std::vector<RequestSpec> decode_specs(std::span<const std::uint32_t> buf);

}  // namespace kvgrid
