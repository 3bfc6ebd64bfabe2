// Grouped low-rank output projection (spec §3.10) with wo_a decoded from FP8 in registers;
// mirrors the wo_a loop of common/model/attention.cc (AttentionForward).
#include <algorithm>

#include "gpu_worker/kernels/fp8_common.cuh"
#include "gpu_worker/kernels/output_projection.h"
#include "gpu_worker/kernels/shared_memory.h"

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

// ---- Decode (T ≤ 8): the tensor cores take the multiply-adds ----------------------------------
//
// One block per 16 output rows (inside one group, rank % 16 == 0), its warps splitting K by
// 128-blocks, as Fp8Gemv does: the 16 × 16 weight tile is the A operand of m16n8k16 mma.sync
// (bf16), the ≤ 8 tokens' bf16 rows of o the B operand (n = token). Lane (g, q) takes 16 weight
// bytes of rows g and g+8 and 16 bf16 of token g's row per 64 k; each 4-byte word is one k16
// step (the same permutation of k for both operands, as U4Word). An e4m3 code becomes bf16 through
// f16 (code·2^-8, exact, subnormals included) and fp32, so each 128-block's mma partial is
// Σ o·code·2^-8 in fp32; times 2^8 (exact) it is added with the block's scale in one fma.
constexpr int kMmaRows = 16;
constexpr int kMmaMaxWarps = 16;

__device__ __forceinline__ uint32_t E4m3x2ToBf16x2(uint32_t w, uint32_t sel) {
  const float2 f = F16x2ToF32x2(E4m3x2ToF16x2(w, sel));
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(f.y), "f"(f.x));
  return r;
}

// A lane's operands of one 128-block.
struct OutProjBlock {
  uint4 wa[2], wb[2], x[4];  // x: 2 × 16 bytes per 64 k
  uint32_t sw;
};

__global__ void __launch_bounds__(32 * kMmaMaxWarps)
    GroupedOutProjMmaKernelImpl(const uint16_t* __restrict__ o, int T, int64_t groups, int64_t rank,
                                int64_t gin, const uint8_t* __restrict__ wa,
                                const uint8_t* __restrict__ ws, uint16_t* __restrict__ z) {
  __shared__ float red[kMmaMaxWarps * 128];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  const int nwarps = blockDim.x >> 5;
  const int64_t nb = gin / 128, rows = groups * rank;
  const int64_t o0 = static_cast<int64_t>(blockIdx.x) * kMmaRows, grp = o0 / rank;
  const uint8_t* pa = wa + (o0 + g) * gin + 16 * q;
  const uint8_t* pb = wa + (o0 + g + 8) * gin + 16 * q;
  const bool live = g < T;
  const uint16_t* px = o + (live ? g : 0) * groups * gin + grp * gin + 16 * q;
  const uint8_t* psw = ws + (o0 / 128) * nb;
  const int64_t kb0 = warp * nb / nwarps, kb1 = (warp + 1) * nb / nwarps;
  const auto load = [&](OutProjBlock& f, int64_t kb) {
    const int64_t off = kb * 128;
    for (int c = 0; c < 2; ++c) {  // weights are read once: streamed, evict-first
      f.wa[c] = __ldcs(reinterpret_cast<const uint4*>(pa + off + 64 * c));
      f.wb[c] = __ldcs(reinterpret_cast<const uint4*>(pb + off + 64 * c));
      for (int h = 0; h < 2; ++h) {
        f.x[2 * c + h] = live ? __ldg(reinterpret_cast<const uint4*>(px + off + 64 * c + 8 * h))
                              : make_uint4(0, 0, 0, 0);
      }
    }
    f.sw = __ldg(psw + kb);
  };
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  DoubleBufferedBlocks<OutProjBlock>(kb0, kb1, 1, load, [&](const OutProjBlock& cur) {
    float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int c = 0; c < 2; ++c) {
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        const uint32_t a = U4Word(cur.wa[c], s), b = U4Word(cur.wb[c], s);
        const uint4& xv = cur.x[2 * c + (s >> 1)];
        MmaBf16(p, E4m3x2ToBf16x2(a, 0x1404), E4m3x2ToBf16x2(b, 0x1404), E4m3x2ToBf16x2(a, 0x3424),
                E4m3x2ToBf16x2(b, 0x3424), U4Word(xv, 2 * (s & 1)), U4Word(xv, 2 * (s & 1) + 1));
      }
    }
    const float sw = Ue8m0ToF32(cur.sw);
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[j] = __fmaf_rn(__fmul_rn(p[j], 256.0f), sw, acc[j]);
  });
  // The warps' partials summed in warp order; d0,d1 = rows g (tokens 2q, 2q+1), d2,d3 = g+8:
  // z [T, rows] as Fp8Gemv's y.
  GemvReduceStore(acc, red, T, o0, rows, z);
}

