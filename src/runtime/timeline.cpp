#include "runtime/timeline.hpp"

#include <algorithm>
#include <limits>
#include <string>

namespace kvgrid {

namespace {

using nlohmann::json;

double us(std::uint64_t ns) { return static_cast<double>(ns) / 1e3; }

// Threads of a rank's process.
enum Tid : int { kSteps = 0, kPrefill, kDecode, kEvents, kD2h, kH2d, kStorage, kGather, kStorageWrite, kThreads };
const char* const kThreadNames[kThreads] = {"steps",  "prefill", "decode",        "events",
                                            "device->host copies", "host->device copies", "storage reads",
                                            "layer gathers", "storage writes"};
constexpr int kWallPid = 100000;  // + world rank: the wall-clock track set

// One flow per step message: (group, cp, tp position) × sending stage × step.
std::uint64_t flow_id(const RankTrace& r, std::int64_t from_stage, std::uint64_t step) {
  const std::uint64_t position = (static_cast<std::uint64_t>(r.group) * 1024 + static_cast<std::uint64_t>(r.cp)) * 1024 +
                                 static_cast<std::uint64_t>(r.tp);
  return ((step * 256 + static_cast<std::uint64_t>(from_stage)) << 24) ^ position;
}

json meta(const char* what, int pid, const std::string& name, int tid = -1) {
  json m = {{"ph", "M"}, {"name", what}, {"pid", pid}, {"args", {{"name", name}}}};
  if (tid >= 0) m["tid"] = tid;
  return m;
}

json slice(const std::string& name, int pid, int tid, std::uint64_t start_ns, std::uint64_t dur_ns, json args = nullptr) {
  json e = {{"ph", "X"}, {"name", name}, {"pid", pid}, {"tid", tid}, {"ts", us(start_ns)}, {"dur", us(dur_ns)}};
  if (!args.is_null()) e["args"] = std::move(args);
  return e;
}

class Builder {
 public:
  Builder(const RunTrace& run, const TimelineOptions& opt) : run_(run), opt_(opt) {}

  json build() {
    for (const auto& r : run_.ranks)
      if (r.present) rank(r);
    requests();
    return {{"traceEvents", std::move(ev_)},
            {"displayTimeUnit", "ms"},
            {"otherData", {{"run", run_.run_file}, {"clock", "modelled (µs); wall-clock processes are named so"}}}};
  }

 private:
  bool in_window(std::uint64_t step) const {
    return (!opt_.from || step >= *opt_.from) && (!opt_.to || step <= *opt_.to);
  }
  bool sampled(std::uint64_t step) const { return in_window(step) && step % std::max<std::uint64_t>(opt_.every, 1) == 0; }

