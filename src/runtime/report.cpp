#include "runtime/report.hpp"

#include <cstdio>
#include <sstream>

namespace kvgrid {

namespace {
nlohmann::json attr_json(const h5::AttrValue& v) {
  return std::visit([](const auto& x) { return nlohmann::json(x); }, v);
}
}  // namespace

nlohmann::json report_json(const RunTrace& run) {
  nlohmann::json j;
  j["run"] = run.run_file;
  j["experiment"] = run.meta_string("experiment");
  j["seed"] = run.meta_int("seed");
  j["topology"] = run.meta_string("topology");
  j["world_size"] = run.meta_int("world_size");
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
  j["device_hit_rate"] = prompt ? static_cast<double>(matched) / static_cast<double>(prompt) : 0.0;
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
      for (const auto& f : r.faults) faults[read_fixed(f.name, sizeof(f.name))] = faults.value(read_fixed(f.name, sizeof(f.name)), 0) + 1;
    }
    for (const auto& s : run.summary_ranks) {
      if (s.rank != r.world_rank) continue;
      x["tree_digest"] = s.tree_digest;
      x["decision_digest"] = s.decision_digest;
      x["tree_pages"] = s.tree_pages;
      x["tree_nodes"] = s.tree_nodes;
      x["requests"] = s.requests;
      x["admitted"] = s.admitted;
      x["verify_failures"] = s.verify_failures;
    }
    ranks.push_back(std::move(x));
  }
  j["faults"] = faults;
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
    char hr[64];
    std::snprintf(hr, sizeof(hr), "%.2f", 100.0 * j["device_hit_rate"].get<double>());
    os << "# device hit rate " << hr << "% of prompt tokens\n";
  } else {
    os << "# incomplete: no /summary (the run did not end cleanly)\n";
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
