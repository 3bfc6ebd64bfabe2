// The stream-to-host doorbell (gpu_worker/kernels/host_call.h with cuda/host_call_server.h): a
// step's calls served in order with their inputs and results intact, also replayed from a
// captured graph with new inputs; a step may skip calls; a step abandoned part-way does not block
// the next one; an unanswered call times out on the device instead of hanging it; the kernels run
// from compute_86 PTX.
#include "gpu_worker/kernels/host_call.h"

#include <atomic>
#include <cstdint>
#include <vector>

#include "gpu_worker/cuda/device_buffers.h"
#include "gpu_worker/cuda/host_call_server.h"
#include "gtest/gtest.h"
#include "tests/gpu_worker/gpu_test_util.h"

namespace ss::cuda {
namespace {

using gpu::cuda_backend_internal::DevBuf;
using gpu::cuda_backend_internal::HostCallServer;
using gpu::cuda_backend_internal::PinnedBuf;
using testing_util::GpuTest;

constexpr uint64_t kLongTimeoutNs = uint64_t{60} * 1000 * 1000 * 1000;

// n calls a step; call i reads `in_bytes` bytes published to `in` and answers `out` with each
// input byte plus i + 1, as int32s (so a wrong call, a stale input or a lost answer shows).
class Doorbell {
 public:
  Doorbell(int n, int64_t in_bytes) : n_(n), in_bytes_(in_bytes) {
    EXPECT_TRUE(in_.Reserve(in_bytes).ok());
    EXPECT_TRUE(out_.Reserve(in_bytes * 4).ok());
    EXPECT_TRUE(arrivals_.Reserve(4).ok());
    EXPECT_EQ(cudaMemset(arrivals_.p, 0, 4), cudaSuccess);
    auto s = HostCallServer::Create(n, [this](int i) {
      for (int64_t b = 0; b < in_bytes_; ++b) out_.as<int32_t>()[b] = in_.as<uint8_t>()[b] + i + 1;
      served_.fetch_add(1);
    });
    EXPECT_TRUE(s.ok()) << s.status();
    server_ = std::move(*s);
  }
  // Call i on `stream`: src (device, in_bytes) to the host, the answer to dst (device, 4x).
  cudaError_t Enqueue(int i, const void* src, void* dst, cudaStream_t stream,
                      uint64_t timeout_ns = kLongTimeoutNs) {
    HostCallPublishParams p{.segments = {{src, in_.p, in_bytes_}},
                            .n_segments = 1,
                            .seq = server_->seq(),
                            .req = server_->req(i),
                            .arrivals = arrivals_.as<unsigned>()};
    cudaError_t e = HostCallPublish(p, stream);
    if (e != cudaSuccess) return e;
    return HostCallAwait({.seq = server_->seq(),
                          .done = server_->done(i),
                          .src = out_.p,
                          .dst = dst,
                          .bytes = in_bytes_ * 4,
                          .timeout_ns = timeout_ns,
                          .timed_out = server_->timed_out_flag()},
                         stream);
  }
  HostCallServer& server() { return *server_; }
  int served() const { return served_.load(); }

