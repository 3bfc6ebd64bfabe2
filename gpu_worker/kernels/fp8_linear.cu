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

// One warp per output feature o, all rows (decode batch) at once: the weight row is read once.
template <int kMaxRows>
__global__ void Fp8LinearKernelImpl(const uint8_t* __restrict__ q, const float* __restrict__ sa,
                                    int64_t rows, const uint8_t* __restrict__ w,
                                    const uint8_t* __restrict__ ws, int64_t out, int64_t in,
                                    uint16_t* __restrict__ y) {
  const int64_t o = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (o >= out) return;
  const int lane = threadIdx.x & 31;
  const int64_t nb = (in + kBlock - 1) / kBlock;
  for (int64_t r0 = 0; r0 < rows; r0 += kMaxRows) {
    const int nr = static_cast<int>(rows - r0 < kMaxRows ? rows - r0 : kMaxRows);
    float acc[kMaxRows];
    for (int r = 0; r < kMaxRows; ++r) acc[r] = 0.0f;
    for (int64_t b = 0; b < nb; ++b) {
      const float sw = Ue8m0ToF32(ws[(o / kBlock) * nb + b]);
      float wv[4];
      for (int j = 0; j < 4; ++j) {
        const int64_t i = b * kBlock + lane * 4 + j;
        wv[j] = i < in ? E4m3ToF32(w[o * in + i]) : 0.0f;
      }
      for (int r = 0; r < nr; ++r) {
        const uint8_t* qr = q + (r0 + r) * in;
        float part = 0.0f;
        for (int j = 0; j < 4; ++j) {
          const int64_t i = b * kBlock + lane * 4 + j;
          if (i < in) part = __fadd_rn(part, __fmul_rn(E4m3ToF32(qr[i]), wv[j]));
        }
        for (int off = 16; off > 0; off >>= 1) {
          part = __fadd_rn(part, __shfl_xor_sync(0xffffffffu, part, off));
        }
        acc[r] = __fadd_rn(acc[r], __fmul_rn(__fmul_rn(part, sa[(r0 + r) * nb + b]), sw));
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
  Fp8LinearKernelImpl<kRowsPerPass>
      <<<blocks, 32 * kWarpsPerBlock, 0, stream>>>(q, s_act, rows, w, w_scale, out, in, y);
  return cudaGetLastError();
}

const void* QuantizeActE4m3Kernel() {
  return reinterpret_cast<const void*>(&QuantizeActKernelImpl);
}
const void* Fp8LinearKernel() {
  return reinterpret_cast<const void*>(&Fp8LinearKernelImpl<kRowsPerPass>);
}

}  // namespace ss::cuda
