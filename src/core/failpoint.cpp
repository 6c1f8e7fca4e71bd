#include "core/failpoint.hpp"

#include <algorithm>
#include <sstream>

#include "core/check.hpp"
#include "core/schedule.hpp"

namespace kvgrid {

const std::vector<FailpointSpec>& failpoint_catalogue() {
  static const std::vector<FailpointSpec> catalogue = {
      {"rank.stall",
       "the rank stops working for duration_ms of wall time at the start of a step (a slow or hung rank)",
       {{"duration_ms", 1000.0, 0.0, 3.6e6, "stall length, wall milliseconds"}}},
      {"host.alloc.fail", "a host-page allocation (backup or prefetch) fails on this rank (host memory pressure)", {}},
      {"device.alloc.fail", "the device-page allocation of an admission fails on this rank (the request waits)", {}},
      {"transfer.delay", "a device->host backup copy completes delay_us later",
       {{"delay_us", 1000.0, 0.0, 1e9, "extra completion delay, modelled (simulated) or wall (threaded) microseconds"}}},
      {"transfer.fail", "a device->host backup copy fails: its pages are never published (the nodes stay device-only)", {}},
      {"storage.read.slow", "a storage read batch completes delay_ms later",
       {{"delay_ms", 10.0, 0.0, 1e6, "extra completion delay, milliseconds"}}},
      {"storage.read.fail", "a storage read batch fails from a random page on (an I/O error): those pages are misses", {}},
      {"storage.read.short", "a random object of a storage read batch is truncated before it is read (detected: a miss)", {}},
      {"storage.object.corrupt", "a random object of a storage read batch has a payload byte flipped (checksum: a miss)", {}},
      {"p2p.delay", "a stage's step message to the next stage (activation, arrivals, the pp_sync counts) arrives delay_us later on the modelled clock; "
       "in a P/D world also a prefill suffix transfer (drawn by the prefill leader)",
       {{"delay_us", 1000.0, 0.0, 1e9, "extra modelled link time, microseconds"}}},
      {"request.abort",
       "at the start of a step PP0's leader aborts a random waiting or running request (a client going away); every rank "
       "releases what it held, mid-prefetch or mid-load included; the request counts as failed",
       {}},
      {"storage.write.fail", "a storage object write fails (nothing is left behind; later prefetches miss it)", {}},
      {"pd.transfer.fail",
       "P/D: a request's suffix transfer from the prefill ranks breaks after a random layer (the rest arrives as zeros); "
       "the decode side fails that request and releases what it held",
       {}},
      {"pd.restore.fail",
       "P/D: a decode rank's host->device restore of a request's cached prefix fails from a random layer on (a copy "
       "error); decode agrees the outcome over its ranks, fails that request (reason pd_restore) before it is decoded "
       "and releases what it held; the restored pages are never published",
       {}},
      {"transfer.load.fail",
       "a host->device load-back copy of one layer fails on this rank, and the load's later layers with it (a copy "
       "error); protocol.load_back agrees the outcome over every rank serving the request: the loaded positions "
       "become misses everywhere and are recomputed (in a P/D world: prefill's load-backs; decode's restores fail with "
       "pd.restore.fail)",
       {}},
      {"device.page.corrupt",
       "flips bits of a random cached (radix tree) device page at the start of a step; its next reader must see an oracle mismatch",
       {{"bits", 1.0, 1.0, 64.0, "bits flipped"}}},
  };
  return catalogue;
}

FailpointRegistry::FailpointRegistry(std::uint64_t seed, int world_rank)
    : base_(rank_stream(seed, world_rank).fork("failpoints")), rank_(world_rank) {}

void FailpointRegistry::configure(const FailpointConfig& cfg) {
  const auto& cat = failpoint_catalogue();
  auto it = std::find_if(cat.begin(), cat.end(), [&](const FailpointSpec& s) { return s.name == cfg.name; });
  KVGRID_CHECK(it != cat.end(), "unknown failpoint '", cfg.name, "'");
  Point p{cfg, base_.fork(cfg.name)};
  for (const auto& ps : it->params)
    if (!p.cfg.params.count(ps.name)) p.cfg.params[ps.name] = ps.default_value;
  points_.erase(cfg.name);
  points_.emplace(cfg.name, std::move(p));
}

std::optional<FailpointHit> FailpointRegistry::evaluate_configured(std::string_view name, std::uint64_t step) {
  auto it = points_.find(name);
  if (it == points_.end()) return std::nullopt;
  Point& p = it->second;
  if (step < p.cfg.from_step) return std::nullopt;
  if (!p.cfg.ranks.empty() &&
      std::find(p.cfg.ranks.begin(), p.cfg.ranks.end(), static_cast<std::int64_t>(rank_)) == p.cfg.ranks.end())
    return std::nullopt;
  bool fires = p.rng.bernoulli(p.cfg.probability);
  // Under kvgrid explore every evaluation is a choice point, the draw its default (core/schedule.hpp).
  if (ChoiceSource* c = choice_source()) fires = c->answer(fires, "failpoint " + std::string(name) + (fires ? " (drawn: fires)" : " (drawn: quiet)"), "fires", "quiet");
  if (!fires) return std::nullopt;
  std::ostringstream os;
  bool first = true;
  for (const auto& [k, v] : p.cfg.params) {
    os << (first ? "" : " ") << k << "=" << v;
    first = false;
  }
  pending_.push_back({step, std::string(name), os.str()});
  ++fired_;
  return FailpointHit{&p.cfg.params};
}

std::vector<FailpointFiring> FailpointRegistry::take_new() {
  std::vector<FailpointFiring> out;
  out.swap(pending_);
  return out;
}

}  // namespace kvgrid
