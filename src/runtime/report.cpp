#include "runtime/report.hpp"

#include <algorithm>
#include <cstdio>
#include <map>
#include <tuple>
#include <sstream>

namespace kvgrid {

namespace {
nlohmann::json attr_json(const h5::AttrValue& v) {
  return std::visit([](const auto& x) { return nlohmann::json(x); }, v);
}
}  // namespace

namespace {
std::string hex64(std::uint64_t v) {
  char b[24];
  std::snprintf(b, sizeof(b), "0x%016llx", static_cast<unsigned long long>(v));
  return b;
}

// Copies, P/D transfers, load-back outcomes and CP page figures: from the summary rows alone.
void add_transfers(nlohmann::json& j, const RunTrace& run) {
  // Copies of one rank (every TP/CP rank moves its own shard of the same tokens).
  const std::int64_t ps = run.meta_int("page_size");
  std::int64_t d2h = 0, h2d = 0, sr = 0, sw = 0, sf = 0;
  if (!run.summary_ranks.empty()) {
    const auto& r0 = run.summary_ranks.front();
    d2h = r0.d2h_pages * ps;
    h2d = r0.h2d_pages * ps;
    sr = r0.storage_read_pages * ps;
    sw = r0.storage_write_pages * ps;
    for (const auto& r : run.summary_ranks) sf += r.storage_failed_pages;
  }
  // P/D: prompt tokens the first prefill rank sent its decode peer (counted at the send)
  std::int64_t pd_tokens = 0, pd_bytes = 0, pd_broken = 0;
  for (const auto& r : run.summary_ranks) {
    if (r.rank == 0) pd_tokens = r.pd_sent_tokens;
    pd_bytes += r.pd_sent_bytes;
    pd_broken = std::max(pd_broken, r.pd_broken);
  }
  j["transferred_tokens"] = {{"d2h", d2h}, {"h2d", h2d}, {"storage_read", sr}, {"storage_write", sw}, {"pd", pd_tokens}};
  j["storage_failed_pages"] = sf;
  std::int64_t ce = 0;
  for (const auto& r : run.summary_ranks) ce += r.storage_connection_errors;
  j["storage_connection_errors"] = ce;
  // Objects each rank wrote and read (world rank order): with unified keys one per chunk and page.
  std::vector<std::int64_t> ow, orr, oo, ot, swept;
  for (const auto& r : run.summary_ranks) {
    ow.push_back(r.storage_objects_written);
    orr.push_back(r.storage_objects_read);
    oo.push_back(r.storage_objects_other_jobs);
    ot.push_back(r.storage_tokens_other_jobs);
    swept.push_back(r.storage_objects_swept);
  }
  j["storage_objects"] = {{"written", ow}, {"read", orr}, {"read_other_jobs", oo}, {"read_other_jobs_tokens", ot}, {"swept", swept}};
  // protocol.load_back: load-backs broken on some rank of the group (agreed: the same on every rank)
  if (!run.summary_ranks.empty())
    j["load_back"] = {{"failed_requests", run.summary_ranks.front().load_failed},
                      {"recomputed_tokens", run.summary_ranks.front().load_recomputed_tokens}};
  // Bytes of every rank (each moves its own shard), and the modelled busy time of one rank's
  // streams (simulated engine; 0 with real copies).
  std::int64_t b[4] = {0, 0, 0, 0};
  for (const auto& r : run.summary_ranks) {
    b[0] += r.d2h_bytes;
    b[1] += r.h2d_bytes;
    b[2] += r.storage_read_bytes;
    b[3] += r.storage_write_bytes;
  }
  j["transferred_bytes"] = {{"d2h", b[0]}, {"h2d", b[1]}, {"storage_read", b[2]}, {"storage_write", b[3]}, {"pd", pd_bytes}};
  if (!run.summary_ranks.empty()) {
    const auto& r0 = run.summary_ranks.front();
    j["transfer_time_model_ms"] = {{"d2h", static_cast<double>(r0.d2h_ns) / 1e6},
                                   {"h2d", static_cast<double>(r0.h2d_ns) / 1e6},
                                   {"storage_read", static_cast<double>(r0.storage_read_ns) / 1e6}};
  }  // all ranks: failed/short/corrupt reads and failed writes
  // CP page ownership: device pages per rank (the fullest rank's high-water mark) and the
  // layer gathers (bytes received by all ranks, modelled time of one rank).
  {
    std::int64_t pool = 0, high = 0, gbytes = 0, gns = 0;
    for (const auto& r : run.summary_ranks) {
      pool = std::max(pool, r.device_pool_pages);
      high = std::max(high, r.device_high_water);
      gbytes += r.gather_bytes;
      gns = std::max(gns, r.gather_ns);
    }
    j["device_pages_per_rank"] = {{"pool", pool}, {"high_water", high}};
    // Hybrid models: rank 0's component counters (every rank of a group takes the same decisions).
    if (!run.summary_ranks.empty() && run.summary_ranks.front().hybrid) {
      const auto& h = run.summary_ranks.front();
      j["hybrid"] = {{"swa_tombstones_made", h.swa_tombstones_made},   {"swa_tombstones_healed", h.swa_tombstones_healed},
                     {"swa_freed_pages", h.swa_freed_pages},           {"swa_windows_released", h.swa_windows_released},
                     {"mamba_states_copied", h.mamba_states_copied},   {"mamba_states_saved", h.mamba_states_saved},
                     {"swa_waits", h.swa_waits},
                     {"full_alone_tokens", h.full_alone_tokens},       {"swa_cost_tokens", h.swa_cost_tokens},
                     {"mamba_cost_tokens", h.mamba_cost_tokens}};
      // P/D: the suffixes' FULL pages, tail-window SWA pages and states, per layer of each kind
      // (every prefill rank holding that kind sends the same count: the most of any rank)
      std::int64_t pd[3] = {0, 0, 0};
      for (const auto& r : run.summary_ranks) {
        pd[0] = std::max(pd[0], r.pd_sent_full_pages);
        pd[1] = std::max(pd[1], r.pd_sent_swa_pages);
        pd[2] = std::max(pd[2], r.pd_sent_states);
      }
      // Sessions: the rank holding them with the most opened (P/D: a decode rank; others agree).
      const RankSummaryRow* sr = &h;
      for (const auto& r : run.summary_ranks)
        if (r.sessions_opened > sr->sessions_opened) sr = &r;
      if (sr->sessions_opened > 0)
        j["sessions"] = {{"opened", sr->sessions_opened},
                         {"closed", sr->sessions_closed},
                         {"registered", sr->session_registered},
                         {"stale_finishes", sr->session_stale_finishes},
                         {"forced_evictions_referenced", sr->forced_referenced_tokens},
                         {"forced_evictions_referenced_host", sr->forced_referenced_host_tokens},
                         {"recency_inversions", sr->recency_inversion_tokens}};
      j["hybrid"]["pd_sent_full_pages"] = pd[0];
      j["hybrid"]["pd_sent_swa_pages"] = pd[1];
      j["hybrid"]["pd_sent_states"] = pd[2];
    }
    j["gather"] = {{"bytes", gbytes}, {"time_model_ms", static_cast<double>(gns) / 1e6}};
  }
}

// The serving loop's figures: requests, tokens by tier, TTFT, transfers, P/D, speculative
// decoding, load-backs and per-round rows.
void add_serving(nlohmann::json& j, const RunTrace& run) {
  // Requests of the serving loop, as recorded by the last stage's leader (first group with rows).
  std::vector<RequestRow> reqs;
  for (const auto& r : run.ranks)
    if (reqs.empty() && !r.requests.empty()) reqs = r.requests;
  {
    auto pct = [](std::vector<double> v, double q) {
      if (v.empty()) return 0.0;
      std::sort(v.begin(), v.end());
      return v[std::min(v.size() - 1, static_cast<std::size_t>(q * static_cast<double>(v.size())))];
    };
    std::uint64_t prompt = 0, cached = 0, host = 0, storage = 0, mism = 0, first_arrival = ~0ULL, last_finish = 0;
    std::vector<double> ttft;
    struct Round {
      std::uint64_t prompt = 0, cached = 0, host = 0, storage = 0, n = 0, spec_rounds = 0, spec_accepted = 0, spec_proposed = 0;
      double ttft = 0, decode = 0;
    };
    std::uint64_t spec_rounds = 0, spec_proposed = 0, spec_accepted = 0, draft_mismatches = 0, output = 0;
    double decode_ms = 0, tpot_ms = 0;
    std::uint64_t tpot_n = 0, later_tokens = 0;
    std::map<std::uint32_t, Round> rounds;
    std::uint64_t failed = 0, failed_abort = 0, failed_pd = 0, failed_restore = 0;
    for (const auto& q : reqs) {
      if (q.failed) {  // aborted, a broken P/D transfer or restore: counted, its tokens nowhere
        ++failed;
        ++(q.failed == 2 ? failed_pd : q.failed == 3 ? failed_restore : failed_abort);
        continue;
      }
      prompt += q.prompt_tokens;
      cached += q.cached_tokens;
      host += q.host_tokens;
      storage += q.storage_tokens;
      mism += q.oracle_ok ? 0 : 1;
      first_arrival = std::min(first_arrival, q.arrival_ns);
      last_finish = std::max(last_finish, q.finish_ns);
      ttft.push_back(static_cast<double>(q.ttft_model_ns) / 1e6);
      auto& r = rounds[q.round];
      r.prompt += q.prompt_tokens;
      r.cached += q.cached_tokens;
      r.host += q.host_tokens;
      r.storage += q.storage_tokens;
      r.ttft += static_cast<double>(q.ttft_model_ns) / 1e6;
      ++r.n;
      r.spec_rounds += q.spec_rounds;
      r.spec_accepted += q.spec_accepted;
      r.spec_proposed += q.spec_proposed;
      r.decode += static_cast<double>(q.decode_ns) / 1e6;
      spec_rounds += q.spec_rounds;
      spec_proposed += q.spec_proposed;
      spec_accepted += q.spec_accepted;
      draft_mismatches += q.draft_mismatches;
      output += q.output_tokens;
      decode_ms += static_cast<double>(q.decode_ns) / 1e6;
      if (q.output_tokens > 1) {  // time per output token after the first (modelled)
        tpot_ms += static_cast<double>(q.decode_ns) / 1e6 / static_cast<double>(q.output_tokens - 1);
        ++tpot_n;
        later_tokens += q.output_tokens - 1;
      }
    }
    auto rate = [&](std::uint64_t x) { return prompt ? static_cast<double>(x) / static_cast<double>(prompt) : 0.0; };
    const double hit = rate(cached);
    j["finished"] = reqs.size() - failed;
    j["failed"] = failed;  // aborted requests (request.abort), broken P/D transfers and restores
    j["failed_by_reason"] = {{"abort", failed_abort}, {"pd_transfer", failed_pd}, {"pd_restore", failed_restore}};
    j["prompt_tokens"] = prompt;
    // Tiers by where the hit was found: host_tokens includes what a storage prefetch brought in.
    j["cached_tokens"] = {{"device", cached - host}, {"host", host - storage}, {"storage", storage}};
    j["hit_rate"] = {{"device", rate(cached - host)}, {"host", rate(host - storage)}, {"storage", rate(storage)}, {"total", hit}};
    add_transfers(j, run);
    j["computed_tokens"] = prompt - cached;
    double mean = 0;
    for (double t : ttft) mean += t;
    mean = ttft.empty() ? 0.0 : mean / static_cast<double>(ttft.size());
    j["ttft_model_ms"] = {{"mean", mean}, {"p50", pct(ttft, 0.5)}, {"p90", pct(ttft, 0.9)}, {"p99", pct(ttft, 0.99)}};
    // SGLang bench_serving's names for the same figures (modelled clock, not a measured GPU).
    j["mean_ttft_ms"] = mean;
    j["median_ttft_ms"] = pct(ttft, 0.5);
    j["p99_ttft_ms"] = pct(ttft, 0.99);
    const double duration_s = reqs.empty() || last_finish <= first_arrival ? 0.0 : static_cast<double>(last_finish - first_arrival) / 1e9;
    j["modelled_duration_s"] = duration_s;
    j["input_token_throughput"] = duration_s > 0 ? static_cast<double>(prompt) / duration_s : 0.0;
    j["output_token_throughput"] = duration_s > 0 ? static_cast<double>(output) / duration_s : 0.0;
    j["input_throughput"] = j["input_token_throughput"];
    j["mean_tpot_ms"] = tpot_n ? tpot_ms / static_cast<double>(tpot_n) : 0.0;         // per request, then the mean
    j["mean_itl_ms"] = later_tokens ? decode_ms / static_cast<double>(later_tokens) : 0.0;  // over every later token
    j["output_throughput"] = j["output_token_throughput"];
    const std::size_t done = reqs.size() - failed;
    j["decode_time_model_ms_mean"] = done ? decode_ms / static_cast<double>(done) : 0.0;
    // Speculative decoding: a round verifies its accepted draft tokens and adds one, so the
    // acceptance length (tokens per verify step) is (accepted + rounds) / rounds.
    auto accept_len = [](std::uint64_t rounds, std::uint64_t acc) {
      return rounds ? static_cast<double>(acc + rounds) / static_cast<double>(rounds) : 0.0;
    };
    if (spec_rounds > 0 || draft_mismatches > 0)
      j["spec"] = {{"rounds", spec_rounds},
                   {"proposed", spec_proposed},
                   {"accepted", spec_accepted},
                   {"acceptance_length_mean", accept_len(spec_rounds, spec_accepted)},
                   {"acceptance_rate", spec_proposed ? static_cast<double>(spec_accepted) / static_cast<double>(spec_proposed) : 0.0},
                   {"draft_mismatch_steps", draft_mismatches}};
    j["requests_with_oracle_mismatch"] = mism;
    if (rounds.size() > 1) {
      nlohmann::json rs = nlohmann::json::array();
      for (const auto& [round, r] : rounds) {
        auto frac = [&](std::uint64_t x) { return r.prompt ? static_cast<double>(x) / static_cast<double>(r.prompt) : 0.0; };
        rs.push_back({{"round", round},
                      {"requests", r.n},
                      {"hit_rate", frac(r.cached)},
                      {"hit_rate_by_tier", {{"device", frac(r.cached - r.host)}, {"host", frac(r.host - r.storage)}, {"storage", frac(r.storage)}}},
                      {"ttft_model_ms_mean", r.n ? r.ttft / static_cast<double>(r.n) : 0.0}});
        rs.back()["decode_time_model_ms_mean"] = r.n ? r.decode / static_cast<double>(r.n) : 0.0;
        if (spec_rounds > 0 || draft_mismatches > 0) {
          rs.back()["acceptance_length_mean"] = accept_len(r.spec_rounds, r.spec_accepted);
          rs.back()["spec_proposed"] = r.spec_proposed;
          rs.back()["spec_accepted"] = r.spec_accepted;
        }
      }
      j["rounds"] = rs;
    }
  }
}
}  // namespace

nlohmann::json report_json(const RunTrace& run) {
  nlohmann::json j;
  j["schema_version"] = kReportSchemaVersion;
  j["kvgrid_version"] = run.meta_string("kvgrid_version");
  j["run"] = run.run_file;
  j["experiment"] = run.meta_string("experiment");
  j["seed"] = run.meta_int("seed");
  j["topology"] = run.meta_string("topology");
  j["world_size"] = run.meta_int("world_size");
  j["workload"] = run.meta_string("workload");
  j["git_revision"] = run.meta_string("git_revision");
  j["complete"] = run.summary.has_value();
  if (run.summary) {
    for (const auto& [k, v] : *run.summary) j[k] = attr_json(v);
  } else {
    j["verdict"] = nullptr;
  }
  std::int64_t matched = 0, prompt = 0;
  for (const auto& s : run.summary_ranks) {
    matched += s.matched_tokens;
    prompt += s.prompt_tokens;
  }
  // The tree loop has the device tier only; the serving loop replaces this with the rate by tier
  // (add_serving), so that every rate is named for the tier it counts.
  const double total = prompt ? static_cast<double>(matched) / static_cast<double>(prompt) : 0.0;
  j["hit_rate"] = {{"device", total}, {"total", total}};
  if (run.meta_string("workload") != "tree") add_serving(j, run);
  if (run.summary) {
    auto get = [&](const char* k) -> std::int64_t {
      auto it = run.summary->find(k);
      return it != run.summary->end() && std::holds_alternative<std::int64_t>(it->second) ? std::get<std::int64_t>(it->second) : 0;
    };
    j["divergences"] = get("tree_divergences") + get("decision_divergences");
  }
  nlohmann::json faults = nlohmann::json::object();
  nlohmann::json ranks = nlohmann::json::array();
  for (const auto& r : run.ranks) {
    nlohmann::json x;
    x["rank"] = r.world_rank;
    x["present"] = r.present;
    if (r.present) {
      x["group"] = r.group;
      x["tp"] = r.tp;
      x["cp"] = r.cp;
      x["pp"] = r.pp;
      x["events"] = r.events;
      x["decisions"] = r.decisions.size();
      x["faults"] = r.faults.size();
      x["ops"] = r.ops;
      x["last_step"] = r.decisions.empty() ? 0 : r.decisions.back().step;
      for (const auto& f : r.faults) faults[f.name] = faults.value(f.name, 0) + 1;
    }
    for (const auto& s : run.summary_ranks) {
      if (s.rank != r.world_rank) continue;
      x["tree_digest"] = hex64(s.tree_digest);  // strings: above 2^53 a JSON number loses bits in jq and JavaScript
      x["decision_digest"] = hex64(s.decision_digest);
      x["tree_pages"] = s.tree_pages;
      x["tree_nodes"] = s.tree_nodes;
      x["requests"] = s.requests;
      x["admitted"] = s.admitted;
      x["verify_failures"] = s.verify_failures;
    }
    ranks.push_back(std::move(x));
  }
  j["faults"] = faults;
  std::uint64_t injected = 0;
  for (const auto& [k, v] : faults.items()) injected += v.get<std::uint64_t>();
  j["faults_injected"] = injected;
  j["ranks"] = ranks;
  return j;
}

std::string report_text(const RunTrace& run) {
  const auto j = report_json(run);
  std::ostringstream os;
  os << "# run " << run.run_file << "\n# experiment " << j["experiment"].get<std::string>() << ", seed " << j["seed"]
     << ", topology " << j["topology"].get<std::string>() << ", " << j["world_size"] << " ranks, git "
     << j["git_revision"].get<std::string>() << "\n";
  if (run.summary) {
    os << "# verdict " << j["verdict"].get<std::string>() << ": " << j["steps"] << " steps, " << j["checks"]
       << " checks, " << j["tree_divergences"] << " tree / " << j["decision_divergences"] << " decision-log divergences, " << j["verify_failures"] << " verify failures, "
       << j["wall_s"] << " s\n";
    if (j.contains("oracle_mismatches") && j["oracle_mismatches"].get<std::int64_t>() >= 0)
      os << "# oracle mismatches " << j["oracle_mismatches"] << "\n";
  } else {
    os << "# incomplete: no /summary (the run did not end cleanly)\n";
  }
  if (j["workload"] != "tree" && j.contains("prompt_tokens")) {  // the serving loop's figures
    char line[600];
    std::snprintf(line, sizeof(line),
                  "# requests %llu finished, prompt tokens %llu = cached %llu (hit rate: device %.2f%%, host %.2f%%, storage "
                  "%.2f%%) + computed %llu\n"
                  "# TTFT (modelled) ms: mean %.3f  p50 %.3f  p90 %.3f  p99 %.3f;  input throughput %.0f tokens/s over %.3f s\n",
                  j["finished"].get<unsigned long long>(), j["prompt_tokens"].get<unsigned long long>(),
                  j["cached_tokens"]["device"].get<unsigned long long>() + j["cached_tokens"]["host"].get<unsigned long long>() +
                      j["cached_tokens"]["storage"].get<unsigned long long>(),
                  100.0 * j["hit_rate"]["device"].get<double>(), 100.0 * j["hit_rate"]["host"].get<double>(),
                  100.0 * j["hit_rate"]["storage"].get<double>(), j["computed_tokens"].get<unsigned long long>(), j["ttft_model_ms"]["mean"].get<double>(),
                  j["ttft_model_ms"]["p50"].get<double>(), j["ttft_model_ms"]["p90"].get<double>(),
                  j["ttft_model_ms"]["p99"].get<double>(), j["input_token_throughput"].get<double>(),
                  j["modelled_duration_s"].get<double>());
    os << line;
    if (run.meta_string("topology").find(" + ") != std::string::npos) {  // a P/D world
      std::snprintf(line, sizeof(line),
                    "# P/D: %lld prompt tokens transferred prefill -> decode (%.1f%% of the prompts), %llu requests failed "
                    "by a broken transfer, %llu by a broken restore; output throughput %.0f tokens/s\n",
                    static_cast<long long>(j["transferred_tokens"]["pd"].get<std::int64_t>()),
                    j["prompt_tokens"].get<double>() > 0
                        ? 100.0 * j["transferred_tokens"]["pd"].get<double>() / j["prompt_tokens"].get<double>()
                        : 0.0,
                    j["failed_by_reason"]["pd_transfer"].get<unsigned long long>(),
                    j["failed_by_reason"]["pd_restore"].get<unsigned long long>(), j["output_token_throughput"].get<double>());
      os << line;
    }
    if (j.contains("load_back") && j["load_back"]["failed_requests"].get<std::int64_t>() > 0) {
      std::snprintf(line, sizeof(line), "# load-backs: %lld broken on some rank, their %lld tokens recomputed (never read)\n",
                    static_cast<long long>(j["load_back"]["failed_requests"].get<std::int64_t>()),
                    static_cast<long long>(j["load_back"]["recomputed_tokens"].get<std::int64_t>()));
      os << line;
    }
    if (j.contains("hybrid")) {
      const auto& h = j["hybrid"];
      std::snprintf(line, sizeof(line),
                    "# hybrid (rank 0): SWA tombstones made %lld, healed %lld; SWA pages freed behind the window %lld, "
                    "window locks released early %lld; MAMBA states copied %lld, saved %lld; SWA waits %lld\n"
                    "# hybrid reuse at admission: FULL alone would reuse %lld tokens; SWA's rule cuts %lld of them, MAMBA's %lld\n",
                    static_cast<long long>(h["swa_tombstones_made"].get<std::int64_t>()),
                    static_cast<long long>(h["swa_tombstones_healed"].get<std::int64_t>()),
                    static_cast<long long>(h["swa_freed_pages"].get<std::int64_t>()),
                    static_cast<long long>(h["swa_windows_released"].get<std::int64_t>()),
                    static_cast<long long>(h["mamba_states_copied"].get<std::int64_t>()),
                    static_cast<long long>(h["mamba_states_saved"].get<std::int64_t>()),
                    static_cast<long long>(h["swa_waits"].get<std::int64_t>()),
                    static_cast<long long>(h["full_alone_tokens"].get<std::int64_t>()),
                    static_cast<long long>(h["swa_cost_tokens"].get<std::int64_t>()),
                    static_cast<long long>(h["mamba_cost_tokens"].get<std::int64_t>()));
      os << line;
    }
    if (j.contains("spec")) {
      const auto& sp = j["spec"];
      std::snprintf(line, sizeof(line),
                    "# speculative decoding: %llu rounds, %llu tokens proposed, %llu accepted (%.1f%%), acceptance length %.3f, "
                    "%llu steps with a draft checksum mismatch\n",
                    sp["rounds"].get<unsigned long long>(), sp["proposed"].get<unsigned long long>(),
                    sp["accepted"].get<unsigned long long>(), 100.0 * sp["acceptance_rate"].get<double>(),
                    sp["acceptance_length_mean"].get<double>(), sp["draft_mismatch_steps"].get<unsigned long long>());
      os << line;
    }
    if (j.contains("rounds")) {
      os << "#  round  requests   hit%   ttft_ms\n";
      for (const auto& r : j["rounds"]) {
        std::snprintf(line, sizeof(line), "%8u %9llu %6.2f %9.3f\n", r["round"].get<unsigned>(),
                      r["requests"].get<unsigned long long>(), 100.0 * r["hit_rate"].get<double>(),
                      r["ttft_model_ms_mean"].get<double>());
        os << line;
      }
    }
  } else if (run.summary) {
    char hr[64];
    std::snprintf(hr, sizeof(hr), "%.2f", 100.0 * j["hit_rate"]["device"].get<double>());
    os << "# device hit rate " << hr << "% of prompt tokens (the tree loop has the device tier only)\n";
  }
  os << "#  rank group tp cp pp   events decisions faults  last_step\n";
  for (const auto& r : j["ranks"]) {
    char row[128];
    if (!r["present"].get<bool>()) {
      std::snprintf(row, sizeof(row), "%7d  (rank file missing or unreadable)", r["rank"].get<int>());
    } else {
      std::snprintf(row, sizeof(row), "%7d %5d %2d %2d %2d %8llu %9llu %6llu %10llu", r["rank"].get<int>(),
                    r["group"].get<int>(), r["tp"].get<int>(), r["cp"].get<int>(), r["pp"].get<int>(),
                    r["events"].get<unsigned long long>(), r["decisions"].get<unsigned long long>(),
                    r["faults"].get<unsigned long long>(), r["last_step"].get<unsigned long long>());
    }
    os << row << "\n";
  }
  if (!j["faults"].empty()) {
    os << "# faults fired:";
    for (const auto& [k, v] : j["faults"].items()) os << " " << k << "=" << v;
    os << "\n";
  }
  return os.str();
}

}  // namespace kvgrid
