// One rank's scheduler for the serving loop (what each SGLang scheduler process decides alone).
//
// Every rank runs one over the same request stream and must take the same decisions; nothing
// about batches, prefix lengths or cache operations is read from messages. Per step:
//   1. every request in decode produces one token (speculative decoding: its accepted draft
//      tokens, verified in the same step, and one more);
//   2. requests in prefill continue, up to `chunk_size` prefill tokens in all (chunked prefill);
//   3. while budget and `max_running` allow, waiting requests are admitted in arrival order
//      (one whose load-back must first be agreed, protocol.load_back, is scheduled from the next step):
//      match_prefix, lock, reserve pages for prompt + output - 1 positions (evicting if needed);
//      the first one that does not fit stops admission (no overtaking) — pages, or (CP sharding)
//      room in the batch's gather slot, reserved before its load-back is queued;
// After the step, `complete_step` advances each request: the last prefill chunk yields the first
// token, each decode step one more (next token = function of the prefix); a request that has
// all its tokens finishes and commits its KV to the tree.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "cache/device_cache.hpp"
#include "core/fast_mod.hpp"
#include "kernels/kv_math.hpp"
#include "runtime/model.hpp"
#include "runtime/serve_workload.hpp"

namespace kvgrid {

struct ServeRequest {
  RequestSpec spec;
  std::vector<TokenId> tokens;    // prompt, then generated tokens
  std::uint64_t ph = 0;           // prefix hash of `tokens` (for next-token generation)
  std::size_t ph_len = 0;
  std::uint32_t generated = 0;
  std::size_t computed = 0;       // positions whose KV is written
  cache::Reservation res;
  ModelRequestState model;
  OracleRequestState oracle;
  // speculative decoding (last stage): the draft's model state and oracle, and its rounds
  ModelRequestState draft;
  OracleRequestState draft_oracle;
  std::uint32_t spec_rounds = 0, spec_proposed = 0, spec_accepted = 0, draft_mismatches = 0;
  // P/D decode side: admitted, its prompt's KV suffix still arriving from its prefill peer
  bool awaiting_kv = false;
  // Admitted with a private load-back whose outcome is still being agreed (protocol.load_back):
  // not scheduled until `restore_decided`.
  bool awaiting_restore = false;
  std::uint32_t pd_slot = 0;
  bool pd_slot_held = false;  // P/D decode: pd_slot is this request's until its receive ends
  std::vector<transfer::Event> pd_events;  // the suffix's receives, one per transfer leg (runtime/pd.hpp)
  // Hybrid sidecars' words arrive here (one per sidecar leg: this stage's sidecar, its source
  // slots, their words) and enter the sidecar when the receive ends.
  struct PdSidecarReceive {
    std::size_t sidecar = 0;
    std::vector<std::uint32_t> slots;
    std::vector<std::uint64_t> words;
  };
  std::vector<PdSidecarReceive> pd_sidecars;
  // metrics, on this rank's modelled clock (ns) and wall clock (ns since the run started)
  std::uint64_t admit_ns = 0, first_token_ns = 0, finish_ns = 0, forward_ns = 0;
  std::uint64_t seen_wall_ns = 0, first_token_wall_ns = 0;
  bool oracle_ok = true;

  // The prompt is the first prompt_len() tokens (the spec's prompt moved there at enqueue).
  std::size_t prompt_len() const { return prompt_len_; }
  std::span<const TokenId> prompt() const { return std::span<const TokenId>(tokens).first(prompt_len_); }
  std::size_t kv_len() const { return prompt_len_ + spec.output_len - 1; }
  bool prefill_done() const { return computed >= prompt_len(); }
  bool finished() const { return generated >= spec.output_len; }

