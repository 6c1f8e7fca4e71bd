// Named failpoints (DESIGN §5).
//
// A failpoint is a named place in the code where a fault may be injected. The catalogue below
// lists every failpoint with its parameters; the experiment schema is generated from it, so
// `[faults."rank.stall"]` is validated like any other table. A configured failpoint fires with its
// `probability` at each evaluation, drawn from its own seeded stream (the rank stream forked by the
// failpoint's name), optionally only on the listed `ranks` and from step `from_step` on. Every firing is recorded (step,
// failpoint, parameters) for the trace.
//
// Later issues add failpoints to the catalogue; this one provides `rank.stall`.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/rng.hpp"

namespace kvgrid {

struct FailpointParamSpec {
  std::string name;
  double default_value;
  double min, max;
  std::string doc;
};

struct FailpointSpec {
  std::string name;
  std::string doc;
  std::vector<FailpointParamSpec> params;
};

// Every failpoint kvgrid knows.
const std::vector<FailpointSpec>& failpoint_catalogue();

struct FailpointConfig {
  std::string name;
  double probability = 0.0;
  std::vector<std::int64_t> ranks;        // empty: every rank
  std::uint64_t from_step = 0;            // never fires (and never draws) before this step
  std::map<std::string, double> params;   // catalogue parameters, defaults filled in
};

struct FailpointFiring {
  std::uint64_t step = 0;
  std::string name;
  std::string params;  // "duration_ms=200"
};

struct FailpointHit {
  const std::map<std::string, double>* params;
  double param(const std::string& name) const { return params->at(name); }
};

class FailpointRegistry {
 public:
  FailpointRegistry(std::uint64_t seed, int world_rank);
  // Throws InternalError for a name missing from the catalogue.
  void configure(const FailpointConfig& cfg);
  bool configured(std::string_view name) const { return points_.find(name) != points_.end(); }

  // Evaluates the failpoint at `step`: draws from its stream when configured for this rank and
  // returns the parameters on a firing (recorded). Unconfigured failpoints never draw.
  // (A string_view: the callers' literals make no string, and with none configured it is one test.)
  std::optional<FailpointHit> evaluate(std::string_view name, std::uint64_t step) {
    if (points_.empty()) return std::nullopt;
    return evaluate_configured(name, step);
  }

  std::uint64_t fired_count() const { return fired_; }
  std::vector<FailpointFiring> take_new();

 private:
  struct Point {
    FailpointConfig cfg;
    Rng rng;
  };
  Rng base_;
  int rank_;
  std::optional<FailpointHit> evaluate_configured(std::string_view name, std::uint64_t step);
  std::map<std::string, Point, std::less<>> points_;
  std::vector<FailpointFiring> pending_;
  std::uint64_t fired_ = 0;
};

}  // namespace kvgrid
