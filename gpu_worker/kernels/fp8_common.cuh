// Device helpers shared by the FP8 kernels: exact e4m3/ue8m0/bf16 conversions in plain integer
// and fp32 arithmetic (no FP8 conversion instructions: SM 8.6 has none).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ss::cuda {

__device__ __forceinline__ float Bf16ToF32(uint16_t b) {
  return __uint_as_float(static_cast<uint32_t>(b) << 16);
}

// Round-to-nearest-even; NaN stays NaN.
__device__ __forceinline__ uint16_t F32ToBf16(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// An fp32 result stored as the kernel's output type: bf16 (rounded once) or fp32 (as summed,
// the TP partials of a row-parallel projection).
__device__ __forceinline__ void StoreOut(uint16_t* p, float v) { *p = F32ToBf16(v); }
__device__ __forceinline__ void StoreOut(float* p, float v) { *p = v; }

__device__ __forceinline__ float E4m3ToF32(uint32_t c) {
  const uint32_t sign = (c & 0x80u) << 24, exp = (c >> 3) & 0xfu, man = c & 0x7u;
  if (exp == 0) {
    const float v = static_cast<float>(man) * 0.001953125f;  // man · 2^-9
    return sign ? -v : v;
  }
  if (exp == 0xf && man == 0x7) return __uint_as_float(0x7fc00000u);
  return __uint_as_float(sign | ((exp + 120u) << 23) | (man << 20));
}

__device__ __forceinline__ float Ue8m0ToF32(uint32_t b) {
  if (b == 255) return __uint_as_float(0x7fc00000u);
  return b == 0 ? __uint_as_float(0x00400000u) : __uint_as_float(b << 23);
}

// Round-to-nearest-even onto the e4m3 grid, saturating to ±448; x already clamped by callers.
__device__ __forceinline__ uint8_t F32ToE4m3(float x) {
  const uint32_t u = __float_as_uint(x), a = u & 0x7fffffffu;
  const uint32_t sign = (u >> 24) & 0x80u;
  if (a > 0x7f800000u) return 0x7f;                                 // NaN
  if (a >= 0x43e00000u) return static_cast<uint8_t>(sign | 0x7eu);  // |x| ≥ 448
  if (a < 0x3c800000u) {                                            // |x| < 2^-6: subnormal
    return static_cast<uint8_t>(sign | __float2int_rn(__fmul_rn(__uint_as_float(a), 512.0f)));
  }
  // Normal: the exponent and 3 mantissa bits are bits 20-30 of a, rounded to nearest even at bit
  // 20 (a carry moves into the exponent); the e4m3 exponent bias is 7, fp32's 127.
  const uint32_t code = ((a + 0x7ffffu + ((a >> 20) & 1u)) >> 20) - (120u << 3);
  return static_cast<uint8_t>(sign | (code > 0x7eu ? 0x7eu : code));
}

// One pair of an interleaved RoPE rotation (ss::ApplyRope), in place: (a, b) at v[0], v[1]
// (s = −sin: the inverse rotation). rope.cu's kernels and the attention's output de-rotation.
__device__ __forceinline__ void RotatePair(uint16_t* v, float c, float s) {
  const float a = Bf16ToF32(v[0]), b = Bf16ToF32(v[1]);
  v[0] = F32ToBf16(__fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s)));
  v[1] = F32ToBf16(__fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c)));
}

// 2^ceil(log2(max(amax, floor) * fp32(1/qmax))) from the fp32 bits (spec §5.2).
__device__ __forceinline__ float Pow2Scale(float amax, float amax_floor, float qmax) {
  const float a = fmaxf(amax, amax_floor);
  const uint32_t bits = __float_as_uint(__fmul_rn(a, __frcp_rn(qmax)));
  int e = static_cast<int>((bits >> 23) & 0xff) - 127;
  if (bits & 0x7fffffu) ++e;
  return ldexpf(1.0f, e);
}

