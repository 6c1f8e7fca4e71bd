#include "runtime/workload_export.hpp"

#include <cstdio>
#include <queue>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/check.hpp"
#include "core/hash.hpp"
#include "runtime/serve_workload.hpp"

namespace kvgrid {

namespace {

constexpr std::size_t kBlock = 512;  // Mooncake's hash block

class BlockIds {
 public:
  std::vector<std::uint64_t> of(std::span<const TokenId> prompt) {
    std::vector<std::uint64_t> ids;
    std::uint64_t h = 0x6b7667726964ULL;  // the prefix's running hash
    for (std::size_t b = 0; b * kBlock < prompt.size(); ++b) {
      const auto block = prompt.subspan(b * kBlock, std::min(kBlock, prompt.size() - b * kBlock));
      h = hash_combine(hash_combine(h, block.size()), hash_u32(block));
      auto [it, fresh] = ids_.try_emplace(h, ids_.size());
      ids.push_back(it->second);
    }
    return ids;
  }
  std::size_t distinct() const { return ids_.size(); }

 private:
  std::unordered_map<std::uint64_t, std::uint64_t> ids_;
};

}  // namespace

WorkloadExport export_workload(const ExperimentConfig& exp, std::uint64_t service_ns) {
  if (exp.workload.kind == "tree")
    throw InputError("workload.kind = \"tree\" has no requests to export (gsp, multiturn and mooncake do)");
  auto w = make_serve_workload(exp.workload, exp.engine.seed);
  WorkloadExport out;
  BlockIds blocks;
  using Finish = std::pair<std::uint64_t, std::uint64_t>;  // (finish ns, request id)
  std::priority_queue<Finish, std::vector<Finish>, std::greater<>> in_flight;
  std::uint64_t now = 0;
  while (!w->exhausted()) {
    for (auto& r : w->arrivals(now)) {
      const auto ids = blocks.of(r.prompt);
      char head[160];
      std::snprintf(head, sizeof(head), "{\"timestamp\": %.6f, \"input_length\": %zu, \"output_length\": %u, \"hash_ids\": [",
                    static_cast<double>(r.arrival_ns) / 1e6, r.prompt.size(), r.output_len);
      out.jsonl += head;
      for (std::size_t i = 0; i < ids.size(); ++i) out.jsonl += (i ? ", " : "") + std::to_string(ids[i]);
      out.jsonl += "]}\n";
      ++out.requests;
      out.prompt_tokens += r.prompt.size();
      out.output_tokens += r.output_len;
      out.blocks += ids.size();
      out.last_arrival_ns = std::max(out.last_arrival_ns, r.arrival_ns);
      in_flight.push({std::max(now, r.arrival_ns) + service_ns, r.id.value()});
    }
    // The next moment something happens: an arrival or a finish (which may release follow-ups).
    const auto next = w->next_arrival_ns();
    if (!in_flight.empty() && (!next || in_flight.top().first <= *next)) {
      now = std::max(now, in_flight.top().first);
      while (!in_flight.empty() && in_flight.top().first <= now) {
        w->finished(RequestId(in_flight.top().second), now);
        in_flight.pop();
      }
    } else if (next) {
      now = std::max(now, *next);
    } else {
      KVGRID_CHECK(false, "workload export: the workload waits for nothing (", out.requests, " requests written)");
    }
  }
  out.distinct_blocks = blocks.distinct();
  return out;
}

}  // namespace kvgrid
