#include "runtime/model.hpp"

#include <algorithm>

#include "core/check.hpp"
#include "core/hash.hpp"
#include "kernels/kv_math.hpp"

namespace kvgrid {

using namespace kernels;

ModelGeometry ModelGeometry::for_rank(const ExperimentConfig& exp, const GridCoord& c, const GridShape& s) {
  ModelGeometry g;
  g.layers = static_cast<std::uint64_t>(exp.model.layers);
  g.heads = static_cast<std::uint64_t>(exp.model.kv_heads);
  g.head_dim = static_cast<std::uint64_t>(exp.model.head_dim);
  g.mla = exp.model.attention == "mla";
  // Contiguous layer slices; the first (layers % pp) stages take one more.
  const std::uint64_t pp = static_cast<std::uint64_t>(s.pp), base = g.layers / pp, extra = g.layers % pp;
  const std::uint64_t stage = static_cast<std::uint64_t>(c.pp);
  g.layer_begin = stage * base + std::min(stage, extra);
  g.layer_end = g.layer_begin + base + (stage < extra ? 1 : 0);
  if (g.mla) {
    g.kv_heads = {0};
    for (std::uint64_t q = static_cast<std::uint64_t>(c.tp); q < g.heads; q += static_cast<std::uint64_t>(s.tp))
      g.query_heads.push_back(static_cast<std::uint32_t>(q));
  } else {
    const std::uint64_t per = g.heads / static_cast<std::uint64_t>(s.tp);
    for (std::uint64_t h = 0; h < per; ++h) g.kv_heads.push_back(static_cast<std::uint32_t>(static_cast<std::uint64_t>(c.tp) * per + h));
    g.query_heads = g.kv_heads;
  }
  g.cp_rank = c.cp;
  g.cp_size = s.cp;
  g.zigzag = exp.model.cp_split == "zigzag";
  if (exp.model.hybrid()) {
    g.model_kinds = exp.model.kinds();
    g.kinds.assign(g.model_kinds.begin() + static_cast<std::ptrdiff_t>(g.layer_begin),
                   g.model_kinds.begin() + static_cast<std::ptrdiff_t>(g.layer_end));
    for (std::uint64_t l = 0; l < g.layer_begin; ++l) ++g.kind_first[static_cast<std::size_t>(g.model_kinds[l])];
    g.swa_window = static_cast<std::uint64_t>(exp.model.swa_window);
    g.mamba_chunk = static_cast<std::uint64_t>(exp.model.mamba_chunk);
    g.mamba_state = static_cast<std::uint64_t>(exp.model.mamba_state);
    g.sidecars = exp.model.sidecars;
  }
  return g;
}

std::size_t ModelGeometry::local_of(LayerKind k) const {
  if (!hybrid()) return k == LayerKind::Full ? static_cast<std::size_t>(local_layers()) : 0;
  return static_cast<std::size_t>(std::count(kinds.begin(), kinds.end(), k));
}

std::uint64_t ModelGeometry::layer_id(LayerKind k, std::size_t i) const {
  if (!hybrid()) return layer_begin + i;  // (a draft's layer_begin includes kDraftLayer0)
  const std::uint64_t base[kLayerKinds] = {0, kSwaLayer0, kMambaLayer0};
  const auto k_ = static_cast<std::size_t>(k);
  return first_layer + base[k_] + kind_first[k_] + i;
}

ModelGeometry ModelGeometry::draft_for_rank(const ExperimentConfig& exp, const GridCoord& c, const GridShape& s) {
  ExperimentConfig d = exp;
  d.model.layer_types = exp.model.draft.layer_types;  // (a hybrid draft keeps the target's window and grid)
  d.model.sidecars.clear();
  d.model.layers = exp.model.draft.layers;
  d.model.kv_heads = exp.model.draft.kv_heads;
  d.model.head_dim = exp.model.draft.head_dim;
  GridCoord one = c;
  one.pp = 0;
  GridShape flat = s;
  flat.pp = 1;  // every draft layer on this (the last) stage
  ModelGeometry g = for_rank(d, one, flat);
  g.first_layer = kDraftLayer0;
  g.layer_begin += kDraftLayer0;
  g.layer_end += kDraftLayer0;
  return g;
}

bool ModelGeometry::owns_query(std::size_t pos, std::size_t start, std::size_t end) const {
  if (cp_size == 1) return true;
  const std::size_t i = pos - start, n = end - start, cp = static_cast<std::size_t>(cp_size);
  if (!zigzag) return static_cast<int>(i % cp) == cp_rank;
  // Zigzag: 2·CP equal segments; rank r takes segments r and 2·CP-1-r (balances causal work).
  const std::size_t seg = (n + 2 * cp - 1) / (2 * cp);
  const std::size_t k = i / seg;
  const std::size_t owner = k < cp ? k : 2 * cp - 1 - k;
  return static_cast<int>(owner) == cp_rank;
}

SyntheticModel::SyntheticModel(ModelGeometry g, cache::KvPool& pool, Tokens page_size)
    : g_(std::move(g)), pool_(pool), page_size_(static_cast<std::size_t>(page_size.value())) {
  const std::size_t L = g_.local_of(LayerKind::Full), H = g_.kv_heads.size();
  KVGRID_CHECK(pool_.layers() == L && pool_.heads() == H && pool_.layer_base() == g_.layer_id(LayerKind::Full, 0),
               "KV pool geometry does not match the model slice");
  qcoef_ = query_coefs(LayerKind::Full);
}

std::vector<std::uint64_t> SyntheticModel::query_coefs(LayerKind k) const {
  const std::size_t L = g_.local_of(k), H = g_.kv_heads.size();
  std::vector<std::uint64_t> c(L * H, 0);
  for (std::size_t l = 0; l < L; ++l)
    for (std::size_t h = 0; h < H; ++h) {
      const std::uint64_t layer = g_.layer_id(k, l);
      if (g_.mla) {
        for (auto q : g_.query_heads) c[l * H + h] += query_coeff(layer, q);
      } else {
        c[l * H + h] = query_coeff(layer, g_.kv_heads[h]);
      }
    }
  return c;
}

void SyntheticModel::attach_hybrid(cache::KvPool* swa_pool, cache::StatePool* states) {
  const std::size_t H = g_.kv_heads.size();
  if (g_.local_of(LayerKind::Swa) > 0) {
    KVGRID_CHECK(swa_pool && swa_pool->layers() == g_.local_of(LayerKind::Swa) && swa_pool->heads() == H &&
                     swa_pool->layer_base() == g_.layer_id(LayerKind::Swa, 0) && swa_pool->payload() == cache::Payload::Full,
                 "SWA pool geometry does not match the model slice");
    swa_pool_ = swa_pool;
    qcoef_swa_ = query_coefs(LayerKind::Swa);
  }
  if (g_.local_of(LayerKind::Mamba) > 0) {
    KVGRID_CHECK(states && states->words_per_slot() == g_.local_of(LayerKind::Mamba) * H * g_.mamba_state,
                 "MAMBA state pool geometry does not match the model slice");
    states_ = states;
    qcoef_mamba_ = query_coefs(LayerKind::Mamba);
  }
}

void SyntheticModel::forward(ModelRequestState& st, std::span<const TokenId> tokens, std::size_t start, std::size_t end,
                             std::span<const PageId> page_table, std::span<std::uint64_t> out,
                             const std::function<void(std::size_t)>& before_layer, const HybridTables& ht) {
  const std::size_t L = g_.local_of(LayerKind::Full), H = g_.kv_heads.size(), n = end - start;
  KVGRID_CHECK(start < end && end <= tokens.size(), "forward of [", start, ", ", end, ") over ", tokens.size(), " tokens");
  KVGRID_CHECK(out.size() == g_.local_layers(), "forward output of ", out.size(), " layers");
  const bool first = !st.primed;
  // A full-attention model writes its layers' checksums straight into `out`.
  std::span<std::uint64_t> full_out = out;
  if (g_.hybrid()) {
    for (std::size_t k = 0; k < kLayerKinds; ++k) kind_out_[k].assign(g_.local_of(static_cast<LayerKind>(k)), 0);
    full_out = kind_out_[0];
  }
  KVGRID_CHECK((end + page_size_ - 1) / page_size_ <= page_table.size(), "page table too short");
  if (!st.primed) {
    // First computation of this request here: read the cached prefix from its pages.
    // A prefix received whole (P/D: the prompt's KV, its last page partial) is not page-aligned:
    // its partial page is folded too — in digest mode the page's word holds exactly the tokens
    // written to it, in full mode only the slots below `start` are read.
    KVGRID_CHECK(start == 0 || !pool_.sharded(), "the cached prefix of a sharded pool (", start,
                 " tokens) must be read through the layer gather");
    st.run.assign(L * H, 0);
    pages_.clear();
    const std::size_t rem = start % page_size_;
    const bool partial_digest = rem != 0 && pool_.payload() == cache::Payload::Digest;
    for (std::size_t p = 0; p < start / page_size_ + (partial_digest ? 1 : 0); ++p) pages_.push_back(page_table[p].value());
    if (before_layer) {
      for (std::size_t l = 0; l < L; ++l) {
        before_layer(l);
        pool_.fold_pages_layer(pages_, /*first_index=*/0, l, st.run);
      }
    } else {
      pool_.fold_pages(pages_, st.run, /*first_index=*/0);
    }
    if (rem != 0 && !partial_digest)  // full payload: the partial page's written slots
      pool_.fold_slots(page_table[start / page_size_].value(), rem, start / page_size_, st.run);
    st.ph = kPrefixSeed;
    st.hashed = 0;
    st.primed = true;
  }
  if (st.mark_stride != 0) {  // (the chain over a cached prefix, from the marks made with the prompt)
    const std::size_t k = std::min(start / st.mark_stride, st.marks.size());
    if (k * st.mark_stride > st.hashed) {
      st.ph = st.marks[k - 1];
      st.hashed = k * st.mark_stride;
    }
  }
  for (; st.hashed < start; ++st.hashed) st.ph = prefix_hash_step(st.ph, tokens[st.hashed]);
  KVGRID_CHECK(st.hashed == start, "forward of [", start, ", ", end, ") after ", st.hashed, " positions");

  pages_.resize(n);
  slots_.resize(n);
  F_.resize(n);
  G_.resize(n);
  std::size_t page = start / page_size_, slot = start % page_size_;
  for (std::size_t i = 0; i < n; ++i) {
    st.ph = prefix_hash_step(st.ph, tokens[start + i]);
    F_[i] = token_feature(st.ph);
    G_[i] = query_weight(st.ph);
    pages_[i] = page_table[page].value();
    slots_[i] = static_cast<std::uint32_t>(slot);
    if (++slot == page_size_) {
      slot = 0;
      ++page;
    }
  }
  st.hashed = end;
  pool_.write(pages_, slots_, F_);  // sharded: only the owned pages' tokens
  if (pool_.payload() == cache::Payload::Full) folds_.resize(n * L * H);  // (digest mode needs none)
  if (pool_.sharded() && pool_.payload() == cache::Payload::Full) {
    // Attention reads the whole chunk, owned or not: from the staging buffer.
    const std::size_t first = start / page_size_, need = (end - 1) / page_size_ - first + 1;
    if (!staging_ || staging_->config().capacity.value() < static_cast<std::int64_t>(need)) {
      cache::KvPoolConfig sc = pool_.config();
      sc.capacity = Pages(static_cast<std::int64_t>(2 * need));  // room to grow before the next reallocation
      sc.placement = {};
      sc.shard_rank = 0;
      staging_ = std::make_unique<cache::KvPool>(sc);
    }
    stage_pages_.resize(n);
    for (std::size_t i = 0; i < n; ++i) stage_pages_[i] = static_cast<std::uint32_t>((start + i) / page_size_ - first + 1);
    staging_->write(stage_pages_, slots_, F_);
    staging_->fold_tokens(stage_pages_, slots_, F_, start, folds_);
  } else if (pool_.payload() == cache::Payload::Digest) {
    forward_digest(st, start, end, full_out);
    return finish_forward(st, first, start, end, page_table, ht, out);
  } else {
    pool_.fold_tokens(pages_, slots_, F_, start, folds_);
  }

  // Token by token, in folds_' own order (a long chunk's folds are megabytes: a strided pass per
  // layer and head was bound by memory). The sums wrap modulo 2^64, so their order is immaterial.
  std::fill(full_out.begin(), full_out.end(), 0);
  const std::size_t LH = L * H;
  std::uint64_t* run = st.run.data();
  const bool every_query = g_.cp_size == 1;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t* f = folds_.data() + i * LH;
    for (std::size_t k = 0; k < LH; ++k) run[k] += f[k];
    if (!every_query && !g_.owns_query(start + i, start, end)) continue;
    for (std::size_t l = 0; l < L; ++l) {
      std::uint64_t dot = 0;
      for (std::size_t h = 0; h < H; ++h) dot += qcoef_[l * H + h] * run[l * H + h];
      full_out[l] += G_[i] * dot;
    }
  }
  finish_forward(st, first, start, end, page_table, ht, out);
}

