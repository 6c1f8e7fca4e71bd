#include "cache/kv_pool.hpp"

#include <algorithm>
#include <cstring>

#include "core/check.hpp"
#include "core/hash.hpp"
#include "kernels/kv_math.hpp"
#ifdef KVGRID_HAVE_CUDA
#include "cuda/kv_kernels.hpp"
#endif

namespace kvgrid::cache {

// A device pool in GPU memory (engine.transfer = cuda) runs the KV kernels as CUDA kernels, with the
// same arguments and results (cuda/kv_kernels.hpp); every other pool the Kokkos host kernels.
#ifdef KVGRID_HAVE_CUDA
#define KVGRID_KV_KERNEL(name, ...) (data_.gpu() ? cuda::kernels::name(__VA_ARGS__) : kernels::name(__VA_ARGS__))
#else
#define KVGRID_KV_KERNEL(name, ...) kernels::name(__VA_ARGS__)
#endif

Payload parse_payload(const std::string& name) {
  if (name == "full") return Payload::Full;
  KVGRID_CHECK(name == "digest", "unknown payload mode '", name, "'");
  return Payload::Digest;
}

KvPool::KvPool(KvPoolConfig cfg) : cfg_(std::move(cfg)) {
  KVGRID_CHECK(!cfg_.heads.empty() && cfg_.layers > 0 && cfg_.dims > 0, "empty KV pool geometry");
  layout_.pages = static_cast<std::size_t>(cfg_.capacity.value()) + 1;
  layout_.layers = cfg_.layers;
  layout_.heads = cfg_.heads.size();
  layout_.page_size = static_cast<std::size_t>(cfg_.page_size.value());
  layout_.dims = cfg_.dims;
  layout_.layer_base = cfg_.layer_base;
  layout_.head_ids = cfg_.heads.data();
  for (std::size_t s = 0; s < layout_.page_size; ++s) slot_coef_.push_back(kernels::slot_coeff(s));
  for (std::size_t d = 0; d < layout_.dims; ++d) dim_coef_.push_back(kernels::dim_coeff(d, layout_.dims));
  layout_.slot_coef = slot_coef_.data();
  layout_.dim_coef = dim_coef_.data();
  data_ = PoolWords(cfg_.payload == Payload::Full ? layout_.full_words() : layout_.digest_words(), cfg_.memory, cfg_.kind);
  for (std::size_t l = 0; l < layout_.layers; ++l)
    for (std::size_t h = 0; h < layout_.heads; ++h) coef_.push_back(kernels::kv_coeff(layout_.layer_base + l, cfg_.heads[h]));
  layout_.kv_coef = coef_.data();
  const bool digest = cfg_.payload == Payload::Digest;
  const std::size_t block = layer_block_bytes() / sizeof(std::uint64_t);
  for (std::size_t l = 0; l < layout_.layers; ++l)
    runs_.push_back(page_unified() ? kernels::layer_runs(layout_, digest, cfg_.object_chunks, l)
                                   : std::vector<kernels::LayerRun>{{0, l * block, block}});
  std::size_t at = 0;
  for (const auto& c : cfg_.object_chunks) {
    object_offsets_.push_back(at);
    at += object_words(c);
  }
}

void KvPool::require_layer_first(const char* what) const {
  KVGRID_CHECK(!page_unified(), what, " of a page_unified pool (its rows hold storage objects, not layer blocks)");
}

std::size_t KvPool::object_offset(const kernels::ChunkSpan& c) const {
  const auto& own = cfg_.object_chunks;
  for (std::size_t j = 0; j < own.size(); ++j)
    if (c.layer0 == own[j].layer0 && c.layers == own[j].layers && c.head0 == own[j].head0 && c.heads == own[j].heads)
      return object_offsets_[j];
  KVGRID_CHECK(false, "the object of chunk (layers ", c.layer0, "+", c.layers, ", heads ", c.head0, "+", c.heads,
               ") from a pool whose rows hold ", own.size(), " other chunks");
  return 0;
}

std::span<const kernels::LayerRun> KvPool::layer_runs(std::size_t layer) const {
  KVGRID_CHECK(layer < runs_.size(), "layer runs of local layer ", layer, " of ", runs_.size());
  return runs_[layer];
}

std::uint64_t* KvPool::row_data(PageId page, bool owned) {
  return const_cast<std::uint64_t*>(static_cast<const KvPool*>(this)->row_data(page, owned));
}

const std::uint64_t* KvPool::row_data(PageId page, bool owned) const {
  const std::uint32_t r = row(page.value(), owned);
  KVGRID_CHECK(r >= 1 && r < layout_.pages, "row of page ", page, " (row ", r, ")");
  return data_.data() + r * row_words();
}

std::uint64_t KvPool::content_digest() const {
  // Each non-zero word with its index, in index order (multiply-xorshift, as hash_u32: a
  // full-payload pool is large). Zero words add nothing, so the parts of the pool a run never
  // touched are not read at all (PoolWords::for_each_touched): they are zero.
  std::uint64_t h = mix64(0x6b76706f6f6cULL ^ data_.size());
  const std::uint64_t* d = data_.data();
  data_.for_each_touched([&](std::size_t begin, std::size_t end) {
    for (std::size_t i = begin; i < end; ++i)
      if (const std::uint64_t w = d[i]) {
        h = (h ^ w ^ (i * 0x9e3779b97f4a7c15ULL)) * 0x9fb21c651e98df25ULL;
        h ^= h >> 32;
      }
  });
  return mix64(h);
}

std::uint32_t KvPool::row(std::uint32_t page, bool owned) const {
  if (!sharded()) return page;
  KVGRID_CHECK(!owned || cfg_.placement.page_owner(page) == cfg_.shard_rank, "rank ", cfg_.shard_rank,
               " of the shard group read page ", page, ", which rank ", cfg_.placement.page_owner(page), " owns");
  return static_cast<std::uint32_t>(cfg_.placement.local_page(page));
}

std::span<const std::uint32_t> KvPool::rows(std::span<const std::uint32_t> pages) const {
  if (!sharded()) return pages;
  rows_.resize(pages.size());
  for (std::size_t i = 0; i < pages.size(); ++i) rows_[i] = row(pages[i], /*owned=*/true);
  return rows_;
}

void KvPool::write(std::span<const std::uint32_t> page, std::span<const std::uint32_t> slot,
                   std::span<const std::uint64_t> F) {
  require_layer_first("write");
  if (sharded()) {  // only the tokens of owned pages, at their rows
    rows_.clear();
    slots_.clear();
    F_.clear();
    for (std::size_t i = 0; i < page.size(); ++i)
      if (cfg_.placement.page_owner(page[i]) == cfg_.shard_rank) {
        rows_.push_back(row(page[i], true));
        slots_.push_back(slot[i]);
        F_.push_back(F[i]);
      }
    page = rows_;
    slot = slots_;
    F = F_;
  }
  if (cfg_.payload == Payload::Full) KVGRID_KV_KERNEL(write_tokens_full, layout_, data_.data(), page, slot, F);
  else KVGRID_KV_KERNEL(write_tokens_digest, layout_, data_.data(), page, slot, F);
}

void KvPool::fold_pages(std::span<const std::uint32_t> pages, std::span<std::uint64_t> out, std::size_t first_index) const {
  require_layer_first("fold_pages");
  pages = rows(pages);
  if (cfg_.payload == Payload::Full) KVGRID_KV_KERNEL(fold_pages_full, layout_, data_.data(), pages, first_index, out);
  else KVGRID_KV_KERNEL(fold_pages_digest, layout_, data_.data(), pages, first_index, out);
}

std::vector<std::uint64_t> KvPool::page_folds(std::span<const PageId> pages) const {
  if (page_unified()) {  // fold a layer-first copy of each page
    KvPoolConfig lc = cfg_;
    lc.capacity = Pages(static_cast<std::int64_t>(pages.size()));
    lc.object_chunks.clear();
    lc.memory = nullptr;
    KVGRID_CHECK(!sharded(), "page folds of a sharded page_unified pool");
    KvPool scratch(lc);
    std::vector<PageId> scratch_pages;
    for (std::size_t i = 0; i < pages.size(); ++i) scratch_pages.push_back(PageId(static_cast<std::uint32_t>(i + 1)));
    for (auto& per_layer : layer_copies(scratch, scratch_pages, *this, pages))
      for (const auto& c : per_layer) std::memcpy(c.dst, c.src, c.bytes);
    return scratch.page_folds(scratch_pages);
  }
  const std::size_t lh = layout_.layers * layout_.heads;
  std::vector<std::uint64_t> out(pages.size() * lh, 0);
  for (std::size_t i = 0; i < pages.size(); ++i) {
    const std::uint32_t v = pages[i].value();
    fold_pages(std::span<const std::uint32_t>(&v, 1), std::span<std::uint64_t>(out).subspan(i * lh, lh));
  }
  return out;
}

void KvPool::fold_pages_layer(std::span<const std::uint32_t> pages, std::size_t first_index, std::size_t layer,
                              std::span<std::uint64_t> out) const {
  require_layer_first("fold_pages_layer");
  pages = rows(pages);
  if (cfg_.payload == Payload::Full) KVGRID_KV_KERNEL(fold_pages_full, layout_, data_.data(), pages, first_index, out, layer, layer + 1);
  else KVGRID_KV_KERNEL(fold_pages_digest, layout_, data_.data(), pages, first_index, out, layer, layer + 1);
}

void KvPool::fold_tokens(std::span<const std::uint32_t> page, std::span<const std::uint32_t> slot,
                         std::span<const std::uint64_t> F, std::size_t first_pos, std::span<std::uint64_t> out) const {
  require_layer_first("fold_tokens");
  if (cfg_.payload == Payload::Full) {
    KVGRID_KV_KERNEL(fold_tokens_full, layout_, data_.data(), rows(page), slot, first_pos, out);
    return;
  }
  KVGRID_CHECK(out.size() == F.size() * layout_.layers * layout_.heads && slot.size() == F.size(), "fold_tokens sizes");
  const std::size_t lh = coef_.size();
  for (std::size_t i = 0; i < F.size(); ++i) {
    const std::uint64_t w = token_weight(first_pos + i, slot[i], F[i]);
    for (std::size_t k = 0; k < lh; ++k) out[i * lh + k] = w * coef_[k];
  }
}

void KvPool::token_weights(std::size_t first_pos, std::span<const std::uint64_t> F, std::vector<std::uint64_t>& w) const {
  w.resize(F.size());
  const std::size_t p = layout_.page_size;
  std::size_t page = first_pos / p, slot = first_pos % p;
  std::uint64_t Q = kernels::page_coeff(page);  // once per page
  for (std::size_t i = 0; i < F.size(); ++i) {
    w[i] = Q * slot_coef_[slot] * F[i];
    if (++slot == p) {
      slot = 0;
      Q = kernels::page_coeff(++page);
    }
  }
}

std::uint64_t KvPool::token_weight(std::size_t pos, std::uint32_t slot, std::uint64_t F) const {
  KVGRID_CHECK(slot < layout_.page_size, "slot ", slot, " >= page_size ", layout_.page_size);
  return kernels::page_coeff(pos / layout_.page_size) * slot_coef_[slot] * F;
}

void KvPool::fold_slots(std::uint32_t page, std::size_t n, std::size_t index, std::span<std::uint64_t> out) const {
  KVGRID_CHECK(cfg_.payload == Payload::Full, "fold_slots reads stored tokens (full payload only)");
  const std::size_t lh = layout_.layers * layout_.heads;
  KVGRID_CHECK(out.size() == lh, "fold_slots into ", out.size(), " words, not ", lh);
  std::vector<std::uint32_t> pages(n, page), slots(n);
  for (std::size_t i = 0; i < n; ++i) slots[i] = static_cast<std::uint32_t>(i);
  std::vector<std::uint64_t> folds(n * lh, 0);
  fold_tokens(pages, slots, {}, index * layout_.page_size, folds);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t k = 0; k < lh; ++k) out[k] += folds[i * lh + k];
}

