// protocol.pp_sync — agreement of host-tier ACK consumption across pipeline stages.
//
// Invariant: every stage consumes the same write ACKs at the same step. Each stage keeps its own
// tree and its own copies; a stage that decides from its own events which backups finished
// publishes them at other steps than its neighbours, its host state and then its load-backs and
// batch shapes drift (SGLang #22607: "shape '[3013, -1, 128]' is invalid").
//
//   pp_sync              (correct) only PP0 looks at its events: MIN of its leading finished write
//                        ACKs over its stage (protocol.tp_sync), carried point to point to PP1 in
//                        the step's message and relayed stage to stage; later stages consume
//                        exactly that many, FIFO, blocking on each one's local completion, and
//                        never query their own events. Sends are the step messages' bounded
//                        non-blocking sends; no barrier.
//                        With device.alloc.fail, PP0's stage also decides every admission's
//                        allocation outcome and relays it in the step message; later stages
//                        follow it (their pools hold the same pages).
//   independent_polling  (buggy) every stage agrees inside itself on what it sees finished — and,
//                        being independent, on its own admissions' allocation outcomes too
//                        (device.alloc.fail on one stage then also parts the stages).
//
// write_back's backups (taken when a victim is evicted) are write ACKs like the others across
// stages: started at the eviction, the victim kept on the device until their publication
// (cache/host_tier.hpp write_back), never decided inside the eviction by one stage.
//
// Loads need no relay here: a load-back is waited for (per layer) by the request that reads it,
// within its admission step, so no load ACK queue outlives a step — except where loads can fail
// (protocols/load_back) and P/D decode's, read steps later (protocols/pd_restore), whose outcomes
// are agreed over every stage.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "cache/write_acks.hpp"

namespace kvgrid::protocols {

class PpSync {
 public:
  virtual ~PpSync() = default;
  virtual std::string_view name() const = 0;
  // How many leading write ACKs this rank consumes at this step. `upstream`: what the previous
  // stage consumed at this step (absent on PP0). Every rank of a stage calls it at the same point.
  virtual std::size_t write_acks(cache::WriteAcks& acks, std::optional<std::uint64_t> upstream) = 0;
  // Whether PP0's admission outcomes are relayed to later stages (device.alloc.fail, PP > 1).
  virtual bool relays_admissions() const = 0;
};

// Throws InputError for an unknown variant name.
std::unique_ptr<PpSync> make_pp_sync(const std::string& variant);

}  // namespace kvgrid::protocols
