#include "cache/storage_tier.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "cache/page_hash.hpp"
#include "core/check.hpp"

namespace kvgrid::cache {

namespace fs = std::filesystem;

namespace {

// Failpoint damage done to a real object before it is read: the reader must detect it.
void truncate_object(const std::string& path) {
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  if (!ec && size > 8) fs::resize_file(path, size / 2, ec);
}

void corrupt_object(const std::string& path) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  if (!f) return;
  f.seekg(0, std::ios::end);
  const auto size = static_cast<std::streamoff>(f.tellg());
  if (size < 2) return;
  const std::streamoff at = size - 1;  // the payload's last byte: only the checksum can tell
  f.seekg(at);
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x5a);
  f.seekp(at);
  f.write(&c, 1);
}

}  // namespace

bool StorageTier::Batch::seen() const {
  if (result.valid()) return result.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  return false;  // simulated batches are answered by StorageTier (needs the clock)
}

std::size_t StorageTier::Batch::intact() const { return result.valid() ? result.get() : ok; }

StorageTier::StorageTier(StorageTierConfig cfg, RadixTree& tree, HostTier& host, KvPool& host_kv, AckAgreement& agreement,
                         DecisionLog& log)
    : cfg_(std::move(cfg)), tree_(tree), host_(host), host_kv_(host_kv), agreement_(agreement), log_(log),
      store_(std::make_unique<FileStorage>(cfg_.dir, cfg_.capacity_bytes)), jitter_(Rng(cfg_.seed).fork("storage.jitter")) {
  KVGRID_CHECK(cfg_.stop_policy == "best_effort" || cfg_.stop_policy == "wait_complete" || cfg_.stop_policy == "timeout",
               "prefetch stop policy '", cfg_.stop_policy, "'");
  stop_ = cfg_.stop_policy == "best_effort" ? StopPolicy::BestEffort
          : cfg_.stop_policy == "timeout"   ? StopPolicy::Timeout
                                            : StopPolicy::WaitComplete;
  KVGRID_CHECK(cfg_.batch_pages >= 1, "storage batch of ", cfg_.batch_pages, " pages");
  host_.on_published([this](TreeNode* n) { backup(n); });
}

StorageTier::~StorageTier() {
  for (auto& [id, p] : active_)
    for (auto& b : p.batches)
      if (b.result.valid()) b.result.wait();  // threads write into host pages: let them finish
}

std::vector<std::uint8_t> StorageTier::page_bytes(PageId page) const {
  const std::size_t block = host_kv_.layer_block_bytes();
  std::vector<std::uint8_t> out(block * host_kv_.layers());
  for (std::size_t l = 0; l < host_kv_.layers(); ++l) std::memcpy(out.data() + l * block, host_kv_.layer_block(page, l), block);
  return out;
}

std::size_t StorageTier::page_object_bytes() const {
  return host_kv_.layer_block_bytes() * host_kv_.layers() + (draft_ ? draft_->object_bytes() : 0);
}

std::vector<std::string> StorageTier::keys_for(std::span<const TokenId> tokens, std::size_t from_page) const {
  const auto digests = page_hash_chain(tokens, static_cast<std::size_t>(tree_.page_size().value()));
  std::vector<std::string> keys;
  for (std::size_t i = from_page; i < digests.size(); ++i) keys.push_back(storage_key(digests[i], cfg_.key_suffix));
  return keys;
}

void StorageTier::backup(TreeNode* node) {
  if (!cfg_.writer) return;  // MLA: TP rank 0 writes for everyone
  std::vector<const TreeNode*> path;
  for (const TreeNode* n = node; n != tree_.root(); n = n->parent) path.push_back(n);
  std::vector<TokenId> tokens;
  for (auto it = path.rbegin(); it != path.rend(); ++it) tokens.insert(tokens.end(), (*it)->key.begin(), (*it)->key.end());
  const std::size_t p = static_cast<std::size_t>(tree_.page_size().value());
  const std::size_t first = (tokens.size() - node->key.size()) / p;
  const auto keys = keys_for(tokens, first);
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (!host_kv_.owns(node->host[i])) continue;  // CP sharding: each page is written by its owner
    if (store_->exists(keys[i])) continue;
    if (cfg_.faults.write_fail && cfg_.faults.write_fail()) {
      ++stats_.write_failed;  // a failed write leaves nothing behind: later prefetches just miss
      continue;
    }
    // A sidecar draft's object first: a page whose target object exists always has its draft.
    if (draft_ && !store_->exists(keys[i] + DraftState::kObjectSuffix)) {
      const auto d = draft_->object(node->host[i]);
      if (!store_->set(keys[i] + DraftState::kObjectSuffix, d)) {
        ++stats_.write_failed;
        continue;
      }
      stats_.written_bytes += d.size();
    }
    const auto bytes = page_bytes(node->host[i]);
    if (store_->set(keys[i], bytes)) {
      ++stats_.written_pages;
      stats_.written_bytes += bytes.size();
    } else {
      ++stats_.write_failed;
    }
  }
}

