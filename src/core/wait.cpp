#include "core/wait.hpp"

#include <atomic>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "core/check.hpp"

namespace kvgrid {

namespace {
std::atomic<double> g_deadline_s{120.0};
std::mutex g_handler_mu;
WatchdogHandler g_handler;
WaitInterrupt g_interrupt;  // set and polled by the rank's own loop thread only (kvgrid explore)
// add_wait_progress: this thread's hooks, and whether one is running (no re-entry).
thread_local std::vector<std::pair<int, std::function<void()>>> t_progress;
thread_local bool t_in_progress = false;
thread_local int t_next_progress = 0;

void run_progress() {
  if (t_progress.empty() || t_in_progress) return;
  t_in_progress = true;
  try {
    for (auto& [id, f] : t_progress) f();
  } catch (...) {
    t_in_progress = false;
    throw;
  }
  t_in_progress = false;
}

using Clock = std::chrono::steady_clock;

[[noreturn]] void fire(std::string_view what, Clock::time_point start) {
  WatchdogReport r;
  r.world_rank = check_rank();
  r.awaited = std::string(what);
  r.waited_s = std::chrono::duration<double>(Clock::now() - start).count();
  r.deadline_s = g_deadline_s.load();
  WatchdogHandler h;
  {
    std::lock_guard<std::mutex> g(g_handler_mu);
    h = g_handler;
  }
  if (h) h(r);
  throw WatchdogTimeout(r);
}

// Back-off schedule: ~100 spins, then yields for the first 20 ms of a wait, then sleeps growing
// to 1 ms. Yielding (not sleeping) keeps short waits short: a sleep costs at least the kernel's
// timer slack (~50 µs), which on an oversubscribed node would be paid at every pipeline step,
// while a yield hands the core straight to the peer being waited for. A wait that moves data
// (`progressing`: bulk MPI transfers, which Open MPI advances only inside MPI calls) keeps
// yielding: a sleep there stalls the transfer itself, not just its notice.
class Backoff {
 public:
  explicit Backoff(bool progressing = false) : progressing_(progressing) {}
  // `what`: the wait, for an interruption's report. Past the first spins an installed interrupt
  // is polled; it may end the wait with WaitInterrupted.
  void pause(std::string_view what) {
    ++n_;
    if (n_ < 100) return;
    if (g_interrupt && g_interrupt()) throw WaitInterrupted("interrupted while waiting for " + std::string(what));
    if (n_ == 100) yield_until_ = Clock::now() + std::chrono::milliseconds(20);
    if (progressing_ || Clock::now() < yield_until_) {
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(sleep_us_));
    if (sleep_us_ < 1000) sleep_us_ *= 2;
  }

 private:
  bool progressing_;
  int n_ = 0;
  int sleep_us_ = 50;
  Clock::time_point yield_until_{};
};
}  // namespace

std::string WatchdogReport::message() const {
  std::ostringstream os;
  os << "watchdog: rank " << world_rank << " waited " << waited_s << " s (deadline " << deadline_s
     << " s) for " << awaited;
  return os.str();
}

void set_wait_deadline(std::chrono::duration<double> d) { g_deadline_s.store(d.count()); }
std::chrono::duration<double> wait_deadline() { return std::chrono::duration<double>(g_deadline_s.load()); }

void set_wait_interrupt(WaitInterrupt f) { g_interrupt = std::move(f); }

int add_wait_progress(std::function<void()> f) {
  t_progress.emplace_back(++t_next_progress, std::move(f));
  return t_next_progress;
}

void remove_wait_progress(int id) {
  for (auto it = t_progress.begin(); it != t_progress.end(); ++it)
    if (it->first == id) {
      t_progress.erase(it);
      return;
    }
}

void set_watchdog_handler(WatchdogHandler h) {
  std::lock_guard<std::mutex> g(g_handler_mu);
  g_handler = std::move(h);
}

void wait_mpi(MPI_Request* req, std::string_view what, MPI_Status* status) {
  const auto start = Clock::now();
  const auto limit = start + std::chrono::duration_cast<Clock::duration>(wait_deadline());
  Backoff b;
  for (;;) {
    run_progress();
    int flag = 0;
    KVGRID_MPI_CHECK(MPI_Test(req, &flag, status));
    if (flag) return;
    if (Clock::now() > limit) fire(what, start);
    b.pause(what);
  }
}

void wait_mpi_all(std::span<MPI_Request> reqs, std::string_view what, bool progressing) {
  const auto start = Clock::now();
  const auto limit = start + std::chrono::duration_cast<Clock::duration>(wait_deadline());
  Backoff b(progressing);
  for (;;) {
    run_progress();
    int flag = 0;
    KVGRID_MPI_CHECK(MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &flag, MPI_STATUSES_IGNORE));
    if (flag) return;
    if (Clock::now() > limit) fire(what, start);
    b.pause(what);
  }
}

void wait_until(const std::function<bool()>& done, std::string_view what) {
  const auto start = Clock::now();
  const auto limit = start + std::chrono::duration_cast<Clock::duration>(wait_deadline());
  Backoff b;
  for (;;) {
    run_progress();
    if (done()) return;
    if (Clock::now() > limit) fire(what, start);
    b.pause(what);
  }
}

void wait_cv(std::unique_lock<std::mutex>& lock, std::condition_variable& cv,
             const std::function<bool()>& done, std::string_view what) {
  const auto start = Clock::now();
  const auto limit = start + std::chrono::duration_cast<Clock::duration>(wait_deadline());
  if (!cv.wait_until(lock, limit, done)) {
    lock.unlock();
    fire(what, start);
  }
}

}  // namespace kvgrid
