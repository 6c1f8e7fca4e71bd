#include "runtime/model.hpp"

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
  return g;
}

ModelGeometry ModelGeometry::draft_for_rank(const ExperimentConfig& exp, const GridCoord& c, const GridShape& s) {
  ExperimentConfig d = exp;
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
  const std::size_t L = g_.local_layers(), H = g_.kv_heads.size();
  KVGRID_CHECK(pool_.layers() == L && pool_.heads() == H, "KV pool geometry does not match the model slice");
  qcoef_.assign(L * H, 0);
  for (std::size_t l = 0; l < L; ++l)
    for (std::size_t h = 0; h < H; ++h) {
      const std::uint64_t layer = g_.layer_begin + l;
      if (g_.mla) {
        for (auto q : g_.query_heads) qcoef_[l * H + h] += query_coeff(layer, q);
      } else {
        qcoef_[l * H + h] = query_coeff(layer, g_.kv_heads[h]);
      }
    }
}

void SyntheticModel::forward(ModelRequestState& st, std::span<const TokenId> tokens, std::size_t start, std::size_t end,
                             std::span<const PageId> page_table, std::span<std::uint64_t> out,
                             const std::function<void(std::size_t)>& before_layer) {
  const std::size_t L = g_.local_layers(), H = g_.kv_heads.size(), n = end - start;
  KVGRID_CHECK(start < end && end <= tokens.size(), "forward of [", start, ", ", end, ") over ", tokens.size(), " tokens");
  KVGRID_CHECK(out.size() == L, "forward output of ", out.size(), " layers");
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
  for (; st.hashed < start; ++st.hashed) st.ph = prefix_hash_step(st.ph, tokens[st.hashed]);
  KVGRID_CHECK(st.hashed == start, "forward of [", start, ", ", end, ") after ", st.hashed, " positions");

  pages_.resize(n);
  slots_.resize(n);
  F_.resize(n);
  G_.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t pos = start + i;
    st.ph = prefix_hash_step(st.ph, tokens[pos]);
    F_[i] = token_feature(st.ph);
    G_[i] = query_weight(st.ph);
    pages_[i] = page_table[pos / page_size_].value();
    slots_[i] = static_cast<std::uint32_t>(pos % page_size_);
  }
  st.hashed = end;
  pool_.write(pages_, slots_, F_);  // sharded: only the owned pages' tokens
  folds_.resize(n * L * H);
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
  } else {
    pool_.fold_tokens(pages_, slots_, F_, start, folds_);
  }

  for (std::size_t l = 0; l < L; ++l) {
    std::uint64_t acc = 0;
    for (std::size_t h = 0; h < H; ++h) {
      std::uint64_t run = st.run[l * H + h];
      const std::uint64_t coef = qcoef_[l * H + h];
      for (std::size_t i = 0; i < n; ++i) {
        run += folds_[(i * L + l) * H + h];
        if (g_.owns_query(start + i, start, end)) acc += G_[i] * coef * run;
      }
      st.run[l * H + h] = run;
    }
    out[l] = acc;
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
  for (std::uint64_t l = g.first_layer; l < g.first_layer + g.layers; ++l) {
    std::uint64_t k = 0;
    for (std::uint64_t h = 0; h < g.heads; ++h) k += query_coeff(l, h) * kv_coeff(l, g.mla ? 0 : h);
    K_.push_back(k);
  }
}

std::uint64_t Oracle::expected(OracleRequestState& st, RequestId id, std::span<const TokenId> tokens, std::size_t start,
                               std::size_t end) {
  if (st.hashed == 0) st.ph = kPrefixSeed;
  KVGRID_CHECK(st.hashed <= start, "oracle asked for [", start, ", ", end, ") after ", st.hashed, " positions");
  for (; st.hashed < start; ++st.hashed) {
    st.ph = prefix_hash_step(st.ph, tokens[st.hashed]);
    st.S += position_coeff(st.hashed, page_size_) * token_feature(st.ph);
  }
  std::uint64_t T = 0;
  for (std::size_t q = start; q < end; ++q) {
    st.ph = prefix_hash_step(st.ph, tokens[q]);
    st.S += position_coeff(q, page_size_) * token_feature(st.ph);
    T += query_weight(st.ph) * st.S;
  }
  st.hashed = end;
  std::uint64_t a = chain_seed(id, start, end, draft_);
  for (auto k : K_) a = hash_combine(a, k * T);
  return a;
}

}  // namespace kvgrid
