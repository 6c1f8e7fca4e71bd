// What the two P/D plug-ins (runtime/pd_prefill.hpp, runtime/pd_decode.hpp) share: the run ends
// on prefill's relayed stop, the clients hear of finished requests through the P/D link (not from
// the loop), and the run's P/D totals are reduced over the whole world (every rank has one of the
// two plug-ins, at the same place in the loop's list, so the collective matches).
#pragma once

#include <optional>

#include "runtime/pd.hpp"
#include "runtime/step_plugin.hpp"

namespace kvgrid {

class PdStep : public StepPlugin {
 public:
  explicit PdStep(PdLink& pd) : link_(pd) {}

  std::optional<bool> done(const ServeStep& s) const override { return s.in.pd_stop != 0; }
  bool owns_client_finish() const override { return true; }
  void drain() override { link_.drain(); }
  void totals(ServeResult& res) override {
    // The first prefill rank's and the first decode rank's counts, on every rank.
    const auto t = link_.world_totals(res.pd_received_tokens, res.finished, res.failed);
    res.pd_sent_tokens = t.sent_tokens;
    res.pd_received_tokens = t.received_tokens;
    res.pd_failed = t.failed;
    res.pd_restore_failed = t.restore_failed;
    res.finished = t.finished_requests;  // decode's: the requests it decoded, and those it failed
    res.failed = t.failed_requests;
  }
  void summary(RankSummaryRow& m) const override {
    m.pd_sent_tokens = link_.stats().sent_tokens;
    m.pd_sent_bytes = link_.stats().sent_bytes;
    m.pd_broken = link_.stats().broken;
    m.pd_failed = link_.stats().failed;
    m.pd_restore_failed = link_.stats().restore_failed;
    m.pd_sent_full_pages = link_.stats().sent_full_pages;
    m.pd_sent_swa_pages = link_.stats().sent_swa_pages;
    m.pd_sent_states = link_.stats().sent_states;
  }

 protected:
  PdLink& link_;
};

}  // namespace kvgrid
