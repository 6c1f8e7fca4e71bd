// `kvgrid explore`: an experiment under every schedule of its copy completions within a bound,
// inside one mpirun — a fresh rank stack per schedule, as the MPI tests' seed loops do. See
// docs/exploration.md for the choice points, the reduction and what a violation is.
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <thread>

#include "app/commands.hpp"
#include "app/mpi_main.hpp"
#include "core/check.hpp"
#include "core/decision_log.hpp"
#include "core/failpoint.hpp"
#include "core/hash.hpp"
#include "core/log.hpp"
#include "core/schedule.hpp"
#include "core/schedule_search.hpp"
#include "core/topology.hpp"
#include "core/wait.hpp"
#include "runtime/experiment.hpp"
#include "runtime/serve.hpp"
#include "runtime/serve_loop.hpp"

namespace kvgrid::app {

namespace {

std::string g_schedule;  // the schedule running now, for a failure the consensus check did not contain

// What one schedule's run gave, as world rank 0 sees it.
struct ScheduleRun {
  ScheduleOutcome outcome;
  std::uint64_t digest = 0;  // every rank's decision digest, mixed: tells outcomes apart
};

// Every rank's text at `root` (one string per rank).
std::vector<std::string> gather_text(MPI_Comm comm, const std::string& mine, int root) {
  int size = 0, rank = 0;
  KVGRID_MPI_CHECK(MPI_Comm_size(comm, &size));
  KVGRID_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  int len = static_cast<int>(mine.size());
  std::vector<int> lens(static_cast<std::size_t>(size)), offs(static_cast<std::size_t>(size));
  KVGRID_MPI_CHECK(MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, root, comm));
  std::string all;
  if (rank == root) {
    int total = 0;
    for (int r = 0; r < size; ++r) {
      offs[static_cast<std::size_t>(r)] = total;
      total += lens[static_cast<std::size_t>(r)];
    }
    all.resize(static_cast<std::size_t>(total));
  }
  KVGRID_MPI_CHECK(MPI_Gatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), offs.data(), MPI_CHAR, root, comm));
  std::vector<std::string> out;
  if (rank == root)
    for (int r = 0; r < size; ++r)
      out.push_back(all.substr(static_cast<std::size_t>(offs[static_cast<std::size_t>(r)]),
                               static_cast<std::size_t>(lens[static_cast<std::size_t>(r)])));
  return out;
}

// A choice record as one line: index step default answer dominated what.
std::string encode(const std::vector<ChoiceRecord>& records) {
  std::ostringstream os;
  for (const auto& c : records)
    os << c.index << ' ' << c.step << ' ' << c.default_answer << ' ' << c.answer << ' ' << c.dominated << ' ' << c.said << ' '
       << c.what << '\n';
  return os.str();
}

std::vector<ChoiceRecord> decode(const std::string& text) {
  std::vector<ChoiceRecord> out;
  std::istringstream is(text);
  for (std::string line; std::getline(is, line);) {
    std::istringstream ls(line);
    ChoiceRecord c;
    ls >> c.index >> c.step >> c.default_answer >> c.answer >> c.dominated >> c.said;
    std::getline(ls >> std::ws, c.what);
    out.push_back(std::move(c));
  }
  return out;
}