// Prefill (T > 8): a GEMM per group on the tensor cores, as Fp8Gemm but with bf16 activations:
// a 64-token x 128-feature tile of z per block (the features inside one group and one weight
// scale row block), K (the group's inputs) streamed one 128-block per stage through a 3-stage
// cp.async pipeline: o's bf16 rows [64, 128] and wo_a's e4m3 codes [128, 128], both k-contiguous
// (A row-major, B "col" as mma takes them). Warp (wm, wn) owns tokens wm·32.. and features
// wn·32..; lane (g, t) reads 16 bytes of o (8 values) and 8 code bytes of wo_a per row per 32 k,
// the same k permutation for both (U4Word's), and decodes the codes to bf16 in registers. Each
// 128-block's fp32 mma partial is scaled by 2^8 and the block's scale in one fma, as the decode
// kernel adds it.
constexpr int kGemmBM = 64, kGemmBN = 128, kGemmStages = 3, kGemmThreads = 256;
constexpr int kGemmABytes = kGemmBM * 256, kGemmBBytes = kGemmBN * 128;
constexpr int kGemmStageBytes = kGemmABytes + kGemmBBytes;

// o rows are 256 bytes (16 chunks of 16): odd rows swap the two 64-byte halves of each 128, so a
// quarter-warp's two rows of 4 chunks cover all banks. wo_a rows are 128 bytes (8 chunks):
// Fp8Gemm's swizzle.
__device__ __forceinline__ int SwzA(int r, int c) { return r * 256 + ((c ^ ((r & 1) << 2)) << 4); }
__device__ __forceinline__ int SwzB(int r, int c) { return r * 128 + ((c ^ ((r & 3) << 1)) << 4); }

__global__ void __launch_bounds__(kGemmThreads)
    GroupedOutProjGemmKernelImpl(const uint16_t* __restrict__ o, int64_t T, int64_t groups,
                                 int64_t rank, int64_t gin, const uint8_t* __restrict__ wa,
                                 const uint8_t* __restrict__ ws, uint16_t* __restrict__ z) {
  extern __shared__ __align__(16) uint8_t smem[];
  const int tid = static_cast<int>(threadIdx.x), warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t = lane & 3, wm = warp >> 2, wn = warp & 3;
  const int64_t rows = groups * rank, nb = gin / 128;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kGemmBN, grp = n0 / rank;
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kGemmBM;
  const uint16_t* ob = o + grp * gin;  // token r's group inputs at ob + r·groups·gin
  const uint8_t* psw = ws + (n0 / 128) * nb;
  // Tokens past T repeat the last one; their results are not stored.
  const auto load = [&](int stage, int64_t kb) {
    uint8_t* a = smem + stage * kGemmStageBytes;
    uint8_t* b = a + kGemmABytes;
    for (int i = tid; i < kGemmBM * 16; i += kGemmThreads) {
      const int r = i >> 4, c = i & 15;
      CpAsync16(a + SwzA(r, c), ob + min(m0 + r, T - 1) * groups * gin + kb * 128 + c * 8);
    }
    for (int i = tid; i < kGemmBN * 8; i += kGemmThreads) {
      const int r = i >> 3, c = i & 7;
      CpAsync16(b + SwzB(r, c), wa + (n0 + r) * gin + kb * 128 + c * 16);
    }
  };
  float acc[2][4][4] = {};
  CpAsyncPipeline<kGemmStages>(nb, load, [&](int stage, int64_t kb) {
    const uint8_t* a = smem + stage * kGemmStageBytes;
    const uint8_t* b = a + kGemmABytes;
    float p[2][4][4] = {};
#pragma unroll
    for (int c32 = 0; c32 < 4; ++c32) {
      uint4 af[2][2];
      uint2 bf[4];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int r = wm * 32 + i * 16 + g;
        af[i][0] = *reinterpret_cast<const uint4*>(a + SwzA(r, 4 * c32 + t));
        af[i][1] = *reinterpret_cast<const uint4*>(a + SwzA(r + 8, 4 * c32 + t));
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        bf[j] = *reinterpret_cast<const uint2*>(b + SwzB(wn * 32 + j * 8 + g, 2 * c32 + (t >> 1)) +
                                                (t & 1) * 8);
      }
#pragma unroll
      for (int s2 = 0; s2 < 2; ++s2) {
        uint32_t b0[4], b1[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const uint32_t x = s2 ? bf[j].y : bf[j].x;
          b0[j] = E4m3x2ToBf16x2(x, 0x1404);
          b1[j] = E4m3x2ToBf16x2(x, 0x3424);
        }
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const uint32_t a0 = U4Word(af[i][0], 2 * s2), a2 = U4Word(af[i][0], 2 * s2 + 1);
          const uint32_t a1 = U4Word(af[i][1], 2 * s2), a3 = U4Word(af[i][1], 2 * s2 + 1);
#pragma unroll
          for (int j = 0; j < 4; ++j) MmaBf16(p[i][j], a0, a1, a2, a3, b0[j], b1[j]);
        }
      }
    }
    const float sw = __fmul_rn(Ue8m0ToF32(__ldg(psw + kb)), 256.0f);
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[i][j][e] = __fmaf_rn(p[i][j][e], sw, acc[i][j][e]);
  });
