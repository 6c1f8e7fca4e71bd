#include "cache/device_cache.hpp"

#include <algorithm>
#include <vector>

#include "core/check.hpp"
#include "core/hash.hpp"

namespace kvgrid::cache {

namespace {
// The eviction victims (in eviction order) as one digest: ranks must evict the same pages.
std::uint64_t victims_digest(const std::vector<PageId>& freed) {
  std::uint64_t h = 0x76696374ULL;
  for (PageId p : freed) h = hash_combine(h, p.value());
  return h;
}
}  // namespace

DeviceCache::DeviceCache(const DeviceCacheConfig& cfg, DecisionLog& log)
    : tree_(TreeConfig{cfg.page_size, cfg.shards}),
      pool_(cfg.device_pages, CpPlacement{cfg.shards, static_cast<std::uint64_t>(cfg.page_size.value())}),
      log_(log) {
  if (cfg.hybrid) {
    hybrid_ = std::make_unique<HybridCache>(*cfg.hybrid, pool_, log_);
    hybrid_->set_allocation_decider([this](RequestId id, bool ok) { return decide_allocation(id, ok); });
  }
}

Admission DeviceCache::admit(RequestId id, std::span<const TokenId> prompt) {
  // A reservation for the page-aligned prompt, inserted at once: the request then holds the lock
  // on its own leaf (the tree loop's "running" request) until release().
  const std::int64_t p = tree_.page_size().value();
  const Tokens aligned(static_cast<std::int64_t>(prompt.size()) / p * p);
  Admission a;
  a.prompt = Tokens(static_cast<std::int64_t>(prompt.size()));
  auto r = reserve(id, prompt, aligned);
  if (!r) {
    a.matched = last_match_;
    a.evicted = last_evicted_;
    return a;
  }
  a.admitted = true;
  a.matched = r->matched;
  a.evicted = r->evicted;
  a.new_pages = r->fresh;
  insert_computed(id, *r, prompt.first(static_cast<std::size_t>(aligned.value())));
  a.node = r->node;
  return a;
}

void DeviceCache::release(const Admission& a) {
  if (!a.admitted || a.node == nullptr) return;
  tree_.unlock(a.node);
  debug_verify();
}

std::optional<std::vector<PageId>> DeviceCache::alloc_evicting(Pages n, std::uint32_t first_owner, Pages* evicted,
                                                              const RestorePlacement* restore) {
  auto short_by = [&] { return restore ? restore->shortfall(pool_, n, first_owner) : pool_.shortfall(n, first_owner); };
  // Sharded pools may need several rounds: a victim's pages need not belong to the owners short.
  for (Pages want = short_by(); want.value() > 0; want = short_by()) {
    std::vector<PageId> freed =
        host_ && host_->writes_back() ? tree_.evict(want, [this](TreeNode* v) { host_->write_back(v); }) : tree_.evict(want);
    pool_.free(freed);
    if (evicted) *evicted += Pages(static_cast<std::int64_t>(freed.size()));
    last_evicted_ += Pages(static_cast<std::int64_t>(freed.size()));
    KVGRID_CONSENSUS(log_, "evict", {want.value()},
                     {static_cast<std::int64_t>(freed.size()), freed.empty() ? 0 : freed.front().value()},
                     victims_digest(freed));
    if (static_cast<std::int64_t>(freed.size()) < want.value()) break;  // nothing left to evict
  }
  return restore ? restore->alloc(pool_, n, first_owner) : pool_.alloc(n, first_owner);
}

bool DeviceCache::decide_allocation(RequestId id, bool local_ok) {
  if (following_) {
    KVGRID_CHECK(follow_at_ < follow_.size(), "request ", id, ": PP0 relayed ", follow_.size(),
                 " admission outcomes, this stage is at admission ", follow_at_ + 1);
    const bool admit = follow_[follow_at_++] != 0;
    // The failpoint is still drawn (and recorded) here, but PP0's decision stands: this pool holds
    // the same pages as PP0's, so a failure injected on a later stage cannot part the stages.
    if (alloc_fault_) (void)alloc_fault_();
    KVGRID_CHECK(!admit || local_ok, "request ", id, ": PP0 admitted it but this stage has no pages for it");
    return admit;
  }
  if (!alloc_fault_) return local_ok;
  const bool ok = alloc_agreement_->agree_allocation(local_ok && !alloc_fault_());
  admissions_.push_back(ok ? 1 : 0);
  return ok;
}

std::optional<Reservation> DeviceCache::reserve(RequestId id, std::span<const TokenId> prompt, Tokens kv_tokens,
                                                Tokens max_match) {
  if (hybrid_) {
    auto r = hybrid_->reserve(id, prompt, kv_tokens, max_match);
    if (storage_ && r) {  // of what the load-back brought, the part its storage prefetch had added
      const auto [b, e] = storage_->prefetched_range(id);  // (a refused request keeps it for its retry)
      const Tokens lo = std::max(b, r->matched - r->host_loaded), hi = std::min(e, r->matched);
      if (hi > lo) r->storage_loaded = hi - lo;
      storage_->forget(id);
    }
    return r;
  }
  const std::int64_t p = tree_.page_size().value();
  // match_prefix reuses at most size - 1 tokens: a view of max_match + 1 tokens caps the match.
  const auto cap = static_cast<std::size_t>(max_match.value());
  const std::size_t view = cap < prompt.size() ? cap + 1 : prompt.size();
  MatchResult m = tree_.match_prefix(prompt.first(view));
  KVGRID_CONSENSUS(log_, "match_prefix", {static_cast<std::int64_t>(id.value()), static_cast<std::int64_t>(prompt.size())},
                   {m.matched.value(), m.host_matched.value()});
  tree_.lock(m.last_node);
  // write_through_selective: a prefix that just reached the hit threshold is backed up now, not
  // only when something is inserted below it.
  if (host_ && m.matched.value() > 0) host_->on_hit(m.last_node);
  last_match_ = m.matched;
  last_evicted_ = Pages(0);
  Reservation r;
  const Tokens on_device = m.matched;
  if (private_restores_ && host_) {
    // A private restore of a request refused anyway would be copied for nothing (and again at
    // every retry): refuse first when even eviction cannot make room for everything past the
    // device hit (restored + fresh pages).
    const Pages beyond = Pages((kv_tokens.value() + p - 1) / p) - Pages(static_cast<std::int64_t>(m.device_pages.size()));
    if (pool_.free_pages() + tree_.evictable_pages() < beyond) {
      KVGRID_CONSENSUS(log_, "admit", {static_cast<std::int64_t>(id.value())}, {0, beyond.value()});
      tree_.unlock(m.last_node);
      debug_verify();
      return std::nullopt;
    }
  }
  if (host_) {
    r.load_events = host_->load_back(
        m, [&](Pages n, std::uint32_t owner) { return alloc_evicting(n, owner, &r.evicted, restore_); },
        private_restores_ ? &r.restore_hold : nullptr);
    r.host_loaded = m.matched - on_device;
    if (storage_) {
      const auto [b, e] = storage_->prefetched_range(id);
      const Tokens lo = std::max(b, on_device), hi = std::min(e, m.matched);
      if (hi > lo) r.storage_loaded = hi - lo;
      storage_->forget(id);
    }
  }
  r.matched = m.matched;
  r.kv_tokens = kv_tokens;
  const Pages total((kv_tokens.value() + p - 1) / p);
  const Pages need = total - Pages(static_cast<std::int64_t>(m.device_pages.size()));
  // The chain continues the prefix's owner cycle: position-page P is owned by P mod N.
  const auto first_owner = static_cast<std::uint32_t>(m.device_pages.size() % pool_.shards());
  auto fresh = alloc_evicting(need, first_owner, &r.evicted);
  if (!decide_allocation(id, fresh.has_value()) && fresh) {
    pool_.free(*fresh);
    fresh.reset();
  }
  KVGRID_CONSENSUS(log_, "admit", {static_cast<std::int64_t>(id.value())}, {fresh ? 1 : 0, need.value()});
  // Private restores: the restored pages [on_device, matched) are the request's, not the tree's.
  const Pages restored = r.restore_hold ? Pages((m.matched - on_device).value() / p) : Pages(0);
  if (!fresh) {
    // Loaded pages stay in the tree (cached, just not used by this request now): let their copies
    // land before anyone can read them. Private ones are freed (never published).
    for (auto& e : r.load_events) e.synchronize();
    if (r.restore_hold) {
      const std::size_t kept = m.device_pages.size() - static_cast<std::size_t>(restored.value());
      pool_.free(std::span<const PageId>(m.device_pages).subspan(kept));
      end_restore(r.restore_hold, m.last_node);
    }
    tree_.unlock(m.last_node);
    r.load_events.clear();
    debug_verify();
    return std::nullopt;
  }
  r.fresh = need;
  r.private_pages = need + restored;
  r.shared = r.restore_hold ? on_device : m.matched;
  reserved_ += need + restored;
  r.pages = std::move(m.device_pages);
  r.pages.insert(r.pages.end(), fresh->begin(), fresh->end());
  r.node = m.last_node;
  debug_verify();
  return r;
}

void DeviceCache::attach_host_tier(HostTierConfig cfg, KvPool& device_kv, KvPool& host_kv, transfer::TransferEngine& engine,
                                   AckAgreement& agreement) {
  host_ = std::make_unique<HostTier>(std::move(cfg), tree_, device_kv, host_kv, engine, agreement, log_);
}

void DeviceCache::attach_storage_tier(StorageTierConfig cfg, KvPool& host_kv, AckAgreement& agreement) {
  if (hybrid_) {
    storage_ = hybrid_->make_storage_tier(std::move(cfg), agreement);
    return;
  }
  KVGRID_CHECK(host_ != nullptr, "the storage tier needs the host tier");
  storage_ = std::make_unique<StorageTier>(std::move(cfg), tree_, *host_, host_kv, agreement, log_);
}

void DeviceCache::insert_computed(RequestId id, Reservation& r, std::span<const TokenId> computed_tokens) {
  if (hybrid_) return hybrid_->insert_computed(id, r, computed_tokens);
  const std::size_t p = static_cast<std::size_t>(tree_.page_size().value());
  const std::size_t aligned = computed_tokens.size() / p;  // pages
  const std::size_t from = static_cast<std::size_t>(r.shared.value()) / p;
  if (aligned <= from) return;
  KVGRID_CHECK(r.pages.size() >= aligned, "page table of ", r.pages.size(), " pages for ", aligned, " computed pages");
  auto key = computed_tokens.first(aligned * p);
  InsertResult ins = tree_.insert(key, std::span<const PageId>(r.pages).first(aligned));
  KVGRID_CONSENSUS(log_, "insert", {static_cast<std::int64_t>(id.value()), static_cast<std::int64_t>(key.size())},
                   {ins.prefix_len.value()});
  const std::size_t present = static_cast<std::size_t>(ins.prefix_len.value()) / p;
  if (present > from) {
    // Another request inserted [from, present) meanwhile: use the tree's pages, free ours.
    MatchResult m = tree_.match_computed(key.first(present * p));
    KVGRID_CHECK(m.device_pages.size() == present, "re-match found ", m.device_pages.size(), " of ", present, " pages");
    std::vector<PageId> ours(r.pages.begin() + static_cast<std::ptrdiff_t>(from), r.pages.begin() + static_cast<std::ptrdiff_t>(present));
    pool_.free(ours);
    std::copy(m.device_pages.begin() + static_cast<std::ptrdiff_t>(from), m.device_pages.end(),
              r.pages.begin() + static_cast<std::ptrdiff_t>(from));
  }
  const Pages moved(static_cast<std::int64_t>(aligned - from));  // freed as duplicates or now owned by the tree
  r.private_pages -= moved;
  reserved_ -= moved;
  tree_.lock(ins.last_node);
  tree_.unlock(r.node);
  r.node = ins.last_node;
  r.shared = Tokens(static_cast<std::int64_t>(aligned * p));
  if (host_) host_->backup_path(ins.last_node);
  debug_verify();
}

void DeviceCache::end_restore(TreeNode* hold, TreeNode* boundary) {
  // The restored range is the chain from `hold` up to the device boundary (splits meanwhile only
  // added nodes to it).
  for (TreeNode* n = hold; n != boundary; n = n->parent) {
    KVGRID_CHECK(n != nullptr && n->ext.restoring > 0, "restored node without its restore mark");
    --n->ext.restoring;
  }
  tree_.unlock(hold);
}

bool DeviceCache::restore_intact(const Reservation& r) {
  bool ok = true;
  for (const auto& ev : r.load_events) ok = ok && !ev.failed();
  if (r.hybrid)
    for (const auto& ev : r.hybrid->state_events) ok = ok && !ev.failed();
  return ok;
}

void DeviceCache::confirm_restore(RequestId id, Reservation& r, std::span<const TokenId> prompt, bool ok) {
  if (hybrid_) return hybrid_->confirm_restore(id, r, ok);
  for (auto& e : r.load_events) e.synchronize();  // a copy into our pages must land before anything else
  KVGRID_CONSENSUS(log_, "restore", {static_cast<std::int64_t>(id.value()), r.host_loaded.value()}, {ok ? 1 : 0});
  if (!r.restore_hold) return;
  end_restore(r.restore_hold, r.node);
  r.restore_hold = nullptr;
  if (ok) insert_computed(id, r, prompt.first(static_cast<std::size_t>(r.matched.value())));
  debug_verify();
}

std::vector<PageId> DeviceCache::drop_restore(RequestId id, Reservation& r, std::span<const TokenId> prompt) {
  if (hybrid_) return hybrid_->drop_restore(id, r);
  KVGRID_CHECK(r.restore_hold != nullptr, "request ", id, " has no private restore to drop");
  confirm_restore(id, r, prompt, /*ok=*/false);  // waits for the copies, ends the restore unpublished
  const std::size_t p = static_cast<std::size_t>(tree_.page_size().value());
  const std::size_t from = static_cast<std::size_t>(r.shared.value()) / p, to = static_cast<std::size_t>(r.matched.value()) / p;
  std::vector<PageId> pages(r.pages.begin() + static_cast<std::ptrdiff_t>(from), r.pages.begin() + static_cast<std::ptrdiff_t>(to));
  r.matched = r.shared;
  r.host_loaded = Tokens(0);
  r.storage_loaded = Tokens(0);
  r.load_events.clear();
  debug_verify();
  return pages;
}

void DeviceCache::commit(RequestId id, Reservation& r, std::span<const TokenId> kv_tokens, SessionTag session) {
  if (hybrid_) return hybrid_->commit(id, r, kv_tokens, session);
  KVGRID_CHECK(static_cast<std::int64_t>(kv_tokens.size()) == r.kv_tokens.value(), "commit of ", kv_tokens.size(),
               " tokens for a reservation of ", r.kv_tokens);
  const std::size_t p = static_cast<std::size_t>(tree_.page_size().value());
  insert_computed(id, r, kv_tokens);
  const std::size_t aligned = kv_tokens.size() / p;
  if (r.pages.size() > aligned) {  // the partial last page
    pool_.free(std::span<const PageId>(r.pages).subspan(aligned));
    const Pages tail(static_cast<std::int64_t>(r.pages.size() - aligned));
    r.private_pages -= tail;
    reserved_ -= tail;
  }
  KVGRID_CHECK(r.private_pages.value() == 0, "request ", id, " still holds ", r.private_pages, " private pages at commit");
  KVGRID_CHECK(r.restore_hold == nullptr, "request ", id, " committed before its restore was confirmed");
  tree_.unlock(r.node);
  r.node = nullptr;
  debug_verify();
}

void DeviceCache::abort(RequestId id, Reservation& r) {
  if (hybrid_) {
    hybrid_->abort(id, r);
    KVGRID_CONSENSUS(log_, "abort", {static_cast<std::int64_t>(id.value())}, {});
    return;
  }
  abort_waiting(id);
  for (auto& e : r.load_events) e.synchronize();  // copies into tree pages must land before reuse
  r.load_events.clear();
  const std::size_t p = static_cast<std::size_t>(tree_.page_size().value());
  const std::size_t shared = static_cast<std::size_t>(r.shared.value()) / p;
  if (r.pages.size() > shared) {
    pool_.free(std::span<const PageId>(r.pages).subspan(shared));
    const Pages mine(static_cast<std::int64_t>(r.pages.size() - shared));
    r.private_pages -= mine;
    reserved_ -= mine;
  }
  KVGRID_CHECK(r.private_pages.value() == 0, "request ", id, " still holds ", r.private_pages, " private pages at abort");
  if (r.restore_hold) end_restore(r.restore_hold, r.node);  // never published: the nodes stay host-only
  if (r.node) tree_.unlock(r.node);
  r.node = nullptr;
  r.restore_hold = nullptr;
  r.pages.clear();
  KVGRID_CONSENSUS(log_, "abort", {static_cast<std::int64_t>(id.value())}, {});
  debug_verify();
}

std::vector<PageId> DeviceCache::cached_pages() const {
  if (hybrid_) return hybrid_->cached_pages();
  std::vector<PageId> out;
  std::vector<const TreeNode*> stack{tree_.root()};
  while (!stack.empty()) {
    const TreeNode* n = stack.back();
    stack.pop_back();
    out.insert(out.end(), n->device.begin(), n->device.end());
    for (const auto& [h, c] : n->children) stack.push_back(c.get());
  }
  std::sort(out.begin(), out.end());  // independent of the children's iteration order
  return out;
}

void DeviceCache::verify(VerifyDepth depth) const {
  if (hybrid_) return hybrid_->verify();
  tree_.verify(depth);
  pool_.verify();
  KVGRID_CHECK(tree_.total_pages() + reserved_ == pool_.used_pages(), "tree holds ", tree_.total_pages(), " pages and ",
               reserved_, " are reserved, but the pool has ", pool_.used_pages(), " allocated (leak or double ownership)");
  if (host_) {
    host_->pool().verify();
    const Pages held = storage_ ? storage_->held_pages() : Pages(0);
    KVGRID_CHECK(tree_.host_pages() + host_->pending_pages() + held == host_->pool().used_pages(), "tree holds ",
                 tree_.host_pages(), " host pages, ", host_->pending_pages(), " are being written and ", held,
                 " prefetched, but the host pool has ", host_->pool().used_pages(), " allocated");
  }
}

void DeviceCache::debug_verify() const {
  if (KVGRID_DEBUG_CHECKS_ON()) verify();
}

}  // namespace kvgrid::cache
