// A call from a stream to a host thread through mapped pinned memory (the doorbell of the routed
// experts' host path, gpu_worker/cuda/host_call_server.h): instead of copies plus a
// cudaLaunchHostFunc node, whose wake-up goes through the driver's callback thread, one kernel
// writes the call's inputs into pinned host memory and rings a flag that a spinning host thread
// watches, and a second kernel waits for the thread's answer flag and reads the result back.
// Contract: README.md.
//
// Flags are 32-bit sequence numbers in pinned host memory (cudaMallocHost; with unified
// addressing the device uses the host pointer): the host writes the step's number into `seq`
// before launching; HostCallPublish sets `*req = *seq` once its copies are visible to the host
// (system-scope release), and HostCallAwait returns once `*done == *seq` (system-scope acquire),
// so a captured graph replays with whatever number the host set for the step.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ss::cuda {

// Most copies one publish makes.
inline constexpr int kHostCallMaxSegments = 4;
// Most bytes HostCallAwait copies back itself; a larger result is copied by the caller after it
// (cudaMemcpyAsync: the copy engine beats the kernel's reads of host memory there).
inline constexpr int64_t kHostCallAwaitCopyMax = int64_t{1} << 20;

struct HostCallSegment {
  const void* src = nullptr;  // device memory
  void* dst = nullptr;        // pinned host memory
  int64_t bytes = 0;          // moved 16 bytes at a time where src and dst are 16-byte aligned
};

// Copies every segment to the host, then sets *req = *seq, visible to the host after the copies.
// `arrivals` is a device counter (one unsigned, zero before the first call; the kernel leaves it
// zero) that elects the last block to ring. Fixed launch size from the segments' sizes: safe
// under graph capture.
struct HostCallPublishParams {
  HostCallSegment segments[kHostCallMaxSegments];
  int n_segments = 0;
  const uint32_t* seq = nullptr;  // pinned host
  uint32_t* req = nullptr;        // pinned host
  unsigned* arrivals = nullptr;   // device
};
cudaError_t HostCallPublish(const HostCallPublishParams& p, cudaStream_t stream);

// Waits until *done == *seq (polling host memory, sleeping ~0.5 us between reads), then copies
// `bytes` (<= kHostCallAwaitCopyMax) from the pinned host `src` to the device `dst`. If the
// answer takes longer than `timeout_ns`, sets *timed_out = 1 (pinned host) and returns without
// copying, so a host thread that never answers fails the step instead of hanging the GPU.
struct HostCallAwaitParams {
  const uint32_t* seq = nullptr;   // pinned host
  const uint32_t* done = nullptr;  // pinned host
  const void* src = nullptr;       // pinned host, 16-byte aligned
  void* dst = nullptr;             // device, 16-byte aligned
  int64_t bytes = 0;
  uint64_t timeout_ns = 0;
  uint32_t* timed_out = nullptr;  // pinned host
};
cudaError_t HostCallAwait(const HostCallAwaitParams& p, cudaStream_t stream);

const void* HostCallPublishKernel();
const void* HostCallAwaitKernel();

}  // namespace ss::cuda
