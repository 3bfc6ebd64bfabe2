// Query/KV path pieces (spec §3.4, §3.5, §5.3): the demo's bf16 per-head q normalisation
// (attention.cc HeadNormBf16), the RoPE cos/sin table and rotation (common/rope.cc) and the FP8
// simulation of the KV nope dims (codecs.cc Fp8SimInplace).
#include "gpu_worker/kernels/fp8_common.cuh"
#include "gpu_worker/kernels/rope.h"

namespace ss::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr unsigned kMaxGrid = 1u << 20;

__device__ __forceinline__ float RoundBf16(float v) { return Bf16ToF32(F32ToBf16(v)); }

unsigned GridFor(int64_t threads) {
  const int64_t blocks = (threads + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < kMaxGrid ? blocks : kMaxGrid);
}

// The demo's bf16 head norm of one row by one warp, in place.
__device__ __forceinline__ void HeadNormRow(uint16_t* __restrict__ v, int64_t n, float eps,
                                            int lane) {
  float sum = 0.0f;
  for (int64_t i = lane; i < n; i += 32) {
    const float f = Bf16ToF32(v[i]);
    sum = __fadd_rn(sum, RoundBf16(__fmul_rn(f, f)));
  }
  for (int o = 16; o > 0; o >>= 1) sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, o));
  const float mean = RoundBf16(__fmul_rn(sum, __frcp_rn(static_cast<float>(n))));
  const float r = RoundBf16(__frcp_rn(__fsqrt_rn(RoundBf16(__fadd_rn(mean, eps)))));
  for (int64_t i = lane; i < n; i += 32) v[i] = F32ToBf16(__fmul_rn(Bf16ToF32(v[i]), r));
}

// One warp per row.
__global__ void HeadRmsNormKernelImpl(uint16_t* __restrict__ x, int64_t rows, int64_t n,
                                      float eps) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (row >= rows) return;
  HeadNormRow(x + row * n, n, eps, lane);
}

// HeadRmsNormKernelImpl's row (token t = row / heads), then ApplyRopeKernelImpl's rotation of its
// last rope_dim dims by the same warp (after __syncwarp: the normed values are read back).
__global__ void HeadRmsNormRopeKernelImpl(uint16_t* __restrict__ x, int64_t rows, int64_t n,
                                          float eps, int64_t heads, int64_t rope_dim,
                                          const float* __restrict__ cos_t,
                                          const float* __restrict__ sin_t) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (row >= rows) return;
  uint16_t* v = x + row * n;
  HeadNormRow(v, n, eps, lane);
  __syncwarp();
  const int64_t pairs = rope_dim / 2, t = row / heads;
  for (int64_t i = lane; i < pairs; i += 32) {
    RotatePair(v + (n - rope_dim) + 2 * i, cos_t[t * pairs + i], sin_t[t * pairs + i]);
  }
}

// HeadRmsNormRopeKernelImpl for n = 32·kPer (Flash's 512): the row in registers, its loads
// issued together (one trip to memory instead of three), each rotated pair's other value from
// the neighbouring lane (pair (2i, 2i+1) sits in lanes l, l^1 of the same k, as the rope dims
// start at an even index). The same operations as HeadNormRow then RotatePair: the same bits.
template <int kPer>
__global__ void HeadRmsNormRopeRegsKernelImpl(uint16_t* __restrict__ x, int64_t rows, float eps,
                                              int64_t heads, int64_t rope_dim,
                                              const float* __restrict__ cos_t,
                                              const float* __restrict__ sin_t) {
  constexpr int64_t n = 32 * kPer;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (row >= rows) return;  // warp-uniform
  uint16_t* v = x + row * n;
  float f[kPer];
#pragma unroll
  for (int k = 0; k < kPer; ++k) f[k] = Bf16ToF32(v[lane + 32 * k]);
  float sum = 0.0f;
#pragma unroll
  for (int k = 0; k < kPer; ++k) sum = __fadd_rn(sum, RoundBf16(__fmul_rn(f[k], f[k])));
  for (int o = 16; o > 0; o >>= 1) sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, o));
  const float mean = RoundBf16(__fmul_rn(sum, __frcp_rn(static_cast<float>(n))));
  const float r = RoundBf16(__frcp_rn(__fsqrt_rn(RoundBf16(__fadd_rn(mean, eps)))));
  const int64_t pairs = rope_dim / 2, t = row / heads, r0 = n - rope_dim;
  const bool even = (lane & 1) == 0;
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const float y = RoundBf16(__fmul_rn(f[k], r));
    const float other = __shfl_xor_sync(0xffffffffu, y, 1);
    const int64_t i = lane + 32 * k;
    float out = y;
    if (i >= r0) {
      const int64_t p = t * pairs + (i - r0) / 2;
      const float c = cos_t[p], sn = sin_t[p];
      out = even ? __fsub_rn(__fmul_rn(y, c), __fmul_rn(other, sn))
                 : __fadd_rn(__fmul_rn(other, sn), __fmul_rn(y, c));
    }
    v[i] = F32ToBf16(out);
  }
}

