// Draft-model state in the hierarchical cache (speculative decoding with HiCache).
//
// The draft model (MTP/EAGLE-style layers on the last pipeline stage) keeps its own KV next to the
// target's: a device pool indexed by the target's page ids, so every device page holds both. When
// the cache controller moves target pages between tiers, this module says what moves with them,
// for each layout the cache offers (which `model.draft.mode` variant runs is chosen in
// protocols/draft_restore, which states the invariant):
//
//   Packed       the draft's layers are extra tail layers of the target's host pool: one host
//                slot holds both (the draft's blocks must have the target's shape — heads per
//                rank, head_dim, dtype — checked at start-up); in storage the draft's layers are
//                inside the page object.
//   Sidecar      a separate draft host pool with its own layout and the target host pool's slot
//                count; copies use the target's host page ids (transfer indices derive from the
//                target KV). In storage every page has a second object, key + ".draft".
//   TargetOnly   only the target moves: a restored page's draft rows are cleared (nothing
//                restored them), so the draft reads a blind prefix.
//
// Backups and loads submit the draft's copies as their own batch after the target's on the same
// stream and hand out one joined event (transfer::join): a backup's ACK, and a load's last layer,
// complete only after the draft's copies did.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "cache/kv_pool.hpp"
#include "cache/state_pool.hpp"
#include "transfer/transfer_engine.hpp"

namespace kvgrid::cache {

enum class DraftLayout { Packed, Sidecar, TargetOnly };

class DraftState {
 public:
  // `device`: the draft's device pool. `target_host`: the target's host pool (null: no host tier);
  // with packed it must hold `target_layers` + draft layers (draft_host_layers). Throws InputError
  // when the mode cannot hold this draft (packed with an incompatible block shape).
  // `own_slots` > 0 with no `target_host`: the host tier has slots of this kind but the target no
  // bytes of it on this rank (a hybrid draft's kind on a last stage without a target layer of it):
  // packed and sidecar alike keep the draft's host copies in a pool of their own with that many
  // slots, at the target's host ids — a packed slot whose target part is empty.
  DraftState(DraftLayout layout, KvPool& device, KvPool* target_host, std::size_t target_layers, std::int64_t own_slots = 0);

  DraftLayout layout() const { return layout_; }
  KvPool& device() { return device_; }
  const KvPool& device() const { return device_; }
  // The pool a draft host copy lives in (null: target_only, or no host tier), and the first of its
  // layers that holds the draft's (packed: after the target's; sidecar: 0).
  const KvPool* host() const;
  KvPool* host() { return const_cast<KvPool*>(static_cast<const DraftState*>(this)->host()); }
  std::size_t host_layer0() const { return packed_ ? target_layers_ : 0; }

  // Device → host: the draft of device pages `device_pages` into host slots `host_pages` (the
  // target's host page ids). Empty for target_only.
  std::vector<transfer::Copy> backup_copies(std::span<const PageId> host_pages, std::span<const PageId> device_pages);
  // Host → device. target_only: no copies, and the draft rows of `device_pages` are cleared.
  std::vector<transfer::Copy> restore_copies(std::span<const PageId> device_pages, std::span<const PageId> host_pages);

  // Storage: sidecar keeps one object per page of its own (key + kObjectSuffix).
  static constexpr const char* kObjectSuffix = ".draft";
  bool separate_objects() const { return sidecar_ != nullptr; }
  std::size_t object_bytes() const;
  std::vector<std::uint8_t> object(PageId host_page) const;
  void load_object(PageId host_page, std::span<const std::uint8_t> bytes);

 private:
  DraftLayout layout_;
  bool packed_;  // the draft's rows are in the target's host slots (Packed, unless in a pool of its own)
  KvPool& device_;
  KvPool* target_host_;
  std::size_t target_layers_;
  std::unique_ptr<KvPool> sidecar_;
};

// A hybrid draft's recurrent states (its MAMBA layers, at the target's state slots) in the same
// three layouts over state slots: Packed — the target's host slot holds the draft's words after
// its own (`target_words`); Sidecar — a host state pool of its own with the target's slot count;
// TargetOnly — nothing moves, a restored slot's draft words are poisoned (the draft reads garbage).
class DraftStates {
 public:
  // (`own_slots`: as DraftState's — a pool of the draft's own when the target has no states here)
  DraftStates(DraftLayout layout, StatePool& device, StatePool* target_host, std::size_t target_words,
              std::int64_t own_slots = 0);
  // Device → host / host → device of one slot (nullopt: nothing to copy).
  std::optional<transfer::Copy> backup_copy(std::uint32_t host_slot, std::uint32_t device_slot);
  std::optional<transfer::Copy> restore_copy(std::uint32_t device_slot, std::uint32_t host_slot);
  // Words a packed draft adds to each host slot (0: other layouts).
  std::size_t packed_words() const { return layout_ == DraftLayout::Packed && !sidecar_ ? device_.words_per_slot() : 0; }
  // The pool a draft host state lives in (null: target_only, or no host tier) and the first of its
  // words that are the draft's (packed: after the target's; its own pool: 0).
  const StatePool* host() const { return sidecar_ ? sidecar_.get() : layout_ == DraftLayout::Packed ? target_host_ : nullptr; }
  std::size_t host_word0() const { return sidecar_ ? 0 : target_words_; }
  std::size_t device_words() const { return device_.words_per_slot(); }
  // Sidecar: the draft's host states (at the target's host slots); null otherwise.
  StatePool* sidecar() { return sidecar_.get(); }
  const StatePool* sidecar() const { return sidecar_.get(); }

 private:
  DraftLayout layout_;
  StatePool& device_;
  StatePool* target_host_;
  std::size_t target_words_;
  std::unique_ptr<StatePool> sidecar_;
};

// Why this draft cannot use `layout` (empty: it can): Packed shares the target's host slots, so the
// draft's rows must have the target's shape (KV heads, head_dim, dtype).
struct DraftRowShape {
  std::int64_t kv_heads = 0, head_dim = 0;
  std::string dtype;
};
std::string draft_layout_problem(DraftLayout layout, const DraftRowShape& draft, const DraftRowShape& target);
// Layers of the target's host pool for this layout (Packed: the target's and the draft's).
std::size_t draft_host_layers(DraftLayout layout, std::size_t target_layers, std::size_t draft_layers);

}  // namespace kvgrid::cache
