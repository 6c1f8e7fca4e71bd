#include "runtime/timeline.hpp"

#include <string>

namespace kvgrid {

namespace {

double us(std::int64_t ns) { return static_cast<double>(ns) / 1e3; }

// One flow per step message: (group, cp, tp position) × sending stage × step.
std::uint64_t flow_id(const RankTrace& r, std::int64_t from_stage, std::uint64_t step) {
  const std::uint64_t position = (static_cast<std::uint64_t>(r.group) * 1024 + static_cast<std::uint64_t>(r.cp)) * 1024 +
                                 static_cast<std::uint64_t>(r.tp);
  return ((step * 256 + static_cast<std::uint64_t>(from_stage)) << 24) ^ position;
}

}  // namespace

nlohmann::json timeline_json(const RunTrace& run) {
  using nlohmann::json;
  json ev = json::array();
  const char* threads[] = {"scheduler", "device->host copies", "host->device copies", "storage reads", "layer gathers"};
  for (const auto& r : run.ranks) {
    if (!r.present) continue;
    const int pid = r.world_rank;
    ev.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", pid},
                  {"args", {{"name", "rank " + std::to_string(pid) + " (pp " + std::to_string(r.pp) + ", cp " +
                                         std::to_string(r.cp) + ", tp " + std::to_string(r.tp) + ")"}}}});
    for (int t = 0; t < 5; ++t)
      ev.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", pid}, {"tid", t}, {"args", {{"name", threads[t]}}}});
    for (const auto& e : r.event_rows) {
      const std::string op = read_fixed(e.op, sizeof(e.op));
      const double ts = us(static_cast<std::int64_t>(e.model_ns));
      int tid = -1;
      if (op == "d2h") tid = 1;
      else if (op == "h2d") tid = 2;
      else if (op == "storage_read") tid = 3;
      else if (op == "gather") tid = 4;  // request: how many requests' prefixes
      if (tid > 0) {
        if (e.args[1] <= e.args[0]) continue;  // real copies: no modelled times
        ev.push_back({{"ph", "X"}, {"name", op}, {"pid", pid}, {"tid", tid}, {"ts", us(e.args[0])},
                      {"dur", us(e.args[1] - e.args[0])},
                      {"args", {{"id", e.request}, {"bytes", e.args[2]}, {"step", e.step}}}});
      } else if (op == "pp_send" || op == "pp_recv") {
        const bool send = op == "pp_send";
        const std::uint64_t id = flow_id(r, send ? r.pp : e.args[0], e.step);
        ev.push_back({{"ph", "X"}, {"name", op}, {"pid", pid}, {"tid", 0}, {"ts", ts}, {"dur", 1},
                      {"args", {{"step", e.step}, {"write_acks", e.args[2]}}}});
        ev.push_back({{"ph", send ? "s" : "f"}, {"name", "step message"}, {"cat", "pp"}, {"id", id}, {"pid", pid},
                      {"tid", 0}, {"ts", ts}, {"bp", "e"}});
      } else {
        ev.push_back({{"ph", "i"}, {"name", op}, {"s", "t"}, {"pid", pid}, {"tid", 0}, {"ts", ts},
                      {"args", {{"step", e.step}, {"request", e.request}, {"a0", e.args[0]}, {"a1", e.args[1]},
                                {"a2", e.args[2]}, {"status", e.status}}}});
      }
    }
  }
  return {{"traceEvents", ev}, {"displayTimeUnit", "ms"}, {"otherData", {{"run", run.run_file}, {"clock", "modelled"}}}};
}

}  // namespace kvgrid