void SyntheticModel::forward_digest(ModelRequestState& st, std::size_t start, std::size_t end, std::span<std::uint64_t> full_out) {
  // Digest mode: token i's fold is w_i × c_k (KvPool::token_weight, fold_coefs), so with W_i the
  // running sum of the weights, run_k after token i is run_k + c_k W_i and layer l's output
  //   Σ_i G_i Σ_h q_lh (run_lh + c_lh W_i) = (Σ_h q_lh run_lh) ΣG + (Σ_h q_lh c_lh) Σ_i G_i W_i
  // (over the owned queries) — one pass over the tokens, then one over the layers and heads; the
  // same words as the per-token fold, modulo 2^64.
  const std::size_t L = g_.local_of(LayerKind::Full), H = g_.kv_heads.size();
  const auto c = pool_.fold_coefs();
  KVGRID_CHECK(c.size() == L * H && st.run.size() == L * H, "digest fold of ", c.size(), " coefficients for ", L, " x ", H);
  const bool every_query = g_.cp_size == 1;
  std::uint64_t W = 0, sum_g = 0, sum_gw = 0;
  pool_.token_weights(start, F_, w_);
  for (std::size_t i = 0; i < end - start; ++i) {
    W += w_[i];
    if (!every_query && !g_.owns_query(start + i, start, end)) continue;
    sum_g += G_[i];
    sum_gw += G_[i] * W;
  }
  for (std::size_t l = 0; l < L; ++l) {
    std::uint64_t d0 = 0, q = 0;
    for (std::size_t h = 0; h < H; ++h) {
      d0 += qcoef_[l * H + h] * st.run[l * H + h];
      q += qcoef_[l * H + h] * c[l * H + h];
    }
    full_out[l] = d0 * sum_g + q * sum_gw;
  }
  for (std::size_t k = 0; k < L * H; ++k) st.run[k] += c[k] * W;
}

