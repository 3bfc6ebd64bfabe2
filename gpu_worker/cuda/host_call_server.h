// The host half of the stream-to-host doorbell (gpu_worker/kernels/host_call.h): one thread that
// serves a step's host calls in order, each as soon as its HostCallPublish rings, and answers
// through the flag its HostCallAwait watches. It replaces a cudaLaunchHostFunc node per call
// whose wake-up goes through the driver's callback thread, by a thread that spins on a flag in
// pinned memory while a step runs (busy for the first 2 ms of a wait, then polling every 50 us,
// every 1 ms after 100 ms and every 10 ms after 1 s) and sleeps between steps.
//
// Flags (pinned host memory, fixed addresses for the object's life, so graphs may hold them): the
// step's sequence number seq(), and per call i < max_calls a request req(i) and an answer
// done(i); a device-side timeout sets timed_out().
//
// A step: Arm(n) before its launch (a fresh sequence number, the flags of calls [0, n) cleared);
// the thread then waits for the first call i with req(i) == seq, runs serve(i), sets done(i) =
// seq, and goes on from i + 1 (a step may skip calls: a layer whose experts stream never rings;
// the calls of a step are enqueued in order on one stream, each publish after the previous await,
// so they ring one at a time and in order). A step whose launch failed part-way leaves the thread
// waiting for a request that never rings: the next Arm abandons it. serve(i) must return (its
// own deadlines bound it).
//
// Threading: Arm and timed_out from the step's thread, one step at a time, never while a step's
// kernels may still run; serve runs on the server's thread. Destruction stops the thread (after
// the running serve returns) and must not overlap a step.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ss::gpu::cuda_backend_internal {

class HostCallServer {
 public:
  static absl::StatusOr<std::unique_ptr<HostCallServer>> Create(int max_calls,
                                                                std::function<void(int)> serve);
  ~HostCallServer();
  HostCallServer(const HostCallServer&) = delete;
  HostCallServer& operator=(const HostCallServer&) = delete;

  // InvalidArgument for n outside [0, max_calls].
  absl::Status Arm(int n);
  // After the step's final wait: whether a HostCallAwait of it gave up waiting.
  bool timed_out() const;

  const uint32_t* seq() const { return Flag(kSeq); }
  uint32_t* req(int i) const { return Flag(kFirstCall + 2 * i); }
  const uint32_t* done(int i) const { return DoneFlag(i); }
  uint32_t* timed_out_flag() const { return Flag(kTimedOut); }
  int max_calls() const { return max_calls_; }

 private:
  enum : int { kSeq = 0, kTimedOut = 1, kFirstCall = 2 };
  HostCallServer(int max_calls, std::function<void(int)> serve, uint32_t* flags);
  uint32_t* Flag(int k) const { return flags_ + static_cast<int64_t>(k) * kFlagStride; }
  uint32_t* DoneFlag(int i) const { return Flag(kFirstCall + 2 * i + 1); }
  void Loop();
  // The first call i in [next, n) with req(i) == seq, once one rings; −1 when the step was
  // abandoned (a newer Arm) or the server stops.
  int WaitRing(int next, int n, uint32_t seq, uint64_t generation) const;

  static constexpr int kFlagStride = 16;  // one 64-byte line a flag
  const int max_calls_;
  const std::function<void(int)> serve_;
  uint32_t* const flags_;  // cudaMallocHost
  uint32_t next_seq_ = 0;

  std::mutex mu_;
  std::condition_variable cv_;
  int armed_n_ = 0;                      // under mu_
  uint32_t armed_seq_ = 0;               // under mu_
  std::atomic<uint64_t> generation_{0};  // Arm's count
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace ss::gpu::cuda_backend_internal
