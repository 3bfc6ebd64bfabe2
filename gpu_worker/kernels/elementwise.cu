#include "gpu_worker/kernels/elementwise.h"
#include "gpu_worker/kernels/fp8_common.cuh"
#include "gpu_worker/kernels/hc_post_common.cuh"

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

__global__ void MoeCombineBf16KernelImpl(const uint16_t* __restrict__ shared,
                                         const float* __restrict__ routed, int64_t n,
                                         uint16_t* __restrict__ y) {
  // What MoeCombineHcPost takes as its x, stored.
  GridStride(n, [&](int64_t i) { y[i] = HcXMoeBf16{shared, routed}.Bits(i); });
}

__global__ void Bf16ToF32KernelImpl(const uint16_t* __restrict__ x, int64_t n,
                                    float* __restrict__ y) {
  GridStride(n, [&](int64_t i) { y[i] = Bf16ToF32(x[i]); });
}

}  // namespace

cudaError_t MoeCombineF32(const float* shared, const float* routed, int64_t n, bf16_t* y,
                          cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  MoeCombineF32KernelImpl<<<GridStrideBlocks(n, kThreads), kThreads, 0, stream>>>(shared, routed, n,
                                                                                  Raw(y));
  return cudaGetLastError();
}

cudaError_t RoundF32ToBf16(const float* x, int64_t n, bf16_t* y, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  RoundF32ToBf16KernelImpl<<<GridStrideBlocks(n, kThreads), kThreads, 0, stream>>>(x, n, Raw(y));
  return cudaGetLastError();
}

cudaError_t MoeCombineBf16(const bf16_t* shared, const float* routed, int64_t n, bf16_t* y,
                           cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  MoeCombineBf16KernelImpl<<<GridStrideBlocks(n, kThreads), kThreads, 0, stream>>>(
      Raw(shared), routed, n, Raw(y));
  return cudaGetLastError();
}

cudaError_t Bf16ToF32(const bf16_t* x, int64_t n, float* y, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  Bf16ToF32KernelImpl<<<GridStrideBlocks(n, kThreads), kThreads, 0, stream>>>(Raw(x), n, y);
  return cudaGetLastError();
}

const void* MoeCombineF32Kernel() {
  return reinterpret_cast<const void*>(&MoeCombineF32KernelImpl);
}
const void* RoundF32ToBf16Kernel() {
  return reinterpret_cast<const void*>(&RoundF32ToBf16KernelImpl);
}
const void* MoeCombineBf16Kernel() {
  return reinterpret_cast<const void*>(&MoeCombineBf16KernelImpl);
}
const void* Bf16ToF32Kernel() { return reinterpret_cast<const void*>(&Bf16ToF32KernelImpl); }

}  // namespace ss::cuda
