// The device tier of a hybrid model (full attention + sliding-window attention + recurrent
// layers) on one rank: the unified tree core (unified_tree.hpp) with FULL, SWA and MAMBA
// components, and one pool per index space — FULL pages in the rank's DevicePool, SWA pages and
// MAMBA state slots in their own SlotPools. DeviceCache hands every call of a hybrid run here.
//
// A request's life, decision by decision (every one recorded in the decision log):
//  * reserve: match (the deepest boundary every component accepts: FULL holds every page, the
//    last W tokens before it are live SWA pages, a MAMBA state sits exactly there) → lock (FULL:
//    the path; SWA: the tail window; MAMBA: the node) → FULL pages for the rest of its positions
//    and two MAMBA slots (its running state and a checkpoint), evicting each component's LRU
//    victims to make room, all or nothing → the matched state copied into its running slot (the
//    match finalizer's copy: the request advances its private copy, never the tree's).
//  * prepare (each step, before the forward): SWA pages for the positions the step computes —
//    SWA pages are taken as the request goes, since it frees them again as its window moves on.
//    Admission sets aside the most a request can hold at once (its own pages of a chunk and a
//    window, and the tree's window pages it locks: 2·⌈W/p⌉ + ⌈chunk/p⌉ + 2 pages) and admits only
//    while the running requests' footprints fit the pool, so every step finds its pages (a
//    request that cannot get them would sit the step out).
//  * advance (after each forward): the depth of its checkpoint (the deepest grid depth the
//    forward passed: the model saved the state there), and its own SWA pages wholly before the window it still needs
//    (the window of its page-aligned length) are freed, and its lock on the tree's window goes
//    once decode has passed it.
//  * insert (each prefill chunk, and at commit): the page-aligned computed prefix with its FULL
//    pages, its SWA pages from where it freed up to the end (the tree keeps only the window
//    before the end: the rest becomes or stays tombstones, a tombstone inside the window is
//    healed), and its checkpoint state at the deepest grid depth it passed; pages the tree
//    already held replace the request's own in its page tables; the lock moves to the new end.
//  * commit / abort: what it still holds privately goes back to the pools.
// Planted bugs of this file (cache.component_bugs, cache/component_bugs.hpp): heal_frees_stale and
// unfinished_insert_live (advance, insert_computed), state_at_floor (advance), shared_state_slot
// and read_past_boundary (reserve).
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "cache/component_bugs.hpp"
#include "cache/device_pool.hpp"
#include "cache/hybrid_host_tier.hpp"
#include "cache/storage_tier.hpp"
#include "cache/unified_components.hpp"
#include "cache/unified_tree.hpp"
#include "core/decision_log.hpp"