  std::size_t prompt_len_ = 0;  // (set by Scheduler::enqueue)
};

struct BatchEntry {
  ServeRequest* req;
  std::size_t start, end;
  bool prefill;
};

struct SchedulerConfig {
  std::int64_t chunk_size = 512;
  std::int64_t max_running = 64;
  std::uint64_t vocab = 32000;
  // CP sharding: the batch's cached prefixes are gathered into one slot of `gather_pages` pages
  // (0: no gather). A request whose prefix would overflow the slot waits for a later step (no
  // overtaking); one that alone exceeds it reuses only what fits. P/D decode gathers a request's
  // whole received prompt at its first decode step instead: those steps share the slot (the rest
  // wait a step), and a prompt larger than the slot fails the run at admission.
  std::int64_t gather_pages = 0;
  std::uint32_t shards = 1;
  // P/D. Decode side (`receive_prompt`): an admission reserves pages for the whole request and
  // matches its own cache (`reuse`; off: nothing is reused) but computes nothing — the request
  // waits (awaiting_kv) until `kv_arrived`. Prefill side: `admit_gate(id)` false keeps the head of
  // the queue waiting (decode has not answered its bootstrap yet).
  bool receive_prompt = false, reuse = true;
  std::function<bool(RequestId)> admit_gate = {};
};

class Scheduler {
 public:
  Scheduler(SchedulerConfig cfg, cache::DeviceCache& cache);

  void enqueue(RequestSpec spec, std::uint64_t wall_ns);
  // Decides this step's batch (admissions included). `now_ns` stamps admissions.
  std::vector<BatchEntry> schedule(std::uint64_t now_ns);
  // engine.decode = fused: the batch schedule() would return when the one running request decodes
  // a token that does not finish it and nothing can be admitted (a full-attention model: nothing
  // to prepare); nullopt otherwise. Leaves what schedule() leaves: no fresh pages, no admissions.
  std::optional<BatchEntry> quiet_decode();
  // Advances the batch's requests after their forward pass; returns the requests that finished
  // (committed to the cache and removed from the running set; owned by the caller now).
  std::vector<std::unique_ptr<ServeRequest>> complete_step(const std::vector<BatchEntry>& batch, std::uint64_t now_ns,
                                                           std::uint64_t wall_ns);

  // P/D decode side: request `id`'s prompt KV is complete at `now_ns`; its first token (the
  // prefill's) is appended and it decodes from the next step on.
  void kv_arrived(RequestId id, std::uint64_t now_ns, std::uint64_t wall_ns);
  // Request `id`'s private load-back was agreed (protocol.load_back): it is scheduled from now on,
  // computing from its (possibly shrunk, when the load failed) reused prefix.
  void restore_decided(ServeRequest& r) {
    r.awaiting_restore = false;
    r.computed = static_cast<std::size_t>(r.res.matched.value());
  }
  // Requests admitted by the last schedule() (admission order), with their reused prefix.
  const std::vector<ServeRequest*>& admitted() const { return admitted_; }
  ServeRequest* find_running(RequestId id);
  // Speculative decoding: the target accepted `n` draft tokens of running request `id` after its
  // last token; they are appended (the next step verifies them with one more). A request that is
  // not running any more (aborted) is skipped.
  void accept_draft(RequestId id, std::uint32_t n);
  // Removes request `id` wherever it is and releases everything it held (cache abort); null when
  // it is not here (finished already).
  std::unique_ptr<ServeRequest> abort(RequestId id);
  // Ids of the waiting and running requests, in ascending order.
  std::vector<RequestId> ids() const;

  bool idle() const { return waiting_.empty() && running_.empty(); }
  std::size_t waiting() const { return waiting_.size(); }
  std::size_t running() const { return running_.size(); }
  // Fresh pages of this step's admissions (the KV pool resets them before use).
  const std::vector<PageId>& fresh_pages() const { return fresh_pages_; }

 private:
  // kernels::next_token(ph, cfg_.vocab), the same token without a division (once per decode step).
  TokenId next_token(std::uint64_t ph) const { return static_cast<TokenId>(vocab_.mod(kernels::next_token_hash(ph))); }
  // r.ph continued over r.tokens up to position n (from r.ph_len).
  static void hash_through(ServeRequest& r, std::size_t n) {
    for (; r.ph_len < n; ++r.ph_len) r.ph = kernels::prefix_hash_step(r.ph, r.tokens[r.ph_len]);
  }

  SchedulerConfig cfg_;
  FastMod64 vocab_;  // cfg_.vocab, for next_token
  cache::DeviceCache& cache_;
  std::deque<std::unique_ptr<ServeRequest>> waiting_;
  std::vector<std::unique_ptr<ServeRequest>> running_;  // admission order
  std::vector<PageId> fresh_pages_;
  std::vector<ServeRequest*> admitted_;
};

}  // namespace kvgrid
