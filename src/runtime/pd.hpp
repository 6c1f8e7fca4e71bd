// P/D disaggregation in one world (group 0 prefills, group 1 decodes, each its own TP × CP × PP
// layout). The suffix goes from the prefill ranks that hold a (layer, KV head) to the decode ranks
// that need it (`PdLeg`: one message per request, leg and layer; with equal layouts prefill rank w
// sends everything to decode rank w + group size; MLA's latent KV, held by every TP rank, comes to
// decode TP rank t from prefill TP rank t mod prefill TP; decode CP rank c takes prefill CP rank
// c mod prefill CP's; CP-sharded pools: each page from its prefill owner to its decode owner, the
// shard groups may differ in size and axis). The two groups run the serving loop in lockstep; their PP0 leaders exchange
// one control message per step in each direction:
//
//   P(s)  prefill leader → decode leader, at the start of prefill step s: the arrivals of step s,
//         the suffixes every prefill rank sent at step s - 1 (request, modelled end) or that broke
//         (request, first layer that did not arrive), the modelled clock, exhausted and stop.
//   D(s)  decode leader → prefill leader, at the end of decode step s (received at prefill step
//         s + 1): the requests decode admitted (request, decode_prefix_len, transfer slot), the
//         requests it finished (request, modelled clock: the client goes on), and whether it is idle.
//
// Decode admits a request when it arrives (match its own tree — device, host and an accepted
// storage prefetch — lock, reserve the whole request), posts its receives of the suffix pages
// [decode_prefix_len, prompt) right away, one per leg on tag slot × (transfer layers + sidecars) + transfer layer, and
// answers. Prefill admits a request only once decode answered; after its last prefill chunk every
// prefill rank sends that suffix of its own layers and heads (the receives are posted, so the
// sends complete), and the leader announces it. Decode then waits for its receives and its
// restores and decodes; a broken transfer (`pd.transfer.fail`, decided by the prefill leader at
// the answer, relayed inside the group) fails the request on decode — never decoded — and
// releases everything it held. The groups stop at the same step: the prefill leader decides it
// (workload exhausted, nothing in prefill, decode idle).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "cache/kv_pool.hpp"
#include "cache/state_pool.hpp"
#include "core/failpoint.hpp"
#include "core/rng.hpp"
#include "core/topology.hpp"
#include "runtime/experiment.hpp"
#include "runtime/model.hpp"
#include "runtime/scheduler.hpp"
#include "runtime/step_message.hpp"
#include "transfer/kv_transport.hpp"