namespace kvgrid::cache {

struct Reservation;

// A finished request's session (0: none) and the generation it arrived with.
struct SessionTag {
  std::uint64_t session = 0, generation = 0;
};

struct HybridCacheConfig {
  Tokens page_size{16};
  bool swa = false;
  Tokens window{0};       // SWA window W
  Pages swa_pages{0};
  bool mamba = false;
  Tokens mamba_chunk{0};  // checkpoint grid
  std::int64_t mamba_slots = 0;
  Tokens chunk_tokens{512};  // the scheduler's prefill chunk (a request's SWA footprint, below)
  // Payload pools following FULL's or SWA's page ids ([[model.sidecar]]).
  struct Sidecar {
    std::string name;
    bool swa = false;  // source: SWA (else FULL)
    std::size_t words_per_token = 1;
  };
  std::vector<Sidecar> sidecars;
  ComponentBugs bugs;  // planted bugs (cache.component_bugs; empty: the correct code)
  // Sessions: tracked (references registered, for eviction order or only for the forced-eviction
  // count) unless off (P/D prefill: decode holds the references); `sessions.order` when
  // cache.eviction is session-aware.
  bool track_sessions = true;
  unified::SessionPolicy sessions;
};

// P/D: where the SWA pages prefill sends for a prompt of `prompt` tokens start, when decode
// matched `matched` — the page holding position prompt - W + 1 (the first of the window
// (prompt - W, prompt] its first decode query reads), or the match's end if that is later.
inline Tokens pd_swa_from(Tokens matched, Tokens prompt, Tokens window, Tokens page) {
  const std::int64_t tail = std::max<std::int64_t>(0, prompt.value() - window.value() + 1) / page.value() * page.value();
  return std::max(matched, Tokens(tail));
}

// What a running request holds of the hybrid components (Reservation::hybrid).
struct HybridHold {
  unified::LockHandle lock;             // on the node ending its shared prefix
  unified::SwaRequest swa;              // its own SWA pages from swa.own_from (swa.lock = &lock)
  std::vector<std::uint32_t> swa_table;  // SWA page of each page of the request (0: none held)
  std::uint32_t mamba = 0;               // its running state (the slot the forward advances)
  std::uint32_t mamba_own = 0;           // the slot it owns (= mamba, except under shared_state_slot)
  std::uint32_t mamba_ckpt = 0;          // its checkpoint slot (0: none)
  Tokens ckpt_at{0};                     // depth of the state in mamba_ckpt (0: none yet)
  std::int64_t swa_budget = 0;           // SWA pages set aside for it at admission (its footprint)
  // Load-back copies of SWA pages and MAMBA states: they land before its first forward reads
  // (FULL's per-layer copies are Reservation::load_events).
  std::vector<transfer::Event> state_events;
  // A private load-back (HybridCache::set_private_restores) whose outcome is not agreed yet: the
  // loaded positions [shared, matched) are the request's own — FULL pages in its page table, the
  // window's SWA pages as its own, the state in its checkpoint slot — and the host path they are
  // copied from stays locked (restore_lock) until confirm_restore or drop_restore.
  bool restoring = false;
  unified::LockHandle restore_lock;
};

struct HybridCounters {
  std::int64_t tombstones_made = 0;    // SWA pages an insert left as tombstones
  std::int64_t tombstones_healed = 0;  // SWA tombstone pages an insert made live again
  std::int64_t swa_freed = 0;          // SWA pages running requests freed as their window moved on
  std::int64_t windows_released = 0;   // SWA window locks released early (decode passed them)
  std::int64_t states_copied = 0;      // MAMBA states copied into a request's private slot
  std::int64_t states_saved = 0;       // MAMBA checkpoints the tree took
  std::int64_t swa_waits = 0;          // steps a request sat out for lack of SWA pages
  std::int64_t load_failed = 0;            // load-backs agreed broken and taken back (transfer.load.fail)
  std::int64_t load_recomputed_tokens = 0;  // the positions they would have brought, computed instead
  // What each rule cost at admission, summed over admitted requests: the prefix FULL alone would
  // have reused, and per component how much of it that component's rule (with FULL's) would cut —
  // the two may overlap (both reject the same boundary).
  std::int64_t full_alone_tokens = 0, swa_cost_tokens = 0, mamba_cost_tokens = 0;
};

class HybridCache {
 public:
  HybridCache(const HybridCacheConfig& cfg, DevicePool& full_pool, DecisionLog& log);

  std::optional<Reservation> reserve(RequestId id, std::span<const TokenId> prompt, Tokens kv_tokens, Tokens max_match);
  bool prepare(RequestId id, Reservation& r, Tokens end);
  // After a forward of [start, computed): the checkpoint's depth, and the SWA pages left behind.
  // `decode`: a decode step (one token, or several with speculative decoding's accepted drafts).
  void advance(Reservation& r, Tokens start, Tokens computed, bool decode = false);
  // `last`: the commit's insert (no fresh checkpoint slot is taken for a request that ends).
  void insert_computed(RequestId id, Reservation& r, std::span<const TokenId> computed_tokens, bool last = false);
  // `session`: a finished request of a tracked session registers, per component, the region its
  // next turn can reuse (before its lock goes).
  void commit(RequestId id, Reservation& r, std::span<const TokenId> kv_tokens, SessionTag session = {});
  void abort(RequestId id, Reservation& r);
  // Sessions (decisions in the log: session_open, session_close, session_arrival, session_register).
  void session_event(bool open, std::uint64_t session);
  std::uint64_t session_arrival(RequestId id, std::uint64_t session);

