// The hybrid device tier's exchanges with the other tiers (cache/hybrid_cache.hpp): the host
// tier it attaches, a load-back of every component at admission (agreed inside it when
// load-backs can fail), the storage tier over its tree, and P/D decode's receive of a suffix.
#include <algorithm>

#include "cache/device_cache.hpp"
#include "cache/hybrid_cache.hpp"
#include "cache/hybrid_storage_site.hpp"
#include "core/check.hpp"

namespace kvgrid::cache {

using unified::ComponentId;
using unified::Slot;

namespace {
std::int64_t n_of(std::size_t n) { return static_cast<std::int64_t>(n); }
}  // namespace

// ---- host and storage tiers -----------------------------------------------------------------

void HybridCache::attach_host_tier(HybridHostConfig cfg, HybridBytes bytes, transfer::TransferEngine& engine,
                                   AckAgreement& agreement) {
  std::vector<ComponentKind> kinds(tree_.components(), ComponentKind::Full);
  if (cfg_.swa) kinds[swa_.value()] = ComponentKind::Swa;
  if (cfg_.mamba) kinds[mamba_.value()] = ComponentKind::Mamba;
  host_ = std::make_unique<HybridHostTier>(std::move(cfg), tree_, std::move(kinds), bytes, sidecars_, engine, agreement, log_);
  agreement_ = &agreement;
}

std::optional<std::vector<Slot>> HybridCache::alloc_device(ComponentId c, std::int64_t n, Pages* evicted) {
  if (c == full_) {
    make_room(full_, n, full_pool_.free_pages().value(), evicted);
    auto got = full_pool_.alloc(Pages(n));
    if (!got) return std::nullopt;
    std::vector<Slot> out;
    for (PageId pg : *got) out.push_back(Slot(pg.value()));
    return out;
  }
  if (cfg_.swa && c == swa_) return alloc_swa(n);
  make_room(mamba_, n, mamba_pool_.free_count(), evicted);
  return mamba_pool_.alloc(n);
}

void HybridCache::load_back(RequestId id, std::span<const TokenId> view, unified::MatchResult& m, Reservation& r,
                            HybridHold& h) {
  const Tokens device = m.matched, target = m.host_matched;
  // Making room may evict device values: the path being loaded is locked meanwhile, and so is the
  // device hit it started from (its window and state), which a partial load falls back to.
  unified::LockHandle path = tree_.lock(m.host_node);
  unified::LockHandle start = tree_.lock(m.last_node);
  const std::vector<unified::LoadItem> items = tree_.plan_load(m);
  std::size_t done = 0;
  std::int64_t swa_loaded = 0;
  for (const auto& it : items) {
    auto slots = alloc_device(it.component, n_of(it.host.size()), &r.evicted);
    if (!slots) break;  // the device is full of what cannot go: what is loaded stays, the rest is a miss
    host_->load(it, *slots, r.load_events, h.state_events);
    // The boundary's state is copied into the request's own slot right below (copy-on-write at
    // admission): its load lands first.
    if (cfg_.mamba && it.component == mamba_ && !h.state_events.empty()) h.state_events.back().synchronize();
    if (cfg_.swa && it.component == swa_) swa_loaded += n_of(it.host.size());
    tree_.commit_load(it, std::move(*slots));
    ++done;
  }
  // A request's SWA budget counts the tree's window it locks: a load-back restores at most that
  // window (bug-catalogue #19). A breach is kept for verify() to report.
  const std::int64_t window_pages = cfg_.swa ? (cfg_.window.value() + cfg_.page_size.value() - 1) / cfg_.page_size.value() : 0;
  if (swa_loaded > window_pages && window_breach_.empty())
    window_breach_ = "request " + std::to_string(id.value()) + ": a load-back restored " + std::to_string(swa_loaded) +
                     " SWA pages, more than its window's " + std::to_string(window_pages);
  if (done < items.size()) {
    // Loaded values past where the device boundary falls back are unlocked from here: their
    // copies land before anyone can evict them and reuse their slots.
    for (auto& e : r.load_events) e.synchronize();
    for (auto& e : h.state_events) e.synchronize();
  }
  if (agreed_loads_ && done > 0) {
    // protocol.load_back = agreed with transfer.load.fail (PP = 1): the copies land and their
    // outcome — none failed on any rank of the stage — is agreed before anyone can read them. A
    // broken load-back is taken back whole on every rank: the nodes stay host-only, the request
    // computes those positions itself.
    bool ok = true;
    for (auto& e : r.load_events) {
      e.synchronize();
      ok = ok && !e.failed();
    }
    for (auto& e : h.state_events) {
      e.synchronize();
      ok = ok && !e.failed();
    }
    const bool agreed = agreement_->agree_allocation(ok);
    KVGRID_CONSENSUS(log_, "load_outcome", {static_cast<std::int64_t>(id.value()), n_of(done)}, {agreed ? 1 : 0});  // (this rank's own outcome is not a decision)
    if (!agreed) {
      const Tokens loaded = tree_.peek_prefix(view).matched - device;
      unified::EvictResult back;
      back.freed.resize(tree_.components());
      for (std::size_t i = done; i-- > 0;) {
        auto slots = tree_.uncommit_load(items[i]);
        auto& f = back.freed[items[i].component.value()];
        f.insert(f.end(), slots.begin(), slots.end());
      }
      release(back, nullptr);
      r.load_events.clear();
      h.state_events.clear();
      ++counters_.load_failed;
      counters_.load_recomputed_tokens += std::max<std::int64_t>(0, loaded.value());
    }
  }
  tree_.unlock(path);
  tree_.unlock(start);
  m = tree_.peek_prefix(view);  // the first match accounted for the access (and the hits) already
  r.host_loaded = std::max(Tokens(0), m.matched - device);
  KVGRID_CONSENSUS(log_, "load_back", {static_cast<std::int64_t>(id.value()), (target - device).value()},
                   {n_of(done), n_of(items.size()), m.matched.value()});
}

std::unique_ptr<StorageTier> HybridCache::make_storage_tier(StorageTierConfig cfg, AckAgreement& agreement) {
  KVGRID_CHECK(host_ != nullptr, "the hybrid storage tier needs the host tier");
  const Tokens window = cfg_.swa ? cfg_.window : Tokens(0), chunk = cfg_.mamba ? cfg_.mamba_chunk : Tokens(0);
  return std::make_unique<StorageTier>(std::move(cfg), agreement, log_, [&](const StorageContext& ctx) {
    return std::make_unique<HybridStorageSite>(ctx, tree_, *host_, window, chunk);
  });
}


// ---- P/D decode ---------------------------------------------------------------------------

bool HybridCache::expect_suffix(RequestId id, Reservation& r, Tokens prompt) {
  if (!cfg_.swa) return true;
  HybridHold& h = *r.hybrid;
  const std::int64_t p = cfg_.page_size.value();
  KVGRID_CHECK(h.swa.own.empty() && h.swa.own_from == r.matched, "request ", id, " took SWA pages before its suffix arrived");
  const Tokens from = pd_swa_from(r.matched, prompt, cfg_.window, cfg_.page_size);
  const std::int64_t want = (prompt.value() + p - 1) / p - from.value() / p;
  if (want <= 0) return true;
  auto got = alloc_swa(want);
  KVGRID_CONSENSUS(log_, "pd_swa_alloc", {static_cast<std::int64_t>(id.value()), from.value(), want}, {got ? 1 : 0});
  if (!got) return false;
  h.swa.own_from = from;  // [matched, from): never held here (tombstones at its commit, as if freed)
  for (std::int64_t i = 0; i < want; ++i) {
    h.swa_table[static_cast<std::size_t>(from.value() / p + i)] = (*got)[static_cast<std::size_t>(i)].value();
    h.swa.own.push_back((*got)[static_cast<std::size_t>(i)]);
  }
  swa_held_ += want;
  debug_verify();
  return true;
}

void HybridCache::suffix_received(Reservation& r, Tokens prompt) {
  HybridHold& h = *r.hybrid;
  if (!cfg_.mamba || h.mamba_ckpt == 0 || prompt <= r.matched || prompt.value() % cfg_.mamba_chunk.value() != 0) return;
  if (copy_state_) copy_state_(h.mamba, h.mamba_ckpt);
  h.ckpt_at = prompt;
}

}  // namespace kvgrid::cache
