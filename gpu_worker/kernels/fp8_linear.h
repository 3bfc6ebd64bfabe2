// FP8 linear layers (spec §5.2, model::Linear8) on quantised activations: the activation
// quantisation, the linear with its decode GEMV / prefill GEMM / plain fallback, and the decode
// launches that fuse it with its neighbour (HcPost, a second weight matrix). Contract: README.md.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "gpu_worker/kernels/hyper_connection.h"
#include "gpu_worker/kernels/types.h"

namespace ss::cuda {

// Per-row activation quantisation of spec §5.2: 1x128 blocks, power-of-two scales from the
// fp32 bits of amax·(1/448) (amax floored at 1e-4), q = e4m3(clamp(x/s, ±448)).
// x: bf16 [rows, n]; q: [rows, n] e4m3 bytes, s: [rows, ceil(n/128)] fp32.
cudaError_t QuantizeActE4m3(const bf16_t* x, int64_t rows, int64_t n, e4m3_t* q, float* s,
                            cudaStream_t stream);

// Linear8 (spec §5.2) on quantised activations: y[r, o] = bf16(Σ_b (Σ_{i∈b} q·w) · s_a · s_w),
// q: [rows, in] e4m3 codes from QuantizeActE4m3, s_act: [rows, nb = ceil(in/128)], w: [out, in]
// e4m3, w_scale: [ceil(out/128), nb] ue8m0, y: [rows, out] bf16.
//
// Both fast paths run on the tensor cores with m16n8k16 mma.sync on f16 operands (sm_80+, no
// FP8 instructions): every e4m3 code is decoded in registers, by three integer operations per
// pair, to an f16 holding its value times 2^-8, which is exact for all codes, subnormals too
// (bf16 would need a rebias that breaks for e4m3 subnormals). A product of two decoded codes is
// therefore the exact e4m3 product times 2^-16; the tensor cores sum each 128-block's products
// in fp32, and that block partial is multiplied by s_a·s_w·2^16 (powers of two: exact) and added
// to an fp32 accumulator with one rounding, as Linear8 adds its block sums. Results agree with
// Linear8 up to fp32 summation order (Linear8 sums each block in double, the tensor cores in
// fp32 with their own rounding).
//
// Fp8Linear picks the path: Fp8Gemv for rows ≤ kFp8GemvMaxRows (decode), Fp8Gemm (fp8_gemm.h)
// above (prefill, verification). Where in % 128 != 0 or q/w are not 16-byte aligned it falls back
// to Fp8LinearGeneric. The three may be called directly; each result is the same function of the
// inputs up to summation order.
inline constexpr int64_t kFp8GemvMaxRows = 8;

cudaError_t Fp8Linear(const e4m3_t* q, const float* s_act, int64_t rows, const e4m3_t* w,
                      const ue8m0_t* w_scale, int64_t out, int64_t in, bf16_t* y,
                      cudaStream_t stream);

// Fp8Linear on quantised activations, then HcPost of its bf16 result as the sublayer output
// (hyper_connection.h; hp.out must not alias hp.residual): one launch in decode (rows ≤
// kFp8GemvMaxRows on the fast path), the HcPost in the GEMV's epilogue (the same bits); otherwise
// the two launches (y needed).
struct Fp8LinearHcPostParams {
  const e4m3_t* q = nullptr;     // [rows, in], from QuantizeActE4m3
  const float* s_act = nullptr;  // [rows, ceil(in/128)]
  int64_t rows = 0;
  const e4m3_t* w = nullptr;         // [out, in]
  const ue8m0_t* w_scale = nullptr;  // [ceil(out/128), ceil(in/128)]
  int64_t out = 0;                   // = hp.dim
  int64_t in = 0;
  bf16_t* y = nullptr;  // [rows, out]; not written on the one-launch path
  HcPostOperands hp;
};
cudaError_t Fp8LinearHcPost(const Fp8LinearHcPostParams& p, cudaStream_t stream);

// Fp8Linear of two weight matrices on the same activations (the shared expert's w1 and w3): for
// rows ≤ kFp8GemvMaxRows on the fast path, one Fp8Gemv launch whose blocks cover both (a 2-8 MiB
// matrix alone leaves the GPU mostly waiting on launch and tail latency). Each output is what
// Fp8Gemv computes with the launch's warps per block, which follow the blocks of both together:
// where that equals each matrix's own count (every matrix at least one block per SM), the bits
// are the two Fp8Gemv calls'. Otherwise the two Fp8Linear calls.
struct Fp8PairMatrix {
  const e4m3_t* w = nullptr;         // [out, in]
  const ue8m0_t* w_scale = nullptr;  // [ceil(out/128), ceil(in/128)]
  int64_t out = 0;
  bf16_t* y = nullptr;  // [rows, out]
};
struct Fp8LinearPairParams {
  const e4m3_t* q = nullptr;     // [rows, in], from QuantizeActE4m3
  const float* s_act = nullptr;  // [rows, ceil(in/128)]
  int64_t rows = 0;
  int64_t in = 0;
  Fp8PairMatrix m0;
  Fp8PairMatrix m1;
};
cudaError_t Fp8LinearPair(const Fp8LinearPairParams& p, cudaStream_t stream);

// Decode GEMV, bound by the weight bytes: one block per one or two tiles of 16 output features
// (the mma's A operand), its warps taking K's 128-blocks in turn, the ≤ 8 activation rows the B
// operand, so each weight byte is read once for all rows. More rows run in passes of 8. Falls
// back to the plain kernel where in % 128 != 0 or q/w are unaligned. Only static shared memory:
// safe to call during CUDA-graph capture.
cudaError_t Fp8Gemv(const e4m3_t* q, const float* s_act, int64_t rows, const e4m3_t* w,
                    const ue8m0_t* w_scale, int64_t out, int64_t in, bf16_t* y,
                    cudaStream_t stream);

// The plain fallback: any in, any alignment; one warp per output feature, fp32 products and sums
// on the CUDA cores.
cudaError_t Fp8LinearGeneric(const e4m3_t* q, const float* s_act, int64_t rows, const e4m3_t* w,
                             const ue8m0_t* w_scale, int64_t out, int64_t in, bf16_t* y,
                             cudaStream_t stream);

// The same with an fp32 output: y[r, o] = Σ_b (Σ_{i∈b} q·w) · s_a · s_w as summed, without the
// final bf16 rounding. A TP rank's share of a row-parallel projection (wo_b, the shared expert's
// w2) is this over its slice of `in` (whole 128-blocks, so the activation quantisation is the one
// of the full row); the ranks' partials summed in fp32 by the all-reduce and rounded to bf16 once
// equal Linear8 up to fp32 summation order. The same kernels, templated on the output type: the
// bf16 variants' arithmetic is unchanged.
cudaError_t Fp8Linear(const e4m3_t* q, const float* s_act, int64_t rows, const e4m3_t* w,
                      const ue8m0_t* w_scale, int64_t out, int64_t in, float* y,
                      cudaStream_t stream);
cudaError_t Fp8Gemv(const e4m3_t* q, const float* s_act, int64_t rows, const e4m3_t* w,
                    const ue8m0_t* w_scale, int64_t out, int64_t in, float* y, cudaStream_t stream);
cudaError_t Fp8LinearGeneric(const e4m3_t* q, const float* s_act, int64_t rows, const e4m3_t* w,
                             const ue8m0_t* w_scale, int64_t out, int64_t in, float* y,
                             cudaStream_t stream);

const void* QuantizeActE4m3Kernel();
const void* Fp8LinearHcPostKernel();   // Fp8LinearHcPost's decode launch
const void* Fp8LinearKernel();         // the decode GEMV
const void* Fp8LinearGenericKernel();  // the plain fallback

}  // namespace ss::cuda
