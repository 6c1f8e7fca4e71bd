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
  check_window(id, swa_loaded);
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

void HybridCache::check_window(RequestId id, std::int64_t swa_loaded) {
  // A request's SWA budget counts the tree's window it locks: a load-back restores at most that
  // window (bug-catalogue #19). A breach is kept for verify() to report.
  const std::int64_t window_pages = cfg_.swa ? (cfg_.window.value() + cfg_.page_size.value() - 1) / cfg_.page_size.value() : 0;
  if (swa_loaded > window_pages && window_breach_.empty())
    window_breach_ = "request " + std::to_string(id.value()) + ": a load-back restored " + std::to_string(swa_loaded) +
                     " SWA pages, more than its window's " + std::to_string(window_pages);
}

// ---- private load-backs (across pipeline stages) ------------------------------------------

bool HybridCache::load_privately(RequestId id, Reservation& r, HybridHold& h, const std::vector<unified::LoadItem>& items,
                                 Tokens target) {
  const std::int64_t p = cfg_.page_size.value();
  const Tokens device = r.shared;
  // The device boundary is a boundary every component accepts, so the window before it is live:
  // every copy lands at or past it, and the SWA copies cover one run of pages ending at target.
  std::int64_t swa_n = 0;
  Tokens swa_from = target;
  for (const auto& it : items) {
    KVGRID_CHECK(it.node->start() >= device, "request ", id, ": a private load-back of node ", it.node->id, " [",
                 it.node->start(), ", ", it.node->end, ") before its device boundary ", device);
    if (cfg_.swa && it.component == swa_) {
      swa_n += n_of(it.host.size());
      swa_from = std::min(swa_from, it.node->start());
    }
  }
  KVGRID_CHECK(swa_n * p == (target - swa_from).value(), "request ", id, ": a private load-back of ", swa_n,
               " SWA pages for [", swa_from, ", ", target, ")");
  std::optional<std::vector<Slot>> swa;
  if (swa_n > 0) swa = alloc_swa(swa_n);
  KVGRID_CONSENSUS(log_, "private_load", {static_cast<std::int64_t>(id.value()), n_of(items.size())},
                   {target.value(), swa_n == 0 || swa ? 1 : 0});
  if (swa_n > 0 && !swa) return false;  // the request computes from its device boundary
  for (const auto& it : items) {
    std::vector<Slot> dst;
    if (it.component == full_) {  // into its own pages of those positions (not fresh: never reset)
      for (std::int64_t i = it.node->start().value() / p; i < it.node->end.value() / p; ++i)
        dst.push_back(Slot(r.pages[static_cast<std::size_t>(i)].value()));
    } else if (cfg_.swa && it.component == swa_) {
      const auto at = static_cast<std::size_t>((it.node->start() - swa_from).value() / p);
      dst.assign(swa->begin() + static_cast<std::ptrdiff_t>(at), swa->begin() + static_cast<std::ptrdiff_t>(at + it.host.size()));
    } else {
      KVGRID_CHECK(it.node->end == target && h.mamba_ckpt != 0, "request ", id, ": a private state load at ", it.node->end);
      dst.push_back(Slot(h.mamba_ckpt));
    }
    host_->load(it, dst, r.load_events, h.state_events);
    if (cfg_.mamba && it.component == mamba_) {  // its running state starts from the loaded one
      if (!h.state_events.empty()) h.state_events.back().synchronize();
      if (copy_state_) copy_state_(h.mamba_ckpt, h.mamba);
      h.ckpt_at = target;
    }
  }
  if (swa) {
    for (std::size_t i = 0; i < swa->size(); ++i) h.swa_table[static_cast<std::size_t>(swa_from.value() / p) + i] = (*swa)[i].value();
    h.swa.own = std::move(*swa);
    h.swa.own_from = swa_from;  // [device, swa_from): outside the window, never held
    swa_held_ += swa_n;
    check_window(id, swa_n);
  }
  const Pages restored((target - device).value() / p);
  r.fresh -= restored;  // (the scheduler resets fresh pages for new content)
  r.matched = target;
  r.host_loaded = target - device;
  h.restoring = true;
  return true;
}

void HybridCache::confirm_restore(RequestId id, Reservation& r, bool ok) {
  HybridHold& h = *r.hybrid;
  KVGRID_CHECK(h.restoring, "request ", id, " has no private load-back to decide");
  for (auto& e : r.load_events) e.synchronize();  // a copy from the host path lands before it can go
  for (auto& e : h.state_events) e.synchronize();
  KVGRID_CONSENSUS(log_, "restore", {static_cast<std::int64_t>(id.value()), r.host_loaded.value()}, {ok ? 1 : 0});
  tree_.unlock(h.restore_lock);
  h.restore_lock = {};
  h.restoring = false;
  debug_verify();
}

std::vector<PageId> HybridCache::drop_restore(RequestId id, Reservation& r) {
  confirm_restore(id, r, /*ok=*/false);
  HybridHold& h = *r.hybrid;
  const std::int64_t p = cfg_.page_size.value();
  const auto from = static_cast<std::size_t>(r.shared.value() / p), to = static_cast<std::size_t>(r.matched.value() / p);
  std::vector<PageId> pages(r.pages.begin() + static_cast<std::ptrdiff_t>(from), r.pages.begin() + static_cast<std::ptrdiff_t>(to));
  r.fresh += Pages(static_cast<std::int64_t>(pages.size()));
  if (cfg_.swa) {  // the request takes SWA pages again as it computes from its device boundary
    for (std::size_t i = from; i < to; ++i) h.swa_table[i] = 0;
    release_own_swa(h);
    h.swa.own_from = r.shared;
  }
  if (cfg_.mamba) {  // the running state is the device boundary's again (none at the root: the forward starts afresh)
    h.ckpt_at = Tokens(0);
    if (r.shared.value() > 0 && copy_state_) {
      const auto& v = h.lock.node->at(mamba_).value;
      KVGRID_CHECK(v && v->size() == 1, "request ", id, ": its device boundary ", r.shared, " holds no MAMBA state");
      copy_state_((*v)[0].value(), h.mamba);
    }
  }
  r.matched = r.shared;
  r.host_loaded = Tokens(0);
  r.storage_loaded = Tokens(0);
  r.load_events.clear();
  h.state_events.clear();
  debug_verify();
  return pages;
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
  // Its own SWA pages end at its match: none, or (a private restore) the window loaded before it.
  KVGRID_CHECK(h.swa.own_from.value() + n_of(h.swa.own.size()) * p == r.matched.value(), "request ", id,
               " took SWA pages before its suffix arrived");
  const Tokens from = pd_swa_from(r.matched, prompt, cfg_.window, cfg_.page_size);
  const std::int64_t want = (prompt.value() + p - 1) / p - from.value() / p;
  if (want <= 0) return true;
  auto got = alloc_swa(want);
  KVGRID_CONSENSUS(log_, "pd_swa_alloc", {static_cast<std::int64_t>(id.value()), from.value(), want}, {got ? 1 : 0});
  if (!got) return false;
  if (from > r.matched) {  // a loaded window ends before the prompt's tail window: nobody reads it
    for (std::size_t i = static_cast<std::size_t>(h.swa.own_from.value() / p); i < static_cast<std::size_t>(r.matched.value() / p); ++i)
      h.swa_table[i] = 0;
    release_own_swa(h);
  }
  if (h.swa.own.empty()) h.swa.own_from = from;  // [matched, from): never held here (tombstones at its commit, as if freed)
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
