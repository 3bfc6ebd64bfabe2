// fp32 linear on bf16 inputs (model::LinearF32: compressor wkv/wgate, indexer weights_proj, the
// LM head of spec §3.12) and greedy argmax.

#include "gpu_worker/kernels/fp8_common.cuh"
#include "gpu_worker/kernels/head.h"
#include "gpu_worker/kernels/shared_memory.h"

namespace ss::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kRows = 8;       // token rows per pass over a weight row
constexpr int kRowChunk = 64;  // token rows per block row of the grid

__device__ __forceinline__ void Unpack8(uint4 v, float* f) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    f[2 * c] = Bf16ToF32(static_cast<uint16_t>(w[c] & 0xffffu));
    f[2 * c + 1] = Bf16ToF32(static_cast<uint16_t>(w[c] >> 16));
  }
}

// One weight matrix of a launch: w bf16 [out, in], y fp32 with row stride ldy.
struct Bf16Matrix {
  const uint16_t* w;
  int64_t out;
  float* y;
  int64_t ldy;
};

// grid (ceil(a.out / kWarps) + ceil(b.out / kWarps), ceil(rows / kRowChunk)), the first blocks0
// columns a's, the rest b's: one warp per output feature o; lane l sums the 8 consecutive inputs
// at 8l + 256i (one 16-byte load) in order for each of up to kRows token rows, then one warp
// reduction per row. The result does not depend on the batching or the launch's other matrix.
__global__ void __launch_bounds__(kThreads)
    LinearBf16F32KernelImpl(const uint16_t* __restrict__ x, int64_t rows, int64_t in, Bf16Matrix a,
                            Bf16Matrix b, int64_t blocks0) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const bool second = blockIdx.x >= blocks0;
  const uint16_t* __restrict__ w = second ? b.w : a.w;
  const int64_t out = second ? b.out : a.out, ldy = second ? b.ldy : a.ldy;
  float* __restrict__ y = second ? b.y : a.y;
  const int64_t o =
      (static_cast<int64_t>(blockIdx.x) - (second ? blocks0 : 0)) * kWarps + (threadIdx.x >> 5);
  if (o >= out) return;
  const uint16_t* wr = w + o * in;
  const int64_t r_begin = static_cast<int64_t>(blockIdx.y) * kRowChunk;
  const int64_t r_end = rows - r_begin < kRowChunk ? rows : r_begin + kRowChunk;
  for (int64_t r0 = r_begin; r0 < r_end; r0 += kRows) {
    const int nr = static_cast<int>(r_end - r0 < kRows ? r_end - r0 : kRows);
    float acc[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) acc[r] = 0.0f;
    // kAhead weight (and input) loads per lane issued before the in-order sums that use them: at
    // decode each warp's pass over its row is otherwise a chain of in / 256 dependent loads.
    constexpr int kAhead = 8;
    int64_t i = 8 * lane;
    for (; i + (kAhead - 1) * 256 < in; i += kAhead * 256) {
      uint4 wv[kAhead];
#pragma unroll
      for (int u = 0; u < kAhead; ++u) {
        wv[u] = __ldg(reinterpret_cast<const uint4*>(wr + i + u * 256));
      }
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        if (r < nr) {
          uint4 xv[kAhead];
#pragma unroll
          for (int u = 0; u < kAhead; ++u) {
            xv[u] = *reinterpret_cast<const uint4*>(x + (r0 + r) * in + i + u * 256);
          }
#pragma unroll
          for (int u = 0; u < kAhead; ++u) {
            float wf[8], xf[8];
            Unpack8(wv[u], wf);
            Unpack8(xv[u], xf);
#pragma unroll
            for (int c = 0; c < 8; ++c) acc[r] = __fadd_rn(acc[r], __fmul_rn(xf[c], wf[c]));
          }
        }
      }
    }
    for (; i < in; i += 256) {
      float wf[8];
      Unpack8(__ldg(reinterpret_cast<const uint4*>(wr + i)), wf);
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        if (r < nr) {
          float xf[8];
          Unpack8(*reinterpret_cast<const uint4*>(x + (r0 + r) * in + i), xf);
#pragma unroll
          for (int c = 0; c < 8; ++c) acc[r] = __fadd_rn(acc[r], __fmul_rn(xf[c], wf[c]));
        }
      }
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      float s = acc[r];
      for (int off = 16; off > 0; off >>= 1) s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, off));
      if (lane == 0 && r < nr) y[(r0 + r) * ldy + o] = s;
    }
  }
}