std::size_t KvPool::object_words(const kernels::ChunkSpan& c) const {
  return kernels::object_words(layout_, cfg_.payload == Payload::Digest, c);
}

void KvPool::pack(std::span<const PageId> pages, std::span<const kernels::ChunkSpan> chunks, std::uint64_t* staging,
                  bool kokkos) const {
  if (page_unified()) {
    for (PageId p : pages)
      for (const auto& c : chunks) staging = std::copy_n(row_data(p, true) + object_offset(c), object_words(c), staging);
    return;
  }
  std::vector<std::uint32_t> r(pages.size());  // local: a worker thread must not share rows_
  for (std::size_t i = 0; i < pages.size(); ++i) r[i] = row(pages[i].value(), /*owned=*/true);
  kernels::pack_objects(layout_, cfg_.payload == Payload::Digest, data_.data(), r, chunks, staging, kokkos);
}

void KvPool::unpack(std::span<const PageId> pages, std::span<const kernels::ChunkSpan> chunks, const std::uint64_t* staging,
                    bool kokkos) {
  if (page_unified()) {
    for (PageId p : pages)
      for (const auto& c : chunks) {
        std::copy_n(staging, object_words(c), row_data(p, true) + object_offset(c));
        staging += object_words(c);
      }
    return;
  }
  std::vector<std::uint32_t> r(pages.size());
  for (std::size_t i = 0; i < pages.size(); ++i) r[i] = row(pages[i].value(), /*owned=*/true);
  kernels::unpack_objects(layout_, cfg_.payload == Payload::Digest, data_.data(), r, chunks, staging, kokkos);
}