void SyntheticModel::begin_decode_span(ModelRequestState& st, std::span<const PageId> page_table) {
  KVGRID_CHECK(span_.st == nullptr, "a decode span begun inside another");
  KVGRID_CHECK(!g_.hybrid(), "a decode span of a hybrid model");
  KVGRID_CHECK(st.primed && st.run.size() == qcoef_.size(), "a decode span of a request not computed here yet");
  span_.st = &st;
  span_.pages = page_table;
  span_.digest = pool_.payload() == cache::Payload::Digest && !pool_.sharded() && g_.cp_size == 1;
  if (!span_.digest) return;  // (full payload: each token through forward(), its KV written at once)
  const std::size_t L = g_.local_of(LayerKind::Full), H = g_.kv_heads.size();
  const auto c = pool_.fold_coefs();
  span_.d.assign(L, 0);
  span_.Q.assign(L, 0);
  for (std::size_t l = 0; l < L; ++l)
    for (std::size_t h = 0; h < H; ++h) {
      span_.d[l] += qcoef_[l * H + h] * st.run[l * H + h];
      span_.Q[l] += qcoef_[l * H + h] * c[l * H + h];
    }
  span_.W = 0;
  span_.kv_pages.clear();
  span_.kv_slots.clear();
  span_.kv_F.clear();
}

