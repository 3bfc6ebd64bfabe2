// Grouped low-rank output projection (spec §3.10) with wo_a decoded from FP8 in registers;
// mirrors the wo_a loop of common/model/attention.cc (AttentionForward).
#include "gpu_worker/kernels/compressor_kernels.h"
#include "gpu_worker/kernels/fp8_common.cuh"

namespace ss::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kRows = 8;       // tokens per pass over a weight row
constexpr int kRowChunk = 64;  // tokens per block row of the grid

// grid (ceil(groups·rank / kWarps), ceil(T / kRowChunk)): one warp per output row gr of group
// g = gr / rank. Lane l handles the 16 consecutive inputs at 16l + 512i (one 16-byte weight load
// inside one 128-block, so one scale), keeps one fp32 partial per token and the warp reduces
// once.
__global__ void __launch_bounds__(kThreads)
    GroupedOutProjKernelImpl(const uint16_t* __restrict__ o, int64_t T, int64_t groups,
                             int64_t rank, int64_t gin, const uint8_t* __restrict__ wa,
                             const uint8_t* __restrict__ ws, uint16_t* __restrict__ z) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int64_t gr = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  const int64_t rows = groups * rank;
  if (gr >= rows) return;
  const int64_t g = gr / rank, nbi = gin / 128;
  const uint8_t* wrow = wa + gr * gin;
  const uint8_t* srow = ws + (gr / 128) * nbi;
  const int64_t t_begin = static_cast<int64_t>(blockIdx.y) * kRowChunk;
  const int64_t t_end = T - t_begin < kRowChunk ? T : t_begin + kRowChunk;
  for (int64_t t0 = t_begin; t0 < t_end; t0 += kRows) {
    const int nr = static_cast<int>(t_end - t0 < kRows ? t_end - t0 : kRows);
    float acc[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) acc[r] = 0.0f;
    // The next two weight loads are in flight while one is decoded and used.
    const auto wload = [&](int64_t i) {
      return i < gin ? __ldcs(reinterpret_cast<const uint4*>(wrow + i)) : make_uint4(0, 0, 0, 0);
    };
    uint4 w1 = wload(16 * lane), w2 = wload(16 * lane + 512);
    for (int64_t i = 16 * lane; i < gin; i += 512) {
      const uint4 wb = w1;
      w1 = w2;
      w2 = wload(i + 1024);
      const uint32_t wv[4] = {wb.x, wb.y, wb.z, wb.w};
      const uint32_t sb = srow[i / 128];
      float wf[16];
      if (Fp8FastDecodeOk(wb, sb)) {
        // code·2^-8 as f16 (exact), times sc·2^8 (exact): the same product as code·sc.
        const float sc = __fmul_rn(Ue8m0ToF32(sb), 256.0f);
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          float2 f = F16x2ToF32x2(E4m3x2ToF16x2(wv[c], 0x1404));
          wf[4 * c] = __fmul_rn(f.x, sc);
          wf[4 * c + 1] = __fmul_rn(f.y, sc);
          f = F16x2ToF32x2(E4m3x2ToF16x2(wv[c], 0x3424));
          wf[4 * c + 2] = __fmul_rn(f.x, sc);
          wf[4 * c + 3] = __fmul_rn(f.y, sc);
        }
      } else {
        const float sc = Ue8m0ToF32(sb);
#pragma unroll
        for (int c = 0; c < 16; ++c) {
          wf[c] = __fmul_rn(E4m3ToF32((wv[c >> 2] >> (8 * (c & 3))) & 0xffu), sc);
        }
      }
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        if (r < nr) {
          const uint4* xp =
              reinterpret_cast<const uint4*>(o + (t0 + r) * groups * gin + g * gin + i);
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const uint4 xv = xp[h];
            const uint32_t xw[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
            for (int c = 0; c < 8; ++c) {
              const float x = Bf16ToF32(static_cast<uint16_t>(xw[c >> 1] >> (16 * (c & 1))));
              acc[r] = __fadd_rn(acc[r], __fmul_rn(x, wf[8 * h + c]));
            }
          }
        }
      }
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      float s = acc[r];
      for (int off = 16; off > 0; off >>= 1) s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, off));
      if (lane == 0 && r < nr) z[(t0 + r) * rows + gr] = F32ToBf16(s);
    }
  }
}

}  // namespace

cudaError_t GroupedOutputProjection(const uint16_t* o, int64_t T, int64_t groups, int64_t rank,
                                    int64_t group_in, const uint8_t* wo_a,
                                    const uint8_t* wo_a_scale, uint16_t* z, cudaStream_t stream) {
  if (groups < 1 || rank < 1 || group_in < 128 || group_in % 128 != 0 || T < 0 ||
      reinterpret_cast<uintptr_t>(o) % 16 != 0 || reinterpret_cast<uintptr_t>(wo_a) % 16 != 0) {
    return cudaErrorInvalidValue;
  }
  if (T == 0) return cudaSuccess;
  const int64_t row_blocks = (T + kRowChunk - 1) / kRowChunk;
  if (row_blocks > 65535) return cudaErrorInvalidValue;
  const unsigned blocks = static_cast<unsigned>((groups * rank + kWarps - 1) / kWarps);
  GroupedOutProjKernelImpl<<<dim3(blocks, static_cast<unsigned>(row_blocks)), kThreads, 0,
                             stream>>>(o, T, groups, rank, group_in, wo_a, wo_a_scale, z);
  return cudaGetLastError();
}

const void* GroupedOutputProjectionKernel() {
  return reinterpret_cast<const void*>(&GroupedOutProjKernelImpl);
}

}  // namespace ss::cuda
