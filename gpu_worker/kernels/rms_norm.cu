#include "gpu_worker/kernels/rms_norm.h"
#include "gpu_worker/kernels/rms_norm_common.cuh"

namespace ss::cuda {
namespace {

constexpr int kThreads = kNormThreads;

// r = 1/sqrt(mean(x²) + eps) of the row xr [n], for every thread of a kThreads block. Each
// thread's sum runs over i = tid, tid + kThreads, ... in order; kAhead loads are issued before the
// sums that use them (a row is one block's work at decode: latency, not bandwidth).
__device__ __forceinline__ float RowRmsScale(const uint16_t* __restrict__ xr, int64_t n,
                                             float eps) {
  constexpr int kAhead = 16;
  float sum = 0.0f;
  int64_t i0 = threadIdx.x;
  for (; i0 + (kAhead - 1) * kThreads < n; i0 += kAhead * kThreads) {
    float v[kAhead];
#pragma unroll
    for (int u = 0; u < kAhead; ++u) v[u] = Bf16ToF32(xr[i0 + u * kThreads]);
#pragma unroll
    for (int u = 0; u < kAhead; ++u) sum = __fadd_rn(sum, __fmul_rn(v[u], v[u]));
  }
  for (; i0 < n; i0 += kThreads) {
    const float v = Bf16ToF32(xr[i0]);
    sum = __fadd_rn(sum, __fmul_rn(v, v));
  }
  return BlockRms(sum, n, eps);
}

__global__ void RmsNormKernelImpl(const uint16_t* __restrict__ x, const float* __restrict__ g,
                                  int64_t n, float eps, uint16_t* __restrict__ y) {
  const uint16_t* xr = x + blockIdx.x * n;
  uint16_t* yr = y + blockIdx.x * n;
  constexpr int kAhead = 16;
  const float r = RowRmsScale(xr, n, eps);
  int64_t i = threadIdx.x;
  for (; i + (kAhead - 1) * kThreads < n; i += kAhead * kThreads) {
    float xv[kAhead], gv[kAhead];
#pragma unroll
    for (int u = 0; u < kAhead; ++u) {
      xv[u] = Bf16ToF32(xr[i + u * kThreads]);
      gv[u] = g[i + u * kThreads];
    }
#pragma unroll
    for (int u = 0; u < kAhead; ++u) {
      yr[i + u * kThreads] = F32ToBf16(__fmul_rn(gv[u], __fmul_rn(xv[u], r)));
    }
  }
  for (; i < n; i += kThreads) {
    yr[i] = F32ToBf16(__fmul_rn(g[i], __fmul_rn(Bf16ToF32(xr[i]), r)));
  }
}

// RmsNormKernelImpl's row, then its spec §5.2 quantisation: warp w takes the row's 128-blocks
// w, w + 8, ..., each lane 4 consecutive elements, the bf16 result in registers.
__global__ void RmsNormQuantKernelImpl(const uint16_t* __restrict__ x, const float* __restrict__ g,
                                       int64_t n, float eps, uint16_t* __restrict__ y,
                                       uint8_t* __restrict__ q, float* __restrict__ s) {
  const int64_t row = blockIdx.x, nb = (n + 127) / 128;
  const uint16_t* xr = x + row * n;
  const float r = RowRmsScale(xr, n, eps);
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  const auto value = [&](int64_t i) { return __fmul_rn(g[i], __fmul_rn(Bf16ToF32(xr[i]), r)); };
  for (int64_t b = warp; b < nb; b += kThreads / 32) {
    ProduceAndQuantizeBlock128(value, lane, b, n, y + row * n, q + row * n, s + row * nb + b);
  }
}

// RmsNormQuantKernelImpl for n = kPer · kThreads (Flash's 4096 and 1024): every load of x and g
// is issued at the start and kept in registers (the same sum of squares, in the same order, as
// RowRmsScale), then RmsNormQuantRowRegs.
template <int kPer>
__global__ void __launch_bounds__(kThreads)
    RmsNormQuantRegsKernelImpl(const uint16_t* __restrict__ x, const float* __restrict__ g,
                               float eps, uint16_t* __restrict__ y, uint8_t* __restrict__ q,
                               float* __restrict__ s) {
  constexpr int64_t n = int64_t{kPer} * kThreads, nb = n / 128;
  const int64_t row = blockIdx.x;
  const int tid = static_cast<int>(threadIdx.x);
  const uint16_t* xr = x + row * n;
  float xv[kPer], gv[kPer];
#pragma unroll
  for (int u = 0; u < kPer; ++u) {
    xv[u] = Bf16ToF32(xr[tid + u * kThreads]);
    gv[u] = g[tid + u * kThreads];
  }
  RmsNormQuantRowRegs<kPer>(xv, gv, eps, y + row * n, q + row * n, s + row * nb);
}

}  // namespace

cudaError_t RmsNormQuant(const bf16_t* x, const float* g, int64_t rows, int64_t n, float eps,
                         bf16_t* y, e4m3_t* q, float* s, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  const unsigned grid = static_cast<unsigned>(rows);
  if (n == 16 * kThreads) {
    RmsNormQuantRegsKernelImpl<16>
        <<<grid, kThreads, 0, stream>>>(Raw(x), g, eps, Raw(y), Raw(q), s);
  } else if (n == 8 * kThreads) {
    RmsNormQuantRegsKernelImpl<8><<<grid, kThreads, 0, stream>>>(Raw(x), g, eps, Raw(y), Raw(q), s);
  } else if (n == 4 * kThreads) {
    RmsNormQuantRegsKernelImpl<4><<<grid, kThreads, 0, stream>>>(Raw(x), g, eps, Raw(y), Raw(q), s);
  } else {
    RmsNormQuantKernelImpl<<<grid, kThreads, 0, stream>>>(Raw(x), g, n, eps, Raw(y), Raw(q), s);
  }
  return cudaGetLastError();
}

cudaError_t RmsNorm(const bf16_t* x, const float* g, int64_t rows, int64_t n, float eps, bf16_t* y,
                    cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  RmsNormKernelImpl<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(Raw(x), g, n, eps,
                                                                          Raw(y));
  return cudaGetLastError();
}

const void* RmsNormKernel() { return reinterpret_cast<const void*>(&RmsNormKernelImpl); }
const void* RmsNormQuantKernel() { return reinterpret_cast<const void*>(&RmsNormQuantKernelImpl); }
const void* RmsNormQuantRegsKernel() {
  return reinterpret_cast<const void*>(&RmsNormQuantRegsKernelImpl<16>);
}

}  // namespace ss::cuda
