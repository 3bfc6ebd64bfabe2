// The reference model's linear algebra, bit-faithful to the official demo's kernels
// (spec §5.2, golden README "How the reference was produced").
//
// Activations are float arrays whose values are bf16-representable; outputs of ops the demo
// runs in bf16 are rounded to bf16. Exact partial sums are formed in double and rounded to fp32
// once, which is what an fp32 GEMM with exact products gives up to summation order. All
// functions are pure (thread-safe) and parallelise internally with OpenMP where it pays.
#pragma once

#include <cstdint>
#include <cstring>

#include "common/bf16.h"

namespace ss::model {

// FP8 e4m3 weight [out, in] with ue8m0 128x128 block scales [ceil(out/128), ceil(in/128)],
// pointing into the mapped checkpoint.
struct Fp8Weight {
  const uint8_t* w = nullptr;
  const uint8_t* s = nullptr;
  int64_t out = 0, in = 0;
  // The dequantised value (exact in bf16 and fp32).
  float At(int64_t o, int64_t i) const;
  // Row o dequantised into dst[in]: At(o, i) for every i, without the per-element lookups.
  void Row(int64_t o, float* dst) const;
};

// MXFP4 weight: I8 [out, in/2] (element 2j = low nibble) with ue8m0 scales [out, in/32].
struct Fp4Weight {
  const uint8_t* w = nullptr;
  const uint8_t* s = nullptr;
  int64_t out = 0, in = 0;
};

// A BF16 matrix [rows, cols] in the checkpoint (unaligned: read through memcpy).
struct Bf16Matrix {
  const uint8_t* data = nullptr;
  int64_t rows = 0, cols = 0;
  float At(int64_t r, int64_t c) const {
    uint16_t b;
    std::memcpy(&b, data + 2 * (r * cols + c), 2);
    return Bf16ToFloat(b);
  }
  void Row(int64_t r, float* out) const;
};

// Linear8 (spec §5.2): per-row e4m3 activation quantisation in 1x128 blocks with power-of-two
// scales, per-block exact sums times both scales accumulated in K order in fp32, bf16 output.
// x: [rows, w.in], y: [rows, w.out].
void Linear8(const Fp8Weight& w, const float* x, int64_t rows, float* y);
// Linear4: e4m3 activations (1x128 blocks) times e2m1 weights, one fp32 partial per 32-wide
// K block times s_act[k/4]·s_w, accumulated in K order, bf16 output.
void Linear4(const Fp4Weight& w, const float* x, int64_t rows, float* y);
// y = x · Wᵀ with fp32 output (no rounding to bf16): the demo's fp32 linears (compressor,
// router, LM head) on bf16-valued weights.
void LinearF32(const Bf16Matrix& w, const float* x, int64_t rows, float* y);
// LinearF32 on an fp32 matrix w [outs, n]: y [rows, outs], each sum DotF32(x_r, w_o, n).
void LinearRowsF32(const float* w, int64_t outs, int64_t n, const float* x, int64_t rows,
                   float* y);
// Rows [o0, o0 + outs) of an FP8 weight dequantised exactly (Fp8Weight::Row) times strided x:
// y[r·ldy + o] = DotF32(x + r·ldx, Row(o0 + o), w.in) for r < rows, o < outs.
void LinearFp8RowsF32(const Fp8Weight& w, int64_t o0, int64_t outs, const float* x, int64_t ldx,
                      int64_t rows, float* y, int64_t ldy);
// y = bf16(x · Wᵀ): a bf16 F.linear (indexer weights_proj).
void LinearBf16(const Bf16Matrix& w, const float* x, int64_t rows, float* y);

// RMSNorm over n values, fp32 math: bf16(g ⊙ (x · rsqrt(mean(x²) + eps))). g: fp32 weights.
void RmsNorm(const float* x, const float* g, int64_t n, float eps, float* y);
// The mean of squares as torch computes it: sum · fp32(1/n).
float MeanSquare(const float* x, int64_t n);

// The vector ISA of the linears' kernels: chosen from the CPU (AVX2 + FMA, else SSE2), both
// giving the same bits. Tests force each in turn (not thread-safe against running linears;
// kAuto restores the CPU's choice).
enum class LinearIsa { kAuto, kSse2, kAvx2 };
void ForceLinearIsaForTesting(LinearIsa isa);

// Work (multiply-adds) from which the model's loops run in parallel.
inline constexpr int64_t kParallelMinWork = int64_t{1} << 23;

// Dot product of two float arrays formed exactly in double and rounded to fp32 once.
float DotF32(const float* a, const float* b, int64_t n);
// Four DotF32(a, b[k], n) at once: the same sequential double sum per k (bit-identical results),
// interleaved so the four dependency chains overlap.
void DotF32x4(const float* a, const float* const* b, int64_t n, float* out);

}  // namespace ss::model
