// The wait primitive (deadline, handler, condition variables) and the workload generator.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "core/wait.hpp"
#include "runtime/workload.hpp"

namespace kvgrid {
namespace {

class WaitTest : public ::testing::Test {
 protected:
  void SetUp() override { set_wait_deadline(std::chrono::duration<double>(0.05)); }
  void TearDown() override {
    set_wait_deadline(std::chrono::duration<double>(120.0));
    set_watchdog_handler({});
  }
};

TEST_F(WaitTest, PassedDeadlineReportsWhatWasAwaited) {
  try {
    wait_until([] { return false; }, "the moon");
    FAIL() << "the watchdog did not fire";
  } catch (const WatchdogTimeout& e) {
    EXPECT_EQ(e.report.awaited, "the moon");
    EXPECT_GE(e.report.waited_s, 0.05);
    EXPECT_NE(std::string(e.what()).find("waited"), std::string::npos);
  }
}

TEST_F(WaitTest, HandlerRunsBeforeTheTimeoutIsThrown) {
  std::string seen;
  set_watchdog_handler([&](const WatchdogReport& r) { seen = r.awaited; });
  EXPECT_THROW(wait_until([] { return false; }, "x"), WatchdogTimeout);
  EXPECT_EQ(seen, "x");
}

TEST_F(WaitTest, ConditionVariableWaitWakesOnNotifyAndTimesOutOtherwise) {
  set_wait_deadline(std::chrono::duration<double>(30.0));
  std::mutex mu;
  std::condition_variable cv;
  bool ready = false;
  std::thread t([&] {
    std::lock_guard<std::mutex> g(mu);
    ready = true;
    cv.notify_all();
  });
  {
    std::unique_lock<std::mutex> lk(mu);
    wait_cv(lk, cv, [&] { return ready; }, "producer");
  }
  t.join();
  set_wait_deadline(std::chrono::duration<double>(0.02));
  std::unique_lock<std::mutex> lk(mu);
  EXPECT_THROW(wait_cv(lk, cv, [] { return false; }, "nobody"), WatchdogTimeout);
}

TEST_F(WaitTest, CompletedConditionReturnsAtOnce) {
  int calls = 0;
  wait_until([&] { return ++calls >= 3; }, "three polls");
  EXPECT_EQ(calls, 3);
}

TEST(TreeWorkload, SameSeedSameRequestsAndLengthsInRange) {
  TreeWorkloadConfig cfg;
  cfg.prompt_tokens_min = 20;
  cfg.prompt_tokens_max = 90;
  cfg.prefix_tokens = 60;
  cfg.requests_per_step = 5;
  TreeWorkload a(cfg, 32000, 3), b(cfg, 32000, 3), c(cfg, 32000, 4);
  bool differs = false;
  std::uint64_t expect_id = 0;
  for (int s = 0; s < 50; ++s) {
    auto x = a.next_step(), y = b.next_step(), z = c.next_step();
    ASSERT_EQ(x.size(), 5u);
    for (std::size_t i = 0; i < x.size(); ++i) {
      EXPECT_EQ(x[i].tokens, y[i].tokens);
      EXPECT_EQ(x[i].id.value(), expect_id++);
      EXPECT_GE(x[i].tokens.size(), 20u);
      EXPECT_LE(x[i].tokens.size(), 90u);
      EXPECT_GE(x[i].hold_steps, 1);
      differs = differs || x[i].tokens != z[i].tokens;
    }
  }
  EXPECT_TRUE(differs);
}

TEST(TreeWorkload, EncodingRoundTripsAndRejectsTruncation) {
  TreeWorkloadConfig cfg;
  TreeWorkload g(cfg, 32000, 1);
  auto reqs = g.next_step();
  reqs[0].id = RequestId(0x1234567890ull);
  auto buf = encode_requests(reqs);
  auto back = decode_requests(buf);
  ASSERT_EQ(back.size(), reqs.size());
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(back[i].id, reqs[i].id);
    EXPECT_EQ(back[i].hold_steps, reqs[i].hold_steps);
    EXPECT_EQ(back[i].tokens, reqs[i].tokens);
  }
  buf.pop_back();
  EXPECT_ANY_THROW(decode_requests(buf));
}

}  // namespace
}  // namespace kvgrid