// Spec §5.2 for one 1x128 activation block held by a warp, lane l holding elements 4l .. 4l+3
// (v: fp32 values of bf16 numbers; `valid` of the block's 128 are inside the row): the block's
// power-of-two scale from the warp's amax, the e4m3 codes of the valid elements to q[4l + j],
// the scale to *s (lane 0). QuantizeActE4m3 and the kernels that quantise what they produce
// (RmsNormQuant, SwiGluBf16Quant) share it, so their codes and scales are the same bits.
__device__ __forceinline__ void QuantizeBlock128(const float (&v)[4], int lane, int64_t valid,
                                                 uint8_t* __restrict__ q, float* __restrict__ s) {
  float amax = 0.0f;
#pragma unroll
  for (int j = 0; j < 4; ++j) amax = fmaxf(amax, fabsf(v[j]));
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float sc = Pow2Scale(amax, 1e-4f, 448.0f);
  // sc is a power of two, so 1/sc is exact and v·(1/sc) is v/sc correctly rounded: the same bits.
  const float inv = __frcp_rn(sc);
  uint32_t codes = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    codes |= static_cast<uint32_t>(F32ToE4m3(fminf(fmaxf(__fmul_rn(v[j], inv), -448.0f), 448.0f)))
             << (8 * j);
  }
  if (valid >= 128 && reinterpret_cast<uintptr_t>(q) % 4 == 0) {
    reinterpret_cast<uint32_t*>(q)[lane] = codes;
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int k = lane * 4 + j;
      if (k < valid) q[k] = static_cast<uint8_t>(codes >> (8 * j));
    }
  }
  if (lane == 0) *s = sc;
}

// A kernel that quantises what it produces: lane l of the warp owning 128-block b of a row of n
// values computes elements 128b + 4l + j (j < 4) with value(i) (an fp32 result, rounded to
// bf16 here), stores them to out_row and quantises the block (QuantizeBlock128) to q_row / s.
template <typename Value>
__device__ __forceinline__ void ProduceAndQuantizeBlock128(const Value& value, int lane, int64_t b,
                                                           int64_t n,
                                                           uint16_t* __restrict__ out_row,
                                                           uint8_t* __restrict__ q_row,
                                                           float* __restrict__ s) {
  float v[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int64_t i = b * 128 + lane * 4 + j;
    if (i < n) {
      const uint16_t o = F32ToBf16(value(i));
      out_row[i] = o;
      v[j] = Bf16ToF32(o);
    } else {
      v[j] = 0.0f;
    }
  }
  QuantizeBlock128(v, lane, n - b * 128, q_row + b * 128, s);
}

// Two e4m3 codes of `w` (bytes 0,1 with sel = 0x1404; bytes 2,3 with sel = 0x3424) as an f16x2,
// each half holding the code's value times 2^-8, exactly: the 7 magnitude bits shifted into an
// fp16's exponent and mantissa fields are that value for every code, subnormals included (an
// e4m3 subnormal lands on an fp16 subnormal). The lower byte goes to the lower half, as mma.sync
// expects. A product of two such operands is the exact e4m3 product times 2^-16 (kF16Unscale).
__device__ __forceinline__ uint32_t E4m3x2ToF16x2(uint32_t w, uint32_t sel) {
  const uint32_t h = __byte_perm(w, 0u, sel);  // [0, lo code, 0, hi code]
  return (h & 0x80008000u) | ((h >> 1) & 0x3f803f80u);
}
constexpr float kF16Unscale = 65536.0f;

// The two halves of an f16x2 as fp32 (exact).
__device__ __forceinline__ float2 F16x2ToF32x2(uint32_t h) {
  float2 f;
  asm("{\n.reg .b16 lo, hi;\nmov.b32 {lo, hi}, %2;\ncvt.f32.f16 %0, lo;\ncvt.f32.f16 %1, hi;\n}"
      : "=f"(f.x), "=f"(f.y)
      : "r"(h));
  return f;
}

