#include <cuda/atomic>

#include "gpu_worker/kernels/host_call.h"

namespace ss::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxPublishBlocks = 32;  // PCIe writes: a few SMs saturate the link
constexpr int kAwaitBlocks = 16;       // the result's reads of host memory, spread over SMs
constexpr unsigned kPollSleepNs = 500;

// A flag in pinned host memory, read or written at system scope.
__device__ __forceinline__ ::cuda::atomic_ref<uint32_t, ::cuda::thread_scope_system> HostFlag(
    const uint32_t* f) {
  return ::cuda::atomic_ref<uint32_t, ::cuda::thread_scope_system>(*const_cast<uint32_t*>(f));
}

struct PublishArgs {
  HostCallSegment seg[kHostCallMaxSegments];
  int n;
  const uint32_t* seq;
  uint32_t* req;
  unsigned* arrivals;
};

// Copies the segment with this grid: 16-byte moves where both ends are 16-byte aligned, else bytes
// (the small segments: ids and weights).
__device__ void GridCopy(const HostCallSegment& s) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool aligned =
      ((reinterpret_cast<uintptr_t>(s.src) | reinterpret_cast<uintptr_t>(s.dst)) & 15) == 0;
  const int64_t vec = aligned ? s.bytes / 16 : 0;
  const auto* src = static_cast<const uint4*>(s.src);
  auto* dst = static_cast<uint4*>(s.dst);
  for (int64_t i = first; i < vec; i += stride) dst[i] = src[i];
  const auto* sb = static_cast<const uint8_t*>(s.src);
  auto* db = static_cast<uint8_t*>(s.dst);
  for (int64_t i = vec * 16 + first; i < s.bytes; i += stride) db[i] = sb[i];
}

__global__ void __launch_bounds__(kThreads) HostCallPublishKernelImpl(const PublishArgs a) {
  for (int i = 0; i < a.n; ++i) GridCopy(a.seg[i]);
  // Each thread's stores to host memory before the block counts itself; the last block rings.
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x == 0) {
    ::cuda::atomic_ref<unsigned, ::cuda::thread_scope_device> count(*a.arrivals);
    if (count.fetch_add(1u, ::cuda::memory_order_acq_rel) == gridDim.x - 1) {
      count.store(0u, ::cuda::memory_order_relaxed);
      __threadfence_system();
      const uint32_t seq = HostFlag(a.seq).load(::cuda::memory_order_relaxed);
      HostFlag(a.req).store(seq, ::cuda::memory_order_release);
    }
  }
}

__device__ __forceinline__ uint64_t GlobalTimerNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void __launch_bounds__(kThreads) HostCallAwaitKernelImpl(const HostCallAwaitParams p) {
  __shared__ bool answered;
  if (threadIdx.x == 0) {
    const uint32_t seq = HostFlag(p.seq).load(::cuda::memory_order_relaxed);
    const auto done = HostFlag(p.done);
    const uint64_t t0 = GlobalTimerNs();
    answered = true;
    while (done.load(::cuda::memory_order_acquire) != seq) {
      if (GlobalTimerNs() - t0 > p.timeout_ns) {
        answered = false;
        HostFlag(p.timed_out).store(1u, ::cuda::memory_order_relaxed);
        break;
      }
      __nanosleep(kPollSleepNs);
    }
  }
  __syncthreads();
  if (!answered) return;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t vec = p.bytes / 16;
  // Plain loads after the acquire above: they read what the host wrote before its release.
  const auto* src = static_cast<const uint4*>(p.src);
  auto* dst = static_cast<uint4*>(p.dst);
  for (int64_t i = first; i < vec; i += stride) dst[i] = __ldcv(src + i);
  const auto* sb = static_cast<const uint8_t*>(p.src);
  auto* db = static_cast<uint8_t*>(p.dst);
  for (int64_t i = vec * 16 + first; i < p.bytes; i += stride) db[i] = sb[i];
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

cudaError_t HostCallPublish(const HostCallPublishParams& p, cudaStream_t stream) {
  if (p.n_segments < 0 || p.n_segments > kHostCallMaxSegments || p.seq == nullptr ||
      p.req == nullptr || p.arrivals == nullptr) {
    return cudaErrorInvalidValue;
  }
  PublishArgs a{};
  int64_t most = 0;
  for (int i = 0; i < p.n_segments; ++i) {
    const HostCallSegment& s = p.segments[i];
    if (s.bytes < 0 || (s.bytes > 0 && (s.src == nullptr || s.dst == nullptr))) {
      return cudaErrorInvalidValue;
    }
    a.seg[i] = s;
    most = s.bytes > most ? s.bytes : most;
  }
  a.n = p.n_segments;
  a.seq = p.seq;
  a.req = p.req;
  a.arrivals = p.arrivals;
  const int64_t blocks = (most / 16 + kThreads - 1) / kThreads;
  HostCallPublishKernelImpl<<<
      static_cast<unsigned>(blocks < 1 ? 1
                                       : (blocks < kMaxPublishBlocks ? blocks : kMaxPublishBlocks)),
      kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

cudaError_t HostCallAwait(const HostCallAwaitParams& p, cudaStream_t stream) {
  if (p.seq == nullptr || p.done == nullptr || p.timed_out == nullptr || p.bytes < 0 ||
      p.bytes > kHostCallAwaitCopyMax ||
      (p.bytes > 0 &&
       (p.src == nullptr || p.dst == nullptr || !Aligned16(p.src) || !Aligned16(p.dst)))) {
    return cudaErrorInvalidValue;
  }
  const int64_t blocks = (p.bytes / 16 + kThreads - 1) / kThreads;
  HostCallAwaitKernelImpl<<<static_cast<unsigned>(
                                blocks < 1 ? 1 : (blocks < kAwaitBlocks ? blocks : kAwaitBlocks)),
                            kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

const void* HostCallPublishKernel() {
  return reinterpret_cast<const void*>(HostCallPublishKernelImpl);
}
const void* HostCallAwaitKernel() { return reinterpret_cast<const void*>(HostCallAwaitKernelImpl); }

}  // namespace ss::cuda
