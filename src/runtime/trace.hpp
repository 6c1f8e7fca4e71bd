// The HDF5 trace (DESIGN §6; schema in the README).
//
//   <dir>/run.h5            written by world rank 0: /meta at start-up, /ranks/<NNNNN> external
//                           links (relative paths) to the rank files, /summary at a clean end only
//   <dir>/rank_<NNNNN>.h5   one per rank: tables events, decisions, faults, requests, steps
//                           (appendable, chunked; requests only on the ranks that finish them;
//                           steps only in the serving loop)
//
// Rank files are written incrementally: records are buffered in memory and appended, then the file
// is flushed, every `flush_every` steps and before any abort (watchdog). Between flushes the file
// is not touched, so a rank killed at any moment leaves a file holding everything up to its last
// flush. A run without /summary did not end cleanly.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "core/decision_log.hpp"
#include "core/failpoint.hpp"
#include "core/topology.hpp"
#include "runtime/h5util.hpp"

namespace kvgrid {

// The rows' strings are variable-length UTF-8 in the file and `const char*` in memory, pointing
// into a TraceStrings pool that outlives the rows (the writer's, or the RunTrace's).
class TraceStrings {
 public:
  const char* intern(std::string_view s) {
    if (auto it = pool_.find(s); it != pool_.end()) return it->c_str();  // the common case: no allocation
    return pool_.emplace(s).first->c_str();
  }

