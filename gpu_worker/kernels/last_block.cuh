// A launch whose blocks each produce part of a unit and whose unit is finished by the block that
// completes it (HcPre's mix and finish in one launch, the split top-k's second histogram).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cuda/atomic>

namespace ss::cuda {

// The end of such a block. Every thread of the block calls it after the block's stores: after a
// barrier, which orders the block's stores before it, one thread counts the block in sync[unit]
// with an acquire-release atomic at device scope (as cooperative groups' grid sync arrives: one
// such atomic costs ~0.3 us less than fences around a relaxed one, gpu_kernels_bench --sync),
// and the unit's `blocks`-th block, whose acquire orders every block's counted stores before
// finish(), sets the counter back to 0 and runs finish().
// finish() must read the other blocks' stores through L2 (__ldcg): this SM's L1 may hold stale
// lines. The counters start at zero and are left zero; overlapping launches must not share them.
template <typename Finish>
__device__ __forceinline__ void LastBlockFinishes(uint32_t* sync, int64_t unit, uint32_t blocks,
                                                  const Finish& finish) {
  __shared__ bool last;
  __syncthreads();
  if (threadIdx.x == 0) {
    ::cuda::atomic_ref<uint32_t, ::cuda::thread_scope_device> count(sync[unit]);
    last = count.fetch_add(1u, ::cuda::memory_order_acq_rel) == blocks - 1;
    // Every block of the unit has counted itself.
    if (last) count.store(0u, ::cuda::memory_order_relaxed);
  }
  __syncthreads();
  if (last) finish();
}

}  // namespace ss::cuda