#pragma unroll
  for (int i = 0; i < 2; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t r = m0 + wm * 32 + i * 16 + g + 8 * h;
      if (r >= T) continue;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int64_t col = n0 + wn * 32 + j * 8 + 2 * t;
        *reinterpret_cast<uint32_t*>(z + r * rows + col) =
            static_cast<uint32_t>(F32ToBf16(acc[i][j][2 * h])) |
            (static_cast<uint32_t>(F32ToBf16(acc[i][j][2 * h + 1])) << 16);
      }
    }
  }
}

cudaError_t LaunchOutProjGemm(const uint16_t* o, int64_t T, int64_t groups, int64_t rank,
                              int64_t gin, const uint8_t* wa, const uint8_t* ws, uint16_t* z,
                              cudaStream_t stream) {
  constexpr int kSmem = kGemmStages * kGemmStageBytes;
  const dim3 grid(static_cast<unsigned>(groups * rank / kGemmBN),
                  static_cast<unsigned>((T + kGemmBM - 1) / kGemmBM));
  GroupedOutProjGemmKernelImpl<<<grid, kGemmThreads, kSmem, stream>>>(o, T, groups, rank, gin, wa,
                                                                      ws, z);
  return cudaGetLastError();
}

}  // namespace

cudaError_t GroupedOutputProjection(const bf16_t* o, int64_t T, int64_t groups, int64_t rank,
                                    int64_t group_in, const e4m3_t* wo_a_codes,
                                    const ue8m0_t* wo_a_scales, bf16_t* z, cudaStream_t stream) {
  const uint8_t *wo_a = Raw(wo_a_codes), *wo_a_scale = Raw(wo_a_scales);
  if (groups < 1 || rank < 1 || group_in < 128 || group_in % 128 != 0 || T < 0 ||
      reinterpret_cast<uintptr_t>(Raw(o)) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(wo_a) % 16 != 0) {
    return cudaErrorInvalidValue;
  }
  if (T == 0) return cudaSuccess;
  if (T <= 8 && rank % kMmaRows == 0) {
    const int64_t blocks = groups * rank / kMmaRows, nb = group_in / 128;
    const int64_t warps = GemvWarpsPerBlock(blocks, nb, kMmaMaxWarps);  // as Fp8Gemv
    GroupedOutProjMmaKernelImpl<<<static_cast<unsigned>(blocks), static_cast<unsigned>(32 * warps),
                                  0, stream>>>(Raw(o), static_cast<int>(T), groups, rank, group_in,
                                               wo_a, wo_a_scale, Raw(z));
    return cudaGetLastError();
  }
  if (rank % kGemmBN == 0 && (T + kGemmBM - 1) / kGemmBM <= 65535) {
    return LaunchOutProjGemm(Raw(o), T, groups, rank, group_in, wo_a, wo_a_scale, Raw(z), stream);
  }
  const int64_t row_blocks = (T + kRowChunk - 1) / kRowChunk;
  if (row_blocks > 65535) return cudaErrorInvalidValue;
  const unsigned blocks = static_cast<unsigned>((groups * rank + kWarps - 1) / kWarps);
  GroupedOutProjKernelImpl<<<dim3(blocks, static_cast<unsigned>(row_blocks)), kThreads, 0,
                             stream>>>(Raw(o), T, groups, rank, group_in, wo_a, wo_a_scale, Raw(z));
  return cudaGetLastError();
}

std::vector<SharedMemoryOptIn> GroupedOutputProjectionOptIns() {
  return {{"GroupedOutputProjection (GEMM)",
           reinterpret_cast<const void*>(&GroupedOutProjGemmKernelImpl),
           kGemmStages * kGemmStageBytes}};
}

const void* GroupedOutputProjectionKernel() {
  return reinterpret_cast<const void*>(&GroupedOutProjKernelImpl);
}
const void* GroupedOutputProjectionGemmKernel() {
  return reinterpret_cast<const void*>(&GroupedOutProjGemmKernelImpl);
}
const void* GroupedOutputProjectionMmaKernel() {
  return reinterpret_cast<const void*>(&GroupedOutProjMmaKernelImpl);
}

}  // namespace ss::cuda
