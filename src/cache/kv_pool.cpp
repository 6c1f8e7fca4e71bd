#include "cache/kv_pool.hpp"

#include <algorithm>

#include "core/check.hpp"
#include "kernels/kv_math.hpp"

namespace kvgrid::cache {

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
  data_.assign(cfg_.payload == Payload::Full ? layout_.full_words() : layout_.digest_words(), 0);
  for (std::size_t l = 0; l < layout_.layers; ++l)
    for (std::size_t h = 0; h < layout_.heads; ++h) coef_.push_back(kernels::kv_coeff(layout_.layer_base + l, cfg_.heads[h]));
}

void KvPool::write(std::span<const std::uint32_t> page, std::span<const std::uint32_t> slot,
                   std::span<const std::uint64_t> F) {
  if (cfg_.payload == Payload::Full) kernels::write_tokens_full(layout_, data_.data(), page, slot, F);
  else kernels::write_tokens_digest(layout_, data_.data(), page, F);
}

void KvPool::fold_pages(std::span<const std::uint32_t> pages, std::span<std::uint64_t> out) const {
  if (cfg_.payload == Payload::Full) kernels::fold_pages_full(layout_, data_.data(), pages, out);
  else kernels::fold_pages_digest(layout_, data_.data(), pages, out);
}

void KvPool::fold_tokens(std::span<const std::uint32_t> page, std::span<const std::uint32_t> slot,
                         std::span<const std::uint64_t> F, std::span<std::uint64_t> out) const {
  if (cfg_.payload == Payload::Full) {
    kernels::fold_tokens_full(layout_, data_.data(), page, slot, out);
    return;
  }
  KVGRID_CHECK(out.size() == F.size() * layout_.layers * layout_.heads, "fold_tokens sizes");
  const std::size_t lh = coef_.size();
  for (std::size_t i = 0; i < F.size(); ++i)
    for (std::size_t k = 0; k < lh; ++k) out[i * lh + k] = F[i] * coef_[k];
}

void KvPool::reset(std::span<const PageId> pages) {
  if (cfg_.payload != Payload::Digest) return;  // full mode overwrites every slot it later reads
  for (PageId p : pages) {
    KVGRID_CHECK(p.value() >= 1 && p.value() < layout_.pages, "reset of page ", p);
    auto* w = data_.data() + layout_.digest_index(p.value(), 0, 0);
    std::fill(w, w + layout_.layers * layout_.heads, 0);
  }
}

void KvPool::corrupt(PageId page, Rng& rng) {
  KVGRID_CHECK(page.value() >= 1 && page.value() < layout_.pages, "corrupt of page ", page);
  const std::size_t words = cfg_.payload == Payload::Full ? layout_.layers * layout_.heads * layout_.page_size * layout_.dims
                                                          : layout_.layers * layout_.heads;
  const std::size_t base = cfg_.payload == Payload::Full ? layout_.full_index(page.value(), 0, 0, 0, 0)
                                                         : layout_.digest_index(page.value(), 0, 0);
  data_[base + rng.below(words)] ^= 1ULL << rng.below(64);
}

}  // namespace kvgrid::cache
