// The synthetic model on one rank, and the oracle that checks it (kernels/kv_math.hpp has the
// arithmetic).
//
// SyntheticModel::forward computes a request's positions [start, end) for this rank's layers
// (a contiguous PP slice), KV heads (MHA: a TP slice; MLA: the one latent, replicated) and query
// tokens (a CP slice: interleave or zigzag). It writes the new tokens' KV into their pages and
// reads KV only from pages: the cached prefix [0, start) is folded from the pool the first time a
// request is computed on this rank (after a cache hit, or after a page is (re)loaded), and the
// new tokens are read back from the pool (full) or from the scratch features (digest). The
// result is one partial attention checksum per local layer; summing them over the stage (TP and
// CP) gives C_l, and a stage chains its layers with `chain`.
//
// Oracle::expected computes the whole chain from the tokens alone, never from pages or from the
// model's running fold; every value is bound to its position, layer, head and element, so a
// misplaced value is a mismatch as surely as a wrong one.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cache/kv_pool.hpp"
#include "cache/state_pool.hpp"
#include "cache/unified_components.hpp"
#include "core/ids.hpp"
#include "core/topology.hpp"
#include "runtime/experiment.hpp"

namespace kvgrid {

struct ModelGeometry {
  std::uint64_t layers = 1, heads = 1, head_dim = 1;  // model-wide (heads: KV heads, or query heads for MLA)
  bool mla = false;
  std::uint64_t layer_begin = 0, layer_end = 1;       // this stage's slice [begin, end)
  std::vector<std::uint32_t> kv_heads;                // KV heads stored here (global ids)
  std::vector<std::uint32_t> query_heads;             // query heads computed here (global ids)
  int cp_rank = 0, cp_size = 1;
  bool zigzag = false;
  std::uint64_t first_layer = 0;  // global id of the model's layer 0 (a draft's: kDraftLayer0)
  // Hybrid models (empty `model_kinds`: every layer is full attention). The k-th layer of a kind
  // has the kv math's id of that kind (kernels/kv_math.hpp: k, kSwaLayer0 + k, kMambaLayer0 + k).
  std::vector<LayerKind> model_kinds;  // every layer of the model
  std::vector<LayerKind> kinds;        // this stage's layers
  std::uint64_t kind_first[kLayerKinds] = {0, 0, 0};  // kind index of this stage's first layer of each kind
  std::uint64_t swa_window = 0, mamba_chunk = 0, mamba_state = 0;
  std::vector<SidecarConfig> sidecars;  // [[model.sidecar]]

  static ModelGeometry for_rank(const ExperimentConfig& exp, const GridCoord& c, const GridShape& s);
  // The draft model ([model.draft]) on a last-stage rank: all its layers, its heads split like the
  // target's, layer ids from kDraftLayer0 (its own KV coefficients).
  static ModelGeometry draft_for_rank(const ExperimentConfig& exp, const GridCoord& c, const GridShape& s);
  static constexpr std::uint64_t kDraftLayer0 = 1u << 20;
  std::uint64_t local_layers() const { return layer_end - layer_begin; }
  bool hybrid() const { return !model_kinds.empty(); }
  LayerKind kind(std::size_t local_layer) const { return kinds.empty() ? LayerKind::Full : kinds[local_layer]; }
  std::size_t local_of(LayerKind k) const;  // this stage's layers of kind k
  // The kv math's id of the i-th local layer of kind k (the FULL pool's layer_base: i = 0).
  std::uint64_t layer_id(LayerKind k, std::size_t i) const;
  // Whether this CP rank computes query position `pos` of a chunk [start, end).
  bool owns_query(std::size_t pos, std::size_t start, std::size_t end) const;
};

// Hybrid models: where a request's SWA and MAMBA data live (the hybrid cache's reservation).
struct HybridTables {
  std::span<const std::uint32_t> swa;  // SWA page per page of the request (0: none held)
  std::uint32_t mamba = 0;             // the request's private state slot
  std::uint32_t mamba_ckpt = 0;        // where a state at a checkpoint depth is saved (0: nowhere)
};

// A request's model state on one rank.
struct ModelRequestState {
  bool primed = false;
  std::uint64_t ph = 0;              // prefix hash through position hashed - 1
  std::size_t hashed = 0;
  std::vector<std::uint64_t> run;    // [local layer][local KV head]: fold of positions < computed
  std::vector<std::uint64_t> sidecar_run;  // per FULL-source sidecar: fold of positions < computed
  // The prompt's prefix hash at every mark_stride tokens, where the workload made them with it
  // (RequestSpec::prefix_marks; empty: none): forward() takes a chunk's chain from the last one at
  // or below its start instead of hashing the cached prefix again.
  std::vector<std::uint64_t> marks;
  std::uint32_t mark_stride = 0;
};

class SyntheticModel {
 public:
  // `pool` holds the FULL layers (all layers of a full-attention model).
  SyntheticModel(ModelGeometry g, cache::KvPool& pool, Tokens page_size);
  // Hybrid models: the SWA layers' pool (full payload: per-token values, one word per head in
  // digest runs) and the MAMBA layers' states.
  void attach_hybrid(cache::KvPool* swa_pool, cache::StatePool* states);
  // Sidecars ([[model.sidecar]]): payload pools indexed by their source's page ids (FULL: the
  // page table; SWA: the SWA table). Each is a verifiable payload with its own layer id
  // (kSidecarLayer0 + i), written with the tokens and read back like its source's attention
  // (FULL: every position <= q; SWA: the window), its fold added to the checksum of this
  // stage's first layer of the source kind, on one rank of the stage. An entry missing where it
  // is read (its source's page moved without it) reads as poison.
  void attach_sidecars(std::vector<cache::unified::PayloadSidecar*> sidecars, std::vector<SidecarConfig> specs);