// Entry idx (position idx / pairs, pair idx % pairs) of a cos/sin table.
__device__ __forceinline__ void CosSinEntry(const float* __restrict__ freqs, int64_t pairs,
                                            const int64_t* __restrict__ positions, int64_t idx,
                                            bool fp32_trig, float* __restrict__ cos_out,
                                            float* __restrict__ sin_out) {
  const float angle = __fmul_rn(static_cast<float>(positions[idx / pairs]), freqs[idx % pairs]);
  if (fp32_trig) {
    cos_out[idx] = cosf(angle);
    sin_out[idx] = sinf(angle);
  } else {
    cos_out[idx] = static_cast<float>(cos(static_cast<double>(angle)));
    sin_out[idx] = static_cast<float>(sin(static_cast<double>(angle)));
  }
}

__global__ void RopeCosSinKernelImpl(const float* __restrict__ freqs, int64_t pairs,
                                     const int64_t* __restrict__ positions, int64_t n,
                                     bool fp32_trig, float* __restrict__ cos_out,
                                     float* __restrict__ sin_out) {
  const int64_t total = n * pairs;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    CosSinEntry(freqs, pairs, positions, idx, fp32_trig, cos_out, sin_out);
  }
}

// Two tables of the same positions, the first 2·n·pairs threads' halves.
__global__ void RopeCosSinPairKernelImpl(const float* __restrict__ freqs0,
                                         const float* __restrict__ freqs1, int64_t pairs,
                                         const int64_t* __restrict__ positions, int64_t n,
                                         float* __restrict__ cos0, float* __restrict__ sin0,
                                         float* __restrict__ cos1, float* __restrict__ sin1) {
  const int64_t total = n * pairs;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < 2 * total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (idx < total) {
      CosSinEntry(freqs0, pairs, positions, idx, false, cos0, sin0);
    } else {
      CosSinEntry(freqs1, pairs, positions, idx - total, false, cos1, sin1);
    }
  }
}

// One thread per (token, head, pair).
__global__ void ApplyRopeKernelImpl(uint16_t* __restrict__ x, int64_t T, int64_t heads,
                                    int64_t head_dim, int64_t rope_dim,
                                    const float* __restrict__ cos_t,
                                    const float* __restrict__ sin_t, bool inverse) {
  const int64_t pairs = rope_dim / 2, total = T * heads * pairs;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = idx % pairs, th = idx / pairs, t = th / heads;
    const float s = inverse ? -sin_t[t * pairs + i] : sin_t[t * pairs + i];
    RotatePair(x + th * head_dim + (head_dim - rope_dim) + 2 * i, cos_t[t * pairs + i], s);
  }
}

// One warp per (row, block).
__global__ void Fp8SimKernelImpl(uint16_t* __restrict__ x, int64_t rows, int64_t row_stride,
                                 int64_t n, int64_t block, bool round_e4m3) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int64_t nb = (n + block - 1) / block;
  const int64_t w = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (w >= rows * nb) return;
  const int64_t b0 = (w % nb) * block;
  const int64_t len = n - b0 < block ? n - b0 : block;
  uint16_t* v = x + (w / nb) * row_stride + b0;
  float amax = 0.0f;
  for (int64_t i = lane; i < len; i += 32) amax = fmaxf(amax, fabsf(Bf16ToF32(v[i])));
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float s = Pow2Scale(amax, 1e-4f, 448.0f);
  for (int64_t i = lane; i < len; i += 32) {
    float q = __fdiv_rn(Bf16ToF32(v[i]), s);
    q = q < -448.0f ? -448.0f : (448.0f < q ? 448.0f : q);  // std::clamp
    q = round_e4m3 ? E4m3ToF32(F32ToE4m3(q)) : RoundBf16(q);
    v[i] = F32ToBf16(__fmul_rn(q, s));
  }
}

}  // namespace

cudaError_t HeadRmsNormBf16(bf16_t* x, int64_t rows, int64_t head_dim, float eps,
                            cudaStream_t stream) {
  if (head_dim < 1) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  const unsigned blocks = static_cast<unsigned>((rows + kWarps - 1) / kWarps);
  HeadRmsNormKernelImpl<<<blocks, kThreads, 0, stream>>>(Raw(x), rows, head_dim, eps);
  return cudaGetLastError();
}

