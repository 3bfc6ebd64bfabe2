#include "common/stop_signals.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace ss {
namespace {

// A blocked stop signal stays pending until waited for: sent before the wait, it is still taken.
TEST(StopSignalsTest, WaitTakesAPendingSignal) {
  BlockStopSignals(Sigpipe::kDefault);
  EXPECT_EQ(WaitForStopSignal(absl::Milliseconds(10)), 0);
  ASSERT_EQ(kill(getpid(), SIGTERM), 0);
  EXPECT_EQ(WaitForStopSignal(absl::Seconds(5)), SIGTERM);
  EXPECT_EQ(WaitForStopSignal(absl::Milliseconds(10)), 0);  // taken once
  EXPECT_STREQ(StopSignalName(SIGTERM), "SIGTERM");
  EXPECT_STREQ(StopSignalName(SIGINT), "SIGINT");
}

TEST(StopSignalsTest, TheThreadCallsOnStopOnceWithTheSignal) {
  BlockStopSignals(Sigpipe::kDefault);
  std::atomic<int> calls{0}, got{0};
  absl::Notification called;
  {
    StopSignalThread t([&](int sig) {
      got.store(sig);
      calls.fetch_add(1);
      called.Notify();
    });
    ASSERT_EQ(kill(getpid(), SIGINT), 0);
    EXPECT_TRUE(called.WaitForNotificationWithTimeout(absl::Seconds(5)));
  }
  EXPECT_EQ(got.load(), SIGINT);
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(WaitForStopSignal(absl::Milliseconds(10)), 0);  // nothing left pending
}

// Destroyed before any signal, the thread ends without calling on_stop and leaves no signal
// pending for the process.
TEST(StopSignalsTest, DestroyingTheThreadDoesNotCallOnStop) {
  BlockStopSignals(Sigpipe::kDefault);
  std::atomic<int> calls{0};
  {
    StopSignalThread t([&](int) { calls.fetch_add(1); });
  }
  EXPECT_EQ(calls.load(), 0);
  EXPECT_EQ(WaitForStopSignal(absl::Milliseconds(10)), 0);
}

TEST(StopSignalsDeathTest, DieOfSignalEndsTheProcessByTheSignal) {
  BlockStopSignals(Sigpipe::kDefault);
  EXPECT_EXIT(DieOfSignal(SIGTERM), testing::KilledBySignal(SIGTERM), "");
}

}  // namespace
}  // namespace ss