void SyntheticModel::decode_token(std::span<const TokenId> tokens, std::span<std::uint64_t> out) {
  KVGRID_CHECK(span_.st != nullptr, "a decode token outside a decode span");
  ModelRequestState& st = *span_.st;
  const std::size_t pos = st.hashed;
  if (!span_.digest) return forward(st, tokens, pos, pos + 1, span_.pages, out);
  const std::size_t L = span_.d.size(), slot = pos % page_size_;
  KVGRID_CHECK(out.size() == L && pos < tokens.size() && pos / page_size_ < span_.pages.size(), "decode of position ", pos,
               " into ", out.size(), " layers over ", tokens.size(), " tokens and ", span_.pages.size(), " pages");
  st.ph = prefix_hash_step(st.ph, tokens[pos]);
  const std::uint64_t F = token_feature(st.ph), G = query_weight(st.ph);
  const std::uint64_t w = pool_.token_weight(pos, static_cast<std::uint32_t>(slot), F), gw = G * w;
  for (std::size_t l = 0; l < L; ++l) {
    out[l] = span_.d[l] * G + span_.Q[l] * gw;
    span_.d[l] += span_.Q[l] * w;
  }
  span_.W += w;
  span_.kv_pages.push_back(span_.pages[pos / page_size_].value());
  span_.kv_slots.push_back(static_cast<std::uint32_t>(slot));
  span_.kv_F.push_back(F);
  st.hashed = pos + 1;
}