// More than kRows token rows (prefill): a GEMM on the tensor cores, a 64-row x 128-feature tile of
// y per block (the grid's first blocks0 columns a's tiles, the rest b's), K streamed 64 at a time
// through a 3-stage cp.async pipeline of both operands' bf16 rows (k-contiguous: A row-major, B
// "col" as mma takes them). Warp (wm, wn) owns rows wm·32.. and features wn·32..; lane (g, t)
// reads 16 bytes (8 values) of each row per 32 k, the same permutation of k for both operands
// (U4Word's). bf16 products are exact in fp32; the sums run in the mma's order.
constexpr int kGemmBM = 64, kGemmBN = 128, kGemmBK = 64, kGemmStages = 3;
constexpr int kGemmABytes = kGemmBM * kGemmBK * 2, kGemmBBytes = kGemmBN * kGemmBK * 2;
constexpr int kGemmStageBytes = kGemmABytes + kGemmBBytes;

// Rows of 128 bytes (8 chunks of 16): odd rows swap the two 64-byte halves, so a quarter-warp's
// two rows of 4 chunks cover all banks.
__device__ __forceinline__ int Swz128(int r, int c) {
  return r * 128 + ((c ^ ((r & 1) << 2)) << 4);
}

__global__ void __launch_bounds__(kThreads)
    LinearBf16F32GemmKernelImpl(const uint16_t* __restrict__ x, int64_t rows, int64_t in,
                                Bf16Matrix a, Bf16Matrix b, int64_t blocks0) {
  extern __shared__ __align__(16) uint8_t smem[];
  const int tid = static_cast<int>(threadIdx.x), warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t = lane & 3, wm = warp >> 2, wn = warp & 3;
  const bool second = blockIdx.x >= blocks0;
  const uint16_t* __restrict__ w = second ? b.w : a.w;
  const int64_t out = second ? b.out : a.out, ldy = second ? b.ldy : a.ldy;
  float* __restrict__ y = second ? b.y : a.y;
  const int64_t n0 = (static_cast<int64_t>(blockIdx.x) - (second ? blocks0 : 0)) * kGemmBN;
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kGemmBM, nk = in / kGemmBK;
  // Rows past `rows` and features past `out` repeat the last one; their results are not stored.
  const auto load = [&](int stage, int64_t kb) {
    uint8_t* sa = smem + stage * kGemmStageBytes;
    uint8_t* sb = sa + kGemmABytes;
    for (int i = tid; i < kGemmBM * 8; i += kThreads) {
      const int r = i >> 3, c = i & 7;
      CpAsync16(sa + Swz128(r, c), x + min(m0 + r, rows - 1) * in + kb * kGemmBK + c * 8);
    }
    for (int i = tid; i < kGemmBN * 8; i += kThreads) {
      const int r = i >> 3, c = i & 7;
      CpAsync16(sb + Swz128(r, c), w + min(n0 + r, out - 1) * in + kb * kGemmBK + c * 8);
    }
  };
  float acc[2][4][4] = {};
  CpAsyncPipeline<kGemmStages>(nk, load, [&](int stage, int64_t) {
    const uint8_t* sa = smem + stage * kGemmStageBytes;
    const uint8_t* sb = sa + kGemmABytes;
#pragma unroll
    for (int c32 = 0; c32 < 2; ++c32) {
      uint4 af[2][2], bf[4];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int r = wm * 32 + i * 16 + g;
        af[i][0] = *reinterpret_cast<const uint4*>(sa + Swz128(r, 4 * c32 + t));
        af[i][1] = *reinterpret_cast<const uint4*>(sa + Swz128(r + 8, 4 * c32 + t));
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        bf[j] = *reinterpret_cast<const uint4*>(sb + Swz128(wn * 32 + j * 8 + g, 4 * c32 + t));
      }
#pragma unroll
      for (int s2 = 0; s2 < 2; ++s2) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const uint32_t a0 = U4Word(af[i][0], 2 * s2), a2 = U4Word(af[i][0], 2 * s2 + 1);
          const uint32_t a1 = U4Word(af[i][1], 2 * s2), a3 = U4Word(af[i][1], 2 * s2 + 1);
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            MmaBf16(acc[i][j], a0, a1, a2, a3, U4Word(bf[j], 2 * s2), U4Word(bf[j], 2 * s2 + 1));
          }
        }
      }
    }
  });