void KvPool::reset(std::span<const PageId> pages) {
  if (cfg_.payload != Payload::Digest) return;  // full mode overwrites every slot it later reads
  for (PageId p : pages) {
    if (!owns(p)) continue;
    const std::uint32_t r = row(p.value(), true);
    KVGRID_CHECK(r >= 1 && r < layout_.pages, "reset of page ", p);
    auto* w = data_.data() + layout_.digest_index(r, 0, 0);
    std::fill(w, w + layout_.layers * layout_.heads, 0);
  }
}

void KvPool::poison(std::span<const PageId> pages, bool always) {
  if (cfg_.payload == Payload::Full && !always && !KVGRID_DEBUG_CHECKS_ON()) return;  // costly: tests turn it on
  fill(pages, kPoison, "poison");
}

void KvPool::clear(std::span<const PageId> pages) { fill(pages, 0, "clear"); }

void KvPool::fill(std::span<const PageId> pages, std::uint64_t word, const char* what) {
  const std::size_t words = cfg_.payload == Payload::Full ? layout_.layers * layout_.heads * layout_.page_size * layout_.dims
                                                          : layout_.layers * layout_.heads;
  for (PageId p : pages) {
    if (!owns(p)) continue;
    const std::uint32_t r = row(p.value(), true);
    KVGRID_CHECK(r >= 1 && r < layout_.pages, what, " of page ", p);
    auto* w = data_.data() + (cfg_.payload == Payload::Full ? layout_.full_index(r, 0, 0, 0, 0) : layout_.digest_index(r, 0, 0));
    std::fill(w, w + words, word);
  }
}

