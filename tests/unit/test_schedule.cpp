// Schedules and their enumeration (kvgrid explore): the text form, a rank's answers, the
// breadth-first search over fake programs with a known number of schedules, and the simulated
// engine under a choice source (defaults from the clock, flips, FIFO, monotone answers).
#include <gtest/gtest.h>

#include <functional>
#include <numeric>

#include "cache/write_acks.hpp"
#include "core/check.hpp"
#include "core/schedule.hpp"
#include "core/schedule_search.hpp"
#include "transfer/transfer_engine.hpp"

namespace kvgrid {
namespace {

TEST(Schedule, ParsesFormatsAndRejectsBadEntries) {
  const Schedule s = Schedule::parse("3:0,1:4,1:2");
  EXPECT_EQ(s.str(), "1:2,1:4,3:0");  // sorted by (rank, index)
  EXPECT_EQ(s.for_rank(1), (std::vector<std::uint32_t>{2, 4}));
  EXPECT_TRUE(s.for_rank(0).empty());
  EXPECT_EQ(Schedule::parse("").size(), 0u);
  EXPECT_EQ(Schedule::parse(s.str()), s);
  for (const char* bad : {"1", "1:", ":2", "a:1", "1:2,", "-1:2", "1:2:3", "1:2,1:2"})
    EXPECT_THROW(Schedule::parse(bad), InputError) << bad;
  try {
    Schedule::parse("0:1,x:2", "--schedule");
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("'x:2'"), std::string::npos) << e.what();
  }
}

TEST(Schedule, SourceAnswersFlipsItsPointsAndRecordsThem) {
  ChoiceSource c({1, 3});
  c.set_step(7);
  EXPECT_TRUE(c.answer(true, "a"));
  EXPECT_FALSE(c.answer(true, "b"));  // flipped
  EXPECT_FALSE(c.answer(false, "c"));
  EXPECT_TRUE(c.answer(false, "d"));  // flipped
  EXPECT_EQ(c.applied(), 2u);
  ASSERT_EQ(c.size(), 4u);
  EXPECT_EQ(c.records()[3].step, 7u);
  EXPECT_EQ(c.records()[1].what, "b");
  c.dominate_since(2);  // only a point answered "pending" by default is dominated
  EXPECT_TRUE(c.records()[2].dominated);
  EXPECT_FALSE(c.records()[3].dominated);
  EXPECT_FALSE(c.records()[0].dominated);
}

// A fake program: `points(answers so far)` says whether another choice point comes, and with which
// default; it runs against one rank's flips.
using Program = std::function<std::optional<bool>(const std::vector<bool>& answers)>;

ScheduleOutcome run_fake(const Program& prog, const Schedule& s, const std::function<bool(const ChoiceSource&)>& bad,
                         const std::vector<std::uint32_t>& dominated = {}) {
  ChoiceSource c(s.for_rank(0));
  std::vector<bool> answers;
  while (auto d = prog(answers)) answers.push_back(c.answer(*d, "point"));
  ScheduleOutcome o;
  o.ranks.push_back(c.records());
  for (auto i : dominated)
    if (i < o.ranks[0].size() && !o.ranks[0][i].answer) o.ranks[0][i].dominated = true;
  o.violation = bad(c);
  return o;
}

std::uint64_t digest(const ScheduleOutcome& o) {
  std::uint64_t d = 0;
  for (const auto& r : o.ranks[0]) d = d * 3 + (r.answer ? 1 : 2);
  return d;
}

ScheduleSearchStats search(int bound, const Program& prog, const std::function<bool(const ChoiceSource&)>& bad,
                           std::vector<Schedule>* order = nullptr, const std::vector<std::uint32_t>& dominated = {}) {
  ScheduleSearch s(bound);
  while (auto next = s.next()) {
    if (order) order->push_back(*next);
    const ScheduleOutcome o = run_fake(prog, *next, bad, dominated);
    s.record(*next, o, digest(o));
  }
  return s.stats();
}

TEST(ScheduleSearch, ThreeIndependentChoicesGiveEverySubsetOnce) {
  const Program three = [](const std::vector<bool>& a) -> std::optional<bool> {
    if (a.size() < 3) return false;
    return std::nullopt;
  };
  auto never = [](const ChoiceSource&) { return false; };
  // Bound 3: 1 + 3 + 3 + 1 schedules; without deduplication 3 + 6 + 3 children, 5 of them twice.
  std::vector<Schedule> order;
  auto st = search(3, three, never, &order);
  EXPECT_EQ(st.explored, 8u);
  EXPECT_EQ(st.unreduced, 12u);
  EXPECT_EQ(st.duplicates, 5u);
  EXPECT_EQ(st.outcomes.size(), 8u);
  for (std::size_t i = 1; i < order.size(); ++i) EXPECT_LE(order[i - 1].size(), order[i].size());  // breadth first
  EXPECT_EQ(search(1, three, never).explored, 4u);
  EXPECT_EQ(search(0, three, never).explored, 1u);
  // The reduction: point 2 dominated (never branched on) leaves the subsets of {0, 1}.
  st = search(3, three, never, nullptr, {2});
  EXPECT_EQ(st.explored, 4u);
  EXPECT_EQ(st.dominated, 4u);  // point 2 in each of the 4 runs below the bound
}

TEST(ScheduleSearch, PointsReachedOnlyUnderAFlipAreFoundAndSmallerRunsAreNotExtended) {
  // Point 0 answered "complete" (flipped) opens points 1 and 2; by default the run has one point.
  const Program branching = [](const std::vector<bool>& a) -> std::optional<bool> {
    if (a.empty()) return false;
    if (a[0] && a.size() < 3) return true;
    return std::nullopt;
  };
  // The violation needs point 0 early and point 2 late.
  auto bad = [](const ChoiceSource& c) {
    const auto& r = c.records();
    return r.size() == 3 && r[0].answer && !r[2].answer;
  };
  ScheduleSearch s(2);
  std::uint64_t runs = 0;
  while (auto next = s.next()) {
    ++runs;
    const ScheduleOutcome o = run_fake(branching, *next, bad);
    s.record(*next, o, digest(o));
  }
  EXPECT_EQ(runs, 4u);  // {}, {0}, {0,1}, {0,2}
  ASSERT_EQ(s.violations().size(), 1u);
  EXPECT_EQ(s.violations()[0].str(), "0:0,0:2");
  // A schedule naming a point its run never reaches is that smaller run: counted, not extended.
  ScheduleSearch t(2);
  auto first = t.next();
  t.record(*first, run_fake(branching, *first, bad), 0);
  const Schedule unreachable = Schedule::parse("0:5");
  const ScheduleOutcome o = run_fake(branching, unreachable, bad);
  EXPECT_EQ(applied_flips(unreachable, o).size(), 0u);
  t.record(unreachable, o, 0);
  EXPECT_EQ(t.stats().redundant, 1u);
}

struct Clock {
  std::uint64_t t = 0;
  transfer::EngineConfig cfg() {
    transfer::EngineConfig c;
    c.bytes_per_ns = 1.0;
    c.jitter = 0.0;
    c.now = [this] { return t; };
    c.advance_to = [this](std::uint64_t v) { t = v; };
    return c;
  }
};

TEST(ControlledEngine, ClockDefaultsFlipsFifoAndMonotoneAnswers) {
  Clock clk;
  auto e = transfer::make_engine(clk.cfg());
  std::vector<std::uint8_t> src(100, 7), a(100, 0), b(100, 0);
  transfer::Event ea = e->submit(0, {{a.data(), src.data(), 100}});  // due at 101
  transfer::Event eb = e->submit(0, {{b.data(), src.data(), 100}});  // due at 202 (FIFO behind ea)
  ChoiceSource c({1, 2});
  set_choice_source(&c);
  clk.t = 150;
  EXPECT_TRUE(ea.query());    // point 0: default (the clock passed it)
  EXPECT_TRUE(eb.query());    // point 1: flipped — complete before its time
  EXPECT_EQ(b, src);          // its copy landed
  EXPECT_TRUE(eb.query());    // monotone: no new point
  transfer::Event ec = e->submit(1, {{a.data(), src.data(), 10}});
  clk.t = 10'000;
  EXPECT_FALSE(ec.query());   // point 2: flipped — still pending although due
  EXPECT_TRUE(ec.query());    // point 3: default
  set_choice_source(nullptr);
  ASSERT_EQ(c.size(), 4u);
  EXPECT_FALSE(c.records()[1].default_answer);
  EXPECT_TRUE(c.records()[1].answer);
  EXPECT_NE(c.records()[1].what.find("copy #1 (stream 0"), std::string::npos) << c.records()[1].what;
  // FIFO: a later copy reported complete completes the earlier ones on its stream.
  ChoiceSource d({0});
  set_choice_source(&d);
  clk.t = 0;
  std::vector<std::uint8_t> x(100, 0), y(100, 0);
  transfer::Event ex = e->submit(2, {{x.data(), src.data(), 100}});
  transfer::Event ey = e->submit(2, {{y.data(), src.data(), 100}});
  EXPECT_TRUE(ey.query());  // flipped
  EXPECT_TRUE(ex.query());  // already performed: no choice
  EXPECT_EQ(x, src);
  EXPECT_EQ(d.size(), 1u);
  set_choice_source(nullptr);
}

// The write ACK queue marks as dominated an early completion on a rank that already saw more
// finished than the agreement took.
class FixedMin final : public cache::AckAgreement {
 public:
  explicit FixedMin(std::size_t peer) : peer_(peer) {}
  std::string_view name() const override { return "fixed"; }
  std::size_t agree(std::size_t ready, std::size_t) override { return std::min(ready, peer_); }
  bool agree_allocation(bool ok) override { return ok; }
  std::uint64_t agree_min(std::uint64_t v) override { return v; }
  std::size_t peer_;
};

TEST(ControlledEngine, WriteAcksDominateEarlyCompletionsAboveTheAgreedCount) {
  for (std::size_t peer : {0u, 5u}) {
    Clock clk;
    auto e = transfer::make_engine(clk.cfg());
    std::vector<std::uint8_t> src(100, 1), dst(300, 0);
    FixedMin agreement(peer);
    DecisionLog log;
    cache::WriteAcks acks(agreement, log, [](std::uint64_t, bool, bool) {});
    for (int i = 0; i < 3; ++i) acks.push(static_cast<std::uint64_t>(i), e->submit(0, {{dst.data() + 100 * i, src.data(), 100}}));
    clk.t = 150;  // the first is due, the second not
    ChoiceSource c({});
    set_choice_source(&c);
    EXPECT_EQ(acks.agreed_ready(), std::min<std::size_t>(1, peer));
    set_choice_source(nullptr);
    ASSERT_EQ(c.size(), 2u);  // copy 0 complete, copy 1 pending: the count stops there
    EXPECT_EQ(c.records()[1].dominated, peer == 0) << "peer " << peer;  // a peer at 0 masks this rank's count
    EXPECT_FALSE(c.records()[0].dominated);
  }
}

}  // namespace
}  // namespace kvgrid