namespace kvgrid {

enum class PdRole { None, Prefill, Decode };
// One record of a control message or of the records relayed inside a group: (kind, request, value).
using PdRecord = std::array<std::uint64_t, 3>;
// Kinds of StepMessage::pd records.
enum PdKind : std::uint64_t {
  kPdAdmitted = 1,  // D: (request, decode_prefix_len | slot << 32); relayed inside prefill
  kPdFinished = 2,  // D: (request, decode's modelled clock)
  kPdIdle = 3,      // D: (0, 1 if decode holds no request)
  kPdSent = 4,      // P: (request, modelled end of the transfer)
  kPdBroken = 5,    // P: (request, transfer layer from which it did not arrive; >= model.layers: the draft's)
  kPdFault = 6,     // relayed inside prefill: (request, transfer layer at which its transfer breaks)
  kPdAbort = 7,     // P: (request, 0) aborted by the prefill leader at this step (request.abort)
};

PdRole pd_role(const ExperimentConfig& exp, const RankGrid& grid);

// One leg of the suffix transfer seen from this rank: a peer of the other group and, for one local
// layer, the KV heads [head_begin, head_end) (indices into this rank's pool) it sends or receives.
// A sidecar leg (`sidecar` >= 0, the [[model.sidecar]]'s index in the model; layer and heads
// unused) moves the sidecar's words of the pages its source sends — every TP rank of the stage
// holding the source kind's first layer keeps the sidecar whole, so decode rank (tp, cp) takes them
// from prefill rank (tp mod prefill TP, cp mod prefill CP).
// CP-sharded pools (cache.cp_sharding): a page at prompt position i lives on shard rank i mod N of
// each side's shard group, so the leg between a prefill owner and a decode owner carries exactly the
// suffix pages whose position i ≡ `page_res` (mod `page_mod`), page_mod = lcm(N_prefill, N_decode)
// (the Chinese remainder of both owners' residues; a pair without a common residue has no leg).
// Unsharded sides have N = 1: page_mod 1, every page.
struct PdLeg {
  int peer = -1;
  std::size_t layer = 0;
  std::size_t head_begin = 0, head_end = 0;
  int sidecar = -1;
  std::uint32_t page_mod = 1, page_res = 0;
  bool draft = false;  // a layer of the draft model (speculative decoding; last stages only)
  bool operator==(const PdLeg&) const = default;
};
// This rank's legs (pure layout arithmetic: both sides derive the same pairs). Empty in a
// single-group world.
std::vector<PdLeg> pd_legs(const ExperimentConfig& exp, const TopologySpec& spec, const GridCoord& me);
// Speculative decoding in a P/D world: the suffix carries the draft's KV too (its layers after the
// target's: draft layer d is transfer layer model.layers + d, for tags and pd.transfer.fail's
// draw), except with target_only, whose draft gets nothing back from any copy.
bool pd_sends_draft(const ExperimentConfig& exp);

struct PdStats {
  std::int64_t sent_tokens = 0, sent_bytes = 0, broken = 0;  // prefill ranks, counted at the send
  // What this prefill rank sent, by kind (hybrid models; per request whose suffix went whole):
  // FULL pages (of its FULL layers), SWA pages (of its SWA layers) and MAMBA states.
  std::int64_t sent_full_pages = 0, sent_swa_pages = 0, sent_states = 0;
  std::int64_t failed = 0;                                   // decode: requests failed by a broken transfer
  std::int64_t restore_failed = 0;                           // decode: requests failed by a broken restore
};

class PdLink {
 public:
  PdLink(const ExperimentConfig& exp, const RankGrid& grid, cache::KvPool& pool, FailpointRegistry& faults,
         double kv_bytes_scale);
  PdRole role() const { return role_; }
  // Hybrid models: the SWA layers' pool and the MAMBA layers' states (null: none of that kind
  // here). Their legs move the prompt's tail window (pd_swa_from) and the state at its end.
  // `sidecars`: this stage's sidecar payloads and their specs (rank_stack.hpp); their legs move the
  // words of the FULL pages or SWA pages the transfer sends.
  void attach_hybrid(cache::KvPool* swa_pool, cache::StatePool* states,
                     std::vector<cache::unified::PayloadSidecar*> sidecars = {}, std::vector<SidecarConfig> specs = {});
  // Speculative decoding (pd_sends_draft), the last stage: the draft's device pool, whose pages of
  // the suffix its legs move, and a hybrid draft's SWA pool and states (at the target's SWA page
  // ids and state slots: its legs move the tail window and the state at the prompt's end, as the
  // target's do).
  void attach_draft(cache::KvPool* draft_pool, cache::KvPool* draft_swa_pool = nullptr,
                    cache::StatePool* draft_states = nullptr);

  // Leaders' control messages (blocking, watchdog included).
  void send_control(const StepMessage& m);
  // After the last step: waits for the control messages still in flight.
  void drain() { sender_.drain(true); }
  StepMessage recv_control(std::int64_t step);

  // Prefill leader, at the start of step s > 0: decode's answers D(s − 1). Its admissions become
  // records for the prefill group (`relay`, each with its pd.transfer.fail draw) and move `clock`
  // to when decode sent them (+ the link latency: prefill cannot start a request before it heard
  // the answer); finished requests go to `finished(id, decode's clock)`.
  struct DecodeAnswers {
    std::uint64_t clock_ns = 0;  // decode's clock at the answer
    bool idle = false;           // decode holds no request
  };
  DecodeAnswers receive_answers(std::int64_t step, std::uint64_t& clock, std::vector<PdRecord>& relay,
                                const std::function<void(RequestId, std::uint64_t)>& finished);
  // Prefill leader: P(s) — this step's inputs as decode gets them (arrivals as they are, exhausted,
  // stop), the records in `to_peer` (emptied) and this step's aborts (decode releases them too).
  void send_requests(const StepMessage& in, std::vector<PdRecord>& to_peer);
  // Decode leader, at the end of a step that is not the last: D(s) — the records in `to_peer`
  // (emptied), idle, and its clock.
  void send_answers(std::uint64_t clock_ns, bool idle, std::vector<PdRecord>& to_peer);
  // After the loop, collective over the world: the first prefill rank's sent tokens and the first
  // decode rank's received tokens, failures and requests finished and failed (decode's view is
  // the world's: it decodes them), on every rank. `mine`: this rank's result.
  struct WorldTotals {
    std::int64_t sent_tokens = 0, received_tokens = 0, failed = 0, restore_failed = 0;
    std::int64_t finished_requests = 0, failed_requests = 0;
  };
  WorldTotals world_totals(std::int64_t received_tokens, std::int64_t finished, std::int64_t failed) const;
  // Every prefill rank: the group's relayed records.
  void on_prefill_records(const std::vector<PdRecord>& pd);
  bool bootstrapped(RequestId id) const { return boot_.count(id.value()) > 0; }
  // Every prefill rank, after the step's forward: sends the suffix of each entry that finished its
  // prefill; returns the leader's announcements (kPdSent / kPdBroken) for the next P.
  // The leader (`announcer`) also draws p2p.delay for each: decode sees that transfer end later.
  std::vector<PdRecord> send_suffixes(const std::vector<BatchEntry>& batch, std::uint64_t clock_ns,
                                                          std::int64_t step, bool announcer);

