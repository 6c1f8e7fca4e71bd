#include "cache/storage_writer.hpp"

#include "cache/storage_tier.hpp"

namespace kvgrid::cache {

std::uint64_t WriteBatch::total_bytes() const {
  std::uint64_t n = 0;
  for (const auto& p : payloads) n += p.size();
  return n;
}

StorageWriter::StorageWriter(ObjectStore& store, StorageTierStats& stats, std::size_t threads, WriterTiming timing)
    : store_(store), stats_(stats), timing_(std::move(timing)), jitter_(Rng(timing_.seed).fork("storage.write.jitter")) {
  for (std::size_t i = 0; i < threads; ++i) threads_.emplace_back([this] { work(); });
}

StorageWriter::~StorageWriter() {
  drain();
  {
    std::lock_guard<std::mutex> g(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void StorageWriter::submit(WriteBatch batch) {
  if (batch.keys.empty()) return;
  auto e = std::make_unique<Entry>();
  e->batch = std::move(batch);
  for (const auto& k : e->batch.keys) pending_.insert(k);
  if (threads_.empty() && !timing_.now) {  // inline: lands now
    land(*e);
    apply(*e);
    for (const auto& k : e->batch.keys) pending_.erase(k);
    return;
  }
  Entry* raw = e.get();
  if (threads_.empty()) {  // simulated: the write queue serializes batches
    const std::uint64_t now = timing_.now();
    const double bytes = static_cast<double>(e->batch.total_bytes());
    const auto dur = static_cast<std::uint64_t>(static_cast<double>(timing_.latency_ns) +
                                                bytes / timing_.bytes_per_ns * (1.0 + timing_.jitter * jitter_.uniform()));
    const std::uint64_t start = std::max(now, tail_ns_);
    e->due_ns = tail_ns_ = start + dur;
    records_.push_back({start, e->due_ns, static_cast<std::uint64_t>(bytes)});
  }
  queue_.push_back(std::move(e));
  if (!threads_.empty()) {
    {
      std::lock_guard<std::mutex> g(mu_);
      todo_.push_back(raw);
    }
    work_cv_.notify_one();
  } else {
    settle();  // what was due before this one lands now (keeps the queue short)
  }
}

std::vector<bool> StorageWriter::present(std::span<const std::string> keys) {
  std::vector<bool> there = store_.present(keys);
  if (!pending_.empty())
    for (std::size_t i = 0; i < keys.size(); ++i) there[i] = there[i] || pending_.count(keys[i]) > 0;
  return there;
}

void StorageWriter::land(Entry& e) { e.ok = store_.set_batch(e.batch.keys, e.batch.payloads); }

void StorageWriter::land(std::span<Entry* const> es) {
  if (es.size() == 1) return land(*es[0]);
  std::vector<std::string> keys;
  std::vector<std::span<const std::uint8_t>> payloads;
  for (const Entry* e : es) {
    keys.insert(keys.end(), e->batch.keys.begin(), e->batch.keys.end());
    payloads.insert(payloads.end(), e->batch.payloads.begin(), e->batch.payloads.end());
  }
  const std::vector<bool> ok = store_.set_batch(keys, payloads);
  std::size_t at = 0;
  for (Entry* e : es) {
    e->ok.assign(ok.begin() + static_cast<std::ptrdiff_t>(at), ok.begin() + static_cast<std::ptrdiff_t>(at + e->batch.keys.size()));
    at += e->batch.keys.size();
  }
}

void StorageWriter::apply(Entry& e) {
  const WriteBatch& b = e.batch;
  std::vector<bool> group_ok(b.groups.size(), true);
  for (std::size_t w = 0; w < b.keys.size(); ++w) {
    if (!e.ok[w]) {
      group_ok[b.group[w]] = false;
      continue;
    }
    ++stats_.objects_written;
    stats_.written_bytes += b.payloads[w].size();
  }
  for (std::size_t g = 0; g < b.groups.size(); ++g) {
    if (b.groups[g].writes == 0) continue;
    if (!group_ok[g]) ++stats_.write_failed;
    else if (b.groups[g].counts_page) ++stats_.written_pages;
  }
}

void StorageWriter::settle() { settle_until(false); }
void StorageWriter::drain() { settle_until(true); }

void StorageWriter::settle_until(bool all) {
  if (!threads_.empty() && !queue_.empty()) {  // threaded: every queued batch, whatever the timing
    std::unique_lock<std::mutex> g(mu_);
    done_cv_.wait(g, [&] {
      for (const auto& e : queue_)
        if (!e->landed) return false;
      return true;
    });
  }
  std::size_t n = queue_.size();  // threaded: every one landed
  if (threads_.empty()) {  // simulated: those due (in order of due time, monotone), as one store batch
    const std::uint64_t now = timing_.now ? timing_.now() : 0;
    std::vector<Entry*> due;
    for (const auto& e : queue_) {
      if (!all && e->due_ns > now) break;
      due.push_back(e.get());
    }
    if (!due.empty()) land(due);
    n = due.size();
  }
  for (; n > 0; --n) {
    Entry& e = *queue_.front();
    apply(e);
    for (const auto& k : e.batch.keys) pending_.erase(k);
    queue_.pop_front();
  }
}

void StorageWriter::work() {
  std::unique_lock<std::mutex> g(mu_);
  for (;;) {
    work_cv_.wait(g, [&] { return stop_ || !todo_.empty(); });
    if (todo_.empty()) return;  // stop_, nothing left
    // A store that writes in batches (segments, Redis) gets every batch queued now, up to
    // kCoalesceBytes, as one (a segment store writes it as one file); each keeps its own outcomes.
    std::vector<Entry*> take;
    std::uint64_t bytes = 0;
    const std::uint64_t cap = store_.writes_in_batches() ? kCoalesceBytes : 0;  // a file per object: each thread its own
    while (!todo_.empty() && (take.empty() || bytes + todo_.front()->batch.total_bytes() <= cap)) {
      bytes += todo_.front()->batch.total_bytes();
      take.push_back(todo_.front());
      todo_.pop_front();
    }
    g.unlock();
    land(take);
    g.lock();
    for (Entry* e : take) e->landed = true;
    done_cv_.notify_all();
  }
}

}  // namespace kvgrid::cache
