#include "bench/persistent_layer.h"
#include "bench/stream_read.h"
#include "gpu_worker/kernels/fp8_common.cuh"

namespace ss::bench {
namespace {

constexpr int kThreads = 512, kAhead = 8;

__device__ __forceinline__ uint64_t GlobalNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// One thread busy for ns nanoseconds.
__device__ __forceinline__ void Spin(int64_t ns) {
  const uint64_t t0 = GlobalNs();
  while (GlobalNs() - t0 < static_cast<uint64_t>(ns)) {
  }
}

__global__ void SpinKernelImpl(int64_t ns) {
  if (threadIdx.x == 0) Spin(ns);
}

// Grid barrier number `round` (1, 2, ...): fence, arrival, spin on the count (as sync_cost.cu's).
__device__ __forceinline__ void GridBarrier(uint32_t* counter, uint32_t round) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(counter, 1u);
    const uint32_t target = round * gridDim.x;
    while (*reinterpret_cast<volatile uint32_t*>(counter) < target) {
    }
    __threadfence();
  }
  __syncthreads();
}

__device__ __forceinline__ uint32_t Xor(const uint4& v) { return v.x ^ v.y ^ v.z ^ v.w; }

// Block b's share of phase p: chunks b, b + blocks, b + 2·blocks, ... of kThreads 16-byte units
// (as a grid-strided loop takes them, so that the blocks read neighbouring bytes at a time), n
// units in all; its k-th unit is the phase's unit Unit(k).
__device__ __forceinline__ int64_t ShareUnits(const LayerPlan& plan, int p) {
  const int64_t units = plan.bytes[p] / 16, full = units / kThreads, nb = gridDim.x;
  const int64_t b = blockIdx.x;
  int64_t n = full > b ? (full - b + nb - 1) / nb * kThreads : 0;
  if (full % nb == b) n += units % kThreads;
  return n;
}
__device__ __forceinline__ int64_t Unit(int64_t k) {
  return (k / kThreads * gridDim.x + blockIdx.x) * kThreads + k % kThreads;
}

