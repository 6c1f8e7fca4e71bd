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
//   independent_polling  (buggy) every stage agrees inside itself on what it sees finished
//
// Loads need no relay here: a load-back is waited for (per layer) by the request that reads it,
// within its admission step, so no load ACK queue outlives a step — except P/D decode's, read
// steps later and agreed by protocols/pd_restore.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "cache/host_tier.hpp"

namespace kvgrid::protocols {

class PpSync {
 public:
  virtual ~PpSync() = default;
  virtual std::string_view name() const = 0;
  // How many leading write ACKs this rank consumes at this step. `upstream`: what the previous
  // stage consumed at this step (absent on PP0). Every rank of a stage calls it at the same point.
  virtual std::size_t write_acks(cache::HostTier& host, std::optional<std::uint64_t> upstream) = 0;
};

// Throws InputError for an unknown variant name.
std::unique_ptr<PpSync> make_pp_sync(const std::string& variant);

}  // namespace kvgrid::protocols