void SyntheticModel::end_decode_span() {
  KVGRID_CHECK(span_.st != nullptr, "no decode span to end");
  if (!span_.digest) {
    span_.st = nullptr;
    return;
  }
  pool_.write(span_.kv_pages, span_.kv_slots, span_.kv_F);
  const auto c = pool_.fold_coefs();
  for (std::size_t k = 0; k < c.size(); ++k) span_.st->run[k] += c[k] * span_.W;
  span_.st = nullptr;
}

void SyntheticModel::finish_forward(ModelRequestState& st, bool first, std::size_t start, std::size_t end,
                                    std::span<const PageId> page_table, const HybridTables& ht, std::span<std::uint64_t> out) {
  if (!g_.hybrid()) return;
  if (swa_pool_) forward_swa(start, end, ht, kind_out_[static_cast<std::size_t>(LayerKind::Swa)]);
  if (!sidecars_.empty()) forward_sidecars(st, first, start, end, page_table, ht);
  if (states_) forward_mamba(first, start, end, ht, kind_out_[static_cast<std::size_t>(LayerKind::Mamba)]);
  std::size_t at[kLayerKinds] = {0, 0, 0};
  for (std::size_t l = 0; l < out.size(); ++l) {
    const auto k = static_cast<std::size_t>(g_.kind(l));
    out[l] = kind_out_[k][at[k]++];
  }
}

void SyntheticModel::forward_swa(std::size_t start, std::size_t end, const HybridTables& ht, std::span<std::uint64_t> out) {
  // F_ and G_ hold the chunk's features and query weights (forward computed them).
  const std::size_t W = g_.swa_window, L = swa_pool_->layers(), H = g_.kv_heads.size(), n = end - start;
  KVGRID_CHECK(ht.swa.size() >= (end + page_size_ - 1) / page_size_, "SWA page table of ", ht.swa.size(),
               " pages for a chunk ending at ", end);
  // Every query q attends to (q - W, q]: the window of the chunk's first query reaches back to lo.
  const std::size_t lo = start + 1 >= W ? start + 1 - W : 0, m = end - lo;
  win_pages_.resize(m);
  win_slots_.resize(m);
  for (std::size_t i = 0; i < m; ++i) {
    const std::size_t pos = lo + i;
    win_pages_[i] = ht.swa[pos / page_size_];
    win_slots_[i] = static_cast<std::uint32_t>(pos % page_size_);
  }
  const auto chunk_pages = std::span<const std::uint32_t>(win_pages_).subspan(start - lo);
  const auto chunk_slots = std::span<const std::uint32_t>(win_slots_).subspan(start - lo);
  for (std::size_t i = 0; i < n; ++i)
    KVGRID_CHECK(chunk_pages[i] != 0, "SWA page of position ", start + i, " is not held");
  swa_pool_->write(chunk_pages, chunk_slots, std::span<const std::uint64_t>(F_).first(n));
  // The window's folds, read back from the pool (the SWA pool is always full payload). A window
  // position whose page the request does not hold reads as poison, like a missing sidecar entry:
  // the oracle sees it (a cache bug handed the request a window with holes).
  missing_.clear();
  for (std::size_t i = 0; i < start - lo && n > 0; ++i)
    if (win_pages_[i] == 0) {
      missing_.push_back(i);
      win_pages_[i] = chunk_pages[0];  // a held page, read and then overwritten
    }
  win_F_.assign(m, 0);
  win_folds_.resize(m * L * H);
  swa_pool_->fold_tokens(win_pages_, win_slots_, win_F_, lo, win_folds_);
  for (std::size_t i : missing_)
    for (std::size_t k = 0; k < L * H; ++k) win_folds_[i * L * H + k] = cache::KvPool::kPoison * (lo + i + 1);
  auto fold = [&](std::size_t pos, std::size_t l, std::size_t h) { return win_folds_[((pos - lo) * L + l) * H + h]; };
  for (std::size_t l = 0; l < L; ++l) {
    std::uint64_t acc = 0;
    for (std::size_t h = 0; h < H; ++h) {
      std::uint64_t win = 0;
      for (std::size_t t = lo; t <= start; ++t) win += fold(t, l, h);
      const std::uint64_t coef = qcoef_swa_[l * H + h];
      for (std::size_t q = start; q < end; ++q) {
        if (q > start) {
          win += fold(q, l, h);
          if (q >= W) win -= fold(q - W, l, h);
        }
        if (g_.owns_query(q, start, end)) acc += G_[q - start] * coef * win;
      }
    }
    out[l] = acc;
  }
}