  // P/D decode (protocol.pd = decode_reuse): the request's prompt KV beyond its match comes from
  // prefill — FULL pages of [matched, prompt), SWA pages of the prompt's tail window only
  // (pd_swa_from: what its first decode query reads; prefill freed the rest as it went) and the
  // MAMBA state at the prompt's end. `expect_suffix` takes the SWA pages the receive lands in
  // (before the receives are posted; false: none to be had — the admission budget rules it out);
  // `suffix_received` once the KV arrived: a prompt ending on the checkpoint grid makes the
  // received state the request's checkpoint (its commit gives the tree the state there).
  bool expect_suffix(RequestId id, Reservation& r, Tokens prompt);
  void suffix_received(Reservation& r, Tokens prompt);
  // The boundary reserve() would reuse, without touching LRU.
  Tokens peek_hit(std::span<const TokenId> prompt) { return tree_.peek_prefix(prompt).matched; }

  // Freed SWA pages and MAMBA slots go through these (the model's pools poison them); a matched
  // state is copied with `copy_state(src, dst)`.
  void set_on_swa_free(std::function<void(std::span<const PageId>)> f) { on_swa_free_ = std::move(f); }
  void set_on_state_free(std::function<void(std::span<const std::uint32_t>)> f) { on_state_free_ = std::move(f); }
  void set_copy_state(std::function<void(std::uint32_t, std::uint32_t)> f) { copy_state_ = std::move(f); }
  // An admission's allocation outcome from what this rank found (device.alloc.fail: agreed over
  // the stage, or PP0's relayed; DeviceCache::decide_allocation). Unset: this rank's.
  void set_allocation_decider(std::function<bool(RequestId, bool)> f) { decide_allocation_ = std::move(f); }

  // Adds the host tier (hybrid_host_tier.hpp): backups after inserts, load-backs in reserve().
  void attach_host_tier(HybridHostConfig cfg, HybridBytes bytes, transfer::TransferEngine& engine, AckAgreement& agreement);
  HybridHostTier* host_tier() { return host_.get(); }
  // Load-backs that can fail (transfer.load.fail, protocol.load_back = agreed; one stage): each
  // load-back's copies land and their outcome is agreed over the stage inside the admission; a
  // broken one is taken back whole (the request computes those positions).
  void set_agreed_loads(bool on) { agreed_loads_ = on; }
  // Load-backs that can fail across pipeline stages (protocol.load_back = agreed, PP > 1): a
  // load-back is private (HybridHold::restoring) until its outcome, agreed over every stage a step
  // later, is applied — confirm_restore: the request computes on from its whole match and its next
  // insert publishes what was loaded as if computed; drop_restore: the loaded FULL pages stay its
  // own (returned for the caller to reset), the loaded SWA pages go back, the running state is the
  // device boundary's again and matched shrinks to shared.
  void set_private_restores(bool on) { private_restores_ = on; }
  void confirm_restore(RequestId id, Reservation& r, bool ok);
  std::vector<PageId> drop_restore(RequestId id, Reservation& r);
  // A storage tier over this cache's tree and host tier (hybrid_storage_site.hpp; needs the host
  // tier): objects per component, written when backups publish, prefetched as host copies.
  std::unique_ptr<StorageTier> make_storage_tier(StorageTierConfig cfg, AckAgreement& agreement);
  const HybridHostTier* host_tier() const { return host_.get(); }