  // CP sharding: the cached prefix of a sharded pool is read through the layer gather
  // (protocols/layer_gather.hpp), which adds it into `st.run`; call this first. forward() then
  // continues from it (and refuses to read a sharded prefix itself).
  void prime_for_gather(ModelRequestState& st) const;

  // out[l] = this rank's partial checksum of local layer l for positions [start, end).
  // Sharded pools: the chunk's KV is staged (all its tokens, for this rank's attention) and only
  // the tokens of pages this rank owns are written to the pool.
  // `before_layer(l)` (optional) is called before the cached prefix's pages of local layer l are
  // read: a layer-wise load-back waits there for layer l's copy only.
  // Hybrid models: SWA layers attend to (q - W, q] read from the SWA pool through `ht.swa`; MAMBA
  // layers advance the state in slot `ht.mamba` (its words as they are when the request first
  // computes here: a reused state was copied there) and save it into `ht.mamba_ckpt` at every
  // multiple of the checkpoint grid they pass.
  void forward(ModelRequestState& st, std::span<const TokenId> tokens, std::size_t start, std::size_t end,
               std::span<const PageId> page_table, std::span<std::uint64_t> out,
               const std::function<void(std::size_t)>& before_layer = {}, const HybridTables& ht = {});

  // engine.decode = fused (runtime/fused_decode.cpp): a span of one-token decode steps of one
  // request of a full-attention model. decode_token(tokens, out) gives out[l] exactly as
  // forward() of [pos, pos + 1) at pos = st.hashed does, and advances st.ph and st.hashed as
  // forward does. With full payload (or a sharded pool, or CP) it is that forward. With digest
  // payload, an unsharded pool and every query owned (one rank), layer l's output is
  // d_l G + Q_l G w, with d_l = Σ_h q_lh run_lh and Q_l = Σ_h q_lh c_lh; the token's weight w
  // adds Q_l w to d_l, so a step costs O(layers) words instead of O(layers × heads). The span's
  // KV is written to the pool in one launch, and st.run advanced by c_k Σ w, at end_decode_span —
  // the same words, modulo 2^64, as a write and a fold per step. Until then the pool and st.run
  // lag behind: nothing may read them (a fused span has no check, no transfer and no other
  // request).
  void begin_decode_span(ModelRequestState& st, std::span<const PageId> page_table);
  void decode_token(std::span<const TokenId> tokens, std::span<std::uint64_t> out);
  void end_decode_span();

  const ModelGeometry& geometry() const { return g_; }

 private:
  void forward_swa(std::size_t start, std::size_t end, const HybridTables& ht, std::span<std::uint64_t> out);
  // Digest mode's FULL layers in one pass over the chunk (model.cpp), and what follows them.
  void forward_digest(ModelRequestState& st, std::size_t start, std::size_t end, std::span<std::uint64_t> full_out);
  void finish_forward(ModelRequestState& st, bool first, std::size_t start, std::size_t end,
                      std::span<const PageId> page_table, const HybridTables& ht, std::span<std::uint64_t> out);
  void forward_sidecars(ModelRequestState& st, bool first, std::size_t start, std::size_t end,
                        std::span<const PageId> page_table, const HybridTables& ht);
  std::uint64_t sidecar_fold(std::size_t i, std::uint32_t slot, std::size_t pos) const;
  void forward_mamba(bool first, std::size_t start, std::size_t end, const HybridTables& ht, std::span<std::uint64_t> out);
  std::vector<std::uint64_t> query_coefs(LayerKind k) const;