void SyntheticModel::attach_sidecars(std::vector<cache::unified::PayloadSidecar*> sidecars, std::vector<SidecarConfig> specs) {
  KVGRID_CHECK(sidecars.size() == specs.size(), sidecars.size(), " sidecar pools for ", specs.size(), " sidecars");
  for (std::size_t i = 0; i < specs.size(); ++i)
    KVGRID_CHECK(sidecars[i] && sidecars[i]->words_per_slot() == static_cast<std::size_t>(specs[i].words) * page_size_ &&
                     g_.local_of(specs[i].source) > 0 && g_.kind_first[static_cast<std::size_t>(specs[i].source)] == 0,
                 "sidecar ", specs[i].name, " does not match the model slice");
  sidecars_ = std::move(sidecars);
  sidecar_specs_ = std::move(specs);
  sidecar_owner_ = std::find(g_.query_heads.begin(), g_.query_heads.end(), 0u) != g_.query_heads.end();
}

std::uint64_t SyntheticModel::sidecar_fold(std::size_t i, std::uint32_t slot, std::size_t pos) const {
  const auto& sc = *sidecars_[i];
  const std::size_t w = static_cast<std::size_t>(sidecar_specs_[i].words);
  std::uint64_t f = 0;
  if (slot == 0 || !sc.has(cache::unified::Slot(slot))) {
    for (std::size_t j = 0; j < w; ++j) f += dim_coeff(j, w) * cache::StatePool::kPoison;  // not there: poison
  } else {
    const auto words = sc.read(cache::unified::Slot(slot)).subspan((pos % page_size_) * w, w);
    for (std::size_t j = 0; j < w; ++j) f += dim_coeff(j, w) * words[j];
  }
  return position_coeff(pos, page_size_) * f;
}

void SyntheticModel::forward_sidecars(ModelRequestState& st, bool first, std::size_t start, std::size_t end,
                                      std::span<const PageId> page_table, const HybridTables& ht) {
  // F_ and G_ hold the chunk's features and query weights.
  if (first) st.sidecar_run.assign(sidecars_.size(), 0);
  std::vector<std::uint64_t> words;
  for (std::size_t i = 0; i < sidecars_.size(); ++i) {
    auto& sc = *sidecars_[i];
    const auto& spec = sidecar_specs_[i];
    const bool swa = spec.source == LayerKind::Swa;
    const std::size_t w = static_cast<std::size_t>(spec.words);
    const std::uint64_t id = kSidecarLayer0 + spec.index;
    auto slot_of = [&](std::size_t pos) { return swa ? ht.swa[pos / page_size_] : page_table[pos / page_size_].value(); };
    // Write the chunk's tokens (every rank: each holds the stage's sidecars whole).
    for (std::size_t pos = start; pos < end; ++pos) {
      const cache::unified::Slot s(slot_of(pos));
      if (sc.has(s)) {
        auto cur = sc.read(s);
        words.assign(cur.begin(), cur.end());
      } else {
        words.assign(sc.words_per_slot(), 0);
      }
      for (std::size_t j = 0; j < w; ++j) words[(pos % page_size_) * w + j] = kv_element(F_[pos - start], id, 0, j, w);
      sc.write(s, words);
    }
    if (!sidecar_owner_) continue;
    const std::uint64_t N = query_coeff(id, 0);
    std::uint64_t acc = 0;
    if (swa) {  // the window (q - W, q], read back like an SWA layer
      const std::size_t W = g_.swa_window, lo = start + 1 >= W ? start + 1 - W : 0;
      std::uint64_t win = 0;
      for (std::size_t t = lo; t <= start; ++t) win += sidecar_fold(i, slot_of(t), t);
      for (std::size_t q = start; q < end; ++q) {
        if (q > start) {
          win += sidecar_fold(i, slot_of(q), q);
          if (q >= W) win -= sidecar_fold(i, slot_of(q - W), q - W);
        }
        if (g_.owns_query(q, start, end)) acc += G_[q - start] * N * win;
      }
    } else {  // every position <= q: the prefix from its pages once, then the running fold
      std::uint64_t& run = st.sidecar_run[i];
      if (first)
        for (std::size_t t = 0; t < start; ++t) run += sidecar_fold(i, slot_of(t), t);
      for (std::size_t q = start; q < end; ++q) {
        run += sidecar_fold(i, slot_of(q), q);
        if (g_.owns_query(q, start, end)) acc += G_[q - start] * N * run;
      }
    }
    kind_out_[static_cast<std::size_t>(spec.source)][0] += acc;
  }
}