  void rank(const RankTrace& r) {
    const int pid = r.world_rank;
    const std::string name = "rank " + std::to_string(pid) + " (pp " + std::to_string(r.pp) + ", cp " +
                             std::to_string(r.cp) + ", tp " + std::to_string(r.tp) + ")";
    ev_.push_back(meta("process_name", pid, name));
    ev_.push_back({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", pid}, {"args", {{"sort_index", pid}}}});
    for (int t = 0; t < kThreads; ++t) ev_.push_back(meta("thread_name", pid, kThreadNames[t], t));
    if (opt_.wall) {
      ev_.push_back(meta("process_name", kWallPid + pid, "rank " + std::to_string(pid) + " wall clock"));
      ev_.push_back({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", kWallPid + pid}, {"args", {{"sort_index", kWallPid + pid}}}});
      ev_.push_back(meta("thread_name", kWallPid + pid, "steps (wall)", kSteps));
    }
    for (const auto& s : r.steps) {
      if (!in_window(s.step)) continue;
      window_start_ = std::min(window_start_, s.model_start_ns);
      std::uint64_t end = s.model_start_ns;
      for (std::size_t p = 0; p < kStepPhaseCount; ++p) end += s.phase_model_ns[p];
      window_end_ = std::max(window_end_, end);
      if (sampled(s.step)) step(pid, s);
    }
    for (const auto& e : r.event_rows)
      if (in_window(e.step)) event(r, e);
  }

  void step(int pid, const StepRow& s) {
    std::uint64_t total = 0, wall_total = 0;
    for (std::size_t p = 0; p < kStepPhaseCount; ++p) total += s.phase_model_ns[p], wall_total += s.phase_wall_ns[p];
    const json batch = {{"step", s.step}, {"requests", s.batch_requests}, {"prefill_tokens", s.prefill_tokens},
                        {"decode_tokens", s.decode_tokens}};
    if (total > 0) {
      ev_.push_back(slice("step " + std::to_string(s.step), pid, kSteps, s.model_start_ns, total, batch));
      std::uint64_t at = s.model_start_ns;
      for (std::size_t p = 0; p < kStepPhaseCount; ++p) {
        const std::uint64_t d = s.phase_model_ns[p];
        if (d > 0) ev_.push_back(slice(kStepPhases[p], pid, kSteps, at, d));
        if (d > 0 && std::string(kStepPhases[p]) == "forward") {
          if (s.prefill_tokens) ev_.push_back(slice("prefill", pid, kPrefill, at, d, {{"tokens", s.prefill_tokens}}));
          if (s.decode_tokens) ev_.push_back(slice("decode", pid, kDecode, at, d, {{"tokens", s.decode_tokens}}));
        }
        at += d;
      }
    }
    if (opt_.wall && wall_total > 0) {
      ev_.push_back(slice("step " + std::to_string(s.step), kWallPid + pid, kSteps, s.wall_start_ns, wall_total, batch));
      std::uint64_t at = s.wall_start_ns;
      for (std::size_t p = 0; p < kStepPhaseCount; ++p) {
        if (s.phase_wall_ns[p] > 0) ev_.push_back(slice(kStepPhases[p], kWallPid + pid, kSteps, at, s.phase_wall_ns[p]));
        at += s.phase_wall_ns[p];
      }
    }
    // Counters, at the step's end (the pools and queues after it).
    const double ts = us(s.model_start_ns + total);
    json pages = {{"device", s.device_pages_used}};
    if (s.host_pages_used >= 0) pages["host"] = s.host_pages_used;
    ev_.push_back({{"ph", "C"}, {"name", "pages in use"}, {"pid", pid}, {"ts", ts}, {"args", pages}});
    ev_.push_back({{"ph", "C"}, {"name", "requests"}, {"pid", pid}, {"ts", ts},
                   {"args", {{"waiting", s.waiting}, {"running", s.running}}}});
  }

  void event(const RankTrace& r, const EventRow& e) {
    const int pid = r.world_rank;
    const std::string op = e.op;
    int tid = -1;
    if (op == "d2h") tid = kD2h;
    else if (op == "h2d") tid = kH2d;
    else if (op == "storage_read") tid = kStorage;
    else if (op == "storage_write") tid = kStorageWrite;
    else if (op == "gather") tid = kGather;  // request: how many requests' prefixes
    if (tid > 0) {
      if (e.args[1] <= e.args[0]) return;  // real copies: no modelled times
      ev_.push_back(slice(op, pid, tid, static_cast<std::uint64_t>(e.args[0]), static_cast<std::uint64_t>(e.args[1] - e.args[0]),
                          {{"id", e.request}, {"bytes", e.args[2]}, {"step", e.step}}));
    } else if (op == "pp_send" || op == "pp_recv") {
      const bool send = op == "pp_send";
      const std::uint64_t id = flow_id(r, send ? r.pp : e.args[0], e.step);
      ev_.push_back({{"ph", "X"}, {"name", op}, {"pid", pid}, {"tid", kEvents}, {"ts", us(e.model_ns)}, {"dur", 1},
                     {"args", {{"step", e.step}, {"write_acks", e.args[2]}}}});
      ev_.push_back({{"ph", send ? "s" : "f"}, {"name", "step message"}, {"cat", "pp"}, {"id", id}, {"pid", pid},
                     {"tid", kEvents}, {"ts", us(e.model_ns)}, {"bp", "e"}});
    } else {
      ev_.push_back({{"ph", "i"}, {"name", op}, {"s", "t"}, {"pid", pid}, {"tid", kEvents}, {"ts", us(e.model_ns)},
                     {"args", {{"step", e.step}, {"request", e.request}, {"a0", e.args[0]}, {"a1", e.args[1]},
                               {"a2", e.args[2]}, {"status", e.status}}}});
    }
  }

  // An async span per request (the requests table's modelled times), nested: queued, prefill, decode.
  void requests() {
    const int pid = static_cast<int>(run_.ranks.size());
    bool named = false;
    const bool windowed = opt_.from || opt_.to;
    for (const auto& r : run_.ranks)
      for (const auto& q : r.requests) {
        if (windowed && (q.finish_ns < window_start_ || q.arrival_ns > window_end_)) continue;
        if (!named) {
          ev_.push_back(meta("process_name", pid, "requests (modelled)"));
          ev_.push_back({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", pid}, {"args", {{"sort_index", -1}}}});
          named = true;
        }
        const std::string id = "0x" + to_hex(q.request);
        json args = {{"prompt_tokens", q.prompt_tokens}, {"cached_tokens", q.cached_tokens},
                     {"output_tokens", q.output_tokens}, {"oracle_ok", q.oracle_ok}, {"failed", q.failed}};
        if (q.round) args["round"] = q.round;
        span("request " + std::to_string(q.request), pid, id, q.arrival_ns, q.finish_ns, std::move(args));
        if (q.failed) continue;
        span("queued", pid, id, q.arrival_ns, q.admit_ns);
        span("prefill", pid, id, q.admit_ns, q.first_token_ns);
        span("decode", pid, id, q.first_token_ns, q.finish_ns);
      }
  }

  void span(const std::string& name, int pid, const std::string& id, std::uint64_t begin, std::uint64_t end, json args = nullptr) {
    if (end < begin) return;
    json b = {{"ph", "b"}, {"cat", "request"}, {"name", name}, {"id", id}, {"pid", pid}, {"tid", 0}, {"ts", us(begin)}};
    if (!args.is_null()) b["args"] = std::move(args);
    ev_.push_back(std::move(b));
    ev_.push_back({{"ph", "e"}, {"cat", "request"}, {"name", name}, {"id", id}, {"pid", pid}, {"tid", 0}, {"ts", us(end)}});
  }

  static std::string to_hex(std::uint64_t v) {
    char buf[20];
    std::snprintf(buf, sizeof(buf), "%llx", static_cast<unsigned long long>(v));
    return buf;
  }

  const RunTrace& run_;
  const TimelineOptions& opt_;
  json ev_ = json::array();
  std::uint64_t window_start_ = std::numeric_limits<std::uint64_t>::max(), window_end_ = 0;
};

}  // namespace

nlohmann::json timeline_json(const RunTrace& run, const TimelineOptions& opt) { return Builder(run, opt).build(); }

}  // namespace kvgrid
