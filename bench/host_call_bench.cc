// What a layer's routed-experts host call costs on the stream, the host's work left out: a graph
// of 43 layers, each a small device write (the layer's GPU work, a memset) followed by the host
// call of HostRoutedExperts at T rows of a Flash layer (the MoE input bf16 [T, 4096], ids and
// weights [T, 6] to the host, an empty host step, the fp32 sum [T, 4096] back), two ways in the
// same run:
//   host_function: three D2H copies, a cudaLaunchHostFunc node, one H2D copy (the baseline);
//   doorbell:      HostCallPublish, the HostCallServer's thread, HostCallAwait
//                  (gpu_worker/kernels/host_call.h, gpu_worker/cuda/host_call_server.h).
// Prints us per call (graph replay wall time over 43, less nothing) and the ratio.
// Usage: host_call_bench [T ...] (default 1 8)
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "bench/cuda_check.h"
#include "gpu_worker/cuda/device_buffers.h"
#include "gpu_worker/cuda/host_call_server.h"
#include "gpu_worker/kernels/host_call.h"

namespace {

using ss::gpu::cuda_backend_internal::DevBuf;
using ss::gpu::cuda_backend_internal::HostCallServer;
using ss::gpu::cuda_backend_internal::PinnedBuf;

constexpr int kLayers = 43, kDim = 4096, kK = 6, kReplays = 300;

void CUDART_CB EmptyHostStep(void* count) { ++*static_cast<int64_t*>(count); }

struct Buffers {
  DevBuf x, ids, w, sum, work, arrivals;
  PinnedBuf hx, hids, hw, hsum;
  explicit Buffers(int64_t T) {
    for (auto [b, n] : {std::pair{&x, T * kDim * 2},
                        {&ids, T * kK * 4},
                        {&w, T * kK * 4},
                        {&sum, T * kDim * 4},
                        {&work, int64_t{4096}},
                        {&arrivals, int64_t{4}}}) {
      if (!b->Reserve(n).ok()) std::exit(1);
    }
    for (auto [b, n] : {std::pair{&hx, T * kDim * 2},
                        {&hids, T * kK * 4},
                        {&hw, T * kK * 4},
                        {&hsum, T * kDim * 4}}) {
      if (!b->Reserve(n).ok()) std::exit(1);
    }
    CHECK_CUDA(cudaMemset(arrivals.p, 0, 4));
  }
};

// Microseconds per call: the median of kReplays graph replays over kLayers.
template <typename Arm>
double TimeGraph(cudaStream_t st, cudaGraphExec_t exec, const Arm& arm) {
  std::vector<double> us;
  for (int r = 0; r < kReplays + 10; ++r) {
    arm();
    const auto t0 = std::chrono::steady_clock::now();
    CHECK_CUDA(cudaGraphLaunch(exec, st));
    CHECK_CUDA(cudaStreamSynchronize(st));
    const double d =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    if (r >= 10) us.push_back(d / kLayers);
  }
  std::nth_element(us.begin(), us.begin() + us.size() / 2, us.end());
  return us[us.size() / 2];
}

template <typename Enqueue>
cudaGraphExec_t Capture(cudaStream_t st, const Enqueue& enqueue) {
  cudaGraph_t g;
  cudaGraphExec_t exec;
  CHECK_CUDA(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  for (int l = 0; l < kLayers; ++l) enqueue(l);
  CHECK_CUDA(cudaStreamEndCapture(st, &g));
  CHECK_CUDA(cudaGraphInstantiate(&exec, g, 0));
  CHECK_CUDA(cudaGraphDestroy(g));
  return exec;
}

void Run(int64_t T, cudaStream_t st) {
  Buffers b(T);
  int64_t host_steps = 0;
  // The layer's GPU work alone: the floor under both.
  cudaGraphExec_t none =
      Capture(st, [&](int) { CHECK_CUDA(cudaMemsetAsync(b.work.p, 1, 4096, st)); });
  const double floor_us = TimeGraph(st, none, [] {});
  cudaGraphExec_t hf = Capture(st, [&](int) {
    CHECK_CUDA(cudaMemsetAsync(b.work.p, 1, 4096, st));
    CHECK_CUDA(cudaMemcpyAsync(b.hx.p, b.x.p, T * kDim * 2, cudaMemcpyDeviceToHost, st));
    CHECK_CUDA(cudaMemcpyAsync(b.hids.p, b.ids.p, T * kK * 4, cudaMemcpyDeviceToHost, st));
    CHECK_CUDA(cudaMemcpyAsync(b.hw.p, b.w.p, T * kK * 4, cudaMemcpyDeviceToHost, st));
    CHECK_CUDA(cudaLaunchHostFunc(st, EmptyHostStep, &host_steps));
    CHECK_CUDA(cudaMemcpyAsync(b.sum.p, b.hsum.p, T * kDim * 4, cudaMemcpyHostToDevice, st));
  });
  const double hf_us = TimeGraph(st, hf, [] {});
  auto server = HostCallServer::Create(kLayers, [&](int) { ++host_steps; });
  if (!server.ok()) std::exit(1);
  HostCallServer& s = **server;
  cudaGraphExec_t db = Capture(st, [&](int l) {
    CHECK_CUDA(cudaMemsetAsync(b.work.p, 1, 4096, st));
    ss::cuda::HostCallPublishParams p{.segments = {{b.x.p, b.hx.p, T * kDim * 2},
                                                   {b.ids.p, b.hids.p, T * kK * 4},
                                                   {b.w.p, b.hw.p, T * kK * 4}},
                                      .n_segments = 3,
                                      .seq = s.seq(),
                                      .req = s.req(l),
                                      .arrivals = b.arrivals.as<unsigned>()};
    CHECK_CUDA(ss::cuda::HostCallPublish(p, st));
    CHECK_CUDA(ss::cuda::HostCallAwait({.seq = s.seq(),
                                        .done = s.done(l),
                                        .src = b.hsum.p,
                                        .dst = b.sum.p,
                                        .bytes = T * kDim * 4,
                                        .timeout_ns = uint64_t{10} * 1000 * 1000 * 1000,
                                        .timed_out = s.timed_out_flag()},
                                       st));
  });
  const double db_us = TimeGraph(st, db, [&] {
    if (!s.Arm(kLayers).ok()) std::exit(1);
  });
  if (s.timed_out()) {
    std::fprintf(stderr, "doorbell: a call timed out\n");
    std::exit(1);
  }
  std::printf(
      "T=%-3lld  layer's GPU work alone %6.2f us | host_function call %7.2f us | doorbell call "
      "%7.2f us | calls less the GPU work: %.2f vs %.2f us, %.2fx faster\n",
      static_cast<long long>(T), floor_us, hf_us, db_us, hf_us - floor_us, db_us - floor_us,
      (hf_us - floor_us) / std::max(db_us - floor_us, 1e-3));
  std::printf("        host steps run: %lld (expected %d)\n", static_cast<long long>(host_steps),
              2 * kLayers * (kReplays + 10));
  for (cudaGraphExec_t e : {none, hf, db}) CHECK_CUDA(cudaGraphExecDestroy(e));
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> Ts;
  for (int i = 1; i < argc; ++i) Ts.push_back(std::atoll(argv[i]));
  if (Ts.empty()) Ts = {1, 8};
  cudaStream_t st;
  CHECK_CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  std::printf("host call per layer, %d layers a graph, median of %d replays\n", kLayers, kReplays);
  for (int64_t T : Ts) Run(T, st);
  return 0;
}
