#include "gpu_worker/kernels/fp8_common.cuh"
#include "gpu_worker/kernels/hc_post_common.cuh"
#include "gpu_worker/kernels/kernels.h"

namespace ss::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void MoeCombineF32KernelImpl(const float* __restrict__ shared,
                                        const float* __restrict__ routed, int64_t n,
                                        uint16_t* __restrict__ y) {
  // What MoeCombineF32HcPost takes as its x, stored.
  GridStride(n, [&](int64_t i) { y[i] = HcXMoeF32{shared, routed}.Bits(i); });
}

__global__ void RoundF32ToBf16KernelImpl(const float* __restrict__ x, int64_t n,
                                         uint16_t* __restrict__ y) {
  GridStride(n, [&](int64_t i) { y[i] = F32ToBf16(x[i]); });
}

}  // namespace

cudaError_t MoeCombineF32(const float* shared, const float* routed, int64_t n, uint16_t* y,
                          cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  MoeCombineF32KernelImpl<<<GridStrideBlocks(n, kThreads), kThreads, 0, stream>>>(shared, routed, n,
                                                                                  y);
  return cudaGetLastError();
}

cudaError_t RoundF32ToBf16(const float* x, int64_t n, uint16_t* y, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  RoundF32ToBf16KernelImpl<<<GridStrideBlocks(n, kThreads), kThreads, 0, stream>>>(x, n, y);
  return cudaGetLastError();
}

const void* MoeCombineF32Kernel() {
  return reinterpret_cast<const void*>(&MoeCombineF32KernelImpl);
}
const void* RoundF32ToBf16Kernel() {
  return reinterpret_cast<const void*>(&RoundF32ToBf16KernelImpl);
}

}  // namespace ss::cuda
