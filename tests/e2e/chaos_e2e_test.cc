// Chaos under load (issue 23, Deliver 6): while two clients send completions without pause, a
// random child of `splitserve up` (coordinator, GPU worker or expert worker) is killed with
// SIGKILL every few seconds for about a minute. Each time the service must recover (a completion
// succeeds again within a bound); every request must end within its timeout, with an answer or an
// error (none hangs); after the stop nothing is left: no process, no segment, no run directory.
// Prints the recovery times (kill -> first successful completion), median and p99, per kind.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/e2e/up_process.h"
#include "tests/test_util.h"

namespace ss {
namespace {

namespace fs = std::filesystem;
using namespace testing_util;  // NOLINT: the up_process.h helpers

constexpr auto kChaosFor = std::chrono::seconds(60);
constexpr auto kRecoveryBound = std::chrono::seconds(30);
constexpr int kRequestTimeoutS = 20;

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())));
  return v[i];
}

std::string KindOf(int pid) {
  const std::vector<std::string> args = Cmdline(pid);
  if (args.empty()) return "";
  for (const char* kind : {"coordinator", "gpu-worker", "expert-worker"}) {
    if (args[0].ends_with(kind)) return kind;
  }
  return "";
}

TEST(ChaosE2eTest, RandomChildKillsUnderLoad) {
  TempDir dir("up_chaos");
  const int port = FreeLoopbackPortBlock();
  const std::string log = dir / "up.log";
  setenv("XDG_RUNTIME_DIR", dir.path().c_str(), 1);
  ChildProcess up({std::string(SS_BIN_DIR) + "/splitserve", "up", "--port", std::to_string(port),
                   "--log-dir", dir / "logs"},
                  log);
  unsetenv("XDG_RUNTIME_DIR");
  const int pid = up.pid();
  ASSERT_TRUE(WaitServing(port, up, log)) << ReadLog(log);

  // The load: every request ends with 200, another status or a transport error; one that has no
  // answer within its timeout is a hang.
  std::atomic<bool> stop{false};
  std::atomic<int> ok{0}, failed{0}, hung{0};
  std::vector<std::thread> clients;
  for (int t = 0; t < 2; ++t) {
    clients.emplace_back([&] {
      while (!stop.load()) {
        const auto start = std::chrono::steady_clock::now();
        const int status = Complete(port, 8, kRequestTimeoutS);
        const auto took = std::chrono::steady_clock::now() - start;
        if (status == 200) {
          ++ok;
        } else if (status < 0 && took >= std::chrono::seconds(kRequestTimeoutS)) {
          ++hung;
        } else {
          ++failed;
          std::this_thread::sleep_for(std::chrono::milliseconds(50));  // refused: no busy loop
        }
      }
    });
  }

  std::mt19937 rng(std::random_device{}());
  std::map<std::string, std::vector<double>> recovery;  // kind -> seconds
  std::set<int> seen;
  int kills = 0;
  const auto chaos_end = std::chrono::steady_clock::now() + kChaosFor;
  while (std::chrono::steady_clock::now() < chaos_end && up.Running()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1000 + rng() % 2000));
    const std::vector<int> children = ChildrenOf(pid);
    seen.insert(children.begin(), children.end());
    ASSERT_FALSE(children.empty());
    const int victim = children[rng() % children.size()];
    const std::string kind = KindOf(victim);
    if (kind.empty()) continue;
    const auto killed = std::chrono::steady_clock::now();
    ASSERT_EQ(kill(victim, SIGKILL), 0);
    ++kills;
    bool back = false;
    while (!back && std::chrono::steady_clock::now() - killed < kRecoveryBound && up.Running()) {
      back = Complete(port, 1, 10) == 200;
      if (!back) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ASSERT_TRUE(back) << "no recovery within " << kRecoveryBound.count() << " s after killing "
                      << kind << " (kill " << kills << ")\n"
                      << ReadLog(log);
    recovery[kind].push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count());
    for (int c : ChildrenOf(pid)) seen.insert(c);
  }
  stop.store(true);
  for (std::thread& t : clients) t.join();

  EXPECT_GE(kills, 10);
  EXPECT_EQ(hung.load(), 0) << "requests without an answer within " << kRequestTimeoutS << " s";
  EXPECT_GT(ok.load(), 0);
  std::vector<double> workers;
  for (const auto& [kind, v] : recovery) {
    if (kind != "coordinator") workers.insert(workers.end(), v.begin(), v.end());
    std::printf("chaos: %zu kills of %s: recovery median %.2f s, p99 %.2f s, max %.2f s\n",
                v.size(), kind.c_str(), Percentile(v, 0.5), Percentile(v, 0.99),
                Percentile(v, 1.0));
  }
  std::printf(
      "chaos: %d kills; worker kills: recovery median %.2f s, p99 %.2f s; requests: %d "
      "ok, %d failed, %d hung\n",
      kills, Percentile(workers, 0.5), Percentile(workers, 0.99), ok.load(), failed.load(),
      hung.load());

  const std::string run_dir = [&] {
    const int coordinator = ChildRunning(pid, "splitserve-coordinator");
    return coordinator < 0
               ? std::string()
               : fs::path(FlagValue(Cmdline(coordinator), "--cluster")).parent_path().string();
  }();
  for (int c : ChildrenOf(pid)) seen.insert(c);
  EXPECT_EQ(up.Stop(), 0) << ReadLog(log);
  EXPECT_TRUE(AllGone({seen.begin(), seen.end()}, std::chrono::seconds(5)));
  EXPECT_TRUE(ShmSegmentsOf(pid).empty());
  EXPECT_FALSE(run_dir.empty());
  EXPECT_FALSE(fs::exists(run_dir)) << run_dir;
}

}  // namespace
}  // namespace ss