 private:
  struct Hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::unordered_set<std::string, Hash, std::equal_to<>> pool_;  // node-based: the strings never move
};

struct EventRow {
  std::uint64_t step = 0;
  std::uint64_t wall_ns = 0;   // since the run started on this rank
  std::uint64_t model_ns = 0;  // the rank's modelled clock
  std::uint64_t request = 0;
  const char* op = "";  // interned (TraceStrings)
  std::int64_t args[3] = {0, 0, 0};
  std::int32_t status = 0;
};

struct DecisionRow {
  std::uint64_t seq = 0, step = 0;
  const char* name = "";  // interned
  std::uint64_t args_digest = 0, result_digest = 0;
  std::int64_t args[3] = {0, 0, 0};   // the chosen argument values (readable)
  std::int64_t results[2] = {0, 0};   // the chosen result values (readable)
  std::int32_t n_args = 0, n_results = 0;
};

struct FaultRow {
  std::uint64_t step = 0;
  const char* name = "";    // interned
  const char* params = "";  // interned, e.g. "duration_ms=200"
};

// One finished (or failed) request, written by the last stage's leader (tp 0, cp 0) of each group.
struct RequestRow {
  std::uint64_t request = 0;
  std::uint32_t round = 0, prompt_tokens = 0, output_tokens = 0, cached_tokens = 0, computed_tokens = 0;
  std::uint32_t host_tokens = 0;  // of cached_tokens, loaded back from the host tier
  std::uint32_t storage_tokens = 0;  // of host_tokens, prefetched from storage for this request
  std::int32_t oracle_ok = 1;
  // 1: aborted before it finished, 2: its P/D transfer broke, 3: its P/D restore broke (finish_ns:
  // when); its tokens count nowhere
  std::int32_t failed = 0;
  std::uint64_t arrival_ns = 0, admit_ns = 0, first_token_ns = 0, finish_ns = 0;  // modelled clock
  std::uint64_t ttft_model_ns = 0, queue_ns = 0, forward_ns = 0, ttft_wall_ns = 0;
  std::uint64_t decode_ns = 0;  // modelled: first token to finish
  // speculative decoding: draft rounds, tokens proposed and accepted, steps whose draft checksum
  // did not match its oracle (a draft that read wrong KV)
  std::uint32_t spec_rounds = 0, spec_proposed = 0, spec_accepted = 0, draft_mismatches = 0;
  std::uint32_t pd_transferred_tokens = 0;  // P/D: prompt tokens whose KV came from prefill
  std::uint64_t session = 0;                // its session (0: none)
};

// One serving step on one rank: where its modelled and wall time went, phase by phase (the
// phases of runtime/serve_loop.hpp, in order), what its batch held and the queues and pools after
// it. The timeline draws its step, phase and batch slices and its counters from these rows.
inline constexpr const char* kStepPhases[] = {"faults", "receive", "cache_events", "schedule", "gather",
                                              "forward", "verify",  "send",         "complete", "report"};
inline constexpr std::size_t kStepPhaseCount = sizeof(kStepPhases) / sizeof(kStepPhases[0]);

struct StepRow {
  std::uint64_t step = 0;
  std::uint64_t model_start_ns = 0, wall_start_ns = 0;  // the rank's clocks when the step began
  std::uint64_t phase_model_ns[kStepPhaseCount] = {};   // how far each phase moved the modelled clock
  std::uint64_t phase_wall_ns[kStepPhaseCount] = {};    // wall time each phase took
  std::uint32_t batch_requests = 0, prefill_tokens = 0, decode_tokens = 0;  // this rank's batch
  std::uint32_t waiting = 0, running = 0;                                  // queues after the step
  std::int64_t device_pages_used = 0, host_pages_used = 0;                 // pools after the step (-1: no host tier)
};

struct RankSummaryRow {
  std::int32_t rank = 0, group = 0, tp = 0, cp = 0, pp = 0, verify_failures = 0;
  std::uint64_t tree_digest = 0, decision_digest = 0, decisions = 0, faults_fired = 0;
  std::int64_t tree_pages = 0, tree_nodes = 0, requests = 0, admitted = 0, matched_tokens = 0, prompt_tokens = 0;
  std::int64_t oracle_mismatches = 0, model_ns = 0;
  std::int64_t d2h_pages = 0, h2d_pages = 0;  // host tier copies
  std::int64_t storage_read_pages = 0, storage_write_pages = 0, storage_failed_pages = 0;  // storage tier
  std::int64_t storage_objects_written = 0, storage_objects_read = 0;  // objects (unified keys: one per chunk)
  std::int64_t storage_objects_other_jobs = 0;  // of those read: objects another job wrote
  std::int64_t storage_tokens_other_jobs = 0;   // the same as prompt tokens (objects / objects per page x page size)
  std::int64_t storage_objects_swept = 0;       // removed by this rank's store-level sweeps (unified keys)
  std::int64_t storage_connection_errors = 0;   // a remote store (redis) unreachable or failing
  std::int64_t d2h_bytes = 0, h2d_bytes = 0, storage_read_bytes = 0, storage_write_bytes = 0;
  std::int64_t d2h_ns = 0, h2d_ns = 0, storage_read_ns = 0;  // modelled transfer time (simulated engine)
  // CP sharding: KV pages of this rank's device pool (after the gather slots' charge), the most
  // it held at once, and its layer gathers (bytes received, modelled time)
  std::int64_t device_pool_pages = 0, device_high_water = 0, gather_bytes = 0, gather_ns = 0;
  std::uint64_t kv_digest = 0;  // the device KV pool's content at the end (every word of every row)
  std::int64_t fused_steps = 0;  // engine.decode = fused: steps run in fused spans
  std::int64_t oracle_thread_chunks = 0;  // engine.helper_thread: chunks the oracle checked on the helper thread
  // P/D: prompt tokens and bytes this prefill rank sent (counted at the send), broken transfers;
  // requests this decode rank failed on a broken transfer, on a broken restore
  std::int64_t pd_sent_tokens = 0, pd_sent_bytes = 0, pd_broken = 0, pd_failed = 0, pd_restore_failed = 0;
  // protocol.load_back: requests whose load-back failed on some rank of the group (agreed), and
  // the loaded positions they recomputed instead
  std::int64_t load_failed = 0, load_recomputed_tokens = 0;
  // Hybrid models (hybrid = 1; cache/hybrid_cache.hpp): SWA pages inserts left as tombstones and
  // tombstone pages they healed, SWA pages requests freed as their window moved on, window locks
  // released early, MAMBA states copied into requests' slots and checkpoints the tree took, and
  // request-steps spent waiting for SWA pages
  std::int64_t hybrid = 0, swa_tombstones_made = 0, swa_tombstones_healed = 0, swa_freed_pages = 0;
  std::int64_t swa_windows_released = 0, mamba_states_copied = 0, mamba_states_saved = 0, swa_waits = 0;
  // ... and what the rules cost: the prefix tokens FULL alone would have reused, and those SWA
  // alone and MAMBA alone refused (summed over admissions)
  std::int64_t full_alone_tokens = 0, swa_cost_tokens = 0, mamba_cost_tokens = 0;
  // P/D with a hybrid model: what this prefill rank sent, per layer of each kind — FULL pages, SWA
  // pages (the prompts' tail windows) and MAMBA states
  std::int64_t pd_sent_full_pages = 0, pd_sent_swa_pages = 0, pd_sent_states = 0;
  // Sessions (hybrid models; cache/unified_tree.hpp "Sessions"): opened and closed, finishers
  // that registered, that carried a stale generation or finished after their session closed, and
  // the FULL tokens of referenced (open sessions') KV that device and host eviction took
  std::int64_t sessions_opened = 0, sessions_closed = 0, session_registered = 0, session_stale_finishes = 0;
  std::int64_t forced_referenced_tokens = 0, forced_referenced_host_tokens = 0;
  std::int64_t recency_inversion_tokens = 0;  // device values evicted while a closed session's older idle KV stayed
};

struct RunMeta {
  std::string experiment, source, config_toml, topology, started;
  std::string workload;  // workload.kind: "tree" runs have no model, oracle or requests table
  std::int64_t page_size = 0;
  std::int64_t seed = 0, world_size = 0;
};

struct RunSummary {
  std::string verdict;  // "OK" or "FAILED"
  std::int64_t steps = 0, verify_failures = 0, checks = 0;
  std::int64_t tree_divergences = 0, decision_divergences = 0;  // checks with a disagreement
  std::int64_t oracle_mismatches = -1;                            // -1: the loop has no oracle (tree)
  std::int64_t requests = 0, finished = 0, failed = 0;
  double wall_s = 0.0;
  std::vector<RankSummaryRow> ranks;
};

// HDF5 compound types of the rows above (owned by the caller).
h5::Handle event_type();
h5::Handle decision_type();
h5::Handle fault_type();
h5::Handle rank_summary_type();
h5::Handle request_type();
h5::Handle step_type();

std::string rank_file_name(int world_rank);

class TraceWriter {
 public:
  // World rank 0 creates run.h5 with /meta and the links; every rank creates its rank file.
  // Throws InputError when a file cannot be created.
  TraceWriter(const std::string& dir, const RankGrid& grid, const RunMeta& meta);
  ~TraceWriter();

