// The `threaded` transfer backend: one worker thread per stream performs the batches in FIFO
// order with memcpy; completions arrive in real time. Waiting goes through wait_cv (deadline and
// watchdog included). Threads never call MPI or HDF5.
#include <atomic>
#include <condition_variable>
#include <algorithm>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "core/check.hpp"
#include "core/wait.hpp"
#include "transfer/transfer_engine.hpp"

namespace kvgrid::transfer {

namespace {

class ThreadEvent final : public EventState {
 public:
  bool query() override { return done.load(std::memory_order_acquire); }
  void synchronize() override {
    // Copies finish within microseconds to a few hundred: poll with yields (which hand the core to
    // the copy threads) before paying for a sleep and a wake-up.
    for (int i = 0; i < 2000 && !query(); ++i) std::this_thread::yield();
    if (query()) return;
    std::unique_lock<std::mutex> lk(mu);
    wait_cv(lk, cv, [&] { return done.load(std::memory_order_acquire); }, "a threaded transfer to complete");
  }
  std::vector<Copy> copies;
  std::uint64_t delay_ns = 0;
  std::atomic<bool> done{false};
  std::mutex mu;
  std::condition_variable cv;
};

// Copies a batch with up to `helpers + 1` threads: the stream's worker takes one share and the
// helpers the others, so one batch can use the memory bandwidth of several cores. Shares are whole
// copies (never split), handed out in order; the batch completes when every share is done.
class HelperPool {
 public:
  explicit HelperPool(int helpers) {
    for (int i = 0; i < helpers; ++i) threads_.emplace_back([this] { run(); });
  }
  ~HelperPool() {
    {
      std::lock_guard<std::mutex> g(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  int helpers() const { return static_cast<int>(threads_.size()); }

  // Runs copies[i] for all i, spread over the caller and the helpers; returns when all are done.
  void copy_all(const std::vector<Copy>& copies) {
    const std::size_t shares = std::min<std::size_t>(copies.size(), threads_.size() + 1);
    if (shares <= 1) {
      for (const auto& c : copies) std::memcpy(c.dst, c.src, c.bytes);
      return;
    }
    Job job;
    job.copies = &copies;
    job.shares = shares;
    {
      std::lock_guard<std::mutex> g(mu_);
      jobs_.push_back(&job);
      pending_.store(true, std::memory_order_release);
    }
    cv_.notify_all();
    run_share(job, 0);
    std::unique_lock<std::mutex> lk(job.mu);
    job.cv.wait(lk, [&] { return job.done == job.shares; });
  }

 private:
  struct Job {
    const std::vector<Copy>* copies = nullptr;
    std::size_t shares = 0, next_share = 1, done = 0;  // share 0 is the caller's
    std::mutex mu;
    std::condition_variable cv;
  };
  void run_share(Job& job, std::size_t share) {
    const auto& c = *job.copies;
    for (std::size_t i = share; i < c.size(); i += job.shares) std::memcpy(c[i].dst, c[i].src, c[i].bytes);
    std::lock_guard<std::mutex> g(job.mu);
    if (++job.done == job.shares) job.cv.notify_all();
  }
  void run() {
    for (;;) {
      Job* job = nullptr;
      std::size_t share = 0;
      // Jobs of a per-layer load come back to back: look for the next one for a while (yielding
      // the core) before paying for a sleep and a wake-up.
      for (int i = 0; i < 200 && !pending_.load(std::memory_order_acquire); ++i) std::this_thread::yield();
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return stop_ || !jobs_.empty(); });
        if (jobs_.empty()) return;
        job = jobs_.front();
        share = job->next_share++;
        if (job->next_share == job->shares) jobs_.pop_front();
        pending_.store(!jobs_.empty(), std::memory_order_release);
      }
      run_share(*job, share);
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job*> jobs_;
  std::atomic<bool> pending_{false};
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

class Worker {
 public:
  explicit Worker(HelperPool& pool) : pool_(pool), thread_([this] { run(); }) {}
  ~Worker() {
    {
      std::lock_guard<std::mutex> g(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void push(std::shared_ptr<ThreadEvent> e) {
    {
      std::lock_guard<std::mutex> g(mu_);
      q_.push_back(std::move(e));
    }
    cv_.notify_one();
  }

 private:
  void run() {
    for (;;) {
      std::shared_ptr<ThreadEvent> e;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return stop_ || !q_.empty(); });
        if (q_.empty()) return;  // stop requested and nothing left
        e = std::move(q_.front());
        q_.pop_front();
      }
      if (e->delay_ns) std::this_thread::sleep_for(std::chrono::nanoseconds(e->delay_ns));  // injected fault
      if (!e->failed) pool_.copy_all(e->copies);
      e->copies.clear();
      {
        std::lock_guard<std::mutex> g(e->mu);
        e->done.store(true, std::memory_order_release);
      }
      e->cv.notify_all();
    }
  }
  HelperPool& pool_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<ThreadEvent>> q_;
  bool stop_ = false;
  std::thread thread_;  // last: starts after the members it uses exist
};

class ThreadedEngine final : public TransferEngine {
 public:
  explicit ThreadedEngine(const EngineConfig& cfg) : pool_(std::max(cfg.copy_threads, 1) - 1) {
    KVGRID_CHECK(cfg.streams > 0, "streams ", cfg.streams);
    for (int s = 0; s < cfg.streams; ++s) workers_.push_back(std::make_unique<Worker>(pool_));
  }
  std::string_view name() const override { return "threaded"; }
  Event submit(StreamId stream, std::vector<Copy> batch) override {
    KVGRID_CHECK(stream >= 0 && stream < static_cast<int>(workers_.size()), "stream ", stream);
    auto e = std::make_shared<ThreadEvent>();
    for (const auto& c : batch) e->bytes += c.bytes;
    e->copies = std::move(batch);
    e->delay_ns = next_delay_;
    e->failed = next_fail_;
    next_delay_ = 0;
    next_fail_ = false;
    workers_[static_cast<std::size_t>(stream)]->push(e);
    return Event(e);
  }
  void inject(std::uint64_t delay_ns, bool fail) override {
    next_delay_ += delay_ns;
    next_fail_ = next_fail_ || fail;
  }

 private:
  HelperPool pool_;  // before the workers, which use it
  std::vector<std::unique_ptr<Worker>> workers_;
  std::uint64_t next_delay_ = 0;
  bool next_fail_ = false;
};

}  // namespace

std::unique_ptr<TransferEngine> make_threaded_engine(const EngineConfig& cfg) {
  return std::make_unique<ThreadedEngine>(cfg);
}

}  // namespace kvgrid::transfer