// A schedule's way out when it cannot end normally on every rank: a rank that fails where the
// consensus check cannot see it (a shape mismatch, say) or whose wait passes the deadline (a hang)
// *abandons* the schedule — tells every other rank on the control communicator, then joins one
// collective there that every rank joins exactly once per schedule (the quiesce). A rank blocked in
// a wait sees the message through the wait's interrupt, joins the quiesce *before* its stack
// unwinds (so messages already on their way land in buffers that still exist), then leaves with
// WaitInterrupted; a rank that ended the schedule normally joins at the end. What a schedule that
// ended by an exception anywhere created — its rank stack, its communicators — is never freed:
// requests may still point into it, and a freed communicator's context id could be reused by the
// next schedule's and match a stale message (docs/exploration.md).
class ScheduleExit {
 public:
  ScheduleExit(MPI_Comm ctl, int tag) : ctl_(ctl), tag_(tag) {
    KVGRID_MPI_CHECK(MPI_Comm_size(ctl, &size_));
    KVGRID_MPI_CHECK(MPI_Comm_rank(ctl, &rank_));
    KVGRID_MPI_CHECK(MPI_Irecv(&incoming_, 1, MPI_INT, MPI_ANY_SOURCE, tag_, ctl_, &recv_));
  }
  // Polled by waits: another rank abandoned the schedule (then this rank has quiesced).
  bool abandoned_elsewhere() {
    if (quiesced_) return true;
    int flag = 0;
    KVGRID_MPI_CHECK(MPI_Test(&recv_, &flag, MPI_STATUS_IGNORE));
    if (!flag) return false;
    quiesce(false, true);
    return true;
  }
  // This rank abandons the schedule: every other rank is told, then it quiesces.
  void abandon() {
    if (quiesced_) return;
    std::vector<MPI_Request> sends;
    int one = 1;
    for (int r = 0; r < size_; ++r)
      if (r != rank_) {
        sends.emplace_back();
        KVGRID_MPI_CHECK(MPI_Isend(&one, 1, MPI_INT, r, tag_, ctl_, &sends.back()));
      }
    raw_wait(sends);
    quiesce(true, true);
  }
  // At the schedule's end on every rank: whether it ended by an exception on any rank.
  bool settle(bool exception) {
    if (!quiesced_) quiesce(false, exception);
    return exceptions_ > 0;
  }

