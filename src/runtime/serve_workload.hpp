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
//   agentic    agent trajectories shaped like SWE-bench agent runs (experiment.hpp AgenticConfig):
//              sessions of many turns, each resending its whole context plus a heavy-tailed tool
//              result after a pause, sub-agents forking from a parent's context
//   mooncake   replay of a Mooncake JSONL trace: each 512-token hash block maps to fixed token ids,
//              timestamps (ms) are arrivals on the modelled clock, scaled by time_scale; an optional
//              session_id (integer or string) makes a line part of a session (opened at its first
//              request, closed when its last one finished); lines without one belong to none
//
// Sessions (session-aware eviction): requests carry a session id (0: none); the workload also
// emits session events — an open before a session's first request, a close after its last one
// finished (agentic: or while it runs, abandon_prob) — which PP0's leader relays with the
// arrivals, so that every rank applies them at the same step.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/ids.hpp"
#include "runtime/experiment.hpp"

namespace kvgrid {

using SessionId = std::uint64_t;  // 0: no session

struct SessionEvent {
  enum Kind : std::uint64_t { Open = 1, Close = 2 };
  Kind kind = Open;
  SessionId session = 0;
};

struct RequestSpec {
  RequestId id{0};
  SessionId session = 0;          // 0: none
  std::uint64_t session_gen = 0;  // set on each rank at arrival (the cache's generation; not sent)
  std::uint64_t arrival_ns = 0;  // modelled
  std::uint32_t round = 0;       // conversation turn (0 for single-turn workloads)
  std::uint32_t output_len = 1;  // tokens to generate (>= 1)
  std::vector<TokenId> prompt;
  // Where the workload made them with the prompt (a trace's prompts on the helper thread; not sent
  // to other ranks): prefix_marks[k] is the prefix hash (kernels::prefix_hash_step from kPrefixSeed)
  // of the prompt's first (k + 1) · mark_stride tokens. The model starts a chunk's hash chain from
  // the last mark at or below its start; the oracle never reads them.
  std::vector<std::uint64_t> prefix_marks;
  std::uint32_t mark_stride = 0;
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
  // Called by PP0's leader when nothing is running, no arrival is known and the workload is not
  // exhausted: a workload that waits on another process (routed_workload.hpp) blocks here until
  // it knows more. `now_ns`: the leader's modelled clock.
  virtual void wait_for_arrival(std::uint64_t /*now_ns*/) {}
  // engine.helper_thread: a workload that makes its prompts from a trace may make them on a thread
  // of its own, ahead of their arrival (the same prompts), with their prefix marks.
  virtual void make_ahead() {}
  // Session opens and closes since the last call, in order (applied before that step's arrivals).
  std::vector<SessionEvent> take_session_events() { return std::exchange(events_, {}); }
  bool has_session_events() const { return !events_.empty(); }

 protected:
  std::vector<SessionEvent> events_;
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
// Session events as (kind, id) pairs for the step message.
std::vector<std::pair<std::uint64_t, std::uint64_t>> encode_session_events(std::span<const SessionEvent> ev);
std::vector<SessionEvent> decode_session_events(std::span<const std::pair<std::uint64_t, std::uint64_t>> ev);

}  // namespace kvgrid