  void event(const EventRow& e) { events_.push_back(e); }
  void event(std::uint64_t step, std::uint64_t wall_ns, std::uint64_t model_ns, std::uint64_t request, const char* op,
             std::int64_t a0, std::int64_t a1, std::int64_t a2, std::int32_t status);
  // Takes the log's and the registry's new records, appends everything and flushes the file.
  void flush_all(DecisionLog& log, FailpointRegistry& faults);
  void request(const RequestRow& r) { requests_.push_back(r); }
  void step(const StepRow& r) { steps_.push_back(r); }
  void decisions(std::vector<DecisionRecord> d);
  void faults(std::vector<FailpointFiring> f);
  // Appends the buffered rows and flushes the rank file.
  void flush();
  // Every decision of steps <= `step` has been recorded: the next flush writes the rank file's
  // `completed_step` attribute (the offline checker compares logs up to the steps both completed).
  void set_completed_step(std::uint64_t step) { completed_step_ = static_cast<std::int64_t>(step); }

  // World rank 0 only, after every rank's final flush: adds /summary to run.h5.
  static void write_summary(const std::string& dir, const RunSummary& s);

 private:
  h5::Handle file_, ev_type_, dec_type_, fault_type_, req_type_, step_type_;
  std::int64_t completed_step_ = -1;
  h5::AppendTable events_tbl_, decisions_tbl_, faults_tbl_, requests_tbl_, steps_tbl_;
  std::vector<RequestRow> requests_;
  std::vector<StepRow> steps_;
  std::vector<EventRow> events_;
  std::vector<DecisionRow> decisions_;
  std::vector<FaultRow> faults_;
  TraceStrings strings_;  // the rows' strings
};

}  // namespace kvgrid