__global__ void __launch_bounds__(kThreads, 1)
    LayerPersistentKernelImpl(const uint4* __restrict__ w, LayerPlan plan, int64_t spin_ns,
                              int64_t ring_units, uint32_t* barrier, uint32_t* sink) {
  extern __shared__ uint4 ring[];
  const int tid = static_cast<int>(threadIdx.x);
  int64_t base[LayerPlan::kMaxPhases];
  int64_t at = 0;
  for (int p = 0; p < plan.n; ++p) {
    base[p] = at;
    at += plan.bytes[p] / 16;
  }
  // The ring (block-uniform state): units issued and consumed in all; the next unit to prefetch
  // is unit pf_off of this block's share of phase pf_phase.
  int64_t issued = 0, consumed = 0, pf_off = 0;
  int pf_phase = 0;
  const auto prefetch = [&] {
    while (ring_units > 0 && pf_phase < plan.n && issued - consumed < ring_units) {
      const int64_t n = ShareUnits(plan, pf_phase);
      const int64_t room = ring_units - (issued - consumed);
      const int64_t take = n - pf_off < room ? n - pf_off : room;
      const uint4* src = w + base[pf_phase];
      // 32-bit indices (a ring holds < 2^14 units): issuing ~14K copies a block is on the
      // latency-bound steps' time. Warp 0 stays free for the latency-bound work (block 0's
      // spin): it issues no copies.
      const uint32_t head = static_cast<uint32_t>(issued % ring_units);
      const uint32_t units = static_cast<uint32_t>(ring_units), n32 = static_cast<uint32_t>(take);
      for (uint32_t i = static_cast<uint32_t>(tid) - 32; tid >= 32 && i < n32; i += kThreads - 32) {
        const uint32_t slot = head + i;
        ss::cuda::CpAsync16(ring + (slot < units ? slot : slot - units), src + Unit(pf_off + i));
      }
      ss::cuda::CpAsyncCommit();
      issued += take;
      pf_off += take;
      if (pf_off < n) break;
      ++pf_phase;
      pf_off = 0;
    }
  };
  uint32_t x = 0, round = 0;
  for (int p = 0; p < plan.n; ++p) {
    for (int s = 0; s < plan.spins[p]; ++s) {  // the latency-bound steps
      prefetch();
      if (blockIdx.x == 0 && tid == 0) Spin(spin_ns);
      GridBarrier(barrier, ++round);
    }
    if (plan.bytes[p] == 0) continue;
    const int64_t n = ShareUnits(plan, p);
    // The prefetched head of the share from the ring, the rest from memory.
    const int64_t pref = pf_phase > p ? n : pf_phase == p ? pf_off : 0;
    if (pf_phase == p) {
      pf_phase = p + 1;
      pf_off = 0;
    }
    // The rest from memory first (kAhead loads a thread in flight), then the ring's part, which
    // has landed meanwhile if it was not already there.
    const uint4* src = w + base[p];
    int64_t i = pref + tid;
    for (; i + (kAhead - 1) * kThreads < n; i += kAhead * kThreads) {
      uint4 v[kAhead];
#pragma unroll
      for (int j = 0; j < kAhead; ++j) v[j] = __ldcs(src + Unit(i + j * kThreads));
#pragma unroll
      for (int j = 0; j < kAhead; ++j) x ^= Xor(v[j]);
    }
    for (; i < n; i += kThreads) x ^= Xor(__ldcs(src + Unit(i)));
    ss::cuda::CpAsyncWait<0>();
    __syncthreads();
    const int64_t tail = pref > 0 ? consumed % ring_units : 0;
    for (int64_t k = tid; k < pref; k += kThreads) {
      const int64_t slot = tail + k;
      x ^= Xor(ring[slot < ring_units ? slot : slot - ring_units]);
    }
    consumed += pref;
    // The ring's consumed slots are refilled at the next latency-bound step (GridBarrier's
    // __syncthreads keeps them until every thread has read them): issued here, the copies would
    // delay this block's arrival at the barrier.
    GridBarrier(barrier, ++round);
  }
  if (x == 0x9e3779b9u) *sink = x;
  // The last block out zeroes the barrier for the next launch: every other block has passed its
  // last barrier when it counts itself out.
  if (tid == 0 && atomicAdd(barrier + 1, 1u) == gridDim.x - 1) {
    barrier[0] = 0;
    barrier[1] = 0;
    __threadfence();
  }
}

}  // namespace

cudaError_t LayerAsLaunches(const uint8_t* w, const LayerPlan& plan, int64_t spin_ns,
                            uint32_t* sink, cudaStream_t stream) {
  int64_t at = 0;
  for (int p = 0; p < plan.n; ++p) {
    for (int s = 0; s < plan.spins[p]; ++s) {
      SpinKernelImpl<<<1, 32, 0, stream>>>(spin_ns);
      const cudaError_t e = cudaGetLastError();
      if (e != cudaSuccess) return e;
    }
    if (plan.bytes[p] > 0) {
      const cudaError_t e = StreamRead(w + at, plan.bytes[p], sink, stream);
      if (e != cudaSuccess) return e;
    }
    at += plan.bytes[p];
  }
  return cudaSuccess;
}

int LayerPersistentMaxPrefetch() {
  int dev = 0, optin = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) {
    return 0;
  }
  return optin / 16 * 16;
}

cudaError_t LayerPersistent(const uint8_t* w, const LayerPlan& plan, int64_t spin_ns,
                            int prefetch_bytes, uint32_t* barrier, uint32_t* sink,
                            cudaStream_t stream) {
  int dev = 0, sms = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  if (e == cudaSuccess) {
    e = cudaFuncSetAttribute(LayerPersistentKernelImpl, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             prefetch_bytes);
  }
  if (e != cudaSuccess) return e;
  const uint4* wv = reinterpret_cast<const uint4*>(w);
  LayerPlan plan_arg = plan;
  int64_t ring_units = prefetch_bytes / 16;
  void* args[] = {&wv, &plan_arg, &spin_ns, &ring_units, &barrier, &sink};
  return cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(&LayerPersistentKernelImpl),
                                     dim3(static_cast<unsigned>(sms)), dim3(kThreads), args,
                                     static_cast<size_t>(prefetch_bytes), stream);
}

}  // namespace ss::bench