 private:
  // Waits without the wait primitive (no interrupt, no watchdog handler); a minute is a bug.
  static void raw_wait(std::vector<MPI_Request>& reqs) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    for (int done = 0; !done;) {
      KVGRID_MPI_CHECK(MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &done, MPI_STATUSES_IGNORE));
      if (!done && std::chrono::steady_clock::now() > until) {
        log_all("kvgrid explore: the control communicator did not settle a schedule in 60 s (a bug); aborting");
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
      if (!done) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  void quiesce(bool originator, bool exception) {
    quiesced_ = true;
    std::int64_t mine[2] = {originator ? 1 : 0, exception ? 1 : 0}, all[2] = {0, 0};
    std::vector<MPI_Request> reqs(1);
    KVGRID_MPI_CHECK(MPI_Iallreduce(mine, all, 2, MPI_INT64_T, MPI_SUM, ctl_, &reqs[0]));
    raw_wait(reqs);
    exceptions_ = all[1];
    // Every abandon message sent to this rank is received, so none is left for a later schedule.
    const std::int64_t expected = all[0] - mine[0];
    if (expected == 0) {
      KVGRID_MPI_CHECK(MPI_Cancel(&recv_));
      std::vector<MPI_Request> r{recv_};
      raw_wait(r);
    } else {
      std::vector<MPI_Request> r{recv_};
      raw_wait(r);
      for (std::int64_t i = 1; i < expected; ++i) {
        KVGRID_MPI_CHECK(MPI_Irecv(&incoming_, 1, MPI_INT, MPI_ANY_SOURCE, tag_, ctl_, &r[0]));
        raw_wait(r);
      }
    }
    recv_ = MPI_REQUEST_NULL;
  }

  MPI_Comm ctl_;
  int tag_, size_ = 1, rank_ = 0;
  int incoming_ = 0;
  MPI_Request recv_ = MPI_REQUEST_NULL;
  bool quiesced_ = false;
  std::int64_t exceptions_ = 0;
};

class Explorer {
 public:
  Explorer(const ExploreOptions& opt, ExperimentConfig exp, int world_rank, int world_size)
      : opt_(opt), exp_(std::move(exp)), rank_(world_rank), size_(world_size) {
    KVGRID_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &ctl_));  // the explorer's own traffic, apart from any run's
  }
  ~Explorer() { MPI_Comm_free(&ctl_); }
  Explorer(const Explorer&) = delete;
  Explorer& operator=(const Explorer&) = delete;

  // Runs `s` on every rank (collective); the outcome is complete on world rank 0.
  ScheduleRun run(const Schedule& s) {
    g_schedule = s.str();
    ExperimentConfig e = exp_;
    const std::string storage = storage_root_ + "/" + std::to_string(runs_);
    if (e.cache.storage != "none") e.cache.storage_dir = storage;
    ChoiceSource choices(s.for_rank(rank_));
    set_choice_source(&choices);
    FailpointRegistry faults(e.engine.seed, rank_);
    for (const auto& f : e.faults) faults.configure(f);
    DecisionLog log;
    std::string violation;
    std::int64_t bad = 0;
    bool exception = false;
    ScheduleExit exit(ctl_, static_cast<int>(runs_++ % 30000));
    set_wait_interrupt([&exit] { return exit.abandoned_elsewhere(); });
    set_watchdog_handler([&](const WatchdogReport& r) {
      violation = "hang: " + r.message();
      exit.abandon();
      throw WaitInterrupted(r.message());
    });
    auto grid = std::make_unique<RankGrid>(e.topology, MPI_COMM_WORLD);
    std::unique_ptr<ServeLoop> loop;
    try {
      loop = std::make_unique<ServeLoop>(e, *grid, faults, log, nullptr, /*print=*/false, nullptr);
      ServeResult r = loop->run();
      bad = r.verify_failures + r.tree_divergences + r.decision_divergences + std::max<std::int64_t>(r.oracle_mismatches, 0);
      if (bad)
        violation = "oracle mismatches " + std::to_string(std::max<std::int64_t>(r.oracle_mismatches, 0)) +
                    ", verify failures " + std::to_string(r.verify_failures) + ", tree/decision divergences " +
                    std::to_string(r.tree_divergences + r.decision_divergences);
    } catch (const DivergenceFound& d) {  // stopped on every rank at the same check
      exception = true;
      violation = d.description;
    } catch (const WaitInterrupted&) {  // another rank abandoned the schedule (or this one hung)
      exception = true;
    } catch (const RunFailure& f) {  // seen by this rank only: it abandons the schedule
      exception = true;
      violation = "rank " + std::to_string(rank_) + ": " + f.what();
      exit.abandon();
    }
    set_wait_interrupt({});
    set_watchdog_handler({});
    set_choice_source(nullptr);
    if (exit.settle(exception)) {  // never freed: see ScheduleExit
      bad = 1;
      (void)loop.release();
      (void)grid.release();
    }
    loop.reset();
    grid.reset();
    std::int64_t any = 0;
    KVGRID_MPI_CHECK(MPI_Allreduce(&bad, &any, 1, MPI_INT64_T, MPI_MAX, ctl_));
    std::ostringstream mine;
    mine << log.running_digest() << '\n' << violation.size() << '\n' << violation << encode(choices.records());
    const std::vector<std::string> all = gather_text(ctl_, mine.str(), 0);
    if (e.cache.storage != "none") {
      KVGRID_MPI_CHECK(MPI_Barrier(ctl_));
      if (rank_ == 0) std::filesystem::remove_all(storage);
    }
    ScheduleRun out;
    out.outcome.violation = any != 0;
    for (int r = 0; r < static_cast<int>(all.size()); ++r) {
      std::istringstream is(all[static_cast<std::size_t>(r)]);
      std::uint64_t digest = 0;
      std::size_t vlen = 0;
      is >> digest >> vlen;
      is.get();
      std::string v(vlen, '\0');
      is.read(v.data(), static_cast<std::streamsize>(vlen));
      if (!v.empty() && out.outcome.what.empty()) out.outcome.what = v;
      out.digest = hash_combine(out.digest, hash_combine(static_cast<std::uint64_t>(r), digest));
      std::string rest((std::istreambuf_iterator<char>(is)), std::istreambuf_iterator<char>());
      out.outcome.ranks.push_back(decode(rest));
    }
    if (out.outcome.violation && out.outcome.what.empty()) out.outcome.what = "a violation (no rank described it)";
    return out;
  }

  // Rank 0 picks the next schedule and every rank learns it; nullopt ends the loop everywhere.
  std::optional<Schedule> broadcast(const std::optional<Schedule>& s) {
    std::string text = s ? "+" + s->str() : "";
    int len = static_cast<int>(text.size());
    KVGRID_MPI_CHECK(MPI_Bcast(&len, 1, MPI_INT, 0, ctl_));
    text.resize(static_cast<std::size_t>(len));
    KVGRID_MPI_CHECK(MPI_Bcast(text.data(), len, MPI_CHAR, 0, ctl_));
    if (text.empty()) return std::nullopt;
    return Schedule::parse(std::string_view(text).substr(1));
  }

  int run_all() {
    storage_root_ = (opt_.out.empty() ? "results/explore/" + exp_.name : opt_.out) + "/storage";
    if (rank_ != 0) {  // rank 0 decides what runs; the others follow
      while (std::optional<Schedule> s = broadcast(std::nullopt)) run(*s);
      return 0;
    }
    auto everywhere = [&](const Schedule& s) {
      broadcast(s);
      return run(s);
    };
    ScheduleSearch search(opt_.bound);
    const auto start = std::chrono::steady_clock::now();
    auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
    bool out_of_time = false;
    std::optional<ScheduleOutcome> bad;
    while (opt_.keep_going || search.violations().empty()) {
      if ((out_of_time = opt_.budget_s > 0 && elapsed() > opt_.budget_s)) break;
      const std::optional<Schedule> s = search.next();
      if (!s) break;
      ScheduleRun r = everywhere(*s);
      search.record(*s, r.outcome, r.digest);
      if (!bad && !search.violations().empty()) bad = r.outcome;
    }
    // Shrinking: each flip moved to the earliest choice point of its rank where the run still fails
    // (the breadth-first order already gives the fewest flips).
    Schedule found = search.violations().empty() ? Schedule{} : search.violations().front();
    std::uint64_t shrink_runs = 0;
    const std::vector<SchedulePoint> original = found.flips;
    for (const SchedulePoint& p : original) {
      if (!bad || opt_.no_shrink) break;
      for (std::uint32_t j = 0; j < p.index; ++j) {
        if (found.contains({p.rank, j})) continue;
        const Schedule c = found.without(p).with({p.rank, j});
        ScheduleRun r = everywhere(c);
        ++shrink_runs;
        if (r.outcome.violation && applied_flips(c, r.outcome) == c) {
          found = c;
          bad = r.outcome;
          break;
        }
      }
    }
    broadcast(std::nullopt);
    return report(search, found, bad, shrink_runs, out_of_time, elapsed());
  }

  int report(const ScheduleSearch& search, const Schedule& found, const std::optional<ScheduleOutcome>& bad,
             std::uint64_t shrink_runs, bool out_of_time, double seconds) {
    const auto& st = search.stats();
    std::ostringstream os;
    char secs[32];
    std::snprintf(secs, sizeof(secs), "%.1f", seconds);
    os << "# schedules: " << st.explored << " run (" << st.redundant << " did not reach a flip: a smaller schedule's run), "
       << st.unreduced << " without the reduction (computed: every choice point of every run below the bound), "
       << st.dominated << " dominated, " << st.duplicates << " reached twice; at most " << st.max_points
       << " choice points per run; " << st.outcomes.size() << " distinct outcomes; " << secs << " s\n";
    os << "# violations: " << st.violations << (opt_.keep_going || !st.violations ? "" : " (the search stops at the first)") << "\n";
    int rc = 0;
    if (bad) {
      os << "# counterexample: " << found.size() << " flip" << (found.size() == 1 ? "" : "s") << ", schedule '" << found.str()
         << "'" << (opt_.no_shrink ? "" : " (shrunk in " + std::to_string(shrink_runs) + " runs)") << "\n";
      for (const auto& p : found.flips) {
        const auto& rec = bad->ranks[static_cast<std::size_t>(p.rank)][p.index];
        const GridCoord c = layout_coord(exp_.topology, p.rank);
        os << "#   rank " << p.rank << " (" << (exp_.topology.groups.size() > 1 ? (c.group ? "decode, " : "prefill, ") : "") << "pp " << c.pp << ", cp " << c.cp << ", tp " << c.tp << ") at step " << rec.step << ": "
           << rec.what << ": " << rec.said << "\n";
      }
      os << "#   " << bad->what << "\n";
      os << "#   replay: mpirun -np " << size_ << " build/kvgrid run " << opt_.experiment << " --seed " << exp_.engine.seed;
      for (const auto& s : opt_.sets) os << " --set '" << s << "'";
      os << " --set protocol.consensus_check=on --set protocol.consensus_interval=1 --schedule '" << found.str() << "'\n";
      rc = 1;
    }
    if (out_of_time) {
      os << "# verdict: INCOMPLETE (the budget of " << opt_.budget_s << " s ran out)";
      rc = rc ? rc : 3;
    } else {
      os << "# verdict: " << (bad ? "VIOLATION" : "clean: every schedule within the bound");
    }
    log0(os.str());
    return rc;
  }

 private:
  const ExploreOptions& opt_;
  ExperimentConfig exp_;
  int rank_, size_;
  std::string storage_root_;
  std::uint64_t runs_ = 0;
  MPI_Comm ctl_ = MPI_COMM_NULL;
};