  // Tree invariants (unified verify with every pool's accounts) and FULL: tree + reserved = used.
  void verify() const;
  std::uint64_t digest() const { return tree_.digest(); }
  Pages reserved_pages() const { return reserved_; }
  std::vector<PageId> cached_pages() const;
  const unified::UnifiedTree& tree() const { return tree_; }
  // The i-th sidecar's payload (the model writes and reads it; the tree drops what its source gives up).
  unified::PayloadSidecar* sidecar(std::size_t i) { return sidecars_[i]; }
  const HybridCounters& counters() const { return counters_; }
  const unified::SlotPool& swa_pool() const { return swa_pool_; }
  const unified::SlotPool& mamba_pool() const { return mamba_pool_; }
  bool has_swa() const { return cfg_.swa; }
  // Why the latest reserve() refused (for a run that can never admit a request).
  const std::string& last_refusal() const { return last_refusal_; }
  // Whether the last refusal was an injected allocation failure (device.alloc.fail): the request
  // waits for a later step like any other, even with nothing running.
  bool last_refusal_injected() const { return last_refusal_injected_; }
  bool has_mamba() const { return cfg_.mamba; }

 private:
  // Evicts component c until `want` of its slots are free (or nothing is left); records it.
  void make_room(unified::ComponentId c, std::int64_t want, std::int64_t free_now, Pages* evicted);
  void release(const unified::EvictResult& e, Pages* evicted);
  void free_swa(std::span<const unified::Slot> s);
  // A request's own SWA pages go back to the pool (their sidecar entries dropped).
  void release_own_swa(HybridHold& h);
  void free_states(std::span<const std::uint32_t> s);
  std::optional<std::vector<unified::Slot>> alloc_swa(std::int64_t n);
  std::optional<std::uint32_t> alloc_state();
  void relock(HybridHold& h, unified::Node* node);
  // The host part of `m` back on the device (as much as the pools can take), then m re-matched:
  // its device boundary is what was loaded. `r` collects the copies' events and evictions.
  void load_back(RequestId id, std::span<const TokenId> view, unified::MatchResult& m, Reservation& r, HybridHold& h);
  // A private load-back of `items` (planned and locked at the match) into the admitted request's
  // own slots; false (nothing copied) when its SWA pages cannot be had.
  bool load_privately(RequestId id, Reservation& r, HybridHold& h, const std::vector<unified::LoadItem>& items, Tokens target);
  // The #19 check of a load-back that restored `swa_loaded` SWA pages.
  void check_window(RequestId id, std::int64_t swa_loaded);
  std::optional<std::vector<unified::Slot>> alloc_device(unified::ComponentId c, std::int64_t n, Pages* evicted);
  void debug_verify() const;

  HybridCacheConfig cfg_;
  unified::UnifiedTree tree_;
  unified::ComponentId full_{0}, swa_{0}, mamba_{0};
  const unified::SwaComponent* swa_comp_ = nullptr;
  std::vector<unified::PayloadSidecar*> sidecars_;  // owned by the tree
  DevicePool& full_pool_;
  unified::SlotPool swa_pool_, mamba_pool_;
  DecisionLog& log_;
  Pages reserved_{0};             // FULL pages held privately by requests
  std::int64_t swa_held_ = 0;     // SWA pages held by requests
  std::int64_t swa_budget_ = 0;   // the running requests' SWA footprints (admission keeps it <= the pool)
  std::int64_t states_held_ = 0;  // MAMBA slots held by requests
  HybridCounters counters_;
  std::string last_refusal_;
  bool last_refusal_injected_ = false;
  // heal_frees_stale only: the SWA page each FULL page's position had when its request released it
  // (SGLang's FULL->SWA index mapping, left stale on tombstones).
  std::unordered_map<std::uint32_t, std::uint32_t> full_to_swa_;
  std::function<void(std::span<const PageId>)> on_swa_free_;
  std::function<void(std::span<const std::uint32_t>)> on_state_free_;
  std::function<void(std::uint32_t, std::uint32_t)> copy_state_;
  std::function<bool(RequestId, bool)> decide_allocation_;
  bool agreed_loads_ = false;            // load-backs agreed before they are read (set_agreed_loads)
  bool private_restores_ = false;        // load-backs private until agreed (set_private_restores)
  AckAgreement* agreement_ = nullptr;    // the stage's (the host tier's)
  std::unique_ptr<HybridHostTier> host_;
  std::string window_breach_;  // the first load-back that restored more SWA pages than a window (none: empty)
};

}  // namespace kvgrid::cache