std::size_t StorageTier::read_pages(const std::vector<std::string>& keys, const std::vector<PageId>& pages,
                                    std::size_t first, std::size_t count, std::optional<std::size_t> fail_at) {
  const std::size_t block = host_kv_.layer_block_bytes();
  std::vector<std::uint8_t> buf(block * host_kv_.layers()), dbuf(draft_ ? draft_->object_bytes() : 0);
  for (std::size_t i = 0; i < count; ++i) {
    if (fail_at && i >= *fail_at) return i;  // storage.read.fail: an I/O error from here on
    if (!host_kv_.owns(pages[first + i])) continue;  // CP sharding: its owner reads it
    if (draft_) {  // the draft first: the page counts as read only once both landed
      if (store_->get(keys[first + i] + DraftState::kObjectSuffix, dbuf) != StorageMiss::None) return i;
      draft_->load_object(pages[first + i], dbuf);
    }
    if (store_->get(keys[first + i], buf) != StorageMiss::None) return i;
    for (std::size_t l = 0; l < host_kv_.layers(); ++l)
      std::memcpy(host_kv_.layer_block(pages[first + i], l), buf.data() + l * block, block);
  }
  return count;
}

std::optional<StorageTier::Plan> StorageTier::plan(std::span<const TokenId> prompt) {
  const std::size_t p = static_cast<std::size_t>(tree_.page_size().value());
  const std::size_t max_pages = prompt.empty() ? 0 : (prompt.size() - 1) / p;  // reuse at most prompt - 1
  if (max_pages * p < static_cast<std::size_t>(cfg_.prefetch_threshold.value())) return std::nullopt;
  MatchResult m = tree_.peek_prefix(prompt);
  const std::size_t cached = static_cast<std::size_t>(m.host_matched.value()) / p;
  if ((max_pages - cached) * p < static_cast<std::size_t>(cfg_.prefetch_threshold.value())) return std::nullopt;
  // Prefetched pages hang below the deepest backed-up node of the hit (backed-up nodes form a
  // prefix); device pages past it that have no host copy are read again and become that copy.
  Plan pl;
  pl.anchor = m.host_path.empty() ? m.last_node : m.host_path.back();
  while (pl.anchor != tree_.root() && pl.anchor->host.empty()) pl.anchor = pl.anchor->parent;
  for (const TreeNode* n = pl.anchor; n != tree_.root(); n = n->parent) pl.start += n->key.size() / p;
  pl.cached = cached;
  pl.tokens.assign(prompt.begin(), prompt.begin() + static_cast<std::ptrdiff_t>(max_pages * p));
  pl.keys = keys_for(pl.tokens, pl.start);
  if (!cfg_.writer) {
    pl.local_hit = pl.keys.size();  // MLA readers: the writer decides
  } else if (!host_kv_.sharded()) {
    pl.local_hit = store_->batch_exists(pl.keys);
    if (draft_) {  // the MIN of the target's and the draft's leading hits
      std::vector<std::string> dkeys;
      for (const auto& k : pl.keys) dkeys.push_back(k + DraftState::kObjectSuffix);
      pl.local_hit = std::min(pl.local_hit, store_->batch_exists(dkeys));
    }
  } else {
    // CP sharding: this rank looks up only the pages it owns (the others count as present here;
    // their owners look them up), so the MIN over the shard group is the leading hit of them all.
    std::vector<std::string> mine;
    std::vector<std::size_t> at;
    const CpPlacement& plc = host_kv_.placement();
    for (std::size_t i = 0; i < pl.keys.size(); ++i)
      if ((pl.start + i) % plc.shards == host_kv_.shard_rank()) {
        mine.push_back(pl.keys[i]);
        at.push_back(i);
      }
    const std::size_t k = store_->batch_exists(mine);
    pl.local_hit = k < mine.size() ? at[k] : pl.keys.size();
  }
  return pl;
}