cudaError_t HeadRmsNormRope(bf16_t* x, int64_t T, int64_t heads, int64_t head_dim, float eps,
                            int64_t rope_dim, const float* cos_t, const float* sin_t,
                            cudaStream_t stream) {
  if (head_dim < 1 || heads < 1 || rope_dim < 2 || rope_dim % 2 != 0 || rope_dim > head_dim) {
    return cudaErrorInvalidValue;
  }
  if (T == 0) return cudaSuccess;
  const int64_t rows = T * heads;
  const unsigned blocks = static_cast<unsigned>((rows + kWarps - 1) / kWarps);
  if (head_dim == 512) {
    HeadRmsNormRopeRegsKernelImpl<16>
        <<<blocks, kThreads, 0, stream>>>(Raw(x), rows, eps, heads, rope_dim, cos_t, sin_t);
  } else {
    HeadRmsNormRopeKernelImpl<<<blocks, kThreads, 0, stream>>>(Raw(x), rows, head_dim, eps, heads,
                                                               rope_dim, cos_t, sin_t);
  }
  return cudaGetLastError();
}

cudaError_t RopeCosSin(const float* freqs, int64_t pairs, const int64_t* positions, int64_t n,
                       bool fp32_trig, float* cos_out, float* sin_out, cudaStream_t stream) {
  if (pairs < 1) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  RopeCosSinKernelImpl<<<GridFor(n * pairs), kThreads, 0, stream>>>(freqs, pairs, positions, n,
                                                                    fp32_trig, cos_out, sin_out);
  return cudaGetLastError();
}

cudaError_t RopeCosSinPair(const RopeCosSinPairParams& p, cudaStream_t stream) {
  if (p.pairs < 1) return cudaErrorInvalidValue;
  if (p.n == 0) return cudaSuccess;
  RopeCosSinPairKernelImpl<<<GridFor(2 * p.n * p.pairs), kThreads, 0, stream>>>(
      p.t0.freqs, p.t1.freqs, p.pairs, p.positions, p.n, p.t0.cos, p.t0.sin, p.t1.cos, p.t1.sin);
  return cudaGetLastError();
}

cudaError_t ApplyRope(bf16_t* x, int64_t T, int64_t heads, int64_t head_dim, int64_t rope_dim,
                      const float* cos_t, const float* sin_t, bool inverse, cudaStream_t stream) {
  if (heads < 1 || rope_dim < 2 || rope_dim % 2 != 0 || rope_dim > head_dim) {
    return cudaErrorInvalidValue;
  }
  if (T == 0) return cudaSuccess;
  ApplyRopeKernelImpl<<<GridFor(T * heads * (rope_dim / 2)), kThreads, 0, stream>>>(
      Raw(x), T, heads, head_dim, rope_dim, cos_t, sin_t, inverse);
  return cudaGetLastError();
}

cudaError_t Fp8SimInplace(bf16_t* x, int64_t rows, int64_t row_stride, int64_t n, int64_t block,
                          bool round_e4m3, cudaStream_t stream) {
  if (block < 1 || n < 0 || row_stride < n) return cudaErrorInvalidValue;
  if (rows == 0 || n == 0) return cudaSuccess;
  const int64_t warps = rows * ((n + block - 1) / block);
  const unsigned blocks = static_cast<unsigned>((warps + kWarps - 1) / kWarps);
  Fp8SimKernelImpl<<<blocks, kThreads, 0, stream>>>(Raw(x), rows, row_stride, n, block, round_e4m3);
  return cudaGetLastError();
}

const void* HeadRmsNormBf16Kernel() {
  return reinterpret_cast<const void*>(&HeadRmsNormKernelImpl);
}
const void* HeadRmsNormRopeRegsKernel() {
  return reinterpret_cast<const void*>(&HeadRmsNormRopeRegsKernelImpl<16>);
}
const void* HeadRmsNormRopeKernel() {
  return reinterpret_cast<const void*>(&HeadRmsNormRopeKernelImpl);
}
const void* RopeCosSinPairKernel() {
  return reinterpret_cast<const void*>(&RopeCosSinPairKernelImpl);
}
const void* RopeCosSinKernel() { return reinterpret_cast<const void*>(&RopeCosSinKernelImpl); }
const void* ApplyRopeKernel() { return reinterpret_cast<const void*>(&ApplyRopeKernelImpl); }
const void* Fp8SimInplaceKernel() { return reinterpret_cast<const void*>(&Fp8SimKernelImpl); }

}  // namespace ss::cuda
