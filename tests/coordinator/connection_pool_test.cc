// The gateway's connection threads (coordinator/connection_pool.h): at most max_threads jobs run
// at once, the rest wait in order; idle threads exit and new ones start on demand; shutdown()
// runs what was queued and joins.
#include "coordinator/connection_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

namespace ss {
namespace {

TEST(ConnectionPoolTest, RunsAtMostMaxThreadsJobsAtOnceAndQueuesTheRest) {
  ConnectionPool pool(3, std::chrono::milliseconds(50));
  std::mutex mu;
  std::condition_variable cv;
  bool release = false;
  std::atomic<int> running{0}, peak{0}, done{0};
  for (int i = 0; i < 8; ++i) {
    pool.enqueue([&] {
      const int now = ++running;
      for (int p = peak.load(); now > p && !peak.compare_exchange_weak(p, now);) {
      }
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return release; });
      --running;
      ++done;
    });
  }
  for (int i = 0; i < 200 && running.load() < 3; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(running.load(), 3);
  {
    std::lock_guard<std::mutex> lock(mu);
    release = true;
  }
  cv.notify_all();
  for (int i = 0; i < 400 && done.load() < 8; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(done.load(), 8);
  EXPECT_EQ(peak.load(), 3);

  // After the threads idled out, new jobs start new ones.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  std::atomic<int> later{0};
  for (int i = 0; i < 4; ++i) pool.enqueue([&] { ++later; });
  pool.shutdown();  // runs the queued jobs, then joins
  EXPECT_EQ(later.load(), 4);
}

}  // namespace
}  // namespace ss
