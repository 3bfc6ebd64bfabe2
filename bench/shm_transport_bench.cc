// Round-trip latency of an empty expert call over the shared-memory transport (T = 1,
// dim 4096, top-6: 8 KB of x in, 16 KB of fp32 out, a handler that does nothing), p50 and p99,
// as ratios to a baseline measured in the same run: a futex ping-pong between two threads of
// this process (one 32-bit word, FUTEX_WAIT / FUTEX_WAKE, no spinning, no payload). A pipe
// ping-pong (one byte each way) is shown as a second reference.
//
// The transport runs with its default spin (client and server busy-poll 20 us before sleeping)
// and with spin 0 (pure futex sleep and wake on both sides: the path comparable to the
// baseline, and the one a real call takes when the experts run longer than the spin), with the
// server in a thread of this process and in a forked child process (the deployment).
//
// All cases are alive at once and measured in interleaved blocks of --block calls, round-robin,
// so a shared, noisy machine shifts them together rather than biasing one case.
//
//   build/bin/shm_transport_bench [--calls N] [--block B] [--tokens T]
//
// The last line is `name=value` pairs.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "bench/expert_bench_lib.h"
#include "cpu_expert_worker/transport/shm_client.h"
#include "cpu_expert_worker/transport/shm_protocol.h"
#include "cpu_expert_worker/transport/shm_server.h"

namespace {

using Clock = std::chrono::steady_clock;
using namespace ss::expert::shm;

constexpr int kDim = 4096, kTopK = 6;

// A connected client (the server may still be starting in another process); exits on failure.
ss::bench::ShmCaller Caller(const std::string& name, absl::Duration spin, int tokens) {
  ShmClientOptions o;
  o.spin = spin;
  auto c = ss::bench::ConnectShm(name, o, absl::Seconds(5));
  if (!c.ok()) {
    std::fprintf(stderr, "cannot connect to %s: %s\n", name.c_str(), c.status().ToString().c_str());
    std::exit(1);
  }
  return ss::bench::ShmCaller(std::move(*c), tokens, kDim, kTopK);
}

void RoundTrip(ss::bench::ShmCaller& caller) {
  const absl::Status s = caller.RoundTrip();
  if (!s.ok()) {
    std::fprintf(stderr, "call failed: %s\n", s.ToString().c_str());
    std::exit(1);
  }
}

// A thread that answers pings on a futex word: 1 → 2.
class FutexEcho {
 public:
  FutexEcho()
      : echo_([this] {
          auto w = std::atomic_ref<uint32_t>(word_);
          while (!done_.load()) {
            const uint32_t v = w.load();
            if (v == 1) {
              w.store(2);
              internal::FutexWake(&word_, 1);
            } else {
              internal::FutexWait(&word_, v, 10'000'000);  // sleeps until the next ping
            }
          }
        }) {}
  ~FutexEcho() {
    done_.store(true);
    std::atomic_ref<uint32_t>(word_).store(1);
    internal::FutexWake(&word_, 1);
    echo_.join();
  }
  void RoundTrip() {
    auto w = std::atomic_ref<uint32_t>(word_);
    w.store(1);
    internal::FutexWake(&word_, 1);
    uint32_t v;
    while ((v = w.load()) != 2) internal::FutexWait(&word_, v, 10'000'000);
    w.store(0);
  }

 private:
  alignas(64) uint32_t word_ = 0;
  std::atomic<bool> done_{false};
  std::thread echo_;
};

// A thread that echoes bytes through two pipes.
class PipeEcho {
 public:
  PipeEcho() {
    if (::pipe(ab_) != 0 || ::pipe(ba_) != 0) std::abort();
    echo_ = std::thread([this] {
      char c;
      while (::read(ab_[0], &c, 1) == 1 && c != 'q') {
        if (::write(ba_[1], &c, 1) != 1) break;
      }
    });
  }
  ~PipeEcho() {
    const char q = 'q';
    if (::write(ab_[1], &q, 1) != 1) std::abort();
    echo_.join();
    for (int fd : {ab_[0], ab_[1], ba_[0], ba_[1]}) ::close(fd);
  }
  void RoundTrip() {
    char c = 'x';
    if (::write(ab_[1], &c, 1) != 1 || ::read(ba_[0], &c, 1) != 1) std::abort();
  }

 private:
  int ab_[2], ba_[2];
  std::thread echo_;
};

struct Case {
  const char* name;
  std::function<void()> round_trip;
  std::vector<double> us;
  double p50 = 0, p99 = 0;
};

ShmServer* g_child_servers[2] = {nullptr, nullptr};

}  // namespace

