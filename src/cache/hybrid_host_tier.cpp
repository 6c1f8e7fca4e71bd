#include "cache/hybrid_host_tier.hpp"

#include <algorithm>

#include "core/check.hpp"
#include "core/hash.hpp"

namespace kvgrid::cache {

using unified::ComponentId;
using unified::Slot;

namespace {
std::vector<PageId> page_ids(std::span<const Slot> s) {
  std::vector<PageId> out;
  out.reserve(s.size());
  for (Slot x : s) out.push_back(PageId(x.value()));
  return out;
}
std::int64_t n_of(std::size_t n) { return static_cast<std::int64_t>(n); }
}  // namespace

HybridHostTier::HybridHostTier(HybridHostConfig cfg, unified::UnifiedTree& tree, std::vector<ComponentKind> kinds,
                               HybridBytes bytes, std::vector<unified::PayloadSidecar*> sidecars,
                               transfer::TransferEngine& engine, AckAgreement& agreement, DecisionLog& log)
    : cfg_(std::move(cfg)), policy_(parse_write_policy(cfg_.tier.write_policy)), tree_(tree), kinds_(std::move(kinds)), bytes_(bytes), engine_(engine), agreement_(agreement),
      log_(log), in_flight_(kinds_.size(), 0),
      acks_(agreement, log, [this](std::uint64_t id, bool placeholder, bool ok) {
        KVGRID_CHECK(!writes_.empty() && writes_.front().id == id, "hybrid write ACK ", id, " published out of order");
        Write w = std::move(writes_.front());
        writes_.pop_front();
        publish(w, placeholder, ok);
      }) {
  KVGRID_CHECK(kinds_.size() == tree.components(), "host tier for ", kinds_.size(), " of ", tree.components(), " components");
  for (ComponentKind k : kinds_)
    pools_.emplace_back(k == ComponentKind::Full ? cfg_.tier.host_pages.value() : k == ComponentKind::Swa ? cfg_.swa_pages : cfg_.mamba_slots);
  for (unified::PayloadSidecar* sc : sidecars) {
    const auto capacity = static_cast<std::size_t>(pools_[sc->source().value()].capacity());
    sidecars_.push_back({sc, std::make_unique<unified::PayloadSidecar>(std::string(sc->name()), sc->source(),
                                                                       sc->words_per_slot(), capacity)});
  }
  KVGRID_CHECK(!bytes_.full_device == !bytes_.full_host && !bytes_.swa_device == !bytes_.swa_host &&
                   !bytes_.state_device == !bytes_.state_host,
               "hybrid host tier: a kind's bytes on one side only");
  // (a packed draft's layers and words follow the target's in the host pools)
  if (bytes_.full_device)
    KVGRID_CHECK(bytes_.full_device->block_compatible(*bytes_.full_host) && bytes_.full_host->layers() >= bytes_.full_device->layers(),
                 "host and device FULL pools differ in geometry");
  if (bytes_.swa_device)
    KVGRID_CHECK(bytes_.swa_device->block_compatible(*bytes_.swa_host) && bytes_.swa_host->layers() >= bytes_.swa_device->layers(),
                 "host and device SWA pools differ in geometry");
  if (bytes_.state_device)
    KVGRID_CHECK(bytes_.state_device->words_per_slot() <= bytes_.state_host->words_per_slot(),
                 "host and device MAMBA states differ in size");
}

void HybridHostTier::set_draft(HybridDraftBytes d) {
  draft_ = d;
  auto packed = [](const DraftState* x) { return x && x->layout() == DraftLayout::Packed ? x->device().layers() : 0; };
  if (bytes_.full_device)
    KVGRID_CHECK(bytes_.full_host->layers() == bytes_.full_device->layers() + packed(d.full), "FULL host pool of ",
                 bytes_.full_host->layers(), " layers for ", bytes_.full_device->layers(), " target and ", packed(d.full), " packed draft layers");
  if (bytes_.swa_device)
    KVGRID_CHECK(bytes_.swa_host->layers() == bytes_.swa_device->layers() + packed(d.swa), "SWA host pool of ",
                 bytes_.swa_host->layers(), " layers for ", bytes_.swa_device->layers(), " target and ", packed(d.swa), " packed draft layers");
  if (bytes_.state_device)
    KVGRID_CHECK(bytes_.state_host->words_per_slot() == bytes_.state_device->words_per_slot() + (d.states ? d.states->packed_words() : 0),
                 "MAMBA host slots of ", bytes_.state_host->words_per_slot(), " words for ", bytes_.state_device->words_per_slot(),
                 " target words and a packed draft's");
}

// ---- host slots -----------------------------------------------------------------------------

void HybridHostTier::free_host(ComponentId c, std::span<const Slot> s) {
  if (s.empty()) return;
  pools_[c.value()].free(s);
  for (auto& sc : sidecars_)
    if (sc.device->source() == c) sc.host->drop(s);
  // A freed host slot holds no old bytes (a read of it before a copy lands is a mismatch) — nor
  // does a sidecar draft's host slot beside it (a packed draft's bytes are poisoned with the target's).
  auto sidecar_draft = [](DraftState* d) { return d && d->separate_objects() ? d->host() : nullptr; };
  std::vector<std::uint32_t> st;
  switch (kinds_[c.value()]) {
    case ComponentKind::Full:
      if (bytes_.full_host) bytes_.full_host->poison(page_ids(s));
      if (KvPool* d = sidecar_draft(draft_.full)) d->poison(page_ids(s));
      break;
    case ComponentKind::Swa:
      if (bytes_.swa_host) bytes_.swa_host->poison(page_ids(s), /*always=*/true);
      if (KvPool* d = sidecar_draft(draft_.swa)) d->poison(page_ids(s), /*always=*/true);
      break;
    case ComponentKind::Mamba:
      for (Slot x : s) st.push_back(x.value());
      if (bytes_.state_host) bytes_.state_host->poison(st);
      if (draft_.states && draft_.states->sidecar()) draft_.states->sidecar()->poison(st);
      break;
  }
}

void HybridHostTier::release_evicted(const unified::EvictResult& e) {
  for (std::size_t c = 0; c < e.freed.size(); ++c) {
    free_host(ComponentId(static_cast<std::uint32_t>(c)), e.freed[c]);
    stats_.host_evicted += e.freed[c].size();
  }
}

std::optional<std::vector<Slot>> HybridHostTier::alloc_local(ComponentId c, std::int64_t n) {
  unified::SlotPool& pool = pools_[c.value()];
  if (pool.free_count() < n) {
    unified::EvictResult e = tree_.evict_host(c, n - pool.free_count());
    std::uint64_t h = 0x68657674ULL;
    for (Slot s : e.freed[c.value()]) h = hash_combine(h, s.value());
    KVGRID_CONSENSUS(log_, "evict_host", {static_cast<std::int64_t>(c.value()), n - pool.free_count()},
                     {n_of(e.freed[c.value()].size()), n_of(e.nodes_deleted)}, h);
    release_evicted(e);
  }
  return pool.alloc(n);
}

void HybridHostTier::host_accounts(unified::VerifyAccounts& acc) const {
  acc.host.clear();
  for (std::size_t c = 0; c < pools_.size(); ++c) acc.host.push_back({pools_[c].capacity(), pools_[c].free_count(), in_flight_[c]});
}

// ---- backups --------------------------------------------------------------------------------

transfer::Event HybridHostTier::submit_backup(const unified::Node& n, const std::vector<std::vector<Slot>>& host) {
  std::vector<std::vector<transfer::Copy>> batches;
  std::vector<transfer::Copy> draft;  // the draft's copies: one more batch, after the target's
  for (std::size_t c = 0; c < host.size(); ++c) {
    if (host[c].empty()) continue;
    const std::vector<Slot>& dev = *n.comp[c].value;
    std::vector<transfer::Copy> copies;
    append_draft_backup(kinds_[c], host[c], dev, draft);
    switch (kinds_[c]) {
      case ComponentKind::Full:
        if (bytes_.full_device)
          copies = flat(layer_copies_at(*bytes_.full_host, page_ids(host[c]), 0, *bytes_.full_device, page_ids(dev), 0,
                                        bytes_.full_device->layers()));
        break;
      case ComponentKind::Swa:
        if (bytes_.swa_device)
          copies = flat(layer_copies_at(*bytes_.swa_host, page_ids(host[c]), 0, *bytes_.swa_device, page_ids(dev), 0,
                                        bytes_.swa_device->layers()));
        break;
      case ComponentKind::Mamba:
        if (bytes_.state_device) {
          auto src = bytes_.state_device->slot(dev[0].value());
          auto dst = bytes_.state_host->slot(host[c][0].value());
          copies.push_back({dst.data(), src.data(), src.size() * sizeof(std::uint64_t)});
        }
        break;
    }
    // Sidecar entries move with their source (the node is locked: they cannot change meanwhile).
    for (auto& sc : sidecars_)
      if (sc.device->source().value() == c)
        for (std::size_t i = 0; i < dev.size(); ++i) sc.host->write(host[c][i], sc.device->read(dev[i]));
    if (!copies.empty()) batches.push_back(std::move(copies));
  }
  if (!draft.empty()) batches.push_back(std::move(draft));
  if (batches.empty()) return {};  // this stage holds none of the bytes: nothing to copy, nothing to fail
  // transfer.fail / transfer.delay apply to the node's first batch (its joined event fails or is late).
  if (cfg_.tier.transfer_fault && cfg_.tier.transfer_fault()) engine_.inject(0, true);
  std::vector<transfer::Event> parts;
  for (auto& b : batches) parts.push_back(engine_.submit(kWriteStream, std::move(b)));
  return parts.size() == 1 ? parts[0] : transfer::join(std::move(parts));
}

void HybridHostTier::backup_path(unified::Node* node) {
  if (policy_ == WritePolicy::WriteBack) return;  // backed up when evicted
  start_backups(node);
}

void HybridHostTier::start_backups(unified::Node* node) {
  const bool cross = acks_.cross_stage();
  for (unified::Node* n : tree_.backup_candidates(node)) {
    if (policy_ == WritePolicy::WriteThroughSelective && n->hit_count < cfg_.tier.write_through_threshold) break;
    std::vector<std::vector<Slot>> host(kinds_.size());
    bool ok = true;
    std::int64_t slots = 0;
    for (std::size_t c = 0; c < kinds_.size() && ok; ++c) {
      const unified::ComponentData& d = n->comp[c];
      if (!d.live() || d.backed()) continue;
      auto got = alloc_local(ComponentId(static_cast<std::uint32_t>(c)), n_of(d.value->size()));
      if (!got) ok = false;
      else host[c] = std::move(*got), slots += n_of(host[c].size());
    }
    const bool faulted = ok && cfg_.tier.alloc_fault && cfg_.tier.alloc_fault();
    // Every rank of the stage takes the same decision (across stages: agreed at publication).
    const bool agreed = cross || agreement_.agree_allocation(ok && !faulted);
    KVGRID_CONSENSUS(log_, "backup", {n->length().value(), slots}, {(ok && !faulted && agreed) || cross ? 1 : 0});
    const bool placeholder = cross && (!ok || faulted);
    if (!placeholder && !(ok && !faulted && agreed)) {
      for (std::size_t c = 0; c < host.size(); ++c) free_host(ComponentId(static_cast<std::uint32_t>(c)), host[c]);
      break;  // host full of what cannot go (somewhere): this and deeper nodes stay device-only
    }
    const std::uint64_t id = next_write_++;
    transfer::Event ev;
    if (!placeholder) {
      ev = submit_backup(*n, host);
      stats_.d2h_bytes += ev.bytes();
      stats_.d2h_ns += ev.modelled_ns();
      stats_.d2h_pages += host[0].size();
      transfers_.push_back({"d2h", id, ev.complete_ns() - ev.modelled_ns(), ev.complete_ns(), ev.bytes()});
    }
    for (std::size_t c = 0; c < host.size(); ++c) in_flight_[c] += n_of(host[c].size());
    ++stats_.writes;
    tree_.mark_writing(n, id);
    writes_.push_back({id, n, tree_.lock_node(n), std::move(host)});  // its device values stay until the copy is done
    acks_.push(id, std::move(ev), placeholder);
  }
}

void HybridHostTier::write_back(unified::Node* victim) {
  if (acks_.cross_stage()) {
    // Across pipeline stages a write-back cannot be agreed inside the eviction (the other stages
    // reach it a step later): it is an ordinary backup, placeholders where this stage failed,
    // published with its outcome agreed over every stage; the victim stays on the device, locked,
    // until then (UnifiedTree::evict skips it). One published as failed is dropped next time.
    if (!victim->write_back_failed) start_backups(victim);
    return;
  }
  for (unified::Node* n : tree_.backup_candidates(victim)) {
    std::vector<std::vector<Slot>> host(kinds_.size());
    bool ok = true;
    std::int64_t slots = 0;
    for (std::size_t c = 0; c < kinds_.size() && ok; ++c) {
      const unified::ComponentData& d = n->comp[c];
      if (!d.live() || d.backed()) continue;
      auto got = alloc_local(ComponentId(static_cast<std::uint32_t>(c)), n_of(d.value->size()));
      if (!got) ok = false;
      else host[c] = std::move(*got), slots += n_of(host[c].size());
    }
    const bool faulted = ok && cfg_.tier.alloc_fault && cfg_.tier.alloc_fault();
    const bool agreed = agreement_.agree_allocation(ok && !faulted);
    KVGRID_CONSENSUS(log_, "write_back", {n->length().value(), slots}, {agreed ? 1 : 0});
    auto give_back = [&] {
      for (std::size_t c = 0; c < host.size(); ++c) free_host(ComponentId(static_cast<std::uint32_t>(c)), host[c]);
    };
    if (!agreed) {
      give_back();
      return;  // the victim (and what is below the failed node) is dropped
    }
    if (cfg_.tier.transfer_fault && cfg_.tier.transfer_fault()) engine_.inject(0, true);
    transfer::Event ev = submit_backup(*n, host);
    ev.synchronize();  // its device values are about to be freed
    stats_.d2h_bytes += ev.bytes();
    stats_.d2h_ns += ev.modelled_ns();
    stats_.d2h_pages += host[0].size();
    transfers_.push_back({"d2h", 0, ev.complete_ns() - ev.modelled_ns(), ev.complete_ns(), ev.bytes()});
    ++stats_.writes;
    if (agreement_.agree_min(ev.failed() ? 0 : 1) == 0) {
      give_back();
      ++stats_.writes_failed;
      return;
    }
    for (std::size_t c = 0; c < host.size(); ++c)
      if (!host[c].empty()) tree_.set_host(n, ComponentId(static_cast<std::uint32_t>(c)), std::move(host[c]));
    if (on_published_) on_published_(n);
  }
}

void HybridHostTier::publish(Write& w, bool placeholder, bool ok_everywhere) {
  KVGRID_CHECK(!placeholder || !ok_everywhere, "hybrid write ", w.id, " published although its host allocation failed here");
  // The written node may have been split since: its fragments above carry the same write id.
  std::vector<unified::Node*> fragments{w.node};
  for (unified::Node* n = w.node->parent; n != tree_.root() && n->pending_write == w.id; n = n->parent) fragments.push_back(n);
  std::reverse(fragments.begin(), fragments.end());
  const std::size_t p = static_cast<std::size_t>(tree_.page_size().value());
  std::vector<std::size_t> at(kinds_.size(), 0);
  bool ok = ok_everywhere, any_unused = false;
  for (unified::Node* f : fragments) {
    tree_.mark_writing(f, 0);
    f->write_back_failed = false;
    // FULL host copies form a prefix: a fragment whose parent has none cannot take one.
    for (std::size_t c = 0; c < kinds_.size(); ++c)
      if (kinds_[c] == ComponentKind::Full && f->parent != tree_.root() && !f->parent->comp[c].backed()) ok = false;
    for (std::size_t c = 0; c < kinds_.size(); ++c) {
      const ComponentId id(static_cast<std::uint32_t>(c));
      if (w.host[c].empty()) continue;
      const bool point = kinds_[c] == ComponentKind::Mamba;
      if (point && f != w.node) continue;  // a state stays at the written node's depth
      const std::size_t k = point ? 1 : f->key.size() / p;
      std::vector<Slot> slice(w.host[c].begin() + static_cast<std::ptrdiff_t>(at[c]),
                              w.host[c].begin() + static_cast<std::ptrdiff_t>(at[c] + k));
      at[c] += k;
      if (ok) {
        tree_.set_host(f, id, std::move(slice));
      } else {
        free_host(id, slice);
        any_unused = true;
      }
    }
  }
  for (std::size_t c = 0; c < kinds_.size(); ++c) {
    if (!placeholder)
      KVGRID_CHECK(at[c] == w.host[c].size(), "hybrid write ", w.id, " covered ", at[c], " of ", w.host[c].size(),
                   " host slots of component ", c);
    else if (at[c] < w.host[c].size())  // a placeholder's slots (kept so that every pool stays the same)
      free_host(ComponentId(static_cast<std::uint32_t>(c)),
                std::span<const Slot>(w.host[c]).subspan(at[c]));
    in_flight_[c] -= n_of(w.host[c].size());
  }
  if (any_unused || placeholder) {
    ++stats_.writes_failed;
    if (policy_ == WritePolicy::WriteBack)  // (across stages) its next eviction drops it
      for (unified::Node* f : fragments) f->write_back_failed = true;
  }
  if (on_published_ && !placeholder)
    for (unified::Node* f : fragments) on_published_(f);  // the storage tier writes what is new there
  tree_.unlock(w.lock);
  KVGRID_CONSENSUS(log_, "write_ack", {static_cast<std::int64_t>(w.id)}, {any_unused || placeholder ? 0 : 1});
  transfers_.push_back({"write_ack", w.id, 0, 0, 0});
}

// ---- load-back ------------------------------------------------------------------------------

void HybridHostTier::load(const unified::LoadItem& item, std::span<const Slot> device,
                          std::vector<transfer::Event>& layer_events, std::vector<transfer::Event>& state_events) {
  const std::size_t c = item.component.value();
  KVGRID_CHECK(device.size() == item.host.size(), "load-back of ", item.host.size(), " host slots into ", device.size());
  const std::uint64_t load = next_load_++;
  auto record = [&](const transfer::Event& e) {
    stats_.h2d_bytes += e.bytes();
    stats_.h2d_ns += e.modelled_ns();
    transfers_.push_back({"h2d", load, e.complete_ns() - e.modelled_ns(), e.complete_ns(), e.bytes()});
  };
  // transfer.load.fail: a FULL copy fails from a drawn layer on, an SWA or MAMBA copy whole.
  auto fails_from = [&](std::size_t layers) { return cfg_.tier.load_fault ? cfg_.tier.load_fault(layers).value_or(layers) : layers; };
  switch (kinds_[c]) {
    case ComponentKind::Full: {
      const std::size_t base = layer_events.size();
      layer_events.resize(base + std::max<std::size_t>(cfg_.local_layers, 1));
      if (bytes_.full_device) {
        auto copies = layer_copies_at(*bytes_.full_device, page_ids(device), 0, *bytes_.full_host, page_ids(item.host), 0,
                                      bytes_.full_device->layers());
        const std::size_t fail_from = fails_from(copies.size());
        for (std::size_t l = 0; l < copies.size(); ++l) {
          if (l >= fail_from) engine_.inject(0, true);
          layer_events[base + l] = engine_.submit(kLoadStream, std::move(copies[l]));
          record(layer_events[base + l]);
        }
      }
      stats_.h2d_pages += device.size();
      break;
    }
    case ComponentKind::Swa:
      if (bytes_.swa_device) {
        if (fails_from(1) == 0) engine_.inject(0, true);
        state_events.push_back(engine_.submit(kLoadStream, flat(layer_copies_at(*bytes_.swa_device, page_ids(device), 0,
                                                                                *bytes_.swa_host, page_ids(item.host), 0,
                                                                                bytes_.swa_device->layers()))));
        record(state_events.back());
      }
      break;
    case ComponentKind::Mamba:
      if (bytes_.state_device) {
        auto src = bytes_.state_host->slot(item.host[0].value());
        auto dst = bytes_.state_device->slot(device[0].value());  // (the target's words: a packed draft's follow on the host)
        if (fails_from(1) == 0) engine_.inject(0, true);
        state_events.push_back(engine_.submit(kLoadStream, {{dst.data(), src.data(), dst.size() * sizeof(std::uint64_t)}}));
        record(state_events.back());
      }
      break;
  }
  for (auto& sc : sidecars_)
    if (sc.device->source().value() == c)
      for (std::size_t i = 0; i < device.size(); ++i) sc.device->write(device[i], sc.host->read(item.host[i]));
  // The draft's copies (speculative decoding): FULL's join the last layer's event, SWA's and
  // MAMBA's are one more event the first forward waits for.
  std::vector<transfer::Copy> draft;
  const ComponentKind k = kinds_[c];
  if (k == ComponentKind::Full && draft_.full) draft = draft_.full->restore_copies(page_ids(device), page_ids(item.host));
  if (k == ComponentKind::Swa && draft_.swa) draft = draft_.swa->restore_copies(page_ids(device), page_ids(item.host));
  if (k == ComponentKind::Mamba && draft_.states)
    if (auto cp = draft_.states->restore_copy(device[0].value(), item.host[0].value())) draft.push_back(*cp);
  if (draft.empty()) return;
  transfer::Event ev = engine_.submit(kLoadStream, std::move(draft));
  record(ev);
  if (k == ComponentKind::Full && !layer_events.empty()) layer_events.back() = transfer::join({layer_events.back(), ev});
  else state_events.push_back(ev);
}

void HybridHostTier::append_draft_backup(ComponentKind k, std::span<const Slot> host, std::span<const Slot> device,
                                         std::vector<transfer::Copy>& out) {
  std::vector<transfer::Copy> copies;
  if (k == ComponentKind::Full && draft_.full) copies = draft_.full->backup_copies(page_ids(host), page_ids(device));
  if (k == ComponentKind::Swa && draft_.swa) copies = draft_.swa->backup_copies(page_ids(host), page_ids(device));
  if (k == ComponentKind::Mamba && draft_.states)
    if (auto cp = draft_.states->backup_copy(host[0].value(), device[0].value())) copies.push_back(*cp);
  out.insert(out.end(), copies.begin(), copies.end());
}

}  // namespace kvgrid::cache