std::uint64_t* KvPool::layer_block(PageId page, std::size_t layer) {
  return const_cast<std::uint64_t*>(static_cast<const KvPool*>(this)->layer_block(page, layer));
}

const std::uint64_t* KvPool::layer_block(PageId page, std::size_t layer) const {
  require_layer_first("layer_block");
  const std::uint32_t r = row(page.value(), /*owned=*/false);
  KVGRID_CHECK(r >= 1 && r < layout_.pages && layer < layout_.layers, "block of page ", page, " (row ", r, ") layer ", layer);
  return data_.data() + (cfg_.payload == Payload::Full ? layout_.full_index(r, layer, 0, 0, 0)
                                                       : layout_.digest_index(r, layer, 0));
}

std::size_t KvPool::layer_block_bytes() const {
  const std::size_t words = cfg_.payload == Payload::Full ? layout_.heads * layout_.page_size * layout_.dims : layout_.heads;
  return words * sizeof(std::uint64_t);
}

bool KvPool::compatible(const KvPool& o) const {
  return cfg_.payload == o.cfg_.payload && cfg_.page_size == o.cfg_.page_size && cfg_.layer_base == o.cfg_.layer_base &&
         cfg_.layers == o.cfg_.layers && cfg_.heads == o.cfg_.heads && cfg_.dims == o.cfg_.dims &&
         cfg_.placement.shards == o.cfg_.placement.shards && cfg_.shard_rank == o.cfg_.shard_rank;
}

bool KvPool::block_compatible(const KvPool& o) const {
  return cfg_.payload == o.cfg_.payload && cfg_.page_size == o.cfg_.page_size && cfg_.heads.size() == o.cfg_.heads.size() &&
         cfg_.dims == o.cfg_.dims && cfg_.placement.shards == o.cfg_.placement.shards && cfg_.shard_rank == o.cfg_.shard_rank;
}