 private:
  const int n_;
  const int64_t in_bytes_;
  PinnedBuf in_, out_;
  DevBuf arrivals_;
  std::atomic<int> served_{0};
  std::unique_ptr<HostCallServer> server_;  // stopped first
};

std::vector<uint8_t> Pattern(int64_t n, int salt) {
  std::vector<uint8_t> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>((i * 7 + salt * 13) & 0xff);
  return v;
}

class HostCallTest : public GpuTest {};

TEST_F(HostCallTest, StepsServeEveryCallInOrderAlsoFromAGraph) {
  constexpr int kCalls = 5;
  constexpr int64_t kBytes = 8195;  // not a multiple of 16: the byte tail too
  Doorbell bell(kCalls, kBytes);
  std::vector<std::unique_ptr<testing_util::DeviceBuffer<uint8_t>>> src;
  std::vector<std::unique_ptr<testing_util::DeviceBuffer<int32_t>>> dst;
  for (int i = 0; i < kCalls; ++i) {
    src.push_back(std::make_unique<testing_util::DeviceBuffer<uint8_t>>(kBytes));
    dst.push_back(std::make_unique<testing_util::DeviceBuffer<int32_t>>(kBytes));
  }
  cudaStream_t st;
  CUDA_ASSERT_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  auto enqueue_step = [&] {
    for (int i = 0; i < kCalls; ++i) {
      CUDA_ASSERT_OK(bell.Enqueue(i, src[i]->get(), dst[i]->get(), st));
    }
  };
  auto check_step = [&](int salt) {
    for (int i = 0; i < kCalls; ++i) {
      const std::vector<uint8_t> in = Pattern(kBytes, salt + i);
      const std::vector<int32_t> out = dst[i]->Get();
      int wrong = 0;
      for (int64_t b = 0; b < kBytes; ++b) wrong += out[b] != in[b] + i + 1 ? 1 : 0;
      EXPECT_EQ(wrong, 0) << "call " << i << " salt " << salt;
    }
  };
  // Launched directly, three steps.
  for (int step = 0; step < 3; ++step) {
    for (int i = 0; i < kCalls; ++i) src[i]->Put(Pattern(kBytes, step * 10 + i));
    ASSERT_TRUE(bell.server().Arm(kCalls).ok());
    enqueue_step();
    CUDA_ASSERT_OK(cudaStreamSynchronize(st));
    EXPECT_FALSE(bell.server().timed_out());
    check_step(step * 10);
  }
  EXPECT_EQ(bell.served(), 3 * kCalls);
  // Captured once, replayed with new inputs each time.
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_ASSERT_OK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  enqueue_step();
  CUDA_ASSERT_OK(cudaStreamEndCapture(st, &graph));
  CUDA_ASSERT_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (int step = 3; step < 6; ++step) {
    for (int i = 0; i < kCalls; ++i) src[i]->Put(Pattern(kBytes, step * 10 + i));
    ASSERT_TRUE(bell.server().Arm(kCalls).ok());
    CUDA_ASSERT_OK(cudaGraphLaunch(exec, st));
    CUDA_ASSERT_OK(cudaStreamSynchronize(st));
    check_step(step * 10);
  }
  EXPECT_EQ(bell.served(), 6 * kCalls);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(st);
}

TEST_F(HostCallTest, AnAbandonedStepDoesNotBlockTheNext) {
  Doorbell bell(3, 64);
  testing_util::DeviceBuffer<uint8_t> src(64);
  testing_util::DeviceBuffer<int32_t> dst(64);
  src.Put(Pattern(64, 1));
  cudaStream_t st;
  CUDA_ASSERT_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  // Armed for 3 calls, only call 0 enqueued (a launch that failed part-way).
  ASSERT_TRUE(bell.server().Arm(3).ok());
  CUDA_ASSERT_OK(bell.Enqueue(0, src.get(), dst.get(), st));
  CUDA_ASSERT_OK(cudaStreamSynchronize(st));
  EXPECT_EQ(bell.served(), 1);
  // The next step's three calls are served.
  ASSERT_TRUE(bell.server().Arm(3).ok());
  for (int i = 0; i < 3; ++i) CUDA_ASSERT_OK(bell.Enqueue(i, src.get(), dst.get(), st));
  CUDA_ASSERT_OK(cudaStreamSynchronize(st));
  EXPECT_EQ(bell.served(), 4);
  EXPECT_EQ(dst.Get()[5], Pattern(64, 1)[5] + 3);
  // A step that skips call 1 (a layer whose experts stream): calls 0 and 2 are served.
  ASSERT_TRUE(bell.server().Arm(3).ok());
  CUDA_ASSERT_OK(bell.Enqueue(0, src.get(), dst.get(), st));
  CUDA_ASSERT_OK(bell.Enqueue(2, src.get(), dst.get(), st));
  CUDA_ASSERT_OK(cudaStreamSynchronize(st));
  EXPECT_EQ(bell.served(), 6);
  EXPECT_FALSE(bell.server().timed_out());
  EXPECT_FALSE(bell.server().Arm(4).ok()) << "more calls than the server was made for";
  cudaStreamDestroy(st);
}

TEST_F(HostCallTest, AnUnansweredCallTimesOutOnTheDevice) {
  Doorbell bell(2, 64);
  testing_util::DeviceBuffer<uint8_t> src(64);
  testing_util::DeviceBuffer<int32_t> dst(64);
  cudaStream_t st;
  CUDA_ASSERT_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  // Armed for one call, enqueued as call 1: nobody answers done(1).
  ASSERT_TRUE(bell.server().Arm(1).ok());
  CUDA_ASSERT_OK(HostCallAwait({.seq = bell.server().seq(),
                                .done = bell.server().done(1),
                                .src = nullptr,
                                .dst = nullptr,
                                .bytes = 0,
                                .timeout_ns = 20 * 1000 * 1000,
                                .timed_out = bell.server().timed_out_flag()},
                               st));
  CUDA_ASSERT_OK(cudaStreamSynchronize(st));
  EXPECT_TRUE(bell.server().timed_out());
  ASSERT_TRUE(bell.server().Arm(1).ok());
  EXPECT_FALSE(bell.server().timed_out()) << "Arm clears it";
  cudaStreamDestroy(st);
}

TEST_F(HostCallTest, RefusesBadArguments) {
  Doorbell bell(1, 64);
  HostCallPublishParams p{.segments = {},
                          .n_segments = 5,
                          .seq = bell.server().seq(),
                          .req = bell.server().req(0),
                          .arrivals = nullptr};
  EXPECT_EQ(HostCallPublish(p, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(HostCallAwait({.seq = bell.server().seq(),
                           .done = bell.server().done(0),
                           .bytes = kHostCallAwaitCopyMax + 16,
                           .timed_out = bell.server().timed_out_flag()},
                          nullptr),
            cudaErrorInvalidValue);
  EXPECT_FALSE(HostCallServer::Create(0, [](int) {}).ok());
}

TEST_F(HostCallTest, KernelsRunFromCompute86Ptx) {
  testing_util::ExpectCompute86Ptx(
      {{"HostCallPublish", HostCallPublishKernel()}, {"HostCallAwait", HostCallAwaitKernel()}});
}

}  // namespace
}  // namespace ss::cuda