#pragma unroll
  for (int i = 0; i < 2; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t r = m0 + wm * 32 + i * 16 + g + 8 * h;
      if (r >= rows) continue;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int64_t col = n0 + wn * 32 + j * 8 + 2 * t;
        if (col < out) y[r * ldy + col] = acc[i][j][2 * h];
        if (col + 1 < out) y[r * ldy + col + 1] = acc[i][j][2 * h + 1];
      }
    }
  }
}

// (v, i) beats (bv, bi): larger value, equal values to the lower index; bi < 0 is "none".
__device__ __forceinline__ bool Beats(float v, int64_t i, float bv, int64_t bi) {
  return bi < 0 || v > bv || (v == bv && i < bi);
}

// One block per row.
__global__ void __launch_bounds__(kThreads)
    ArgmaxKernelImpl(const float* __restrict__ logits, int64_t n, int64_t ld, int64_t id_base,
                     int32_t* __restrict__ ids, float* __restrict__ max_vals,
                     int32_t* __restrict__ nonfinite) {
  __shared__ float sv[kWarps];
  __shared__ int64_t si[kWarps];
  const float* row = logits + static_cast<int64_t>(blockIdx.x) * ld;
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  float bv = 0.0f;
  int64_t bi = -1;
  int bad = 0;
  for (int64_t i = tid; i < n; i += kThreads) {
    const float v = row[i];
    bad |= (v != v) | (v == __int_as_float(0x7f800000));
    if (v == v && Beats(v, i, bv, bi)) {
      bv = v;
      bi = i;
    }
  }
  bad = __syncthreads_or(bad);
  for (int off = 16; off > 0; off >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, off);
    const int64_t oi = __shfl_xor_sync(0xffffffffu, bi, off);
    if (oi >= 0 && Beats(ov, oi, bv, bi)) {
      bv = ov;
      bi = oi;
    }
  }
  if (lane == 0) {
    sv[warp] = bv;
    si[warp] = bi;
  }
  __syncthreads();
  if (tid == 0) {
    for (int wi = 1; wi < kWarps; ++wi) {
      if (si[wi] >= 0 && Beats(sv[wi], si[wi], bv, bi)) {
        bv = sv[wi];
        bi = si[wi];
      }
    }
    ids[blockIdx.x] = bi < 0 ? -1 : static_cast<int32_t>(id_base + bi);
    if (max_vals != nullptr) max_vals[blockIdx.x] = bi < 0 ? __uint_as_float(0x7fc00000u) : bv;
    if (nonfinite != nullptr) nonfinite[blockIdx.x] = bad;
  }
}

