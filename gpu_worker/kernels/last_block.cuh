// A launch whose blocks each produce part of a unit and whose unit is finished by the block that
// completes it (HcPre's mix and finish in one launch, the split top-k's second histogram).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ss::cuda {

// The end of such a block. Every thread of the block calls it after the block's stores: the
// block counts itself in sync[unit] (after a fence, so its stores are visible to whichever block
// finishes), and the unit's `blocks`-th block sets the counter back to 0 and runs finish().
// finish() must read the other blocks' stores through L2 (__ldcg): this SM's L1 may hold stale
// lines. The counters start at zero and are left zero; overlapping launches must not share them.
template <typename Finish>
__device__ __forceinline__ void LastBlockFinishes(uint32_t* sync, int64_t unit, uint32_t blocks,
                                                  const Finish& finish) {
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(sync + unit, 1u) == blocks - 1;
    if (last) sync[unit] = 0;  // every block of the unit has counted itself
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  finish();
}

}  // namespace ss::cuda