// Whether 16 e4m3 codes under ue8m0 scale byte `sb` may be decoded through E4m3x2ToF16x2 and one
// multiply by 2^(sb−127)·2^8: no NaN code (|code| = 0x7f) and the scaled factor finite.
__device__ __forceinline__ bool Fp8FastDecodeOk(const uint4& w, uint32_t sb) {
  // A byte's low 7 bits plus 1 carries into its bit 7 only from 0x7f (never into the next byte).
  const uint32_t m = 0x7f7f7f7fu, one = 0x01010101u;
  const uint32_t carry =
      ((w.x & m) + one) | ((w.y & m) + one) | ((w.z & m) + one) | ((w.w & m) + one);
  return sb <= 246 && (carry & 0x80808080u) == 0;
}

// d += a·b on the tensor cores (sm_80+): m16n8k16, f16 inputs, fp32 accumulation. Fragment
// layouts (PTX ISA "mma.m16n8k16"), lane = 4·g + t: a0 = A[g][2t..2t+1], a1 = A[g+8][2t..],
// a2 = A[g][2t+8..], a3 = A[g+8][2t+8..]; b0 = B[2t..2t+1][g], b1 = B[2t+8..][g];
// d0,d1 = D[g][2t..2t+1], d2,d3 = D[g+8][2t..2t+1].
// SS_MMA_M16N8K16("bf16") is the same with bf16 operands (the grouped wo_a projection, the
// split attention kernel); the one asm statement, the operand type spelled into its string.
#define SS_MMA_M16N8K16(TYPE)                                \
  asm("mma.sync.aligned.m16n8k16.row.col.f32." TYPE "." TYPE \
      ".f32 {%0,%1,%2,%3}, "                                 \
      "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"             \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])       \
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1))
__device__ __forceinline__ void MmaF16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                       uint32_t a3, uint32_t b0, uint32_t b1) {
  SS_MMA_M16N8K16("f16");
}
__device__ __forceinline__ void MmaBf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                        uint32_t a3, uint32_t b0, uint32_t b1) {
  SS_MMA_M16N8K16("bf16");
}
#undef SS_MMA_M16N8K16

// k16 step `s` (0..3) of 64 bytes of e4m3 codes split as 16 per lane t (bytes 16t..16t+15):
// lane t's word s holds the codes that mma.sync calls k = 2t, 2t+1 (bytes 0,1) and 2t+8, 2t+9
// (bytes 2,3). Both operands use the same permutation of k, so each dot product is unchanged.
__device__ __forceinline__ uint32_t U4Word(const uint4& v, int s) {
  return s == 0 ? v.x : s == 1 ? v.y : s == 2 ? v.z : v.w;
}

// Asynchronous global -> shared copies (sm_80+), 16 bytes through L2 only or 4 bytes.
__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void CpAsync16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(SmemAddr(dst)), "l"(src));
}
__device__ __forceinline__ void CpAsync4(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(SmemAddr(dst)), "l"(src));
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// The prefill GEMMs' shared-memory pipeline: K-blocks 0 .. nk - 1 flow through kStages stages of
// cp.async copies. load(stage, kb) issues K-block kb's copies into `stage`; consume(stage, kb)
// runs once they have landed for the whole block, while the next kStages - 1 blocks' copies are in
// flight. Every copy has landed when it returns.
template <int kStages, typename Load, typename Consume>
__device__ __forceinline__ void CpAsyncPipeline(int64_t nk, const Load& load,
                                                const Consume& consume) {
  for (int st = 0; st < kStages - 1; ++st) {
    if (st < nk) load(st, static_cast<int64_t>(st));
    CpAsyncCommit();
  }
  for (int64_t kb = 0; kb < nk; ++kb) {
    CpAsyncWait<kStages - 2>();
    __syncthreads();  // stage kb landed for all; stage kb - 1 is free to refill
    const int64_t next = kb + kStages - 1;
    if (next < nk) load(static_cast<int>(next % kStages), next);
    CpAsyncCommit();
    consume(static_cast<int>(kb % kStages), kb);
  }
  CpAsyncWait<0>();
}