void StorageTier::start_prefetch(RequestId id, std::span<const TokenId> prompt) {
  if (cross_) {  // across stages: decided at the end of the step, with every stage's hit
    queries_.push_back({id.value(), std::vector<TokenId>(prompt.begin(), prompt.end())});
    return;
  }
  auto pl = plan(prompt);
  if (!pl) return;
  const std::size_t hit = static_cast<std::size_t>(agreement_.agree_min(pl->local_hit));
  launch(id, *pl, hit);
}

void StorageTier::launch(RequestId id, Plan& pl, std::size_t hit) {
  const std::size_t p = static_cast<std::size_t>(tree_.page_size().value());
  const std::size_t start = pl.start, cached = pl.cached;
  TreeNode* anchor = pl.anchor;
  auto& keys = pl.keys;
  if (start < cached) ++stats_.reread_device;  // counted: reads that re-fetch device-resident pages
  KVGRID_CONSENSUS(log_, "prefetch_query", {static_cast<std::int64_t>(id.value()), static_cast<std::int64_t>(start)},
                   {static_cast<std::int64_t>(hit)});
  if (start + hit <= cached || (start + hit - cached) * p < static_cast<std::size_t>(cfg_.prefetch_threshold.value())) return;
  tree_.lock(anchor);  // before allocating: making room evicts host-only leaves, the anchor may be one
  // CP sharding: the page at position P belongs to rank P mod N (its host copy too).
  const auto first_owner = static_cast<std::uint32_t>(start % host_kv_.placement().shards);
  std::optional<std::vector<PageId>> pages;
  if (cross_) {  // across stages: every rank serving the request must have allocated
    bool faulted = false;
    pages = host_.alloc_host_local(Pages(static_cast<std::int64_t>(hit)), &faulted, first_owner);
    std::vector<std::uint64_t> ok{pages && !faulted ? 1u : 0u};
    cross_->min(ok);
    if (!ok[0] && pages) {
      host_.free_host(*pages);
      pages.reset();
    }
  } else {
    pages = host_.alloc_host(Pages(static_cast<std::int64_t>(hit)), first_owner);
  }
  KVGRID_CONSENSUS(log_, "prefetch_start", {static_cast<std::int64_t>(id.value())}, {pages ? 1 : 0});
  if (!pages) {
    tree_.unlock(anchor);
    return;
  }
  keys.resize(hit);
  Prefetch pf;
  pf.tokens.assign(pl.tokens.begin(), pl.tokens.begin() + static_cast<std::ptrdiff_t>((start + hit) * p));
  pf.start = Tokens(static_cast<std::int64_t>(start * p));
  pf.anchor = anchor;
  pf.keys = std::move(keys);
  pf.pages = std::move(*pages);
  held_ += Pages(static_cast<std::int64_t>(hit));
  const std::uint64_t now = cfg_.now ? cfg_.now() : 0;
  const std::uint64_t timeout = std::min(cfg_.timeout_max_ns, cfg_.timeout_base_ns + cfg_.timeout_per_1k_ns * hit * p / 1024);
  pf.deadline_ns = now + timeout;
  std::uint64_t tail = std::max(now, next_free_ns_);
  for (std::size_t first = 0; first < hit; first += cfg_.batch_pages) {
    Batch b;
    b.first = first;
    b.count = std::min(cfg_.batch_pages, hit - first);
    // Faults are drawn here, on the loop, in batch order (deterministic in both modes).
    std::optional<std::size_t> fail_at;
    if (cfg_.faults.page_fault) {
      fail_at = cfg_.faults.page_fault("storage.read.fail", b.count);
      if (auto i = cfg_.faults.page_fault("storage.read.short", b.count)) truncate_object(store_->path_of(pf.keys[first + *i]));
      if (auto i = cfg_.faults.page_fault("storage.object.corrupt", b.count)) corrupt_object(store_->path_of(pf.keys[first + *i]));
    }
    const std::uint64_t delay = cfg_.faults.read_delay_ns ? cfg_.faults.read_delay_ns() : 0;
    if (cfg_.threaded) {
      b.result = std::async(std::launch::async, [this, keys = pf.keys, pages = pf.pages, first, count = b.count, fail_at, delay] {
                   if (delay) std::this_thread::sleep_for(std::chrono::nanoseconds(delay));
                   return read_pages(keys, pages, first, count, fail_at);
                 }).share();
    } else {
      b.ok = read_pages(pf.keys, pf.pages, first, b.count, fail_at);
      const double bytes = static_cast<double>(b.count * page_object_bytes());
      const auto dur = static_cast<std::uint64_t>(static_cast<double>(cfg_.latency_ns) +
                                                  bytes / cfg_.bytes_per_ns * (1.0 + cfg_.jitter * jitter_.uniform()));
      transfers_.push_back({"storage_read", id.value(), tail, tail + dur + delay,
                            static_cast<std::uint64_t>(bytes)});
      tail += dur + delay;
      b.done_ns = tail;
      stats_.read_ns += dur + delay;
    }
    pf.batches.push_back(std::move(b));
  }
  next_free_ns_ = tail;
  ++stats_.prefetches;
  stats_.prefetch_pages += hit;
  active_.emplace(id.value(), std::move(pf));
}

