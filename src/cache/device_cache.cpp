#include "cache/device_cache.hpp"

#include <vector>

#include "core/check.hpp"
#include "core/hash.hpp"

namespace kvgrid::cache {

DeviceCache::DeviceCache(const DeviceCacheConfig& cfg, DecisionLog& log)
    : tree_(TreeConfig{cfg.page_size}), pool_(cfg.device_pages), log_(log) {}

Admission DeviceCache::admit(RequestId id, std::span<const TokenId> prompt) {
  const std::int64_t p = tree_.page_size().value();
  Admission a;
  a.prompt = Tokens(static_cast<std::int64_t>(prompt.size()));
  const std::uint64_t req = hash_combine(id.value(), prompt.size());

  MatchResult m = tree_.match_prefix(prompt);
  KVGRID_CONSENSUS(log_, "match_prefix", req, static_cast<std::uint64_t>(m.matched.value()));
  a.matched = m.matched;
  tree_.lock(m.last_node);

  const std::int64_t aligned_pages = static_cast<std::int64_t>(prompt.size()) / p;
  const Pages need(aligned_pages - static_cast<std::int64_t>(m.device_pages.size()));
  if (need > pool_.free_pages()) {
    const Pages want = need - pool_.free_pages();
    std::vector<PageId> freed = tree_.evict(want);
    pool_.free(freed);
    a.evicted = Pages(static_cast<std::int64_t>(freed.size()));
    KVGRID_CONSENSUS(log_, "evict", static_cast<std::uint64_t>(want.value()), static_cast<std::uint64_t>(a.evicted.value()));
  }
  auto fresh = pool_.alloc(need);
  KVGRID_CONSENSUS(log_, "admit", req, fresh ? 1 : 0);
  if (!fresh) {
    tree_.unlock(m.last_node);
    debug_verify();
    return a;
  }
  a.admitted = true;
  a.new_pages = need;

  std::vector<PageId> pages = std::move(m.device_pages);
  pages.insert(pages.end(), fresh->begin(), fresh->end());
  InsertResult ins = tree_.insert(prompt.first(static_cast<std::size_t>(aligned_pages * p)), pages);
  KVGRID_CONSENSUS(log_, "insert", req, static_cast<std::uint64_t>(ins.prefix_len.value()));
  // Pages of the part that was already present beyond our match are duplicates of the tree's own.
  const std::size_t from = static_cast<std::size_t>(m.matched.value() / p);
  const std::size_t to = static_cast<std::size_t>(ins.prefix_len.value() / p);
  if (to > from) {
    pool_.free(std::span<const PageId>(pages).subspan(from, to - from));
    a.duplicate_pages = Pages(static_cast<std::int64_t>(to - from));
  }
  tree_.lock(ins.last_node);
  tree_.unlock(m.last_node);
  a.node = ins.last_node;
  debug_verify();
  return a;
}

void DeviceCache::release(const Admission& a) {
  if (!a.admitted || a.node == nullptr) return;
  tree_.unlock(a.node);
  debug_verify();
}

void DeviceCache::verify() const {
  tree_.verify();
  pool_.verify();
  KVGRID_CHECK(tree_.total_pages() == pool_.used_pages(), "tree holds ", tree_.total_pages(), " pages but the pool has ",
               pool_.used_pages(), " allocated (leak or double ownership)");
}

void DeviceCache::debug_verify() const {
  if (KVGRID_DEBUG_CHECKS_ON()) verify();
}

}  // namespace kvgrid::cache