void SyntheticModel::forward_mamba(bool first, std::size_t start, std::size_t end, const HybridTables& ht,
                                   std::span<std::uint64_t> out) {
  const std::size_t L = g_.local_of(LayerKind::Mamba), H = g_.kv_heads.size(), S = g_.mamba_state;
  KVGRID_CHECK(ht.mamba != 0, "MAMBA layers without a state slot");
  std::span<std::uint64_t> state = states_->slot(ht.mamba);
  if (first && start == 0) {  // a fresh request: the initial state (a reused one was copied into the slot)
    for (std::size_t l = 0; l < L; ++l)
      for (std::size_t h = 0; h < H; ++h)
        for (std::size_t j = 0; j < S; ++j) state[(l * H + h) * S + j] = mamba_initial(g_.layer_id(LayerKind::Mamba, l), g_.kv_heads[h], j);
  }
  std::fill(out.begin(), out.end(), 0);
  for (std::size_t i = 0; i < end - start; ++i) {
    const std::size_t pos = start + i;
    const bool owned = g_.owns_query(pos, start, end);
    for (std::size_t l = 0; l < L; ++l) {
      const std::uint64_t layer = g_.layer_id(LayerKind::Mamba, l);
      for (std::size_t h = 0; h < H; ++h) {
        std::uint64_t* s = state.data() + (l * H + h) * S;
        mamba_step(s, S, F_[i], layer, g_.kv_heads[h]);
        if (owned) out[l] += G_[i] * qcoef_mamba_[l * H + h] * mamba_fold(s, S);
      }
    }
    if (ht.mamba_ckpt != 0 && (pos + 1) % g_.mamba_chunk == 0) states_->copy(ht.mamba, ht.mamba_ckpt);
  }
}

void SyntheticModel::prime_for_gather(ModelRequestState& st) const {
  KVGRID_CHECK(!st.primed, "request primed twice");
  st.run.assign(g_.local_layers() * g_.kv_heads.size(), 0);
  st.ph = kPrefixSeed;
  st.hashed = 0;
  st.primed = true;
}

std::uint64_t chain_seed(RequestId id, std::size_t start, std::size_t end, bool draft) {
  return hash_combine(hash_combine(mix64(id.value() ^ (draft ? 0x6472616674ULL : 0x636861696eULL)), start), end);
}

std::uint64_t chain(std::uint64_t in, std::span<const std::uint64_t> layer_checksums) {
  for (auto c : layer_checksums) in = hash_combine(in, c);
  return in;
}

Oracle::Oracle(const ModelGeometry& g, Tokens page_size)
    : page_size_(static_cast<std::uint64_t>(page_size.value())), draft_(g.first_layer != 0) {
  KVGRID_CHECK(page_size_ > 0, "oracle of a model with page size ", page_size);
  for (std::uint64_t s = 0; s < page_size_; ++s) slot_coef_.push_back(slot_coeff(s));
  kinds_ = g.model_kinds;
  if (kinds_.empty()) kinds_.assign(g.layers, LayerKind::Full);
  window_ = g.swa_window;
  swa_ = window_ > 0 && std::find(kinds_.begin(), kinds_.end(), LayerKind::Swa) != kinds_.end();
  words_ = g.mamba_state;
  state_heads_ = g.mla ? 1 : g.heads;
  const std::uint64_t base[kLayerKinds] = {0, kSwaLayer0, kMambaLayer0};
  std::uint64_t seen[kLayerKinds] = {0, 0, 0};
  for (std::size_t i = 0; i < g.sidecars.size(); ++i) {
    const std::uint64_t id = kSidecarLayer0 + i;
    sidecars_.emplace_back(g.sidecars[i].source, query_coeff(id, 0) * kv_coeff(id, 0));
  }
  for (LayerKind kind : kinds_) {
    const auto k_ = static_cast<std::size_t>(kind);
    const std::uint64_t l = g.first_layer + (g.hybrid() ? base[k_] : 0) + seen[k_]++;
    std::uint64_t k = 0;
    for (std::uint64_t h = 0; h < g.heads; ++h) k += query_coeff(l, h) * kv_coeff(l, g.mla ? 0 : h);
    K_.push_back(k);
    if (kind == LayerKind::Mamba) {
      mamba_ids_.push_back(l);
      std::vector<std::uint64_t> n(state_heads_, 0);
      for (std::uint64_t h = 0; h < g.heads; ++h) n[g.mla ? 0 : h] += query_coeff(l, h);
      mamba_N_.push_back(std::move(n));
    }
  }
}

