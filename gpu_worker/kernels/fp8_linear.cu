#include "gpu_worker/kernels/fp8_common.cuh"
#include "gpu_worker/kernels/kernels.h"

namespace ss::cuda {
namespace {

constexpr int kBlock = 128;

// One warp per (row, 128-block): lane i handles 4 elements.
__global__ void QuantizeActKernelImpl(const uint16_t* __restrict__ x, int64_t n, int64_t nb,
                                      uint8_t* __restrict__ q, float* __restrict__ s) {
  const int64_t row = blockIdx.y;
  const int64_t b = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (b >= nb) return;
  const int lane = threadIdx.x & 31;
  const int64_t i0 = b * kBlock;
  float v[4];
  float amax = 0.0f;
  for (int j = 0; j < 4; ++j) {
    const int64_t i = i0 + lane * 4 + j;
    v[j] = i < n ? Bf16ToF32(x[row * n + i]) : 0.0f;
    amax = fmaxf(amax, fabsf(v[j]));
  }
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float sc = Pow2Scale(amax, 1e-4f, 448.0f);
  for (int j = 0; j < 4; ++j) {
    const int64_t i = i0 + lane * 4 + j;
    if (i < n) q[row * n + i] = F32ToE4m3(fminf(fmaxf(__fdiv_rn(v[j], sc), -448.0f), 448.0f));
  }
  if (lane == 0) s[row * nb + b] = sc;
}

// e4m3 → fp32 without branches: the 7 magnitude bits placed as an fp32 exponent/mantissa are
// the value times 2^-120 (subnormals included, as fp32 subnormals), so one multiply fixes it.
// Code 0x7f (NaN) decodes as 480; checkpoints and quantised activations never hold it.
__device__ __forceinline__ float E4m3Fast(uint32_t c) {
  return __fmul_rn(__uint_as_float(((c & 0x80u) << 24) | ((c & 0x7fu) << 20)), 0x1p120f);
}

__device__ __forceinline__ void Load16(const uint8_t* p, bool full, int64_t avail, uint8_t* b) {
  if (full) {
    const uint4 v = *reinterpret_cast<const uint4*>(p);
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
    for (int j = 0; j < 16; ++j) b[j] = static_cast<uint8_t>(w[j >> 2] >> (8 * (j & 3)));
  } else {
    for (int j = 0; j < 16; ++j) b[j] = j < avail ? p[j] : 0;
  }
}

// One warp per output feature o, all rows (a decode batch) at once, so each weight byte is read
// once. Lane l reads 16 consecutive bytes (inside one 128-block), keeps its own partial sum per
// row scaled by s_act·s_w (powers of two, so scaling each partial is exact), and the warp
// reduces once at the end: the same exact products as the reference, summed in another order.
template <int kMaxRows>
__global__ void Fp8LinearKernelImpl(const uint8_t* __restrict__ q, const float* __restrict__ sa,
                                    int64_t rows, const uint8_t* __restrict__ w,
                                    const uint8_t* __restrict__ ws, int64_t out, int64_t in,
                                    bool aligned, uint16_t* __restrict__ y) {
  const int64_t o = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (o >= out) return;
  const int lane = threadIdx.x & 31;
  const int64_t nb = (in + kBlock - 1) / kBlock;
  const uint8_t* wr = w + o * in;
  const uint8_t* wsr = ws + (o / kBlock) * nb;
  for (int64_t r0 = 0; r0 < rows; r0 += kMaxRows) {
    const int nr = static_cast<int>(rows - r0 < kMaxRows ? rows - r0 : kMaxRows);
    float acc[kMaxRows];
    for (int r = 0; r < kMaxRows; ++r) acc[r] = 0.0f;
    for (int64_t base = lane * 16; base < in; base += 32 * 16) {
      const int64_t b = base / kBlock;
      const bool full = aligned && base + 16 <= in;
      uint8_t wb[16];
      Load16(wr + base, full, in - base, wb);
      float wf[16];
      for (int j = 0; j < 16; ++j) wf[j] = E4m3Fast(wb[j]);
      const float sw = Ue8m0ToF32(wsr[b]);
      for (int r = 0; r < nr; ++r) {
        uint8_t qb[16];
        Load16(q + (r0 + r) * in + base, full, in - base, qb);
        float part = 0.0f;
        for (int j = 0; j < 16; ++j) part = __fadd_rn(part, __fmul_rn(E4m3Fast(qb[j]), wf[j]));
        acc[r] = __fadd_rn(acc[r], __fmul_rn(part, __fmul_rn(sa[(r0 + r) * nb + b], sw)));
      }
    }
    for (int r = 0; r < nr; ++r) {
      for (int off = 16; off > 0; off >>= 1) {
        acc[r] = __fadd_rn(acc[r], __shfl_xor_sync(0xffffffffu, acc[r], off));
      }
    }
    if (lane == 0) {
      for (int r = 0; r < nr; ++r) y[(r0 + r) * out + o] = F32ToBf16(acc[r]);
    }
  }
}

constexpr int kRowsPerPass = 8;
constexpr int kWarpsPerBlock = 8;

}  // namespace

cudaError_t QuantizeActE4m3(const uint16_t* x, int64_t rows, int64_t n, uint8_t* q, float* s,
                            cudaStream_t stream) {
  if (rows == 0 || n == 0) return cudaSuccess;
  const int64_t nb = (n + kBlock - 1) / kBlock;
  const dim3 grid(static_cast<unsigned>((nb + 7) / 8), static_cast<unsigned>(rows));
  QuantizeActKernelImpl<<<grid, 256, 0, stream>>>(x, n, nb, q, s);
  return cudaGetLastError();
}

cudaError_t Fp8Linear(const uint8_t* q, const float* s_act, int64_t rows, const uint8_t* w,
                      const uint8_t* w_scale, int64_t out, int64_t in, uint16_t* y,
                      cudaStream_t stream) {
  if (rows == 0 || out == 0) return cudaSuccess;
  const unsigned blocks = static_cast<unsigned>((out + kWarpsPerBlock - 1) / kWarpsPerBlock);
  const bool aligned = in % 16 == 0 && reinterpret_cast<uintptr_t>(q) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(w) % 16 == 0;
  Fp8LinearKernelImpl<kRowsPerPass><<<blocks, 32 * kWarpsPerBlock, 0, stream>>>(
      q, s_act, rows, w, w_scale, out, in, aligned, y);
  return cudaGetLastError();
}

const void* QuantizeActE4m3Kernel() {
  return reinterpret_cast<const void*>(&QuantizeActKernelImpl);
}
const void* Fp8LinearKernel() {
  return reinterpret_cast<const void*>(&Fp8LinearKernelImpl<kRowsPerPass>);
}

}  // namespace ss::cuda
