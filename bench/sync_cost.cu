#include "bench/sync_cost.h"

#include "gpu_worker/kernels/last_block.cuh"

namespace ss::bench {
namespace {

__global__ void TouchKernelImpl(uint32_t* out) {
  if (threadIdx.x == 0) out[blockIdx.x] = blockIdx.x;
}

__global__ void HandoffKernelImpl(uint32_t* counter, uint32_t* out) {
  if (threadIdx.x == 0) out[blockIdx.x] = blockIdx.x;
  ss::cuda::LastBlockFinishes(counter, 0, gridDim.x, [&] {
    if (threadIdx.x == 0) out[gridDim.x] = __ldcg(out);
  });
}

// The same handoff as LastBlockFinishes had it before (fences around a relaxed atomic).
__global__ void HandoffFencesKernelImpl(uint32_t* counter, uint32_t* out) {
  __shared__ bool last;
  if (threadIdx.x == 0) out[blockIdx.x] = blockIdx.x;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(counter, 1u) == gridDim.x - 1;
    if (last) *counter = 0;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  if (threadIdx.x == 0) out[gridDim.x] = __ldcg(out);
}

__global__ void GridBarrierLoopImpl(int rounds, uint32_t* counter) {
  for (int r = 1; r <= rounds; ++r) {
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();
      atomicAdd(counter, 1u);
      const uint32_t target = static_cast<uint32_t>(r) * gridDim.x;
      while (*reinterpret_cast<volatile uint32_t*>(counter) < target) {
      }
      __threadfence();
    }
    __syncthreads();
  }
}

}  // namespace

cudaError_t TouchKernel(int blocks, uint32_t* out, cudaStream_t stream) {
  TouchKernelImpl<<<blocks, 128, 0, stream>>>(out);
  return cudaGetLastError();
}

cudaError_t HandoffKernel(int blocks, uint32_t* counter, uint32_t* out, cudaStream_t stream) {
  HandoffKernelImpl<<<blocks, 128, 0, stream>>>(counter, out);
  return cudaGetLastError();
}

cudaError_t HandoffFencesKernel(int blocks, uint32_t* counter, uint32_t* out,
                                cudaStream_t stream) {
  HandoffFencesKernelImpl<<<blocks, 128, 0, stream>>>(counter, out);
  return cudaGetLastError();
}

cudaError_t GridBarrierLoop(int blocks, int rounds, uint32_t* counter, cudaStream_t stream) {
  void* args[] = {&rounds, &counter};
  return cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(&GridBarrierLoopImpl),
                                     dim3(blocks), dim3(128), args, 0, stream);
}

}  // namespace ss::bench