std::uint64_t StorageTier::next_ack_ns() const {
  std::uint64_t best = 0;
  const std::uint64_t now = cfg_.now ? cfg_.now() : 0;
  for (const auto& [id, p] : active_)
    for (const auto& b : p.batches)
      if (!b.result.valid() && b.done_ns > now && (best == 0 || b.done_ns < best)) best = b.done_ns;
  return best;
}

std::pair<std::size_t, bool> StorageTier::local_progress(const Prefetch& pf) const {
  const std::uint64_t now = cfg_.now ? cfg_.now() : 0;
  auto seen = [&](const Batch& b) { return b.result.valid() ? b.seen() : b.done_ns <= now; };
  std::size_t acks = 0;  // leading ACKs this rank has seen
  while (acks < pf.batches.size() && seen(pf.batches[acks])) ++acks;
  const bool all = acks == pf.batches.size();
  return {acks, all || stop_ == StopPolicy::BestEffort || (stop_ == StopPolicy::Timeout && now >= pf.deadline_ns)};
}

std::size_t StorageTier::done_pages(Prefetch& pf, std::size_t acks) {
  std::size_t done = 0;  // leading intact pages of the first `acks` ACKs
  for (std::size_t i = 0; i < acks; ++i) {
    auto& b = pf.batches[i];
    if (b.result.valid()) b.result.wait();  // a later stage blocks on its own copy of an ACK PP0 saw
    else if (cfg_.advance_to) cfg_.advance_to(b.done_ns);
    const std::size_t ok = b.intact();
    done += ok;
    if (ok < b.count) break;
  }
  return done;
}

void StorageTier::finish(RequestId id, std::size_t agreed) {
  auto it = active_.find(id.value());
  Prefetch& pf = it->second;
  KVGRID_CONSENSUS(log_, "prefetch_done", {static_cast<std::int64_t>(id.value()), static_cast<std::int64_t>(pf.keys.size())},
                   {static_cast<std::int64_t>(agreed)});
  const Tokens begin = pf.start;
  release(pf, agreed);
  active_.erase(it);
  if (agreed > 0) finished_[id.value()] = {begin, begin + Tokens(static_cast<std::int64_t>(agreed) * tree_.page_size().value())};
}

bool StorageTier::try_finish(RequestId id) {
  if (cross_) return try_finish_across(id);
  auto it = active_.find(id.value());
  if (it == active_.end()) return true;
  const auto [acks, local_stop] = local_progress(it->second);
  const bool stop = agreement_.agree_min(local_stop ? 1 : 0) == 1;
  KVGRID_CONSENSUS(log_, "prefetch_stop", {static_cast<std::int64_t>(id.value())}, {stop ? 1 : 0});
  if (!stop) return false;
  finish(id, static_cast<std::size_t>(agreement_.agree_min(done_pages(it->second, acks))));
  return true;
}

bool StorageTier::try_finish_across(RequestId id) {
  for (const auto& q : queries_)
    if (q.id == id.value()) return false;  // its query is decided at the end of this step
  auto it = active_.find(id.value());
  if (it == active_.end()) return true;
  if (stopping_.count(id.value())) return false;  // stops at the end of this step
  if (cross_->decides()) {
    // PP0 (every stage under the buggy per_rank): its stage agrees whether to stop and on how many
    // ACKs; the decision travels to the next stage with the step's message.
    const auto [acks, local_stop] = local_progress(it->second);
    std::uint64_t v[2] = {local_stop ? 1u : 0u, acks};
    const bool stop = agreement_.agree_min(v[0]) == 1;
    KVGRID_CONSENSUS(log_, "prefetch_stop", {static_cast<std::int64_t>(id.value())}, {stop ? 1 : 0});
    if (!stop) return false;
    v[1] = agreement_.agree_min(v[1]);
    stopping_[id.value()] = v[1];
    decisions_out_.push_back({id.value(), v[1]});
    return false;
  }
  // A later stage follows PP0's decision for this step (even if it already saw newer ACKs).
  for (const auto& [rid, acks] : decisions_in_) {
    if (rid != id.value()) continue;
    KVGRID_CONSENSUS(log_, "prefetch_stop", {static_cast<std::int64_t>(id.value())}, {1});
    stopping_[rid] = acks;
    decisions_out_.push_back({rid, acks});  // relayed to the next stage
    return false;
  }
  KVGRID_CONSENSUS(log_, "prefetch_stop", {static_cast<std::int64_t>(id.value())}, {0});
  return false;
}