// Multiprocessors of the current device (1 if it cannot be read), for launch heuristics.
inline int DeviceSmCount() {
  int dev = 0, n = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
    return 1;
  }
  return n;
}

// ---- Element-wise kernels: a grid-stride loop over n elements ---------------------------------

// fn(i) for each i < n this thread owns.
template <typename Fn>
__device__ __forceinline__ void GridStride(int64_t n, const Fn& fn) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    fn(i);
  }
}

// Blocks of `threads` for a grid-stride kernel over n elements: one element a thread, at most 4096.
inline unsigned GridStrideBlocks(int64_t n, int threads) {
  const int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 4096 ? b : 4096);
}

// ---- The decode GEMVs' shared skeleton (Fp8Gemv, the wo_a decode kernel) ----------------------
//
// A block computes 16 output features (rows o0 .. o0 + 15) for up to 8 activation rows, its warps
// splitting K by 128-blocks; in each warp lane (g, t) holds the m16n8 accumulator fragment of rows
// g and g + 8 and activation rows 2t, 2t + 1.

// Warps per block: many when there are fewer blocks than SMs (small outputs, latency-bound);
// otherwise about two 128-blocks per warp, at most 8, so several blocks share each SM.
inline int64_t GemvWarpsPerBlock(int64_t blocks, int64_t nb, int64_t max_warps) {
  if (blocks < DeviceSmCount()) return nb < max_warps ? nb : max_warps;
  const int64_t w = nb / 2 < 1 ? 1 : nb / 2;
  return w < 8 ? w : 8;
}

// The 128-blocks kb0, kb0 + step, ... below kb1 of a warp, double-buffered: the next block's
// operands are loaded (load(Block&, kb)) while the current one is multiplied (step(const Block&)).
template <typename Block, typename Load, typename Step>
__device__ __forceinline__ void DoubleBufferedBlocks(int64_t kb0, int64_t kb1, int64_t stride,
                                                     const Load& load, const Step& step) {
  Block cur, nxt;
  if (kb0 < kb1) load(cur, kb0);
  for (int64_t kb = kb0; kb < kb1; kb += stride) {
    if (kb + stride < kb1) load(nxt, kb + stride);
    step(cur);
    cur = nxt;
  }
}

// Sums the warps' accumulators in warp order and passes the block's 16 x rows sums to
// store(r, o, sum) for o < out, r < rows (thread i < 128 of the block owns output i: row
// GemvOutRow(i), feature o0 + GemvOutFeature(i)). `red`: nwarps·128 floats of shared memory not
// in use.
__device__ __forceinline__ int GemvOutRow(int i) { return 2 * ((i >> 2) & 3) + (i & 1); }
__device__ __forceinline__ int GemvOutFeature(int i) { return (i >> 4) + ((i & 3) >= 2 ? 8 : 0); }
template <typename Store>
__device__ __forceinline__ void GemvReduce(const float (&acc)[4], float* red, int rows, int64_t o0,
                                           int64_t out, const Store& store) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nwarps = blockDim.x >> 5;
  for (int j = 0; j < 4; ++j) red[warp * 128 + lane * 4 + j] = acc[j];
  __syncthreads();
  for (int i = threadIdx.x; i < 128; i += blockDim.x) {
    float sum = 0.0f;
    for (int v = 0; v < nwarps; ++v) sum = __fadd_rn(sum, red[v * 128 + i]);
    const int64_t o = o0 + GemvOutFeature(i);
    const int r = GemvOutRow(i);
    if (r < rows && o < out) store(r, o, sum);
  }
}
// y[r · out + o] = the sum (rounded to bf16 for a bf16 y).
template <typename OutT>
__device__ __forceinline__ void GemvReduceStore(const float (&acc)[4], float* red, int rows,
                                                int64_t o0, int64_t out, OutT* y) {
  GemvReduce(acc, red, rows, o0, out,
             [&](int r, int64_t o, float sum) { StoreOut(y + r * out + o, sum); });
}

}  // namespace ss::cuda
