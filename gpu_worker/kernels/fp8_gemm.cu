#include "gpu_worker/kernels/fp8_common.cuh"
#include "gpu_worker/kernels/fp8_gemm.h"
#include "gpu_worker/kernels/shared_memory.h"

namespace ss::cuda {
namespace {

constexpr int kBlock = 128;    // k per pipeline stage: one scale block
constexpr int kBN = 128;       // features per tile: one weight-scale block
constexpr int kStages = 3;     // cp.async stages in flight
constexpr int kThreads = 256;  // 2 (rows) x 4 (features) warps

template <int kBM>
__host__ __device__ constexpr int StageBytes() {
  return kBM * kBlock + kBN * kBlock + kBM * 4;  // activation codes, weight codes, s_act
}

// Byte offset of 16-byte chunk c (0..7) of tile row r (128 code bytes a row). Chunks are XOR
// swizzled by (r & 3)·2, so a half-warp's 8-byte fragment loads (rows g = 0..3, lanes t = 0..3)
// and the cp.async stores (8 chunks of one row) each touch 32 distinct banks.
__device__ __forceinline__ int Swz(int r, int c) {
  return r * kBlock + ((c ^ ((r & 3) << 1)) << 4);
}

template <int kBM>
__device__ __forceinline__ void LoadStage(uint8_t* st, const uint8_t* q, const float* sa,
                                          const uint8_t* w, int64_t rows, int64_t out, int64_t in,
                                          int64_t nb, int64_t m0, int64_t n0, int64_t kb) {
  uint8_t* a = st;
  uint8_t* b = st + kBM * kBlock;
  float* s = reinterpret_cast<float*>(st + kBM * kBlock + kBN * kBlock);
  const int64_t k0 = kb * kBlock;
  // Rows past `rows` and features past `out` repeat the last one; their results are not stored.
  for (int i = threadIdx.x; i < kBM * 8; i += kThreads) {
    const int r = i >> 3, c = i & 7;
    CpAsync16(a + Swz(r, c), q + min(m0 + r, rows - 1) * in + k0 + c * 16);
  }
  for (int i = threadIdx.x; i < kBN * 8; i += kThreads) {
    const int r = i >> 3, c = i & 7;
    CpAsync16(b + Swz(r, c), w + min(n0 + r, out - 1) * in + k0 + c * 16);
  }
  if (threadIdx.x < kBM) CpAsync4(s + threadIdx.x, sa + min(m0 + threadIdx.x, rows - 1) * nb + kb);
}

// `pairs`: y is aligned for one store of both values (and out is even).
__device__ __forceinline__ void StorePair(uint16_t* y, int64_t rows, int64_t out, int64_t r,
                                          int64_t col, float v0, float v1, bool pairs) {
  if (r >= rows) return;
  uint16_t* p = y + r * out + col;
  if (pairs && col + 1 < out) {
    *reinterpret_cast<uint32_t*>(p) =
        static_cast<uint32_t>(F32ToBf16(v0)) | (static_cast<uint32_t>(F32ToBf16(v1)) << 16);
    return;
  }
  if (col < out) p[0] = F32ToBf16(v0);
  if (col + 1 < out) p[1] = F32ToBf16(v1);
}
__device__ __forceinline__ void StorePair(float* y, int64_t rows, int64_t out, int64_t r,
                                          int64_t col, float v0, float v1, bool pairs) {
  if (r >= rows) return;
  float* p = y + r * out + col;
  if (pairs && col + 1 < out) {
    *reinterpret_cast<float2*>(p) = make_float2(v0, v1);
    return;
  }
  if (col < out) p[0] = v0;
  if (col + 1 < out) p[1] = v1;
}

// Prefill GEMM: a kBM x 128 output tile per block, K streamed one 128-block per stage through a
// 3-stage cp.async pipeline of raw e4m3 codes (activations [rows, in], weights [out, in], both
// k-contiguous, so each is an mma operand as stored: A row-major, B "col"). Warp (wm, wn) owns
// rows wm·kBM/2.. and features wn·32..; lane (g, t) reads 8 code bytes per row per 32 k and
// decodes them to f16 pairs in registers (E4m3x2ToF16x2) right before the mma. Each 128-block's
// mma partial is scaled by s_act[row]·s_w·2^16 (powers of two: exact) and added into the fp32
// accumulator with one rounding, as Linear8 adds its block sums.
template <int kBM, typename OutT>
__global__ void __launch_bounds__(kThreads)
    Fp8GemmKernelImpl(const uint8_t* __restrict__ q, const float* __restrict__ sa, int64_t rows,
                      const uint8_t* __restrict__ w, const uint8_t* __restrict__ ws, int64_t out,
                      int64_t in, bool pairs, OutT* __restrict__ y) {
  constexpr int kWM = kBM / 2, kMT = kWM / 16, kNT = 4;
  extern __shared__ __align__(16) uint8_t smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int wm = warp >> 2, wn = warp & 3;
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kBM;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kBN;
  const int64_t nb = in / kBlock;
  const uint8_t* psw = ws + static_cast<int64_t>(blockIdx.x) * nb;

  float acc[kMT][kNT][4];
#pragma unroll
  for (int i = 0; i < kMT; ++i)
#pragma unroll
    for (int j = 0; j < kNT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

  const auto load = [&](int stage, int64_t kb) {
    LoadStage<kBM>(smem + stage * StageBytes<kBM>(), q, sa, w, rows, out, in, nb, m0, n0, kb);
  };
  CpAsyncPipeline<kStages>(nb, load, [&](int stage, int64_t kb) {
    const uint8_t* a = smem + stage * StageBytes<kBM>();
    const uint8_t* b = a + kBM * kBlock;
    const float* s_act = reinterpret_cast<const float*>(b + kBN * kBlock);
    const float sw = __fmul_rn(Ue8m0ToF32(__ldg(psw + kb)), kF16Unscale);

    float p[kMT][kNT][4];
#pragma unroll
    for (int i = 0; i < kMT; ++i)
#pragma unroll
      for (int j = 0; j < kNT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) p[i][j][e] = 0.0f;

#pragma unroll
    for (int c32 = 0; c32 < 4; ++c32) {
      // Lane t holds k bytes 32·c32 + 8t .. +7; its word s feeds k16 step (c32, s) with the
      // layout of U4Word (bytes 0,1 -> k = 2t, 2t+1; bytes 2,3 -> 2t+8, 2t+9).
      const int c = 2 * c32 + (t >> 1), half = (t & 1) * 8;
      uint2 af[kMT][2], bf[kNT];
#pragma unroll
      for (int i = 0; i < kMT; ++i) {
        const int r = wm * kWM + i * 16 + g;
        af[i][0] = *reinterpret_cast<const uint2*>(a + Swz(r, c) + half);
        af[i][1] = *reinterpret_cast<const uint2*>(a + Swz(r + 8, c) + half);
      }
#pragma unroll
      for (int j = 0; j < kNT; ++j) {
        bf[j] = *reinterpret_cast<const uint2*>(b + Swz(wn * 32 + j * 8 + g, c) + half);
      }
#pragma unroll
      for (int s = 0; s < 2; ++s) {
        uint32_t b0[kNT], b1[kNT];
#pragma unroll
        for (int j = 0; j < kNT; ++j) {
          const uint32_t x = s ? bf[j].y : bf[j].x;
          b0[j] = E4m3x2ToF16x2(x, 0x1404);
          b1[j] = E4m3x2ToF16x2(x, 0x3424);
        }
#pragma unroll
        for (int i = 0; i < kMT; ++i) {
          const uint32_t u = s ? af[i][0].y : af[i][0].x, v = s ? af[i][1].y : af[i][1].x;
          const uint32_t a0 = E4m3x2ToF16x2(u, 0x1404), a1 = E4m3x2ToF16x2(v, 0x1404);
          const uint32_t a2 = E4m3x2ToF16x2(u, 0x3424), a3 = E4m3x2ToF16x2(v, 0x3424);
#pragma unroll
          for (int j = 0; j < kNT; ++j) MmaF16(p[i][j], a0, a1, a2, a3, b0[j], b1[j]);
        }
      }
    }

#pragma unroll
    for (int i = 0; i < kMT; ++i) {
      const int r = wm * kWM + i * 16 + g;
      const float f0 = __fmul_rn(s_act[r], sw), f1 = __fmul_rn(s_act[r + 8], sw);
#pragma unroll
      for (int j = 0; j < kNT; ++j) {
        acc[i][j][0] = __fmaf_rn(p[i][j][0], f0, acc[i][j][0]);
        acc[i][j][1] = __fmaf_rn(p[i][j][1], f0, acc[i][j][1]);
        acc[i][j][2] = __fmaf_rn(p[i][j][2], f1, acc[i][j][2]);
        acc[i][j][3] = __fmaf_rn(p[i][j][3], f1, acc[i][j][3]);
      }
    }
  });

#pragma unroll
  for (int i = 0; i < kMT; ++i) {
    const int64_t r = m0 + wm * kWM + i * 16 + g;
#pragma unroll
    for (int j = 0; j < kNT; ++j) {
      const int64_t col = n0 + wn * 32 + j * 8 + 2 * t;
      StorePair(y, rows, out, r, col, acc[i][j][0], acc[i][j][1], pairs);
      StorePair(y, rows, out, r + 8, col, acc[i][j][2], acc[i][j][3], pairs);
    }
  }
}

template <int kBM, typename OutT>
cudaError_t LaunchGemm(const uint8_t* q, const float* s_act, int64_t rows, const uint8_t* w,
                       const uint8_t* w_scale, int64_t out, int64_t in, OutT* y,
                       cudaStream_t stream) {
  constexpr int kSmem = kStages * StageBytes<kBM>();
  const dim3 grid(static_cast<unsigned>((out + kBN - 1) / kBN),
                  static_cast<unsigned>((rows + kBM - 1) / kBM));
  const bool pairs = out % 2 == 0 && reinterpret_cast<uintptr_t>(y) % (2 * sizeof(OutT)) == 0;
  Fp8GemmKernelImpl<kBM, OutT>
      <<<grid, kThreads, kSmem, stream>>>(q, s_act, rows, w, w_scale, out, in, pairs, y);
  return cudaGetLastError();
}

template <typename OutT>
cudaError_t GemmT(const uint8_t* q, const float* s_act, int64_t rows, const uint8_t* w,
                  const uint8_t* w_scale, int64_t out, int64_t in, OutT* y, cudaStream_t stream) {
  if (rows == 0 || out == 0) return cudaSuccess;
  if (in % kBlock != 0 || reinterpret_cast<uintptr_t>(q) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(w) % 16 != 0) {
    return cudaErrorInvalidValue;
  }
  // The tallest row tile that still gives about every SM a block (at least 3/4 of them): tall
  // tiles read each weight tile fewer times, but a 512-row chunk of a 1024-feature projection
  // needs short ones to fill the device. Measured on an H200 (bench/RESULTS.md).
  const int64_t sms = DeviceSmCount(), n_tiles = (out + kBN - 1) / kBN;
  if (rows > 64 && 4 * ((rows + 127) / 128) * n_tiles >= 3 * sms) {
    return LaunchGemm<128, OutT>(q, s_act, rows, w, w_scale, out, in, y, stream);
  }
  if (rows > 32 && 4 * ((rows + 63) / 64) * n_tiles >= 3 * sms) {
    return LaunchGemm<64, OutT>(q, s_act, rows, w, w_scale, out, in, y, stream);
  }
  return LaunchGemm<32, OutT>(q, s_act, rows, w, w_scale, out, in, y, stream);
}

}  // namespace

cudaError_t Fp8Gemm(const e4m3_t* q, const float* s_act, int64_t rows, const e4m3_t* w,
                    const ue8m0_t* w_scale, int64_t out, int64_t in, bf16_t* y,
                    cudaStream_t stream) {
  return GemmT(Raw(q), s_act, rows, Raw(w), Raw(w_scale), out, in, Raw(y), stream);
}
cudaError_t Fp8Gemm(const e4m3_t* q, const float* s_act, int64_t rows, const e4m3_t* w,
                    const ue8m0_t* w_scale, int64_t out, int64_t in, float* y,
                    cudaStream_t stream) {
  return GemmT(Raw(q), s_act, rows, Raw(w), Raw(w_scale), out, in, y, stream);
}

std::vector<SharedMemoryOptIn> Fp8GemmOptIns() {
  const auto opt_in = [](const char* name, auto* kernel, int bytes) {
    return SharedMemoryOptIn{name, reinterpret_cast<const void*>(kernel), bytes};
  };
  return {opt_in("Fp8Gemm (32-row tiles, bf16)", &Fp8GemmKernelImpl<32, uint16_t>,
                 kStages * StageBytes<32>()),
          opt_in("Fp8Gemm (64-row tiles, bf16)", &Fp8GemmKernelImpl<64, uint16_t>,
                 kStages * StageBytes<64>()),
          opt_in("Fp8Gemm (128-row tiles, bf16)", &Fp8GemmKernelImpl<128, uint16_t>,
                 kStages * StageBytes<128>()),
          opt_in("Fp8Gemm (32-row tiles, fp32)", &Fp8GemmKernelImpl<32, float>,
                 kStages * StageBytes<32>()),
          opt_in("Fp8Gemm (64-row tiles, fp32)", &Fp8GemmKernelImpl<64, float>,
                 kStages * StageBytes<64>()),
          opt_in("Fp8Gemm (128-row tiles, fp32)", &Fp8GemmKernelImpl<128, float>,
                 kStages * StageBytes<128>())};
}

const void* Fp8GemmKernel() {
  return reinterpret_cast<const void*>(&Fp8GemmKernelImpl<128, uint16_t>);
}

}  // namespace ss::cuda