// The launch of one matrix (b.out = 0) or two on the same inputs.
cudaError_t LinearBf16F32Launch(const uint16_t* x, int64_t rows, int64_t in, const Bf16Matrix& a,
                                const Bf16Matrix& b, cudaStream_t stream) {
  const auto bad = [](const Bf16Matrix& m) {
    return m.out < 1 || m.ldy < m.out || reinterpret_cast<uintptr_t>(m.w) % 16 != 0;
  };
  if (in < 8 || in % 8 != 0 || rows < 0 || reinterpret_cast<uintptr_t>(x) % 16 != 0 || bad(a) ||
      (b.out != 0 && bad(b))) {
    return cudaErrorInvalidValue;
  }
  if (rows == 0) return cudaSuccess;
  if (rows > kRows && in % kGemmBK == 0 && (rows + kGemmBM - 1) / kGemmBM <= 65535) {
    constexpr int kSmem = kGemmStages * kGemmStageBytes;
    const int64_t tiles0 = (a.out + kGemmBN - 1) / kGemmBN;
    const int64_t tiles = tiles0 + (b.out + kGemmBN - 1) / kGemmBN;
    LinearBf16F32GemmKernelImpl<<<dim3(static_cast<unsigned>(tiles),
                                       static_cast<unsigned>((rows + kGemmBM - 1) / kGemmBM)),
                                  kThreads, kSmem, stream>>>(x, rows, in, a, b, tiles0);
    return cudaGetLastError();
  }
  const int64_t row_blocks = (rows + kRowChunk - 1) / kRowChunk;
  const int64_t blocks0 = (a.out + kWarps - 1) / kWarps;
  const int64_t out_blocks = blocks0 + (b.out + kWarps - 1) / kWarps;
  if (row_blocks > 65535 || out_blocks > INT32_MAX) return cudaErrorInvalidValue;
  LinearBf16F32KernelImpl<<<dim3(static_cast<unsigned>(out_blocks),
                                 static_cast<unsigned>(row_blocks)),
                            kThreads, 0, stream>>>(x, rows, in, a, b, blocks0);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LinearBf16F32(const bf16_t* x, int64_t rows, int64_t in, const bf16_t* w, int64_t out,
                          float* y, int64_t ldy, cudaStream_t stream) {
  return LinearBf16F32Launch(Raw(x), rows, in, {Raw(w), out, y, ldy}, {nullptr, 0, nullptr, 0},
                             stream);
}

cudaError_t LinearBf16F32Pair(const LinearBf16F32PairParams& p, cudaStream_t stream) {
  if (p.m1.out < 1) return cudaErrorInvalidValue;
  return LinearBf16F32Launch(Raw(p.x), p.rows, p.in, {Raw(p.m0.w), p.m0.out, p.m0.y, p.m0.ldy},
                             {Raw(p.m1.w), p.m1.out, p.m1.y, p.m1.ldy}, stream);
}

cudaError_t LmHead(const bf16_t* u, int64_t T, int64_t dim, const bf16_t* head, int64_t n_rows,
                   float* logits, int64_t ld, cudaStream_t stream) {
  return LinearBf16F32(u, T, dim, head, n_rows, logits, ld, stream);
}

cudaError_t ArgmaxRows(const float* logits, int64_t T, int64_t n, int64_t ld, int64_t id_base,
                       int32_t* ids, float* max_vals, int32_t* nonfinite, cudaStream_t stream) {
  if (n < 1 || ld < n || T < 0 || T > INT32_MAX || id_base < 0 || id_base + n > INT32_MAX) {
    return cudaErrorInvalidValue;
  }
  if (T == 0) return cudaSuccess;
  ArgmaxKernelImpl<<<static_cast<unsigned>(T), kThreads, 0, stream>>>(logits, n, ld, id_base, ids,
                                                                      max_vals, nonfinite);
  return cudaGetLastError();
}

std::vector<SharedMemoryOptIn> LinearBf16F32OptIns() {
  return {{"LinearBf16F32 (GEMM)", reinterpret_cast<const void*>(&LinearBf16F32GemmKernelImpl),
           kGemmStages * kGemmStageBytes}};
}

const void* LinearBf16F32Kernel() {
  return reinterpret_cast<const void*>(&LinearBf16F32KernelImpl);
}
const void* LinearBf16F32GemmKernel() {
  return reinterpret_cast<const void*>(&LinearBf16F32GemmKernelImpl);
}
const void* ArgmaxKernel() { return reinterpret_cast<const void*>(&ArgmaxKernelImpl); }

}  // namespace ss::cuda
