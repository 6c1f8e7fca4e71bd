// The write ACK queue of a host tier: device→host backups in flight, in submission order, and
// their agreed consumption — what protocol.tp_sync (AckAgreement, over a stage) and
// protocol.pp_sync (CrossStageAgreement, across stages) agree on. Both host tiers use it — the
// radix tree's (host_tier.hpp) and the hybrid models' unified tree's (hybrid_host_tier.hpp) —, so
// a backup of FULL, SWA and MAMBA data is agreed exactly like a FULL one.
//
//  * ACKs are consumed only through `consume` (FIFO, as many as agreed — never by polling alone);
//    `agreed_ready` is the stage's MIN of leading finished ACKs (a collective).
//  * A consumed ACK is published through the owner's callback with its outcome: ok only if its
//    copy succeeded on every rank of the stage (one MIN when none failed, one per ACK otherwise).
//  * Across stages (`set_cross_stage`): consumed ACKs are published at the end of the step with
//    their success agreed over every stage (a non-blocking MIN started at the end of the
//    consuming step, finished at the end of the next), so a copy or allocation that failed on one
//    stage fails on all. A placeholder (a host allocation that failed on this rank only) keeps
//    every rank's queue the same and fails everywhere.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <vector>

#include "cache/agreement.hpp"
#include "core/decision_log.hpp"
#include "transfer/transfer_engine.hpp"

namespace kvgrid::cache {

class WriteAcks {
 public:
  // Called for each consumed ACK, in queue order: its id, whether it is a placeholder, and the
  // agreed outcome (never ok for a placeholder).
  using Publish = std::function<void(std::uint64_t id, bool placeholder, bool ok)>;

  WriteAcks(AckAgreement& agreement, DecisionLog& log, Publish publish)
      : agreement_(agreement), log_(log), publish_(std::move(publish)) {}

  void push(std::uint64_t id, transfer::Event event, bool placeholder = false) {
    queue_.push_back({id, std::move(event), placeholder});
  }
  // The leading finished ACKs of this rank, agreed over the stage (a collective).
  std::size_t agreed_ready();
  // Consumes exactly `n` ACKs in FIFO order, blocking on each one's completion (a later stage
  // under pp_sync does this with PP0's count, without querying first). Collective over the stage
  // when n > 0 (the copies' success is agreed).
  void consume(std::size_t n);
  void check() { consume(agreed_ready()); }

  void set_cross_stage(CrossStageAgreement* cross) { cross_ = cross; }
  bool cross_stage() const { return cross_ != nullptr; }
  // Collective across stages at the end of every step: publishes what the previous step consumed
  // and starts the agreement of this step's.
  void end_of_step();
  // After the last step: finishes and publishes what is still being agreed.
  void finish_cross_stage();

  std::size_t pending() const { return queue_.size(); }
  // Consumed or not, ACKs not yet published (across stages they wait a step for their outcome).
  std::size_t unpublished() const { return queue_.size() + consumed_.size() + agreeing_.size(); }
  // Modelled completion time of the oldest pending write (simulated engine; 0 when none or unknown).
  std::uint64_t oldest_ns() const { return queue_.empty() ? 0 : queue_.front().event.complete_ns(); }

 private:
  struct Entry {
    std::uint64_t id;
    transfer::Event event;
    bool placeholder = false;
    bool failed() const { return placeholder || event.failed(); }
  };
  AckAgreement& agreement_;
  DecisionLog& log_;
  Publish publish_;
  CrossStageAgreement* cross_ = nullptr;
  std::deque<Entry> queue_;
  std::vector<Entry> consumed_;  // across stages: consumed this step
  std::vector<Entry> agreeing_;  // consumed the step before, their outcome being agreed
  std::vector<std::uint64_t> agreeing_ok_;
};

}  // namespace kvgrid::cache