std::vector<std::vector<transfer::Copy>> layer_copies(KvPool& dst, std::span<const PageId> dst_pages, const KvPool& src,
                                                      std::span<const PageId> src_pages) {
  KVGRID_CHECK(dst.compatible(src), "copy between KV pools of different geometry");
  return layer_copies_at(dst, dst_pages, 0, src, src_pages, 0, src.layers());
}

std::vector<std::vector<transfer::Copy>> layer_copies_at(KvPool& dst, std::span<const PageId> dst_pages,
                                                         std::size_t dst_layer0, const KvPool& src,
                                                         std::span<const PageId> src_pages, std::size_t src_layer0,
                                                         std::size_t layers) {
  KVGRID_CHECK(dst.block_compatible(src), "copy between KV pools of different block shape");
  KVGRID_CHECK(dst_layer0 + layers <= dst.layers() && src_layer0 + layers <= src.layers(), "copy of layers [", src_layer0,
               ", +", layers, ") into [", dst_layer0, ", +", layers, ") of pools with ", src.layers(), " and ", dst.layers(),
               " layers");
  KVGRID_CHECK(dst_pages.size() == src_pages.size(), "copy of ", src_pages.size(), " pages into ", dst_pages.size());
  std::vector<std::vector<transfer::Copy>> out(layers);
  constexpr std::size_t W = sizeof(std::uint64_t);
  for (std::size_t i = 0; i < src_pages.size(); ++i) {
    if (!dst.owns(dst_pages[i])) continue;  // the owner of the destination copies it
    if (KVGRID_DEBUG_CHECKS_ON())
      KVGRID_CHECK(src.owns(src_pages[i]), "copy of page ", src_pages[i], " (owned by rank ",
                   src.placement().page_owner(src_pages[i].value()), ") into page ", dst_pages[i], " (owned by rank ",
                   dst.placement().page_owner(dst_pages[i].value()), "): the copy would move a page off its owner");
    std::uint64_t* d = dst.row_data(dst_pages[i]);
    const std::uint64_t* s = src.row_data(src_pages[i]);
    for (std::size_t l = 0; l < layers; ++l) {
      // Both sides' runs over the layer-first block, intersected: one copy per stretch that is
      // contiguous on both (layer-first pools: the whole block).
      const auto dr = dst.layer_runs(dst_layer0 + l), sr = src.layer_runs(src_layer0 + l);
      std::size_t a = 0, b = 0, at = 0;
      while (a < dr.size() && b < sr.size()) {
        const std::size_t end = std::min(dr[a].block + dr[a].words, sr[b].block + sr[b].words);
        out[l].push_back({d + dr[a].row + (at - dr[a].block), s + sr[b].row + (at - sr[b].block), (end - at) * W});
        at = end;
        if (at == dr[a].block + dr[a].words) ++a;
        if (at == sr[b].block + sr[b].words) ++b;
      }
    }
  }
  return out;
}

std::vector<transfer::Block> layer_blocks(KvPool& pool, std::span<const PageId> pages, std::size_t layer) {
  std::vector<transfer::Block> out;
  for (PageId q : pages)
    if (pool.owns(q)) out.push_back({pool.layer_block(q, layer), pool.layer_block_bytes()});
  return out;
}

std::vector<transfer::Copy> flat(std::vector<std::vector<transfer::Copy>> per_layer) {
  std::vector<transfer::Copy> out;
  for (auto& layer : per_layer) out.insert(out.end(), layer.begin(), layer.end());
  return out;
}

void KvPool::corrupt(PageId page, Rng& rng) {
  const std::uint32_t r = row(page.value(), /*owned=*/true);
  KVGRID_CHECK(r >= 1 && r < layout_.pages, "corrupt of page ", page);
  const std::size_t words = cfg_.payload == Payload::Full ? layout_.layers * layout_.heads * layout_.page_size * layout_.dims
                                                          : layout_.layers * layout_.heads;
  const std::size_t base = cfg_.payload == Payload::Full ? layout_.full_index(r, 0, 0, 0, 0) : layout_.digest_index(r, 0, 0);
  data_[base + rng.below(words)] ^= 1ULL << rng.below(64);
}

}  // namespace kvgrid::cache
