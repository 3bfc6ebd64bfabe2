// Stage-to-stage stream transfer (gpu_worker/stage_transfer.h) over loopback gRPC, as splitserve
// runs it between pipeline stages on one machine: a StreamSender pushing into a GpuWorkerServer's
// inbox, a receiver thread waiting in StreamInbox::Take as the stage runner does. No GPU needed.
//
//   build/bin/stage_push_bench [iterations per size, default 200]
//
// For micro-batches of 1, 8, 64 and 512 tokens (64 KiB of fp32 streams per token at Flash width
// 4 x 4096), medians over the iterations of:
//   one-way   the sender's call to Push -> Take returning on the receiver's thread
//   push      the sender's Push call (the RPC's round trip)
// for bf16-exact streams (what stages produce; sent as bf16) and for streams that are not (sent
// as fp32), and as the baseline, in the same run, an in-process handoff of the same streams: a
// thread copying them into the inbox (StreamInbox::Put) while the receiver waits in Take.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "common/bf16.h"
#include "gpu_worker/gpu_worker_service.h"
#include "gpu_worker/stage_transfer.h"

namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::max(1, std::atoi(argv[1])) : 200;
  const ss::ClusterCredential credential =
      *ss::ClusterCredential::FromToken(*ss::GenerateClusterToken());
  auto srv = ss::gpu::GpuWorkerServer::Start("127.0.0.1:0", "stage_push_bench", credential);
  if (!srv.ok()) {
    std::fprintf(stderr, "%s\n", srv.status().ToString().c_str());
    return 1;
  }
  ss::gpu::StreamInbox& inbox = (*srv)->inbox();
  ss::gpu::StreamSender sender("127.0.0.1:" + std::to_string((*srv)->port()), credential);
  uint64_t next_id = 1;
  // One transfer: `send` hands micro-batch `id` over; returns {one-way, send call} seconds.
  auto transfer = [&](const std::function<absl::Status(uint64_t)>& send) {
    const uint64_t id = next_id++;
    double got = 0;
    std::thread rx([&] {
      auto r = inbox.Take(id, absl::Now() + absl::Seconds(30));
      got = Now();
      if (!r.ok()) std::fprintf(stderr, "take: %s\n", r.status().ToString().c_str());
    });
    std::this_thread::sleep_for(std::chrono::microseconds(300));  // the receiver is waiting
    const double t0 = Now();
    const absl::Status st = send(id);
    const double t1 = Now();
    rx.join();
    if (!st.ok()) std::fprintf(stderr, "send: %s\n", st.ToString().c_str());
    return std::pair<double, double>(got - t0, t1 - t0);
  };
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  const int64_t width = 4 * 4096;
  std::printf("%5s %9s | %-28s | %-28s | %-14s | %s\n", "rows", "fp32 KiB",
              "gRPC bf16: one-way / push us", "gRPC fp32: one-way / push us", "in-process us",
              "one-way / in-process (bf16, fp32)");
  for (const int rows : {1, 8, 64, 512}) {
    ss::gpu::StageStreamsData exact{rows, width, std::vector<float>(rows * width), {}};
    for (float& v : exact.streams) v = ss::RoundBf16(nd(rng));
    ss::gpu::StageStreamsData inexact = exact;
    for (float& v : inexact.streams) v = nd(rng);  // not bf16-exact: sent as fp32
    const int reps = rows >= 512 ? std::max(5, iters / 20) : iters;
    std::vector<double> bo, bp, fo, fp, lo;
    for (int i = 0; i < reps + 3; ++i) {
      const auto b = transfer(
          [&](uint64_t id) { return sender.Push(id, exact, absl::Now() + absl::Seconds(30)); });
      const auto f = transfer(
          [&](uint64_t id) { return sender.Push(id, inexact, absl::Now() + absl::Seconds(30)); });
      const auto l = transfer([&](uint64_t id) { return inbox.Put(id, exact); });
      if (i < 3) continue;  // warm-up
      bo.push_back(b.first);
      bp.push_back(b.second);
      fo.push_back(f.first);
      fp.push_back(f.second);
      lo.push_back(l.first);
    }
    const double mb = Median(bo), mf = Median(fo), ml = Median(lo);
    std::printf("%5d %9.0f | %12.1f / %12.1f | %12.1f / %12.1f | %14.1f | %.1f, %.1f\n", rows,
                rows * width * 4 / 1024.0, mb * 1e6, Median(bp) * 1e6, mf * 1e6, Median(fp) * 1e6,
                ml * 1e6, mb / ml, mf / ml);
  }
  (*srv)->Shutdown();
  return 0;
}
