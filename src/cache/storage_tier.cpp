#include "cache/storage_tier.hpp"

#include "cache/file_storage.hpp"
#include "cache/redis_storage.hpp"
#include "cache/segment_storage.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "cache/page_hash.hpp"
#include "cache/radix_storage_site.hpp"
#include "core/check.hpp"
#include "core/schedule.hpp"

namespace kvgrid::cache {

namespace fs = std::filesystem;

namespace {

// The object store of `cfg.backend`: a directory (per-rank LRU under rank_suffix keys; shared,
// swept, under unified keys) or a Redis server.
std::unique_ptr<ObjectStore> make_store(const StorageTierConfig& cfg) {
  if (cfg.backend == "redis") return std::make_unique<RedisStorage>(cfg.url);
  KVGRID_CHECK(cfg.backend == "file", "storage backend '", cfg.backend, "'");
  if (cfg.file_layout == "segment") return std::make_unique<SegmentStorage>(cfg.dir, cfg.capacity_bytes, !cfg.unified_keys());
  KVGRID_CHECK(cfg.file_layout == "object", "storage file layout '", cfg.file_layout, "'");
  return std::make_unique<FileStorage>(cfg.dir, cfg.capacity_bytes, !cfg.unified_keys());
}

}  // namespace

bool StorageTier::Batch::seen() const {
  if (result.valid()) return result.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  return false;  // simulated batches are answered by StorageTier (needs the clock)
}

std::size_t StorageTier::Batch::intact() const { return result.valid() ? result.get() : ok; }

StorageTier::StorageTier(StorageTierConfig cfg, AckAgreement& agreement, DecisionLog& log, const SiteFactory& make)
    : cfg_(std::move(cfg)), agreement_(agreement), log_(log),
      store_(make_store(cfg_)),
      writer_(std::make_unique<StorageWriter>(
          *store_, stats_, cfg_.threaded ? cfg_.write_threads : 0,
          WriterTiming{cfg_.threaded ? std::function<std::uint64_t()>() : cfg_.now, cfg_.bytes_per_ns, cfg_.latency_ns, cfg_.jitter, cfg_.seed})),
      ctx_{cfg_, *store_, stats_, *writer_, agreement_, log_},
      jitter_(Rng(cfg_.seed).fork("storage.jitter")) {
  store_->set_job(cfg_.job);
  store_->set_shared(cfg_.shared);
  store_->set_recency_on_disk(cfg_.unified_keys());
  store_->set_fsync(cfg_.fsync);
  KVGRID_CHECK(cfg_.stop_policy == "best_effort" || cfg_.stop_policy == "wait_complete" || cfg_.stop_policy == "timeout",
               "prefetch stop policy '", cfg_.stop_policy, "'");
  stop_ = cfg_.stop_policy == "best_effort" ? StopPolicy::BestEffort
          : cfg_.stop_policy == "timeout"   ? StopPolicy::Timeout
                                            : StopPolicy::WaitComplete;
  KVGRID_CHECK(cfg_.batch_pages >= 1, "storage batch of ", cfg_.batch_pages, " pages");
  site_ = make(ctx_);
}

StorageTier::StorageTier(StorageTierConfig cfg, RadixTree& tree, HostTier& host, KvPool& host_kv, AckAgreement& agreement,
                         DecisionLog& log)
    : StorageTier(std::move(cfg), agreement, log, [&](const StorageContext& ctx) {
        return std::make_unique<RadixStorageSite>(ctx, tree, host, host_kv);
      }) {
  radix_ = static_cast<RadixStorageSite*>(site_.get());
}

StorageTier::~StorageTier() {
  for (auto& [id, p] : active_)
    for (auto& b : p.batches)
      if (b.result.valid()) b.result.wait();  // threads write into host slots: let them finish
}

SweepResult StorageTier::sweep_store() {
  KVGRID_CHECK(cfg_.unified_keys(), "a store-level sweep of a rank_suffix store (each rank evicts its own)");
  writer_->settle();
  const SweepResult r = store_->sweep(cfg_.capacity_bytes);
  stats_.swept += r.removed;
  stats_.swept_bytes += r.removed_bytes;
  return r;
}

void StorageTier::set_draft(DraftState* d) {
  KVGRID_CHECK(radix_ != nullptr, "a draft model's storage objects with a hybrid model's storage tier");
  radix_->set_draft(d);
}

void StorageTier::start_prefetch(RequestId id, std::span<const TokenId> prompt) {
  if (cross_) {  // across stages: decided at the end of the step, with every stage's hit
    queries_.push_back({id.value(), std::vector<TokenId>(prompt.begin(), prompt.end())});
    return;
  }
  writer_->settle();  // the hit sees what has landed by now, never what a thread happens to have done
  auto job = site_->plan(prompt);
  if (!job) return;
  const std::size_t hit = static_cast<std::size_t>(agreement_.agree_min(job->local_hit));
  launch(id, job, hit);
}

std::optional<std::string> StorageTier::damage_target(const StorageSite::Job& job, std::size_t item) {
  const auto names = site_->objects(job, item);
  if (names.empty()) return std::nullopt;
  return names[damaged_++ % names.size()];  // in turn: every kind of object an item reads is hit
}

void StorageTier::launch(RequestId id, std::unique_ptr<StorageSite::Job>& job, std::size_t hit) {
  const std::size_t p = static_cast<std::size_t>(site_->page_size().value());
  const std::size_t start = job->start, cached = job->cached;
  // One prefetch per request id (its reads may run on a worker thread: a second one would drop it).
  KVGRID_CHECK(!active_.count(id.value()), "a second storage prefetch for request ", id.value());
  if (start < cached) ++stats_.reread_device;  // counted: reads that re-fetch device-resident pages
  KVGRID_CONSENSUS(log_, "prefetch_query", {static_cast<std::int64_t>(id.value()), static_cast<std::int64_t>(start)},
                   {static_cast<std::int64_t>(hit)});
  if (start + hit <= cached || (start + hit - cached) * p < static_cast<std::size_t>(cfg_.prefetch_threshold.value())) return;
  site_->pin(*job);  // before allocating: making room evicts host-only leaves, the anchor may be one
  const bool ok = site_->allocate(*job, hit, cross_);
  KVGRID_CONSENSUS(log_, "prefetch_start", {static_cast<std::int64_t>(id.value())}, {ok ? 1 : 0});
  if (!ok) {
    site_->unpin(*job);
    return;
  }
  job->keys.resize(hit);
  job->tokens.resize((start + hit) * p);
  Prefetch pf;
  pf.job = std::move(job);
  StorageSite::Job& jb = *pf.job;
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
      if (auto i = cfg_.faults.page_fault("storage.read.short", b.count))
        if (auto name = damage_target(jb, first + *i)) store_->truncate(*name);
      if (auto i = cfg_.faults.page_fault("storage.object.corrupt", b.count))
        if (auto name = damage_target(jb, first + *i)) store_->corrupt(*name);
    }
    const std::uint64_t delay = cfg_.faults.read_delay_ns ? cfg_.faults.read_delay_ns() : 0;
    if (cfg_.threaded) {
      b.result = std::async(std::launch::async, [this, job = &jb, first, count = b.count, fail_at, delay] {
                   if (delay) std::this_thread::sleep_for(std::chrono::nanoseconds(delay));
                   return site_->read(*job, first, count, fail_at);
                 }).share();
    } else {
      b.ok = site_->read(jb, first, b.count, fail_at);
      const double bytes = static_cast<double>(site_->bytes(jb, first, b.count));
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
  ChoiceSource* choices = choice_source();
  auto seen = [&](const Batch& b) {
    if (b.result.valid()) return b.seen();
    if (!choices || b.chosen_seen) return b.chosen_seen || b.done_ns <= now;
    // kvgrid explore: whether this rank has seen the batch's ACK is a choice (default: the clock's)
    const std::string what = "storage read of pages " + std::to_string(b.first) + "-" + std::to_string(b.first + b.count - 1) +
                             " (prefetch of " + std::to_string(pf.batches.size()) + " batches, modelled " +
                             (b.done_ns <= now ? "done" : "pending") + ")";
    b.chosen_seen = choices->answer(b.done_ns <= now, what, "seen", "unseen");
    return b.chosen_seen;
  };
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
  return site_->accept(*pf.job, done);
}

void StorageTier::finish(RequestId id, std::size_t agreed) {
  auto it = active_.find(id.value());
  Prefetch& pf = it->second;
  KVGRID_CONSENSUS(log_, "prefetch_done", {static_cast<std::int64_t>(id.value()), static_cast<std::int64_t>(pf.job->keys.size())},
                   {static_cast<std::int64_t>(agreed)});
  const std::int64_t p = site_->page_size().value();
  const Tokens begin(static_cast<std::int64_t>(pf.job->start) * p);
  release(pf, agreed);
  active_.erase(it);
  if (agreed > 0) finished_[id.value()] = {begin, begin + Tokens(static_cast<std::int64_t>(agreed) * p)};
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
  std::vector<std::unique_ptr<StorageSite::Job>> plans;
  if (!queries_.empty()) writer_->settle();
  for (auto& q : queries_) {
    plans.push_back(site_->plan(q.prompt));
    v.push_back(plans.back() ? plans.back()->local_hit : 0);
  }
  cross_->min(v);
  // The plans' anchors must survive what comes first: landing the finished prefetches and the
  // earlier launches' host allocations, which may evict unlocked host-only leaves.
  for (auto& pl : plans)
    if (pl) site_->pin(*pl);
  std::size_t k = 0;
  for (auto& [id, acks] : stopping_) finish(RequestId(id), static_cast<std::size_t>(v[k++]));
  stopping_.clear();
  for (std::size_t i = 0; i < queries_.size(); ++i, ++k)
    if (plans[i]) {
      // launch takes the job when it starts (and pins it again for as long as it runs).
      StorageSite::Job& job = *plans[i];
      launch(RequestId(queries_[i].id), plans[i], static_cast<std::size_t>(v[k]));
      site_->unpin(job);
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
  for (const auto& b : pf.batches) {
    const std::size_t ok = b.intact();
    stats_.read_bytes += site_->bytes(*pf.job, b.first, ok);
    if (ok < b.count) stats_.failed_pages += b.count - ok;
  }
  const std::size_t items = pf.job->keys.size();
  stats_.used_pages += site_->land(*pf.job, keep);
  held_ -= Pages(static_cast<std::int64_t>(items));
}

void StorageTier::abort(RequestId id) {
  queries_.erase(std::remove_if(queries_.begin(), queries_.end(), [&](const Query& q) { return q.id == id.value(); }),
                 queries_.end());
  stopping_.erase(id.value());
  finished_.erase(id.value());  // (a refused request's range, kept for its retry)
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
