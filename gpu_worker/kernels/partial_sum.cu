#include "gpu_worker/kernels/fp8_common.cuh"
#include "gpu_worker/kernels/hc_post_common.cuh"
#include "gpu_worker/kernels/kernels.h"

namespace ss::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void MoeCombineF32KernelImpl(const float* __restrict__ shared,
                                        const float* __restrict__ routed, int64_t n,
                                        uint16_t* __restrict__ y) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    y[i] = HcXMoeF32{shared, routed}.Bits(i);  // MoeCombineF32HcPost's x
  }
}

__global__ void RoundF32ToBf16KernelImpl(const float* __restrict__ x, int64_t n,
                                         uint16_t* __restrict__ y) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    y[i] = F32ToBf16(x[i]);
  }
}

unsigned Blocks(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 4096 ? b : 4096);
}

}  // namespace

cudaError_t MoeCombineF32(const float* shared, const float* routed, int64_t n, uint16_t* y,
                          cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  MoeCombineF32KernelImpl<<<Blocks(n), kThreads, 0, stream>>>(shared, routed, n, y);
  return cudaGetLastError();
}

cudaError_t RoundF32ToBf16(const float* x, int64_t n, uint16_t* y, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  RoundF32ToBf16KernelImpl<<<Blocks(n), kThreads, 0, stream>>>(x, n, y);
  return cudaGetLastError();
}

const void* MoeCombineF32Kernel() {
  return reinterpret_cast<const void*>(&MoeCombineF32KernelImpl);
}
const void* RoundF32ToBf16Kernel() {
  return reinterpret_cast<const void*>(&RoundF32ToBf16KernelImpl);
}

}  // namespace ss::cuda
