#include "cache/hybrid_cache.hpp"

#include <algorithm>

#include "cache/device_cache.hpp"
#include "core/check.hpp"
#include "core/hash.hpp"

namespace kvgrid::cache {

using unified::ComponentId;
using unified::InsertValue;
using unified::Slot;

namespace {
std::uint64_t slots_digest(std::span<const Slot> s) {
  std::uint64_t h = 0x68796272ULL;
  for (Slot x : s) h = hash_combine(h, x.value());
  return h;
}
std::int64_t n_of(std::size_t n) { return static_cast<std::int64_t>(n); }
}  // namespace

HybridCache::HybridCache(const HybridCacheConfig& cfg, DevicePool& full_pool, DecisionLog& log)
    : cfg_(cfg),
      tree_(cfg.page_size),
      full_pool_(full_pool),
      swa_pool_(cfg.swa ? cfg.swa_pages.value() : 0),
      mamba_pool_(cfg.mamba ? cfg.mamba_slots : 0),
      log_(log) {
  KVGRID_CHECK(full_pool.shards() == 1, "hybrid models over a sharded pool");
  tree_.set_session_policy(cfg.sessions);
  full_ = tree_.add_component(std::make_unique<unified::FullComponent>());
  if (cfg.swa) {
    auto s = std::make_unique<unified::SwaComponent>(cfg.window, cfg.bugs);
    swa_comp_ = s.get();
    swa_ = tree_.add_component(std::move(s));
  }
  if (cfg.mamba) mamba_ = tree_.add_component(std::make_unique<unified::MambaComponent>(cfg.mamba_chunk, cfg.bugs));
  for (const auto& sc : cfg.sidecars) {
    KVGRID_CHECK(!sc.swa || cfg.swa, "sidecar ", sc.name, " follows SWA in a model without SWA layers");
    const auto capacity = static_cast<std::size_t>(sc.swa ? cfg.swa_pages.value() : full_pool.capacity().value());
    auto p = unified::PayloadSidecar::make(tree_, sc.name, sc.swa ? swa_ : full_, sc.words_per_token, capacity);
    sidecars_.push_back(p.get());
    tree_.add_sidecar(std::move(p));
  }
}

// ---- pools ----------------------------------------------------------------------------------

void HybridCache::release(const unified::EvictResult& e, Pages* evicted) {
  std::vector<PageId> full;
  for (Slot s : e.freed[full_.value()]) full.push_back(PageId(s.value()));
  full_pool_.free(full);
  if (evicted) *evicted += Pages(n_of(full.size()));
  if (cfg_.swa) free_swa(e.freed[swa_.value()]);
  if (cfg_.mamba) {
    std::vector<std::uint32_t> st;
    for (Slot s : e.freed[mamba_.value()]) st.push_back(s.value());
    free_states(st);
  }
}

void HybridCache::make_room(ComponentId c, std::int64_t want, std::int64_t free_now, Pages* evicted) {
  if (want <= free_now) return;
  unified::EvictResult e =
      host_ && host_->writes_back()
          ? tree_.evict(c, want - free_now, [this](unified::Node* victim) { host_->write_back(victim); })
          : tree_.evict(c, want - free_now);
  KVGRID_CONSENSUS(log_, "evict", {static_cast<std::int64_t>(c.value()), want - free_now},
                   {n_of(e.freed[c.value()].size()), n_of(e.nodes_deleted)}, slots_digest(e.freed[c.value()]));
  release(e, evicted);
}

void HybridCache::free_swa(std::span<const Slot> s) {
  if (s.empty()) return;
  swa_pool_.free(s);
  if (on_swa_free_) {
    std::vector<PageId> p;
    for (Slot x : s) p.push_back(PageId(x.value()));
    on_swa_free_(p);
  }
}

void HybridCache::free_states(std::span<const std::uint32_t> s) {
  if (s.empty()) return;
  std::vector<Slot> slots;
  for (auto x : s) slots.push_back(Slot(x));
  mamba_pool_.free(slots);
  if (on_state_free_) on_state_free_(s);
}

std::optional<std::vector<Slot>> HybridCache::alloc_swa(std::int64_t n) {
  make_room(swa_, n, swa_pool_.free_count(), nullptr);
  return swa_pool_.alloc(n);
}

std::optional<std::uint32_t> HybridCache::alloc_state() {
  make_room(mamba_, 1, mamba_pool_.free_count(), nullptr);
  auto s = mamba_pool_.alloc(1);
  if (!s) return std::nullopt;
  return (*s)[0].value();
}

void HybridCache::relock(HybridHold& h, unified::Node* node) {
  unified::LockHandle next = tree_.lock(node);
  tree_.unlock(h.lock);
  h.lock = std::move(next);
  h.swa.lock = &h.lock;
}

// ---- a request's life -----------------------------------------------------------------------

std::optional<Reservation> HybridCache::reserve(RequestId id, std::span<const TokenId> prompt, Tokens kv_tokens,
                                                Tokens max_match) {
  const std::int64_t p = cfg_.page_size.value();
  const auto cap = static_cast<std::size_t>(max_match.value());
  const std::size_t view = cap < prompt.size() ? cap + 1 : prompt.size();
  unified::MatchResult m = tree_.match_prefix(prompt.first(view));
  KVGRID_CONSENSUS(log_, "match_prefix", {static_cast<std::int64_t>(id.value()), n_of(prompt.size())},
                   {m.matched.value(), m.walked.value()});
  // What each rule cost this request (the walk's votes), read now: eviction below may delete
  // walked nodes past the boundary. FULL alone's boundary, and how much of it each component's
  // rule, with FULL's, would cut (counted once the request is admitted).
  std::int64_t rule_cost[3] = {0, 0, 0};
  {
    auto deepest = [&](std::uint64_t want) {
      std::int64_t d = 0;
      for (const auto& c : m.candidates)
        if ((c.yes & want) == want) d = c.node->end.value();
      return d;
    };
    const std::uint64_t full = 1ULL << full_.value();
    const std::int64_t full_alone = deepest(full);
    rule_cost[0] = full_alone;
    if (cfg_.swa) rule_cost[1] = full_alone - deepest(full | (1ULL << swa_.value()));
    if (cfg_.mamba) rule_cost[2] = full_alone - deepest(full | (1ULL << mamba_.value()));
  }
  auto hold = std::make_unique<HybridHold>();
  Reservation r;
  const std::int64_t total = (kv_tokens.value() + p - 1) / p;
  if (cfg_.swa) {
    const std::int64_t w = (cfg_.window.value() + p - 1) / p, c = (cfg_.chunk_tokens.value() + p - 1) / p;
    hold->swa_budget = std::min(total, 2 * w + c + 2);
    if (swa_budget_ + hold->swa_budget > cfg_.swa_pages.value()) {
      last_refusal_injected_ = false;
      last_refusal_ = "its SWA footprint of " + std::to_string(hold->swa_budget) + " pages (2 windows, a chunk and 2 pages) and the running requests' " +
                      std::to_string(swa_budget_) + " exceed cache.swa_pages = " + std::to_string(cfg_.swa_pages.value());
      KVGRID_CONSENSUS(log_, "admit", {static_cast<std::int64_t>(id.value())}, {0, -hold->swa_budget});
      return std::nullopt;  // the running requests' SWA footprints leave no room for its own
    }
  }
  const bool loads = host_ && m.host_matched - m.matched >= host_->load_back_threshold();
  std::vector<unified::LoadItem> private_items;  // (private restores: copied once the request is admitted)
  if (loads && !private_restores_) load_back(id, prompt.first(view), m, r, *hold);
  if (loads && private_restores_) {  // the host path stays while the request may still copy from it
    hold->restore_lock = tree_.lock(m.host_node);
    auto plan = tree_.plan_private_load(m);
    KVGRID_CONSENSUS(log_, "private_plan", {static_cast<std::int64_t>(id.value())}, {plan ? n_of(plan->size()) : -1});
    if (plan) private_items = std::move(*plan);
    else {  // a copy past the boundary has no host copy: computed instead
      tree_.unlock(hold->restore_lock);
      hold->restore_lock = {};
    }
  }
  unified::Node* reuse_node = m.last_node;
  std::vector<Slot> fm = m.components[full_.value()].slots;
  if (cfg_.bugs.has(ComponentBug::ReadPastBoundary)) {
    // read_past_boundary (#23): FULL's pages to the deepest candidate FULL accepts, although SWA
    // or MAMBA refused the boundaries past m.matched (their state is still the boundary's).
    const std::uint64_t full = 1ULL << full_.value();
    std::size_t last = m.candidates.size();
    for (std::size_t i = 0; i < m.candidates.size(); ++i)
      if (m.candidates[i].yes & full) last = i;
    for (std::size_t i = 0; last < m.candidates.size() && i <= last; ++i) {
      const unified::Node* n = m.candidates[i].node;
      if (n->end <= m.matched) continue;
      fm.insert(fm.end(), n->at(full_).value->begin(), n->at(full_).value->end());
      reuse_node = const_cast<unified::Node*>(n);
    }
  }
  const Tokens matched = reuse_node == tree_.root() ? Tokens(0) : reuse_node->end;
  hold->lock = tree_.lock(reuse_node);
  hold->swa.lock = &hold->lock;
  // write_through_selective: a prefix that just reached the hit threshold is backed up now.
  if (host_ && matched.value() > 0) host_->on_hit(reuse_node);
  const std::int64_t need = total - n_of(fm.size());
  make_room(full_, need, full_pool_.free_pages().value(), &r.evicted);
  auto fresh = full_pool_.alloc(Pages(need));
  std::vector<std::uint32_t> states;
  if (fresh && cfg_.mamba) {
    make_room(mamba_, 2, mamba_pool_.free_count(), &r.evicted);
    if (auto s = mamba_pool_.alloc(2)) states = {(*s)[0].value(), (*s)[1].value()};
  }
  const bool found = fresh && (!cfg_.mamba || !states.empty());
  const bool ok = decide_allocation_ ? decide_allocation_(id, found) : found;
  KVGRID_CONSENSUS(log_, "admit", {static_cast<std::int64_t>(id.value())}, {ok ? 1 : 0, need});
  last_refusal_injected_ = found && !ok;
  if (!ok) {
    last_refusal_ = !fresh   ? "no " + std::to_string(need) + " FULL pages free after eviction"
                    : !found ? "no 2 MAMBA slots free after eviction (the matched state is locked while it is copied)"
                             : "the allocation failed on a rank of the stage (device.alloc.fail)";
    if (fresh) full_pool_.free(*fresh);
    free_states(states);
    tree_.unlock(hold->lock);
    tree_.unlock(hold->restore_lock);
    // What was loaded stays cached in the tree: its copies land before anyone can read it.
    for (auto& e : r.load_events) e.synchronize();
    for (auto& e : hold->state_events) e.synchronize();
    debug_verify();
    return std::nullopt;
  }
  swa_budget_ += hold->swa_budget;
  counters_.full_alone_tokens += rule_cost[0];
  counters_.swa_cost_tokens += rule_cost[1];
  counters_.mamba_cost_tokens += rule_cost[2];
  if (cfg_.mamba) {
    hold->mamba = hold->mamba_own = states[0];
    hold->mamba_ckpt = states[1];
    states_held_ += 2;
    const auto& src = m.components[mamba_.value()].slots;
    if (m.matched.value() > 0) {
      KVGRID_CHECK(src.size() == 1, "request ", id, ": a match at ", m.matched, " without a MAMBA state");
      if (cfg_.bugs.has(ComponentBug::SharedStateSlot)) {
        hold->mamba = src[0].value();  // #22: no private copy — the forward advances the tree's slot
      } else {
        if (copy_state_) copy_state_(src[0].value(), hold->mamba);
        ++counters_.states_copied;
      }
    }
  }
  if (cfg_.swa) {
    hold->swa_table.assign(static_cast<std::size_t>(total), 0);
    const auto& sm = m.components[swa_.value()];
    for (std::size_t i = 0; i < sm.slots.size(); ++i)
      hold->swa_table[static_cast<std::size_t>(sm.from.value() / p) + i] = sm.slots[i].value();
    hold->swa.own_from = matched;
  }
  r.matched = matched;
  r.kv_tokens = kv_tokens;
  r.fresh = Pages(need);
  r.private_pages = Pages(need);
  r.shared = matched;
  reserved_ += Pages(need);
  for (Slot s : fm) r.pages.push_back(PageId(s.value()));
  r.pages.insert(r.pages.end(), fresh->begin(), fresh->end());
  r.hybrid = std::move(hold);
  if (!private_items.empty() && !load_privately(id, r, *r.hybrid, private_items, m.host_matched)) {
    tree_.unlock(r.hybrid->restore_lock);
    r.hybrid->restore_lock = {};
  }
  debug_verify();
  return r;
}

bool HybridCache::prepare(RequestId id, Reservation& r, Tokens end) {
  if (!cfg_.swa) return true;
  HybridHold& h = *r.hybrid;
  const std::int64_t p = cfg_.page_size.value();
  const std::int64_t have_to = h.swa.own_from.value() + n_of(h.swa.own.size()) * p;  // own pages cover [own_from, have_to)
  const std::int64_t want = (end.value() + p - 1) / p - have_to / p;
  if (want <= 0) return true;
  auto got = alloc_swa(want);
  KVGRID_CONSENSUS(log_, "swa_alloc", {static_cast<std::int64_t>(id.value()), want}, {got ? 1 : 0});
  if (!got) {
    ++counters_.swa_waits;
    // It sits the step out: what it loaded back is in the tree already, and others may read it.
    for (auto& e : r.load_events) e.synchronize();
    for (auto& e : h.state_events) e.synchronize();
    return false;
  }
  for (std::int64_t i = 0; i < want; ++i) {
    h.swa_table[static_cast<std::size_t>(have_to / p + i)] = (*got)[static_cast<std::size_t>(i)].value();
    h.swa.own.push_back((*got)[static_cast<std::size_t>(i)]);
  }
  swa_held_ += want;
  debug_verify();
  return true;
}

void HybridCache::advance(Reservation& r, Tokens start, Tokens computed, bool decode) {
  HybridHold& h = *r.hybrid;
  if (cfg_.mamba && h.mamba_ckpt != 0) {
    // The model saved the state at every grid depth in (start, computed]: the deepest is kept.
    const Tokens g(computed.value() / cfg_.mamba_chunk.value() * cfg_.mamba_chunk.value());
    if (g > start) {
      h.ckpt_at = g;
      if (cfg_.bugs.has(ComponentBug::MtpStateAtFloor) && decode && computed > g && copy_state_) {
        // mtp_state_at_floor (#21, atlas #156): a verify step that accepted draft tokens past a
        // checkpoint depth registers the state after all of them (MTP's +k stride floored to the
        // grid) instead of the one the model saved at the depth itself.
        copy_state_(h.mamba, h.mamba_ckpt);
      }
    } else if (cfg_.bugs.has(ComponentBug::StateAtFloor) && g.value() > 0) {
      // state_at_floor (#21): no checkpoint depth was passed, yet the running state (of
      // `computed` tokens) is saved as the checkpoint of the floored depth g.
      if (copy_state_) copy_state_(h.mamba, h.mamba_ckpt);
      h.ckpt_at = g;
    }
  }
  if (!cfg_.swa) return;
  const std::int64_t p = cfg_.page_size.value();
  // What the request still needs: the window before its page-aligned length (where its next
  // insert ends) — a query q >= computed reads (q - W, q], within it.
  const Tokens position(computed.value() / p * p - cfg_.window.value());
  if (position.value() <= 0) return;
  const bool window_held = h.lock.parts[swa_.value()].held;
  const auto first = static_cast<std::size_t>(h.swa.own_from.value() / p);
  std::vector<Slot> freed = swa_comp_->free_before(tree_, h.swa, position);
  if (window_held && !h.lock.parts[swa_.value()].held) ++counters_.windows_released;
  if (cfg_.bugs.has(ComponentBug::HealFreesStale))
    for (std::size_t i = 0; i < freed.size(); ++i) full_to_swa_[r.pages[first + i].value()] = freed[i].value();
  // (unfinished_insert_live keeps the released ids in the table, as a stale page table would.)
  if (!cfg_.bugs.has(ComponentBug::UnfinishedInsertLive))
    for (std::size_t i = 0; i < freed.size(); ++i) h.swa_table[first + i] = 0;
  swa_held_ -= n_of(freed.size());
  counters_.swa_freed += n_of(freed.size());
  free_swa(freed);
  debug_verify();
}

void HybridCache::insert_computed(RequestId id, Reservation& r, std::span<const TokenId> computed_tokens, bool last) {
  HybridHold& h = *r.hybrid;
  const std::size_t p = static_cast<std::size_t>(cfg_.page_size.value());
  const std::size_t aligned = computed_tokens.size() / p;  // pages
  const std::size_t from = static_cast<std::size_t>(r.shared.value()) / p;
  if (aligned <= from) return;
  KVGRID_CHECK(r.pages.size() >= aligned, "page table of ", r.pages.size(), " pages for ", aligned, " computed pages");
  auto key = computed_tokens.first(aligned * p);
  const Tokens end(static_cast<std::int64_t>(aligned * p));
  std::vector<InsertValue> values(tree_.components());
  // FULL: the request's own pages, from where its shared prefix ends (the tree's own before that,
  // locked by the request, so every node there stays).
  std::vector<Slot> full;
  for (std::size_t i = from; i < aligned; ++i) full.push_back(Slot(r.pages[i].value()));
  values[full_.value()] = InsertValue::pages(std::move(full), r.shared);
  std::vector<std::int64_t> swa_before;
  std::size_t swa_offered = 0;
  if (cfg_.swa) {
    swa_before = tree_.page_values(key, swa_);
    KVGRID_CHECK(h.swa.own_from <= end, "request ", id, " freed SWA pages up to ", h.swa.own_from, " beyond ", end);
    swa_offered = std::min(h.swa.own.size(), aligned - static_cast<std::size_t>(h.swa.own_from.value()) / p);
    std::vector<Slot> offer(h.swa.own.begin(), h.swa.own.begin() + static_cast<std::ptrdiff_t>(swa_offered));
    Tokens offer_from = h.swa.own_from;
    if (cfg_.bugs.has(ComponentBug::UnfinishedInsertLive) && !last) {
      // unfinished_insert_live (#16): a chunk's insert does not forward how far the request
      // released its window — it offers from its shared prefix, with the released pages' ids.
      std::vector<Slot> stale;
      for (std::size_t i = from; i < static_cast<std::size_t>(h.swa.own_from.value()) / p; ++i)
        if (h.swa_table[i] != 0) stale.push_back(Slot(h.swa_table[i]));
      if (stale.size() == static_cast<std::size_t>(h.swa.own_from.value()) / p - from) {
        offer.insert(offer.begin(), stale.begin(), stale.end());
        offer_from = r.shared;
      }
    }
    values[swa_.value()] = InsertValue::pages(std::move(offer), offer_from);
  }
  const bool offer_state = cfg_.mamba && h.mamba_ckpt != 0 && h.ckpt_at.value() > 0 && h.ckpt_at <= end;
  if (cfg_.mamba) values[mamba_.value()] = offer_state ? InsertValue::state(Slot(h.mamba_ckpt), h.ckpt_at) : InsertValue::none();
  // Below the node it holds locked: its path was this request's match (or its last insert).
  unified::InsertResult ins = tree_.insert_below(h.lock.node, key, values);
  KVGRID_CONSENSUS(log_, "insert", {static_cast<std::int64_t>(id.value()), n_of(key.size())},
                   {ins.components[full_.value()].present.value(), offer_state ? h.ckpt_at.value() : 0});
  // FULL: pages the tree held already replace ours (ours go back to the pool).
  std::vector<PageId> dup;
  for (Slot s : ins.components[full_.value()].returned) dup.push_back(PageId(s.value()));
  full_pool_.free(dup);
  const auto tree_full = tree_.page_values(key, full_);
  for (std::size_t i = 0; i < aligned; ++i) {
    KVGRID_CHECK(tree_full[i] > 0, "request ", id, ": page ", i, " of its inserted prefix holds no FULL page");
    r.pages[i] = PageId(static_cast<std::uint32_t>(tree_full[i]));
  }
  const Pages moved(static_cast<std::int64_t>(aligned - from));
  r.private_pages -= moved;
  reserved_ -= moved;
  if (cfg_.swa) {
    // Ours the tree did not take (above the window, or duplicates) go back to the pool; the page
    // table follows the tree from here on.
    const auto& back = ins.components[swa_.value()].returned;
    h.swa.own.erase(h.swa.own.begin(), h.swa.own.begin() + static_cast<std::ptrdiff_t>(swa_offered));
    h.swa.own_from = std::max(h.swa.own_from, end);
    swa_held_ -= n_of(swa_offered);
    free_swa(back);
    const auto after = tree_.page_values(key, swa_);
    for (std::size_t i = 0; i < aligned; ++i) {
      h.swa_table[i] = after[i] > 0 ? static_cast<std::uint32_t>(after[i]) : 0;
      if (swa_before[i] < 0 && after[i] == 0) ++counters_.tombstones_made;
      if (swa_before[i] == 0 && after[i] > 0) {
        ++counters_.tombstones_healed;
        // heal_frees_stale (#15): healing frees the position's old FULL->SWA mapping, a page its
        // request released long ago that the pool has handed out again since.
        if (auto it = full_to_swa_.find(static_cast<std::uint32_t>(tree_full[i])); it != full_to_swa_.end()) {
          const Slot stale(it->second);
          full_to_swa_.erase(it);
          if (stale.value() != static_cast<std::uint32_t>(after[i])) free_swa(std::span<const Slot>(&stale, 1));
        }
      }
    }
  }
  // The lock moves first: the checkpoint slot's eviction below must not take what was just inserted.
  relock(h, ins.last_node);
  if (host_) host_->backup_path(ins.last_node);
  r.shared = end;
  if (offer_state) {
    const auto& back = ins.components[mamba_.value()].returned;
    h.ckpt_at = Tokens(0);
    if (back.empty()) {  // the tree took the checkpoint: a fresh slot for the next one (none at the end)
      ++counters_.states_saved;
      --states_held_;
      h.mamba_ckpt = 0;
      if (!last) {
        if (auto s = alloc_state()) {
          h.mamba_ckpt = *s;
          ++states_held_;
        }
        KVGRID_CONSENSUS(log_, "state_slot", {static_cast<std::int64_t>(id.value())}, {h.mamba_ckpt != 0 ? 1 : 0});
      }
    }
  }
  debug_verify();
}

void HybridCache::commit(RequestId id, Reservation& r, std::span<const TokenId> kv_tokens, SessionTag session) {
  KVGRID_CHECK(static_cast<std::int64_t>(kv_tokens.size()) == r.kv_tokens.value(), "commit of ", kv_tokens.size(),
               " tokens for a reservation of ", r.kv_tokens);
  insert_computed(id, r, kv_tokens, /*last=*/true);
  if (cfg_.track_sessions && session.session != 0 && r.hybrid) {
    const auto out = tree_.register_session(session.session, session.generation, r.hybrid->lock.node);
    log_.record("session_register", {static_cast<std::int64_t>(id.value()), static_cast<std::int64_t>(session.session),
                                     static_cast<std::int64_t>(session.generation)},
                {static_cast<std::int64_t>(out)});
  }
  abort(id, r);  // what is still private (the partial last page, own SWA pages, states) goes back
}

void HybridCache::session_event(bool open, std::uint64_t session) {
  if (!cfg_.track_sessions) return;
  if (open) {
    const auto g = tree_.open_session(session);
    log_.record("session_open", {static_cast<std::int64_t>(session)}, {static_cast<std::int64_t>(g)});
  } else {
    const bool was = tree_.close_session(session);
    log_.record("session_close", {static_cast<std::int64_t>(session)}, {was ? 1 : 0});
  }
  debug_verify();
}

std::uint64_t HybridCache::session_arrival(RequestId id, std::uint64_t session) {
  if (!cfg_.track_sessions || session == 0) return 0;
  const auto g = tree_.session_arrival(session);
  log_.record("session_arrival", {static_cast<std::int64_t>(id.value()), static_cast<std::int64_t>(session)},
              {static_cast<std::int64_t>(g)});
  return g;
}

void HybridCache::release_own_swa(HybridHold& h) {
  swa_held_ -= n_of(h.swa.own.size());
  tree_.drop_sidecars(swa_, h.swa.own);
  free_swa(h.swa.own);
  h.swa.own.clear();
}

void HybridCache::abort(RequestId id, Reservation& r) {
  if (!r.hybrid) return;
  HybridHold& h = *r.hybrid;
  for (auto& e : r.load_events) e.synchronize();  // copies into tree slots land before reuse
  for (auto& e : h.state_events) e.synchronize();
  r.load_events.clear();
  const std::size_t p = static_cast<std::size_t>(cfg_.page_size.value());
  const std::size_t shared = static_cast<std::size_t>(r.shared.value()) / p;
  if (r.pages.size() > shared) {
    const auto mine_pages = std::span<const PageId>(r.pages).subspan(shared);
    std::vector<Slot> slots;
    for (PageId pg : mine_pages) slots.push_back(Slot(pg.value()));
    tree_.drop_sidecars(full_, slots);
    full_pool_.free(mine_pages);
    const Pages mine(static_cast<std::int64_t>(r.pages.size() - shared));
    r.private_pages -= mine;
    reserved_ -= mine;
  }
  KVGRID_CHECK(r.private_pages.value() == 0, "request ", id, " still holds ", r.private_pages, " private pages");
  swa_budget_ -= h.swa_budget;
  if (cfg_.swa) {
    release_own_swa(h);
  }
  std::vector<std::uint32_t> st;
  if (h.mamba_own) st.push_back(h.mamba_own);
  if (h.mamba_ckpt) st.push_back(h.mamba_ckpt);
  states_held_ -= n_of(st.size());
  free_states(st);
  tree_.unlock(h.lock);
  tree_.unlock(h.restore_lock);  // (a private load-back not agreed yet: its copies landed above)
  r.hybrid.reset();
  r.pages.clear();
  KVGRID_CONSENSUS(log_, "release", {static_cast<std::int64_t>(id.value())}, {});
  debug_verify();
}

// ---- checks ---------------------------------------------------------------------------------

std::vector<PageId> HybridCache::cached_pages() const {
  std::vector<PageId> out;
  std::vector<const unified::Node*> stack{tree_.root()};
  while (!stack.empty()) {
    const unified::Node* n = stack.back();
    stack.pop_back();
    if (n->at(full_).live())
      for (Slot s : *n->at(full_).value) out.push_back(PageId(s.value()));
    for (const auto& [k, c] : n->children) stack.push_back(c.get());
  }
  std::sort(out.begin(), out.end());
  return out;
}

void HybridCache::verify() const {
  KVGRID_CHECK(window_breach_.empty(), window_breach_);
  unified::VerifyAccounts acc;
  acc.components.resize(tree_.components());
  acc.components[full_.value()] = {full_pool_.capacity().value(), full_pool_.free_pages().value(), reserved_.value()};
  if (cfg_.swa) acc.components[swa_.value()] = {swa_pool_.capacity(), swa_pool_.free_count(), swa_held_};
  if (cfg_.mamba) acc.components[mamba_.value()] = {mamba_pool_.capacity(), mamba_pool_.free_count(), states_held_};
  if (host_) host_->host_accounts(acc);
  tree_.verify(&acc);  // every tree slot of a sidecar's source has its entry
  full_pool_.verify();
  // ... and no entry outlives its source's slot: each sits on a slot its pool has handed out
  // (the tree's, or a request's own).
  for (std::size_t i = 0; i < sidecars_.size(); ++i) {
    const bool swa = cfg_.sidecars[i].swa;
    const std::int64_t cap = swa ? swa_pool_.capacity() : full_pool_.capacity().value();
    for (std::int64_t s = 1; s <= cap; ++s) {
      const Slot slot(static_cast<std::uint32_t>(s));
      if (!sidecars_[i]->has(slot)) continue;
      KVGRID_CHECK(swa ? swa_pool_.is_allocated(slot) : full_pool_.is_allocated(PageId(slot.value())), "sidecar ",
                   sidecars_[i]->name(), " holds an entry for ", swa ? "SWA" : "FULL", " slot ", s, ", which is free");
    }
  }
}

void HybridCache::debug_verify() const {
  if (KVGRID_DEBUG_CHECKS_ON()) verify();
}

}  // namespace kvgrid::cache