void StorageTier::end_of_step() {
  if (!cross_ || (queries_.empty() && stopping_.empty())) return;  // the same on every rank
  // One vector, one MIN over every rank serving the requests: completed pages of the prefetches
  // that stop now, then the storage hits of this step's arrivals.
  std::vector<std::uint64_t> v;
  for (auto& [id, acks] : stopping_) v.push_back(done_pages(active_.at(id), static_cast<std::size_t>(acks)));
  std::vector<std::optional<Plan>> plans;
  for (auto& q : queries_) {
    plans.push_back(plan(q.prompt));
    v.push_back(plans.back() ? plans.back()->local_hit : 0);
  }
  cross_->min(v);
  // The plans' anchors must survive what comes first: landing the finished prefetches and the
  // earlier launches' host allocations, which may evict unlocked host-only leaves.
  for (auto& pl : plans)
    if (pl) tree_.lock(pl->anchor);
  std::size_t k = 0;
  for (auto& [id, acks] : stopping_) finish(RequestId(id), static_cast<std::size_t>(v[k++]));
  stopping_.clear();
  for (std::size_t i = 0; i < queries_.size(); ++i, ++k)
    if (plans[i]) {
      launch(RequestId(queries_[i].id), *plans[i], static_cast<std::size_t>(v[k]));
      tree_.unlock(plans[i]->anchor);
    }
  queries_.clear();
}

std::vector<std::pair<std::uint64_t, std::uint64_t>> StorageTier::take_decisions() {
  std::vector<std::pair<std::uint64_t, std::uint64_t>> out;
  out.swap(decisions_out_);
  return out;
}

void StorageTier::release(Prefetch& pf, std::size_t keep) {
  for (auto& b : pf.batches) {
    if (b.result.valid()) {
      b.result.wait();  // a thread may still write into these pages
      stats_.read_pages += b.result.get();
    } else {
      stats_.read_pages += b.ok;
    }
  }
  const std::size_t page_bytes = page_object_bytes();
  for (const auto& b : pf.batches) {
    const std::size_t ok = b.intact();
    stats_.read_bytes += ok * page_bytes;
    if (ok < b.count) stats_.failed_pages += b.count - ok;
  }
  const std::size_t p = static_cast<std::size_t>(tree_.page_size().value());
  std::vector<PageId> unused;
  if (keep > 0) {
    const std::size_t end = static_cast<std::size_t>(pf.start.value()) + keep * p;
    unused = tree_.insert_host(std::span<const TokenId>(pf.tokens).first(end), pf.start,
                               std::span<const PageId>(pf.pages).first(keep));
    stats_.used_pages += keep - unused.size();
  }
  unused.insert(unused.end(), pf.pages.begin() + static_cast<std::ptrdiff_t>(keep), pf.pages.end());
  host_.free_host(unused);
  held_ -= Pages(static_cast<std::int64_t>(pf.pages.size()));
  tree_.unlock(pf.anchor);
}

void StorageTier::abort(RequestId id) {
  queries_.erase(std::remove_if(queries_.begin(), queries_.end(), [&](const Query& q) { return q.id == id.value(); }),
                 queries_.end());
  stopping_.erase(id.value());
  auto it = active_.find(id.value());
  if (it == active_.end()) return;
  release(it->second, 0);
  active_.erase(it);
  ++stats_.aborted;
  KVGRID_CONSENSUS(log_, "prefetch_abort", {static_cast<std::int64_t>(id.value())}, {});
}

std::pair<Tokens, Tokens> StorageTier::prefetched_range(RequestId id) const {
  auto it = finished_.find(id.value());
  return it == finished_.end() ? std::pair<Tokens, Tokens>{Tokens(0), Tokens(0)} : it->second;
}

}  // namespace kvgrid::cache