std::uint64_t Oracle::expected(OracleRequestState& st, RequestId id, std::span<const TokenId> tokens, std::size_t start,
                               std::size_t end) const {
  const std::size_t M = mamba_ids_.size(), S = words_, Hs = state_heads_;
  const bool swa = swa_;
  if (st.hashed == 0) {
    st.ph = kPrefixSeed;
    st.state.assign(M * Hs * S, 0);
    for (std::size_t m = 0; m < M; ++m)
      for (std::size_t h = 0; h < Hs; ++h)
        for (std::size_t j = 0; j < S; ++j) st.state[(m * Hs + h) * S + j] = mamba_initial(mamba_ids_[m], h, j);
  }
  KVGRID_CHECK(st.hashed <= start, "oracle asked for [", start, ", ", end, ") after ", st.hashed, " positions");
  std::vector<std::uint64_t> Tm(M * Hs, 0);  // per MAMBA layer and state head: sum of G(q) * fold(s_q)
  std::uint64_t T = 0, Tw = 0;
  // R(q) = Q(page) P(slot), the page's coefficient taken once per page.
  std::uint64_t page = st.hashed / page_size_, slot = st.hashed % page_size_, Q = page_coeff(page);
  for (std::size_t q = st.hashed; q < end; ++q) {
    st.ph = prefix_hash_step(st.ph, tokens[q]);
    const std::uint64_t F = token_feature(st.ph), G = query_weight(st.ph);
    st.S += Q * slot_coef_[slot] * F;  // position_coeff(q, page_size_) * F
    if (++slot == page_size_) {
      slot = 0;
      Q = page_coeff(++page);
    }
    if (swa) st.S_at.push_back(st.S);
    for (std::size_t m = 0; m < M; ++m)
      for (std::size_t h = 0; h < Hs; ++h) {
        std::uint64_t* s = st.state.data() + (m * Hs + h) * S;
        mamba_step(s, S, F, mamba_ids_[m], h);
        if (q >= start) Tm[m * Hs + h] += G * mamba_fold(s, S);
      }
    if (q < start) continue;
    T += G * st.S;
    if (swa) Tw += G * (st.S - (q >= window_ ? st.S_at[q - window_] : 0));  // the window (q - W, q]
  }
  st.hashed = end;
  std::uint64_t a = chain_seed(id, start, end, draft_);
  std::size_t m = 0;
  bool first_of[kLayerKinds] = {true, true, true};
  for (std::size_t l = 0; l < kinds_.size(); ++l) {
    std::uint64_t c = 0;
    // Sidecars fold into the first layer of their source kind (FULL: like full attention; SWA: the window).
    if (first_of[static_cast<std::size_t>(kinds_[l])]) {
      first_of[static_cast<std::size_t>(kinds_[l])] = false;
      for (const auto& [src, k] : sidecars_)
        if (src == kinds_[l]) c += k * (src == LayerKind::Swa ? Tw : T);
    }
    switch (kinds_[l]) {
      case LayerKind::Full: c += K_[l] * T; break;
      case LayerKind::Swa: c += K_[l] * Tw; break;
      case LayerKind::Mamba:
        for (std::size_t h = 0; h < Hs; ++h) c += mamba_N_[m][h] * Tm[m * Hs + h];
        ++m;
        break;
    }
    a = hash_combine(a, c);
  }
  return a;
}

}  // namespace kvgrid
