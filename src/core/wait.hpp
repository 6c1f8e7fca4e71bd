// The one wait primitive (DESIGN §2 "Waiting").
//
// Everything that blocks goes through here: MPI requests are polled with MPI_Test, generic
// conditions (a simulated transfer's completion) with a predicate, thread hand-offs with a
// condition variable. Polling backs off (spin, then yield, then sleeps of up to 1 ms) so that a
// blocked rank on an oversubscribed core gives its core to the peer it waits for. Each wait has a
// deadline (`set_wait_deadline`, default 120 s): when it passes, the watchdog fires. The watchdog
// handler receives what was awaited and for how long; the run installs one that prints the rank,
// the wait and the last decisions, flushes the trace and aborts with exit 1. The default handler
// throws `WatchdogTimeout` (what unit tests observe).
#pragma once

#include <mpi.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>

namespace kvgrid {

struct WatchdogReport {
  int world_rank = -1;
  std::string awaited;       // e.g. "Ibcast of step 12 requests (group)"
  double waited_s = 0.0;
  double deadline_s = 0.0;
  std::string message() const;
};

class WatchdogTimeout : public std::runtime_error {
 public:
  explicit WatchdogTimeout(const WatchdogReport& r) : std::runtime_error(r.message()), report(r) {}
  WatchdogReport report;
};

using WatchdogHandler = std::function<void(const WatchdogReport&)>;

// A wait ended by an interrupt (below), not by what it waited for.
class WaitInterrupted : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
// Polled by a wait that has waited a while (past its first spins): returning true ends the wait
// with WaitInterrupted. `kvgrid explore` installs one that sees another rank abandon the schedule
// running now; nothing else does. Pass an empty function to remove it.
using WaitInterrupt = std::function<bool()>;
void set_wait_interrupt(WaitInterrupt f);

// Work a wait must keep doing while it waits for something else: a transport whose data moves only
// when its owner acts (transfer/ordered_transport.cpp takes its peers' announcements and posts the
// matching data receives — without that, a sender waiting for its data to leave and a receiver
// waiting for the sender's next message would wait for each other). Called at every poll of
// wait_mpi, wait_mpi_all and wait_until on the thread that added it (per thread; not re-entered).
// Returns an id for remove_wait_progress.
int add_wait_progress(std::function<void()> f);
void remove_wait_progress(int id);

void set_wait_deadline(std::chrono::duration<double> d);
std::chrono::duration<double> wait_deadline();
// Installs the handler called when a deadline passes. If the handler returns, WatchdogTimeout is
// thrown. Pass an empty function to restore the default (throw).
void set_watchdog_handler(WatchdogHandler h);

// Blocks until `req` completes (MPI_Test with back-off) or the deadline passes.
void wait_mpi(MPI_Request* req, std::string_view what, MPI_Status* status = MPI_STATUS_IGNORE);
// `progressing`: the requests move bulk data, so the wait keeps calling MPI (yields, never sleeps).
void wait_mpi_all(std::span<MPI_Request> reqs, std::string_view what, bool progressing = false);
// Blocks until `done()` is true, calling it with back-off.
void wait_until(const std::function<bool()>& done, std::string_view what);
// Thread hand-off: waits on `cv` (with `lock` held) until `done()`, or the deadline passes.
void wait_cv(std::unique_lock<std::mutex>& lock, std::condition_variable& cv,
             const std::function<bool()>& done, std::string_view what);

}  // namespace kvgrid