  // Every decode rank: a transfer slot and the suffix's receives for each admitted request;
  // returns the leader's kPdAdmitted records.
  std::vector<PdRecord> post_receives(const std::vector<ServeRequest*>& admitted);
  // The request's receives are complete (after P said it was sent); frees its slot.
  void finish_receive(ServeRequest& r);
  // P/D abort: decode withdraws the receives of a request prefill will never send (frees its
  // slot); prefill forgets its bootstrap.
  void cancel_receive(ServeRequest& r);
  void forget(RequestId id) { boot_.erase(id.value()); }

  const PdStats& stats() const { return stats_; }
  PdStats& stats() { return stats_; }

 private:
  struct Boot {
    std::uint64_t dpl = 0;
    std::uint32_t slot = 0;
    std::uint64_t breaks_at = ~0ULL;  // transfer layer (PdLink::transfer_layer)
  };
  int tag(std::uint32_t slot, const PdLeg& leg) const;
  // Sidecar legs: this rank's sidecar of the leg, and the source slots whose words it moves.
  std::size_t local_sidecar(const PdLeg& leg) const;
  std::vector<std::uint32_t> sidecar_slots(const PdLeg& leg, const ServeRequest& r, std::size_t dpl) const;
  // The prompt's tail window (pd_swa_from): its first page, and the request's SWA pages from there.
  std::size_t tail_window_page(std::size_t dpl, std::size_t prompt) const;
  std::vector<PageId> tail_window(const ServeRequest& r, std::size_t dpl) const;
  // `withdrawn`: its receives were cancelled — a message already on its way would match the next
  // receive on those tags, so the slot is retired and a fresh one (new tags) joins the free list,
  // as long as the tags stay under MPI's guaranteed bound.
  void release_slot(ServeRequest& r, bool withdrawn = false);
  std::uint64_t global_layer(std::size_t local_layer) const;
  // The leg's layer in the transfer's order: the target's global layer, or model.layers + d for
  // the draft's layer d.
  std::uint64_t transfer_layer(const PdLeg& leg) const;
  // The blocks leg `leg` moves for request r with decode_prefix_len `dpl`: FULL pages of
  // [dpl, prompt), SWA pages of [pd_swa_from, prompt) or the slice of the MAMBA state.
  std::vector<transfer::Block> leg_blocks(const PdLeg& leg, const ServeRequest& r, std::size_t dpl);
  // The same for a layer leg of model `g` (the target's or the draft's) over its pools.
  std::vector<transfer::Block> layer_blocks(const ModelGeometry& g, cache::KvPool& full, cache::KvPool* swa,
                                            cache::StatePool* states, const PdLeg& leg, const ServeRequest& r,
                                            std::size_t dpl);
  PdRole role_;
  const ExperimentConfig& exp_;
  const RankGrid& grid_;
  cache::KvPool& pool_;
  cache::KvPool* swa_pool_ = nullptr;
  cache::StatePool* states_ = nullptr;
  cache::KvPool* draft_pool_ = nullptr;
  cache::KvPool* draft_swa_pool_ = nullptr;
  cache::StatePool* draft_states_ = nullptr;
  ModelGeometry draft_geo_;  // the draft's layers on this rank (a last stage of a world that sends it)
  std::uint64_t transfer_layers_ = 0;  // model.layers, + the draft's when the suffix carries it
  std::vector<cache::unified::PayloadSidecar*> sidecars_;
  std::vector<SidecarConfig> sidecar_specs_;
  ModelGeometry geo_;  // this rank's layers, their kinds and heads
  FailpointRegistry& faults_;
  double kv_bytes_scale_;
  std::vector<PdLeg> legs_;
  int leader_peer_ = -1;
  std::unique_ptr<transfer::KvTransport> link_;
  Sender sender_;
  std::map<std::uint64_t, Boot> boot_;
  std::vector<std::uint32_t> free_slots_;
  std::uint32_t next_slot_ = 0, slot_limit_ = 0;  // fresh slots for retired ones, below the tag bound
  std::vector<std::uint64_t> zeros_;
  Rng fault_rng_;
  PdStats stats_;
};

}  // namespace kvgrid
