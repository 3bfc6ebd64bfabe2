// The SwiGLU activation (swiglu.h); mirrors common/model/moe.cc SwiGlu.
#include "gpu_worker/kernels/fp8_common.cuh"
#include "gpu_worker/kernels/swiglu.h"

namespace ss::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr unsigned kMaxGrid = 1u << 20;

__device__ __forceinline__ float Load(float v) { return v; }
__device__ __forceinline__ float Load(uint16_t v) { return Bf16ToF32(v); }

// The demo's clamped SwiGLU of one element (before the row weight).
__device__ __forceinline__ float SwiGluValue(float g, float u, float limit) {
  if (limit > 0.0f) {
    u = u < -limit ? -limit : (limit < u ? limit : u);  // std::clamp
    g = limit < g ? limit : g;                          // std::min
  }
  return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u);
}

template <typename In>
__global__ void SwiGluKernelImpl(const In* __restrict__ gate, const In* __restrict__ up,
                                 int64_t in_stride, const float* __restrict__ row_weights,
                                 int64_t rows, int64_t n, float limit, uint16_t* __restrict__ out) {
  const int64_t total = rows * n;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = idx / n, i = idx % n;
    float v = SwiGluValue(Load(gate[r * in_stride + i]), Load(up[r * in_stride + i]), limit);
    if (row_weights != nullptr) v = __fmul_rn(row_weights[r], v);
    out[idx] = F32ToBf16(v);
  }
}

// SwiGluKernelImpl<uint16_t> without row weights, then QuantizeActE4m3 of its output: one warp
// per (row, 128-block), each lane 4 consecutive elements, grid (ceil(nb / kWarps), rows).
__global__ void SwiGluQuantKernelImpl(const uint16_t* __restrict__ gate,
                                      const uint16_t* __restrict__ up, int64_t in_stride, int64_t n,
                                      float limit, uint16_t* __restrict__ out,
                                      uint8_t* __restrict__ q, float* __restrict__ s) {
  const int64_t row = blockIdx.y, nb = (n + 127) / 128;
  const int64_t b = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (b >= nb) return;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const auto value = [&](int64_t i) {
    return SwiGluValue(Bf16ToF32(gate[row * in_stride + i]), Bf16ToF32(up[row * in_stride + i]),
                       limit);
  };
  ProduceAndQuantizeBlock128(value, lane, b, n, out + row * n, q + row * n, s + row * nb + b);
}

template <typename In>
cudaError_t LaunchSwiGlu(const In* gate, const In* up, int64_t in_stride, const float* row_weights,
                         int64_t rows, int64_t n, float limit, uint16_t* out, cudaStream_t stream) {
  if (n < 1 || in_stride < n) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  const int64_t blocks = (rows * n + kThreads - 1) / kThreads;
  const unsigned grid = static_cast<unsigned>(blocks < kMaxGrid ? blocks : kMaxGrid);
  SwiGluKernelImpl<In>
      <<<grid, kThreads, 0, stream>>>(gate, up, in_stride, row_weights, rows, n, limit, out);
  return cudaGetLastError();
}

}  // namespace

cudaError_t SwiGluF32(const float* gate, const float* up, int64_t in_stride,
                      const float* row_weights, int64_t rows, int64_t n, float limit, bf16_t* out,
                      cudaStream_t stream) {
  return LaunchSwiGlu(gate, up, in_stride, row_weights, rows, n, limit, Raw(out), stream);
}

cudaError_t SwiGluBf16(const bf16_t* gate, const bf16_t* up, int64_t in_stride,
                       const float* row_weights, int64_t rows, int64_t n, float limit, bf16_t* out,
                       cudaStream_t stream) {
  return LaunchSwiGlu(Raw(gate), Raw(up), in_stride, row_weights, rows, n, limit, Raw(out), stream);
}

cudaError_t SwiGluBf16Quant(const bf16_t* gate, const bf16_t* up, int64_t in_stride, int64_t rows,
                            int64_t n, float limit, bf16_t* out, e4m3_t* q, float* s,
                            cudaStream_t stream) {
  if (n < 1 || in_stride < n) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  const int64_t nb = (n + 127) / 128;
  const dim3 grid(static_cast<unsigned>((nb + kWarps - 1) / kWarps), static_cast<unsigned>(rows));
  SwiGluQuantKernelImpl<<<grid, kThreads, 0, stream>>>(Raw(gate), Raw(up), in_stride, n, limit,
                                                       Raw(out), Raw(q), s);
  return cudaGetLastError();
}

const void* SwiGluF32Kernel() { return reinterpret_cast<const void*>(&SwiGluKernelImpl<float>); }
const void* SwiGluBf16Kernel() {
  return reinterpret_cast<const void*>(&SwiGluKernelImpl<uint16_t>);
}
const void* SwiGluBf16QuantKernel() {
  return reinterpret_cast<const void*>(&SwiGluQuantKernelImpl);
}

}  // namespace ss::cuda
