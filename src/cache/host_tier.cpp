#include "cache/host_tier.hpp"

#include <algorithm>

#include "core/check.hpp"

namespace kvgrid::cache {

WritePolicy parse_write_policy(const std::string& name) {
  if (name == "write_through") return WritePolicy::WriteThrough;
  if (name == "write_through_selective") return WritePolicy::WriteThroughSelective;
  KVGRID_CHECK(name == "write_back", "write policy '", name, "'");
  return WritePolicy::WriteBack;
}

HostTier::HostTier(HostTierConfig cfg, RadixTree& tree, KvPool& device_kv, KvPool& host_kv,
                   transfer::TransferEngine& engine, AckAgreement& agreement, DecisionLog& log)
    : cfg_(std::move(cfg)), policy_(parse_write_policy(cfg_.write_policy)), tree_(tree), device_kv_(device_kv), host_kv_(host_kv), engine_(engine),
      agreement_(agreement), log_(log),
      pool_(cfg_.host_pages, CpPlacement{device_kv.placement().shards, static_cast<std::uint64_t>(tree.page_size().value())}),
      acks_(agreement, log, [this](std::uint64_t id, bool placeholder, bool ok) {
        KVGRID_CHECK(!writes_.empty() && writes_.front().id == id, "write ACK ", id, " published out of order");
        const WriteAck w = std::move(writes_.front());
        writes_.pop_front();
        publish(w, placeholder, ok);
      }) {
  pool_.set_on_free([this](std::span<const PageId> pages) {
    host_kv_.poison(pages);  // freed host pages hold no old KV (a packed draft's rows included)
    if (draft_ && draft_->separate_objects()) draft_->host()->poison(pages);  // nor a sidecar draft's
  });
  // The host pool holds the device pool's layers first (packed drafts: then the draft's).
  KVGRID_CHECK(device_kv_.block_compatible(host_kv_) && host_kv_.layers() >= device_kv_.layers() &&
                   host_kv_.layer_base() == device_kv_.layer_base(),
               "host and device KV pools differ in geometry");
}

void HostTier::backup_path(TreeNode* node) {
  if (policy_ == WritePolicy::WriteBack) return;  // backups happen on eviction
  start_backups(node);
}

void HostTier::start_backups(TreeNode* node) {
  std::vector<TreeNode*> path;  // bottom-up, then reversed
  for (TreeNode* n = node; n != tree_.root() && n->host.empty() && n->ext.pending_write == 0; n = n->parent)
    path.push_back(n);
  std::reverse(path.begin(), path.end());
  const std::size_t p = static_cast<std::size_t>(tree_.page_size().value());
  for (TreeNode* n : path) {
    if (n->device.empty()) break;  // cannot happen on a freshly inserted path; keep the prefix rule
    if (policy_ == WritePolicy::WriteThroughSelective && n->ext.hit_count < cfg_.write_through_threshold) break;
    const Pages need(static_cast<std::int64_t>(n->key.size() / p));
    bool faulted = false;
    // The host copy of a page lives on the device page's owner (the node's rotation).
    const bool cross = acks_.cross_stage();
    auto hp = cross ? alloc_host_local(need, &faulted, n->ext.rotation_base) : alloc_host(need, n->ext.rotation_base);
    KVGRID_CONSENSUS(log_, "backup", {static_cast<std::int64_t>(n->key.size())}, {hp || cross ? 1 : 0});
    if (acks_.cross_stage() && (!hp || faulted)) {
      // Keep every stage's queue (and host pool) the same: a placeholder, without a copy, that
      // fails everywhere when it is published.
      enqueue(n, hp ? std::move(*hp) : std::vector<PageId>{}, {}, true);
      continue;
    }
    if (!hp) break;  // host full of protected pages (somewhere): this and deeper nodes stay device-only
    if (cfg_.transfer_fault && cfg_.transfer_fault()) engine_.inject(0, true);
    transfer::Event ev = submit_backup(*hp, n->device);
    stats_.d2h_bytes += ev.bytes();
    stats_.d2h_ns += ev.modelled_ns();
    transfers_.push_back({"d2h", next_write_, ev.complete_ns() - ev.modelled_ns(), ev.complete_ns(), ev.bytes()});
    stats_.d2h_pages += static_cast<std::uint64_t>(need.value());
    enqueue(n, std::move(*hp), std::move(ev), false);
  }
}

void HostTier::enqueue(TreeNode* n, std::vector<PageId> host_pages, transfer::Event event, bool placeholder) {
  const std::uint64_t id = next_write_++;
  n->ext.pending_write = id;
  tree_.lock(n);  // its device pages must stay until the copy is done
  pending_pages_ += Pages(static_cast<std::int64_t>(host_pages.size()));
  ++stats_.writes;
  writes_.push_back({id, n, std::move(host_pages)});
  acks_.push(id, std::move(event), placeholder);
}

std::optional<std::vector<PageId>> HostTier::alloc_host_local(Pages need, bool* faulted, std::uint32_t first_owner) {
  for (Pages want = pool_.shortfall(need, first_owner); want.value() > 0; want = pool_.shortfall(need, first_owner)) {
    auto freed = tree_.evict_host(want);
    pool_.free(freed);
    stats_.host_evicted += freed.size();
    if (static_cast<std::int64_t>(freed.size()) < want.value()) break;  // nothing left to evict
  }
  auto hp = pool_.alloc(need, first_owner);
  *faulted = hp && cfg_.alloc_fault && cfg_.alloc_fault();
  return hp;
}

std::optional<std::vector<PageId>> HostTier::alloc_host(Pages need, std::uint32_t first_owner) {
  bool faulted = false;
  auto hp = alloc_host_local(need, &faulted, first_owner);
  if (faulted) {
    pool_.free(*hp);
    hp.reset();
  }
  // Every rank of the stage must take the same decision: the allocation is agreed.
  const bool ok = agreement_.agree_allocation(hp.has_value());
  if (!ok && hp) {
    pool_.free(*hp);
    hp.reset();
  }
  return hp;
}

transfer::Event HostTier::submit_backup(std::span<const PageId> host_pages, std::span<const PageId> device_pages) {
  transfer::Event ev =
      engine_.submit(kWriteStream, flat(layer_copies_at(host_kv_, host_pages, 0, device_kv_, device_pages, 0, device_kv_.layers())));
  if (!draft_) return ev;
  auto dcopies = draft_->backup_copies(host_pages, device_pages);
  if (dcopies.empty()) return ev;
  return transfer::join({ev, engine_.submit(kWriteStream, std::move(dcopies))});
}

void HostTier::write_back(TreeNode* victim) {
  if (acks_.cross_stage()) {
    // Across pipeline stages a write-back cannot be agreed inside the eviction that needs it (the
    // other stages reach it a step later), and deciding it per stage lets a failure on one stage
    // drop a node the others keep (found by testing: tree digests differ across stages). So it is
    // an ordinary backup — enqueued with a placeholder where this stage failed, published at the
    // end of a step with its outcome agreed over every stage — and the victim stays on the device,
    // locked, until then; a published victim is evicted as a backed-up node later. A victim whose
    // write-back was published as failed is dropped at its next eviction.
    if (!victim->ext.write_back_failed) start_backups(victim);
    return;
  }
  std::vector<TreeNode*> path;
  for (TreeNode* n = victim; n != tree_.root() && n->host.empty(); n = n->parent) path.push_back(n);
  std::reverse(path.begin(), path.end());
  const std::size_t p = static_cast<std::size_t>(tree_.page_size().value());
  for (TreeNode* n : path) {
    KVGRID_CHECK(n->ext.pending_write == 0 && !n->device.empty(), "write-back of node ", n->id, " in a wrong state");
    const Pages need(static_cast<std::int64_t>(n->key.size() / p));
    auto hp = alloc_host(need, n->ext.rotation_base);
    KVGRID_CONSENSUS(log_, "write_back", {static_cast<std::int64_t>(n->key.size())}, {hp ? 1 : 0});
    if (!hp) return;  // the victim (and what is below the failed node) is dropped
    if (cfg_.transfer_fault && cfg_.transfer_fault()) engine_.inject(0, true);
    transfer::Event ev = submit_backup(*hp, n->device);
    ev.synchronize();  // the device pages are about to be freed
    stats_.d2h_bytes += ev.bytes();
    stats_.d2h_ns += ev.modelled_ns();
    transfers_.push_back({"d2h", 0, ev.complete_ns() - ev.modelled_ns(), ev.complete_ns(), ev.bytes()});
    stats_.d2h_pages += static_cast<std::uint64_t>(need.value());
    ++stats_.writes;
    if (agreement_.agree_min(ev.failed() ? 0 : 1) == 0) {
      pool_.free(*hp);
      ++stats_.writes_failed;
      return;
    }
    tree_.set_host(n, *hp);
    if (on_published_) on_published_(n);
  }
}

void HostTier::publish(const WriteAck& w, bool placeholder, bool ok_everywhere) {
  // The written node may have been split since: its fragments above it carry the same id.
  std::vector<TreeNode*> fragments{w.node};
  for (TreeNode* n = w.node->parent; n != tree_.root() && n->ext.pending_write == w.id; n = n->parent)
    fragments.push_back(n);
  std::reverse(fragments.begin(), fragments.end());
  if (placeholder) {  // nothing was copied here: it failed everywhere
    KVGRID_CHECK(!ok_everywhere, "write ", w.id, " published although its host allocation failed on this rank");
    for (TreeNode* f : fragments) {
      f->ext.pending_write = 0;
      f->ext.write_back_failed = policy_ == WritePolicy::WriteBack;
    }
    pool_.free(w.host_pages);
    pending_pages_ -= Pages(static_cast<std::int64_t>(w.host_pages.size()));
    ++stats_.writes_failed;
    tree_.unlock(w.node);
    KVGRID_CONSENSUS(log_, "write_ack", {static_cast<std::int64_t>(w.id)}, {0});
    transfers_.push_back({"write_ack", w.id, 0, 0, 0});
    return;
  }
  bool ok = ok_everywhere;
  std::size_t at = 0;
  std::vector<PageId> unused;
  std::vector<TreeNode*> published;
  for (TreeNode* f : fragments) {
    const std::size_t k = f->key.size() / static_cast<std::size_t>(tree_.page_size().value());
    std::span<const PageId> slice(w.host_pages.data() + at, k);
    at += k;
    f->ext.pending_write = 0;
    ok = ok && (f->parent == tree_.root() || !f->parent->host.empty());
    if (ok) {
      tree_.set_host(f, slice);
      published.push_back(f);
    } else {
      unused.insert(unused.end(), slice.begin(), slice.end());
      f->ext.write_back_failed = policy_ == WritePolicy::WriteBack;
    }
  }
  if (on_published_)
    for (TreeNode* f : published) on_published_(f);
  KVGRID_CHECK(at == w.host_pages.size(), "write ", w.id, " covered ", at, " of ", w.host_pages.size(), " pages");
  if (!unused.empty()) {
    pool_.free(unused);
    ++stats_.writes_failed;
  }
  pending_pages_ -= Pages(static_cast<std::int64_t>(w.host_pages.size()));
  tree_.unlock(w.node);
  KVGRID_CONSENSUS(log_, "write_ack", {static_cast<std::int64_t>(w.id)}, {unused.empty() ? 1 : 0});
  transfers_.push_back({"write_ack", w.id, 0, 0, 0});
}

std::vector<transfer::Event> HostTier::load_back(
    MatchResult& m, const std::function<std::optional<std::vector<PageId>>(Pages, std::uint32_t)>& alloc_device,
    TreeNode** hold) {
  std::vector<transfer::Event> events;
  if (hold) *hold = nullptr;
  if (m.host_path.empty() || m.host_matched - m.matched < cfg_.load_back_threshold) return events;
  const std::size_t p = static_cast<std::size_t>(tree_.page_size().value());
  const std::size_t layers = device_kv_.layers();
  // A restore may fail (pd.restore.fail, P/D decode): its copies from this layer on are not done.
  const std::size_t fail_from = cfg_.load_fault ? cfg_.load_fault(layers).value_or(layers) : layers;
  Tokens loaded{0};
  // Making room on the device may allocate host pages (write_back), which may evict host-only
  // leaves: the path being loaded must not be among them.
  TreeNode* tail = m.host_path.back();
  tree_.lock(tail);
  for (TreeNode* n : m.host_path) {
    if (hold && n->ext.restoring > 0) break;  // another request's private restore of it is in flight
    const Pages need(static_cast<std::int64_t>(n->key.size() / p));
    auto dp = alloc_device(need, n->ext.rotation_base);
    if (!dp) break;
    auto copies = layer_copies_at(device_kv_, *dp, 0, host_kv_, n->host, 0, layers);
    std::vector<transfer::Event> layer_events;
    for (std::size_t l = 0; l < layers; ++l) {
      if (l >= fail_from) engine_.inject(0, true);
      layer_events.push_back(engine_.submit(kLoadStream, std::move(copies[l])));
    }
    if (draft_) {  // the draft's copies after the target's last layer: that layer's event waits for them
      auto dcopies = draft_->restore_copies(*dp, n->host);
      if (!dcopies.empty())
        layer_events.back() = transfer::join({layer_events.back(), engine_.submit(kLoadStream, std::move(dcopies))});
    }
    const std::uint64_t load = next_load_++;
    for (const auto& e : layer_events) {
      stats_.h2d_bytes += e.bytes();
      stats_.h2d_ns += e.modelled_ns();
      transfers_.push_back({"h2d", load, e.complete_ns() - e.modelled_ns(), e.complete_ns(), e.bytes()});
    }
    events.insert(events.end(), layer_events.begin(), layer_events.end());
    if (hold) {  // private: the pages are the request's until its restore is confirmed
      ++n->ext.restoring;
      tree_.lock(n);
      if (*hold) tree_.unlock(*hold);
      *hold = n;
    } else {
      tree_.set_device(n, *dp);
      tree_.lock(n);  // keep what is loaded while loading the rest
      tree_.unlock(m.last_node);
      m.last_node = n;
    }
    m.device_pages.insert(m.device_pages.end(), dp->begin(), dp->end());
    m.matched += Tokens(static_cast<std::int64_t>(n->key.size()));
    loaded += Tokens(static_cast<std::int64_t>(n->key.size()));
    stats_.h2d_pages += static_cast<std::uint64_t>(need.value());
  }
  tree_.unlock(tail);
  KVGRID_CONSENSUS(log_, "load_back", {(m.host_matched - m.matched + loaded).value()}, {loaded.value()});
  return events;
}

}  // namespace kvgrid::cache