int main(int argc, char** argv) {
  int calls = 20000, block = 200, tokens = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--calls")) {
      calls = std::atoi(argv[i + 1]);
    } else if (!std::strcmp(argv[i], "--block")) {
      block = std::atoi(argv[i + 1]);
    } else if (!std::strcmp(argv[i], "--tokens")) {
      tokens = std::atoi(argv[i + 1]);
    } else {
      std::fprintf(stderr, "usage: %s [--calls N] [--block B] [--tokens T]\n", argv[0]);
      return 2;
    }
  }
  if (calls < 100 || block < 1 || tokens < 1) return 2;
  const std::string base = "ss-shm-bench-" + std::to_string(::getpid());
  const absl::Duration spin = ShmServerOptions{}.spin;
  const absl::Duration no_spin = absl::ZeroDuration();

  // The cross-process servers first, while this process has one thread.
  const pid_t child = ::fork();
  if (child == 0) {
    auto a = ShmServer::Create(ss::bench::EmptyServerOptions(base + "-p-spin", spin, tokens),
                               ss::bench::EmptyHandler);
    auto b = ShmServer::Create(ss::bench::EmptyServerOptions(base + "-p-nospin", no_spin, tokens),
                               ss::bench::EmptyHandler);
    if (!a.ok() || !b.ok()) ::_exit(1);
    g_child_servers[0] = a->get();
    g_child_servers[1] = b->get();
    struct sigaction sa = {};
    sa.sa_handler = [](int) {
      g_child_servers[0]->RequestStop();
      g_child_servers[1]->RequestStop();
    };
    ::sigaction(SIGTERM, &sa, nullptr);
    (*a)->Wait();
    (*b)->Wait();
    ::_exit(0);
  }

  int child_exit = -1;
  std::vector<Case> cases;
  {
    FutexEcho futex;
    PipeEcho pipe;
    auto ts = ShmServer::Create(ss::bench::EmptyServerOptions(base + "-t-spin", spin, tokens),
                                ss::bench::EmptyHandler);
    auto tn = ShmServer::Create(ss::bench::EmptyServerOptions(base + "-t-nospin", no_spin, tokens),
                                ss::bench::EmptyHandler);
    if (!ts.ok() || !tn.ok()) return 1;
    ss::bench::ShmCaller thread_spin = Caller(base + "-t-spin", spin, tokens);
    ss::bench::ShmCaller thread_nospin = Caller(base + "-t-nospin", no_spin, tokens);
    ss::bench::ShmCaller proc_spin = Caller(base + "-p-spin", spin, tokens);
    ss::bench::ShmCaller proc_nospin = Caller(base + "-p-nospin", no_spin, tokens);
    cases.push_back({"baseline futex ping-pong", [&] { futex.RoundTrip(); }, {}});
    cases.push_back({"pipe ping-pong", [&] { pipe.RoundTrip(); }, {}});
    cases.push_back({"shm, server thread, spin 20us", [&] { RoundTrip(thread_spin); }, {}});
    cases.push_back({"shm, server thread, spin 0", [&] { RoundTrip(thread_nospin); }, {}});
    cases.push_back({"shm, server process, spin 20us", [&] { RoundTrip(proc_spin); }, {}});
    cases.push_back({"shm, server process, spin 0", [&] { RoundTrip(proc_nospin); }, {}});

    const int rounds = (calls + block - 1) / block;
    for (int r = -1; r < rounds; ++r) {  // round -1 warms up and is not recorded
      for (Case& c : cases) {
        for (int i = 0; i < block; ++i) {
          const auto t0 = Clock::now();
          c.round_trip();
          const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
          if (r >= 0) c.us.push_back(us);
        }
      }
    }
    ::kill(child, SIGTERM);
    int status = 0;
    ::waitpid(child, &status, 0);
    child_exit = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

  for (Case& c : cases) {
    std::sort(c.us.begin(), c.us.end());
    c.p50 = c.us[c.us.size() / 2];
    c.p99 = c.us[c.us.size() * 99 / 100];
  }
  const Case& futex = cases[0];
  std::printf(
      "empty call: T = %d, dim %d, top_k %d; %zu calls per case in blocks of %d "
      "(+1 warm-up block); us\n",
      tokens, kDim, kTopK, futex.us.size(), block);
  std::printf("%-34s %8s %8s %12s %12s\n", "case", "p50", "p99", "p50/futex", "p99/futex");
  for (const Case& c : cases) {
    std::printf("%-34s %8.2f %8.2f %12.2f %12.2f\n", c.name, c.p50, c.p99, c.p50 / futex.p50,
                c.p99 / futex.p99);
  }
  const Case& spin_proc = cases[4];
  const Case& nospin_proc = cases[5];
  std::printf(
      "futex_p50_us=%.2f futex_p99_us=%.2f shm_overhead_us=%.2f shm_p99_us=%.2f "
      "shm_nospin_p50_us=%.2f shm_nospin_p99_us=%.2f ratio_p50=%.2f ratio_p99=%.2f "
      "ratio_nospin_p50=%.2f ratio_nospin_p99=%.2f child_exit=%d\n",
      futex.p50, futex.p99, spin_proc.p50, spin_proc.p99, nospin_proc.p50, nospin_proc.p99,
      spin_proc.p50 / futex.p50, spin_proc.p99 / futex.p99, nospin_proc.p50 / futex.p50,
      nospin_proc.p99 / futex.p99, child_exit);
  return 0;
}
