// Per-call cost of the expert worker's thread pool (common/thread_pool.h): one
// ParallelFor over `size` empty tasks, (hot) back to back while the workers still spin, and
// (cold) after an idle gap longer than the spin window, when every worker sleeps on its futex.
// Baselines measured in the same run: an empty call through a function pointer, and one
// std::thread create + join (what a pool saves).
//
//   build/bin/thread_pool_bench [--threads N] [--calls N] [--spin_us US] [--pin 0|1]
// Prints one line per figure and, last, name=value pairs.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common/thread_pool.h"
#include "cpu_expert_worker/numa.h"

namespace {

using Clock = std::chrono::steady_clock;

double NsSince(Clock::time_point t) {
  return std::chrono::duration<double, std::nano>(Clock::now() - t).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

__attribute__((noinline)) void Empty(int64_t) { asm volatile(""); }
void (*volatile g_fn)(int64_t) = &Empty;

}  // namespace

int main(int argc, char** argv) {
  int threads = 0, calls = 20000, spin_us = 200, pin = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const int v = std::atoi(argv[i + 1]);
    if (a == "--threads")
      threads = v;
    else if (a == "--calls")
      calls = v;
    else if (a == "--spin_us")
      spin_us = v;
    else if (a == "--pin")
      pin = v;
    else {
      std::fprintf(stderr, "unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  auto topo = ss::NumaTopology::Discover();
  if (!topo.ok()) {
    std::fprintf(stderr, "%s\n", std::string(topo.status().message()).c_str());
    return 1;
  }
  const std::vector<int>& cores = (*topo)->FindNode(*(*topo)->ResolveNode(-1))->core_cpus;
  if (threads <= 0) threads = static_cast<int>(cores.size());
  ss::ThreadPoolOptions o;
  o.num_threads = threads;
  o.spin_us = spin_us;
  if (pin && threads <= static_cast<int>(cores.size()))
    o.cpus.assign(cores.begin(), cores.begin() + threads);
  auto pool = ss::ThreadPool::Create(o);
  if (!pool.ok()) {
    std::fprintf(stderr, "%s\n", std::string(pool.status().message()).c_str());
    return 1;
  }
  const bool pinned = (*pool)->PinCallingThread() && (*pool)->workers_pinned() && !o.cpus.empty();

  // Baselines.
  const int64_t kEmptyCalls = 10000000;
  auto t0 = Clock::now();
  for (int64_t i = 0; i < kEmptyCalls; ++i) g_fn(i);
  const double empty_ns = NsSince(t0) / kEmptyCalls;
  std::vector<double> spawn;
  for (int i = 0; i < 500; ++i) {
    t0 = Clock::now();
    std::thread([] { Empty(0); }).join();
    spawn.push_back(NsSince(t0));
  }
  const double spawn_ns = Median(spawn);

  // Hot: back-to-back calls.
  std::vector<double> hot;
  const int64_t n = threads;
  for (int i = 0; i < calls; ++i) {
    t0 = Clock::now();
    (void)(*pool)->ParallelFor(n, [](int64_t j, int) { Empty(j); });
    hot.push_back(NsSince(t0));
  }
  // Cold: every worker asleep (idle gap = spin window + 1 ms).
  std::vector<double> cold;
  for (int i = 0; i < std::min(calls, 500); ++i) {
    std::this_thread::sleep_for(std::chrono::microseconds(spin_us + 1000));
    t0 = Clock::now();
    (void)(*pool)->ParallelFor(n, [](int64_t j, int) { Empty(j); });
    cold.push_back(NsSince(t0));
  }
  const double hot_ns = Median(hot), cold_ns = Median(cold);
  std::printf("pool: %d threads (%s), spin %d us\n", threads, pinned ? "pinned" : "unpinned",
              spin_us);
  std::printf("baseline empty call: %.2f ns; std::thread create+join: %.1f us (median)\n", empty_ns,
              spawn_ns / 1e3);
  std::printf(
      "ParallelFor(%ld empty tasks), hot (workers spinning): median %.2f us, p99 %.2f us"
      " = %.4f x thread create+join\n",
      static_cast<long>(n), hot_ns / 1e3, Percentile(hot, 0.99) / 1e3, hot_ns / spawn_ns);
  std::printf(
      "ParallelFor(%ld empty tasks), cold (workers asleep): median %.2f us, p99 %.2f us"
      " = %.4f x thread create+join\n",
      static_cast<long>(n), cold_ns / 1e3, Percentile(cold, 0.99) / 1e3, cold_ns / spawn_ns);
  std::printf(
      "threads=%d pinned=%d empty_call_ns=%.2f spawn_join_us=%.2f hot_us=%.3f cold_us=%.3f "
      "hot_vs_spawn=%.4f cold_vs_spawn=%.4f hot_vs_empty_call=%.0f\n",
      threads, pinned ? 1 : 0, empty_ns, spawn_ns / 1e3, hot_ns / 1e3, cold_ns / 1e3,
      hot_ns / spawn_ns, cold_ns / spawn_ns, hot_ns / empty_ns);
  return 0;
}
