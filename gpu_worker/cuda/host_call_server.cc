#include "gpu_worker/cuda/host_call_server.h"

#include <cuda_runtime.h>
#include <immintrin.h>

#include <chrono>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "gpu_worker/cuda_status.h"

namespace ss::gpu::cuda_backend_internal {
namespace {

// A wait for a call's ring: busy for kSpinFor, then sleeps that grow with the wait.
constexpr auto kSpinFor = std::chrono::milliseconds(2);
constexpr auto kShortSleepsFor = std::chrono::milliseconds(100);
constexpr auto kShortSleep = std::chrono::microseconds(50);
constexpr auto kMediumSleepsFor = std::chrono::seconds(1);
constexpr auto kMediumSleep = std::chrono::milliseconds(1);
constexpr auto kLongSleep = std::chrono::milliseconds(10);

uint32_t Load(const uint32_t* f) {
  return std::atomic_ref<uint32_t>(*const_cast<uint32_t*>(f)).load(std::memory_order_acquire);
}
void Store(uint32_t* f, uint32_t v) {
  std::atomic_ref<uint32_t>(*f).store(v, std::memory_order_release);
}

}  // namespace

absl::StatusOr<std::unique_ptr<HostCallServer>> HostCallServer::Create(
    int max_calls, std::function<void(int)> serve) {
  if (max_calls < 1) return absl::InvalidArgumentError("host call server: max_calls must be >= 1");
  void* p = nullptr;
  const size_t bytes = static_cast<size_t>(kFirstCall + 2 * max_calls) * kFlagStride * 4;
  CUDA_RETURN_IF_ERROR(cudaMallocHost(&p, bytes));
  std::memset(p, 0, bytes);
  return std::unique_ptr<HostCallServer>(
      new HostCallServer(max_calls, std::move(serve), static_cast<uint32_t*>(p)));
}

HostCallServer::HostCallServer(int max_calls, std::function<void(int)> serve, uint32_t* flags)
    : max_calls_(max_calls), serve_(std::move(serve)), flags_(flags) {
  thread_ = std::thread([this] { Loop(); });
}

HostCallServer::~HostCallServer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true);
  }
  cv_.notify_all();
  thread_.join();
  cudaFreeHost(flags_);
}

absl::Status HostCallServer::Arm(int n) {
  if (n < 0 || n > max_calls_) {
    return absl::InvalidArgumentError(
        absl::StrCat("host call server: ", n, " calls in a step, at most ", max_calls_));
  }
  if (++next_seq_ == 0) next_seq_ = 1;  // 0 is every flag's cleared value
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (int i = 0; i < n; ++i) {
      Store(req(i), 0);
      Store(DoneFlag(i), 0);
    }
    Store(timed_out_flag(), 0);
    Store(Flag(kSeq), next_seq_);
    armed_n_ = n;
    armed_seq_ = next_seq_;
    generation_.fetch_add(1);
  }
  cv_.notify_all();
  return absl::OkStatus();
}

bool HostCallServer::timed_out() const { return Load(Flag(kTimedOut)) != 0; }

int HostCallServer::WaitRing(int next, int n, uint32_t seq, uint64_t generation) const {
  const auto t0 = std::chrono::steady_clock::now();
  auto waited = std::chrono::steady_clock::duration::zero();
  for (uint64_t polls = 1;; ++polls) {
    for (int i = next; i < n; ++i) {
      if (Load(req(i)) == seq) return i;
    }
    if (generation_.load(std::memory_order_relaxed) != generation || stop_.load()) return -1;
    if (waited < kSpinFor) {
      _mm_pause();
      if (polls % 256 == 0) waited = std::chrono::steady_clock::now() - t0;
      continue;
    }
    // Longer waits poll less often: a prefill chunk's layers ring tens of ms apart, and a step
    // whose last calls never ring (their layers streamed) waits here until the next Arm.
    std::this_thread::sleep_for(waited < kShortSleepsFor    ? kShortSleep
                                : waited < kMediumSleepsFor ? kMediumSleep
                                                            : kLongSleep);
    waited = std::chrono::steady_clock::now() - t0;
  }
}

void HostCallServer::Loop() {
  uint64_t served = 0;
  for (;;) {
    int n = 0;
    uint32_t seq = 0;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_.load() || generation_.load() != served; });
      if (stop_.load()) return;
      served = generation_.load();
      n = armed_n_;
      seq = armed_seq_;
    }
    for (int next = 0; next < n;) {
      const int i = WaitRing(next, n, seq, served);
      if (i < 0) break;
      serve_(i);
      Store(DoneFlag(i), seq);
      next = i + 1;
    }
  }
}

}  // namespace ss::gpu::cuda_backend_internal