  ModelGeometry g_;
  cache::KvPool& pool_;
  std::size_t page_size_;
  std::vector<std::uint64_t> qcoef_;  // [local full layer][local KV head]: sum of N(l, qh) over its query heads here
  cache::KvPool* swa_pool_ = nullptr;
  cache::StatePool* states_ = nullptr;
  std::vector<std::uint64_t> qcoef_swa_, qcoef_mamba_;  // the same for the SWA and MAMBA layers
  std::vector<std::uint64_t> kind_out_[kLayerKinds];    // hybrid: each kind's checksums, scattered into out
  std::vector<cache::unified::PayloadSidecar*> sidecars_;
  std::vector<SidecarConfig> sidecar_specs_;
  bool sidecar_owner_ = false;  // this rank adds the sidecars' folds (one rank per stage)
  std::vector<std::uint32_t> win_pages_, win_slots_;
  std::vector<std::uint64_t> win_F_, win_folds_;
  std::vector<std::size_t> missing_;  // forward_swa: window positions whose page is not held
  // full payload, sharded pool: the current chunk's KV, staged for attention (row 0: padding)
  std::unique_ptr<cache::KvPool> staging_;
  // The open decode span (begin_decode_span): its request, page table, d_l and Q_l, Σ w, and the
  // pages, slots and features of its tokens not yet written.
  struct DecodeSpan {
    ModelRequestState* st = nullptr;
    bool digest = false;  // the O(layers) path (else each token through forward)
    std::span<const PageId> pages;
    std::vector<std::uint64_t> d, Q;
    std::uint64_t W = 0;
    std::vector<std::uint32_t> kv_pages, kv_slots;
    std::vector<std::uint64_t> kv_F;
  } span_;
  // scratch
  std::vector<std::uint32_t> pages_, slots_, stage_pages_;
  std::vector<std::uint64_t> F_, G_, folds_, w_;
};

// The value a chunk enters the pipeline with (the draft's chain: `draft` = true).
std::uint64_t chain_seed(RequestId id, std::size_t start, std::size_t end, bool draft = false);
// A stage's output: the input chained with each of its layers' checksums, in layer order.
std::uint64_t chain(std::uint64_t in, std::span<const std::uint64_t> layer_checksums);

struct OracleRequestState {
  std::uint64_t ph = 0, S = 0;  // prefix hash and sum of R * F over positions < hashed
  std::size_t hashed = 0;
  std::vector<std::uint64_t> S_at;   // hybrid with SWA layers: S after each position
  std::vector<std::uint64_t> state;  // hybrid with MAMBA layers: [mamba layer][state head][word]
};

class Oracle {
 public:
  // `page_size`: the positions' page-table binding (kernels/kv_math.hpp R(t)).
  Oracle(const ModelGeometry& g, Tokens page_size);
  // The checksum the last stage must produce for positions [start, end) (from tokens alone).
  std::uint64_t expected(OracleRequestState& st, RequestId id, std::span<const TokenId> tokens, std::size_t start,
                         std::size_t end) const;

 private:
  std::vector<std::uint64_t> K_;  // per layer: sum over heads of N * M (MAMBA: unused)
  std::uint64_t page_size_;
  std::vector<std::uint64_t> slot_coef_;  // P(s) per slot of a page (R(t) = Q(t / page) P(t % page))
  bool draft_ = false;            // a draft model's oracle (its own chain seed)
  // hybrid
  std::vector<LayerKind> kinds_;
  std::uint64_t window_ = 0, words_ = 0, state_heads_ = 0;
  bool swa_ = false;  // some layer attends to a window
  std::vector<std::uint64_t> mamba_ids_;                 // per MAMBA layer: its id
  std::vector<std::pair<LayerKind, std::uint64_t>> sidecars_;  // per sidecar: source kind, N * M of its id
  std::vector<std::vector<std::uint64_t>> mamba_N_;      // per MAMBA layer, per state head: sum of N over its query heads
};

}  // namespace kvgrid