int explore_body(const ExploreOptions& opt, int world_rank, int world_size) {
  ExperimentConfig exp = on_every_rank(MPI_COMM_WORLD, [&] {
    std::vector<std::string> sets = opt.sets;
    sets.push_back("protocol.consensus_check=on");  // a divergence stops every rank at the same check
    sets.push_back("protocol.consensus_interval=1");
    ExperimentConfig e = load_experiment(opt.experiment, sets, opt.seed);
    e.validate_for_world(world_size);
    if (e.workload.kind == "tree") throw InputError(opt.experiment + ": kvgrid explore runs serving workloads, not workload.kind = \"tree\"");
    if (e.engine.transfer != "simulated")
      throw InputError(opt.experiment + ": kvgrid explore needs engine.transfer = \"simulated\" (its completions are the choices)");
    if (e.cache.storage == "redis" || e.cache.storage_shared)
      throw InputError(opt.experiment + ": kvgrid explore needs storage private to each run (cache.storage = \"file\")");
    e.output.quiet = true;
    return e;
  });
  set_wait_deadline(std::chrono::duration<double>(opt.deadline_s));
  set_debug_checks(exp.engine.debug_checks);
  std::ostringstream os;
  os << "# " << version_string() << "\n# explore " << exp.name << " (" << exp.source << "): seed " << exp.engine.seed
     << ", topology " << exp.topology.str() << ", " << world_size << " ranks, bound " << opt.bound
     << " (non-default choices per schedule), hang deadline " << opt.deadline_s << " s\n# choice points: every copy "
        "completion and storage read a rank observes, every evaluation of a configured failpoint; online consensus "
        "check at every step";
  log0(os.str());
  int rc = 0;
  {
    Explorer ex(opt, exp, world_rank, world_size);
    rc = ex.run_all();
  }
  // Every rank exits with rank 0's verdict (mpirun waits seconds for the others when one exits
  // non-zero alone).
  KVGRID_MPI_CHECK(MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD));
  return rc;
}

}  // namespace

int cmd_explore(const ExploreOptions& opt, int argc, char** argv) {
  return run_under_mpi(
      argc, argv, "explore", [&](int world_rank, int world_size) { return explore_body(opt, world_rank, world_size); },
      [&](const RunFailure& e) {
        return std::string("FAILED under schedule '") + g_schedule +
               "' (not contained by the consensus check; the exploration stops): " + e.what() +
               "\n# replay it with kvgrid run --schedule";
      });
}

}  // namespace kvgrid::app
