#include "runtime/trace_schema.hpp"

#include "core/check.hpp"
#include "runtime/h5util.hpp"
#include "runtime/trace.hpp"

namespace kvgrid {

namespace {

// The steps table: fixed columns, then one modelled and one wall column per phase.
TableDoc steps_table() {
  static const char* const meaning[kStepPhaseCount] = {
      "debug knobs and failpoints", "arrivals, aborts and the step message", "relayed cache decisions and write ACKs",
      "the batch and its fresh pages", "CP layer gathers", "the model over this rank's layers (the layer pipeline)",
      "chain values, oracle and draft checks", "the step message and end-of-step agreements",
      "requests advanced, finished ones committed", "records, checks, the progress row and the trace's flush"};
  static std::vector<std::string> names, texts;  // storage for the generated columns' strings
  if (names.empty())
    for (std::size_t i = 0; i < kStepPhaseCount; ++i)
      for (const char* clock : {"model", "wall"}) {
        names.push_back(std::string(kStepPhases[i]) + "_" + clock + "_ns");
        texts.push_back(std::string(clock[0] == 'm' ? "modelled time the phase moved the clock: " : "wall time of the phase (0 with output.steps = model): ") +
                        meaning[i]);
      }
  TableDoc t{"steps",
             "one row per serving step on this rank: where its modelled and wall time went, phase by phase in step order "
             "(the timeline's step, phase and batch slices and its counters)",
             {{"step", "step", "scheduler step"},
              {"model_start_ns", "ns (modelled)", "this rank's modelled clock when the step began"},
              {"wall_start_ns", "ns (wall)", "wall time since the run started when the step began"}},
             {},
             ""};
  for (std::size_t i = 0; i < names.size(); ++i)
    t.columns.push_back({names[i].c_str(), i % 2 ? "ns (wall)" : "ns (modelled)", texts[i].c_str()});
  for (const ColumnDoc& c : std::initializer_list<ColumnDoc>{
           {"batch_requests", "count", "requests in this rank's batch"},
           {"prefill_tokens", "tokens", "query tokens of the batch's prefill chunks"},
           {"decode_tokens", "tokens", "query tokens of the batch's decode entries (accepted draft tokens included)"},
           {"waiting", "count", "requests waiting for admission after the step"},
           {"running", "count", "requests admitted and not finished after the step"},
           {"device_pages_used", "pages", "device pages in use after the step"},
           {"host_pages_used", "pages", "host pages in use after the step (-1: no host tier)"}})
    t.columns.push_back(c);
  return t;
}

// The events table: its columns and what every op's args and status hold.
TableDoc events_table() {
  return {"events",
         "what happened on this rank, one row per event in step order: ops, their positional args and status (see the op.* attributes)",
         {{"step", "step", "scheduler step"},
          {"wall_ns", "ns (wall)", "wall time since the run started on this rank"},
          {"model_ns", "ns (modelled)", "this rank's modelled clock"},
          {"request", "id", "the request concerned (0: none; for copies the copy's id, for gather the number of requests)"},
          {"op", "", "what happened (op.<name> says what args and status hold)"},
          {"args", "per op", "three positional arguments (op.<name> names them)"},
          {"status", "per op", "0 normally; 1 for a failure, mismatch or broken transfer (op.<name>)"}},
         {{"admit", "tree loop: args = (prompt tokens, matched tokens, new pages); status 1 admitted"},
          {"evict", "tree loop: args = (pages evicted, -, -)"},
          {"release", "tree loop: a request released its lock"},
          {"check", "periodic check: args = (ranks whose tree digest differs, ranks whose decision log differs, verify failures); status 1 if they disagree"},
          {"stall", "rank.stall fired: args = (duration ms, -, -)"},
          {"corrupt", "device.page.corrupt fired: args = (page, -, -)"},
          {"planted", "debug.plant_divergence: a decision no peer takes"},
          {"divergence", "the online consensus checker found a divergence; status 1"},
          {"pp_recv", "the step message arrived: args = (sending stage, its modelled clock ns, write ACKs it consumed)"},
          {"pp_send", "the step message left: args = (this stage, modelled clock ns sent, write ACKs consumed)"},
          {"p2p_delay", "p2p.delay fired: args = (delay us, -, -)"},
          {"abort", "request.abort released the request: args = (positions computed, tokens loaded from the host, 1 mid-prefetch / 2 mid-load-back / 0); status 1"},
          {"shape_mismatch", "the previous stage's activation differs from this stage's batch: args = (tokens sent, tokens scheduled, -); status 1"},
          {"stage_mismatch", "stage peers scheduled different batches: args = (batch size here, -, -); status 1"},
          {"gather", "CP layer gather of a batch: args = (modelled start ns, modelled end ns, bytes per layer); request = requests gathered"},
          {"oracle_mismatch", "the last stage's checksum differs from the oracle's: args = (start position, end position, -); status 1"},
          {"draft_mismatch", "the draft's checksum differs from its oracle: args = (start, end, -)"},
          {"draft_gather", "CP layer gather of the draft's cached prefixes (last stage): args = (draft layers, modelled ns of their gathers, bytes per layer); request = requests gathered"},
          {"draft_round", "a speculative round verified: args = (tokens proposed, accepted, 1 if the draft was intact)"},
          {"finish", "a request finished: args = (prompt tokens, cached tokens, output tokens); status 1 if its oracle failed"},
          {"d2h", "device -> host backup copy: args = (modelled start ns, modelled end ns, bytes); request = copy id"},
          {"h2d", "host -> device load-back copy: args = (modelled start ns, modelled end ns, bytes); request = load id"},
          {"storage_read", "storage prefetch read batch: args = (modelled start ns, modelled end ns, bytes)"},
          {"storage_write", "a backup's storage objects written (simulated engine: they land at the end): args = (modelled start ns, modelled end ns, bytes)"},
          {"write_ack", "a backup's ACK consumed: request = write id"},
          {"load_broken", "this rank's load-back copies of the request broke: args = (host tokens, -, -); status 1"},
          {"load_fail", "protocol.load_back: the agreed outcome was broken, the positions are recomputed: args = (host tokens, reused prefix left, -); status 1"},
          {"pd_admit", "P/D decode admitted: args = (decode_prefix_len, of it from host, prompt tokens)"},
          {"pd_send", "P/D prefill sent a suffix: args = (modelled end ns, -, -)"},
          {"pd_broken", "P/D prefill's suffix transfer broke: args = (first broken layer, -, -); status 1"},
          {"pd_recv", "P/D decode received a suffix: args = (tokens received, decode_prefix_len, modelled ready ns); status 1 if this rank's restore broke"},
          {"pd_fail", "P/D decode failed the request on a broken transfer: args = (first broken layer, ...); status 1"},
          {"pd_restore_fail", "P/D decode failed the request on a broken restore: args = (host tokens restored, decode_prefix_len, -); status 1"}},
         "op."};
}

const std::vector<TableDoc>& tables() {
  static const std::vector<TableDoc> t = {
      events_table(),
      {"decisions",
       "this rank's consensus log: every cache decision ranks must agree on, in order (kvgrid check compares them)",
       {{"seq", "index", "position in this rank's log"},
        {"step", "step", "scheduler step"},
        {"name", "", "the decision (name.<decision> says what args and results hold)"},
        {"args_digest", "digest", "hash of the arguments"},
        {"result_digest", "digest", "hash of the results"},
        {"args", "per decision", "up to three arguments (n_args used)"},
        {"results", "per decision", "up to two results (n_results used)"},
        {"n_args", "count", "arguments used"},
        {"n_results", "count", "results used"}},
       {{"match_prefix", "(request, prompt tokens) -> (matched tokens, with a host tier also the host hit)"},
        {"evict", "(pages wanted) -> (pages freed, first victim); the victims' digest"},
        {"admit", "(request) -> (1 admitted / 0 not, pages allocated)"},
        {"insert", "(request, key tokens) -> (tokens already present)"},
        {"backup", "(tokens) -> (1/0 host pages)"},
        {"write_ack", "(write id) -> (1 published / 0 failed)"},
        {"writing_check", "(write ACKs consumed) -> ()"},
        {"load_back", "(host tokens) -> (tokens loaded)"},
        {"write_back", "(tokens) -> (1/0)"},
        {"restore", "(request, host tokens) -> (1 intact / 0 broken): an agreed restore or load-back outcome"},
        {"abort", "(request) -> ()"},
        {"prefetch_query", "(request, first page) -> (agreed hit pages)"},
        {"prefetch_start", "(request) -> (1/0 host pages)"},
        {"prefetch_stop", "(request) -> (1 stop / 0 go on)"},
        {"prefetch_done", "(request, pages) -> (pages inserted)"},
        {"prefetch_abort", "(request) -> ()"},
        {"planted", "(step) -> (): debug.plant_divergence"}},
       "name."},
      {"faults", "failpoint firings on this rank",
       {{"step", "step", "scheduler step"},
        {"name", "", "the failpoint"},
        {"params", "", "its parameters, name=value"}},
       {},
       ""},
      {"requests",
       "one row per request, written by the last stage's leader (P/D: decode's); /meta/requests_rank names that rank",
       {{"request", "id", "request id"},
        {"round", "round", "multi-turn round (0 otherwise)"},
        {"prompt_tokens", "tokens", "prompt length"},
        {"output_tokens", "tokens", "output length"},
        {"cached_tokens", "tokens", "prompt tokens served from cache, all tiers (cached + computed = prompt)"},
        {"computed_tokens", "tokens", "prompt tokens computed"},
        {"host_tokens", "tokens", "of cached_tokens, loaded back from the host tier"},
        {"storage_tokens", "tokens", "of host_tokens, prefetched from storage for this request"},
        {"oracle_ok", "bool", "1 if every chunk matched the oracle"},
        {"failed", "code", "0 finished; 1 aborted, 2 broken P/D transfer, 3 broken P/D restore (tokens count nowhere)"},
        {"arrival_ns", "ns (modelled)", "arrival"},
        {"admit_ns", "ns (modelled)", "admission"},
        {"first_token_ns", "ns (modelled)", "first token"},
        {"finish_ns", "ns (modelled)", "finish (failed: when)"},
        {"ttft_model_ns", "ns (modelled)", "time to first token"},
        {"queue_ns", "ns (modelled)", "admission - arrival"},
        {"forward_ns", "ns (modelled)", "its prefill steps, restore and gather waits included"},
        {"ttft_wall_ns", "ns (wall)", "first token - arrival at this rank"},
        {"decode_ns", "ns (modelled)", "first token to finish"},
        {"spec_rounds", "count", "speculative decoding: verify rounds"},
        {"spec_proposed", "tokens", "draft tokens proposed"},
        {"spec_accepted", "tokens", "draft tokens accepted"},
        {"draft_mismatches", "steps", "steps whose draft checksum did not match its oracle"},
        {"pd_transferred_tokens", "tokens", "P/D: prompt tokens whose KV came from prefill"},
        {"session", "id", "its session (0: none; agentic, workload.sessions, a trace's session_id)"}},
       {},
       ""},
      {"summary/ranks", "one row per rank at a clean end: its digests and counters",
       {{"rank", "rank", "world rank"},
        {"group", "index", "0, or 1 for a P/D world's decode group"},
        {"tp", "index", "TP coordinate"},
        {"cp", "index", "CP coordinate"},
        {"pp", "index", "PP stage"},
        {"verify_failures", "count", "tree and pool invariant failures"},
        {"tree_digest", "digest", "radix tree content"},
        {"decision_digest", "digest", "decision log"},
        {"decisions", "count", "decisions logged"},
        {"faults_fired", "count", "failpoint firings"},
        {"tree_pages", "pages", "device pages in the tree at the end"},
        {"tree_nodes", "count", "tree nodes"},
        {"requests", "count", "requests seen"},
        {"admitted", "count", "requests finished on this rank"},
        {"matched_tokens", "tokens", "cached prompt tokens of finished requests"},
        {"prompt_tokens", "tokens", "prompt tokens of finished requests"},
        {"oracle_mismatches", "count", "this rank's oracle mismatches"},
        {"model_ns", "ns (modelled)", "this rank's modelled clock at the end"},
        {"d2h_pages", "pages", "device -> host copies"},
        {"h2d_pages", "pages", "host -> device copies"},
        {"storage_read_pages", "pages", "pages read from storage"},
        {"storage_write_pages", "pages", "pages written to storage"},
        {"storage_failed_pages", "pages", "storage pages that failed (read, short, corrupt)"},
        {"storage_objects_written", "objects", "storage objects this rank wrote (unified keys: one per chunk and page)"},
        {"storage_objects_read", "objects", "storage objects this rank read intact"},
        {"storage_objects_other_jobs", "objects", "of the objects read: those another job wrote (cross-job, cross-bucket reuse)"},
        {"storage_tokens_other_jobs", "tokens", "those objects as tokens: objects / objects per page x page size (0 for hybrid models)"},
        {"storage_objects_swept", "objects", "objects this rank's store-level sweeps removed (unified keys; world rank 0 sweeps)"},
        {"storage_connection_errors", "errors", "storage commands that failed because a remote store (redis) was unreachable or failing"},
        {"d2h_bytes", "bytes", "device -> host bytes"},
        {"h2d_bytes", "bytes", "host -> device bytes"},
        {"storage_read_bytes", "bytes", "bytes read from storage"},
        {"storage_write_bytes", "bytes", "bytes written to storage"},
        {"d2h_ns", "ns (modelled)", "modelled device -> host copy time"},
        {"h2d_ns", "ns (modelled)", "modelled host -> device copy time"},
        {"storage_read_ns", "ns (modelled)", "modelled storage read time"},
        {"device_pool_pages", "pages", "KV pages of the device pool (after the gather slots' charge)"},
        {"device_high_water", "pages", "most device pages held at once (sharded: the fullest owner)"},
        {"gather_bytes", "bytes", "CP layer gathers received"},
        {"gather_ns", "ns (modelled)", "modelled layer gather time"},
        {"kv_digest", "digest", "the device KV pool's content at the end, every word of every row (engine.decode = fused: equal to step's)"},
        {"fused_steps", "steps", "engine.decode = fused: steps run in fused spans (0 with step)"},
        {"oracle_thread_chunks", "chunks", "engine.helper_thread: chunks whose oracle value was computed on the helper thread (0 without it)"},
        {"pd_sent_tokens", "tokens", "P/D: prompt tokens this prefill rank sent"},
        {"pd_sent_bytes", "bytes", "P/D: bytes this prefill rank sent"},
        {"pd_broken", "count", "P/D: broken transfers"},
        {"pd_failed", "count", "P/D decode: requests failed on a broken transfer"},
        {"pd_restore_failed", "count", "P/D decode: requests failed on a broken restore"},
        {"load_failed", "count", "protocol.load_back: requests whose load-back broke on some rank"},
        {"load_recomputed_tokens", "tokens", "protocol.load_back: loaded positions recomputed instead"},
        {"hybrid", "bool", "1: a hybrid model (the unified tree core with SWA / MAMBA components)"},
        {"swa_tombstones_made", "pages", "hybrid: SWA pages inserts left as tombstones"},
        {"swa_tombstones_healed", "pages", "hybrid: SWA tombstone pages inserts made live again"},
        {"swa_freed_pages", "pages", "hybrid: SWA pages running requests freed as their window moved on"},
        {"swa_windows_released", "count", "hybrid: SWA window locks released early (decode passed them)"},
        {"mamba_states_copied", "count", "hybrid: MAMBA states copied into a request's private slot"},
        {"mamba_states_saved", "count", "hybrid: MAMBA checkpoints the tree took"},
        {"swa_waits", "request-steps", "hybrid: steps a request sat out for lack of SWA pages"},
        {"full_alone_tokens", "tokens", "hybrid: prefix tokens FULL alone would have reused at admission (summed)"},
        {"swa_cost_tokens", "tokens", "hybrid: of full_alone_tokens, those SWA's rule (with FULL's) would cut"},
        {"mamba_cost_tokens", "tokens", "hybrid: of full_alone_tokens, those MAMBA's rule (with FULL's) would cut"},
        {"pd_sent_full_pages", "pages", "P/D, hybrid: FULL pages this prefill rank sent (per FULL layer)"},
        {"pd_sent_swa_pages", "pages", "P/D, hybrid: SWA pages of the prompts' tail windows this prefill rank sent (per SWA layer)"},
        {"pd_sent_states", "count", "P/D, hybrid: MAMBA states this prefill rank sent (one per request)"},
        {"sessions_opened", "count", "sessions: sessions opened (hybrid models; P/D: decode)"},
        {"sessions_closed", "count", "sessions: sessions closed"},
        {"session_registered", "count", "sessions: finished requests that registered their session's reusable regions"},
        {"session_stale_finishes", "count", "sessions: finishers that registered nothing (stale generation, or their session had closed)"},
        {"forced_referenced_tokens", "tokens", "sessions: FULL tokens of open sessions' KV that device eviction took"},
        {"forced_referenced_host_tokens", "tokens", "sessions: FULL tokens of open sessions' KV that host eviction took"},
        {"recency_inversion_tokens", "tokens", "sessions: device values evicted while a closed session's idle KV, used less recently, stayed (0 unless closing resets recency)"}},
       {},
       ""},
      steps_table(),
  };
  return t;
}

}  // namespace

const TableDoc& trace_table(const std::string& name) {
  for (const auto& t : tables())
    if (name == t.name) return t;
  KVGRID_CHECK(false, "no trace table '", name, "'");
  return tables().front();
}

void describe_table(hid_t dataset, const TableDoc& doc) {
  h5::write_attr(dataset, "description", std::string(doc.description));
  for (const auto& c : doc.columns) {
    h5::write_attr(dataset, std::string(c.name) + ".unit", std::string(c.unit));
    h5::write_attr(dataset, std::string(c.name) + ".description", std::string(c.description));
  }
  for (const auto& [name, meaning] : doc.entries) h5::write_attr(dataset, std::string(doc.entry_prefix) + name, std::string(meaning));
}

}  // namespace kvgrid
