// CUDA kernels of the GPU worker (spec §3, §5), built for sm_86 + compute_86 PTX only: no FP8
// tensor-core instructions, no wgmma, TMA or clusters. FP8 values are decoded in registers and
// multiplied exactly, in fp32 or on the tensor cores as f16 (see Fp8Linear).
//
// Every kernel takes raw device pointers, sizes, a stream and caller-owned workspace, never
// allocates, and returns the launch's cudaError_t; shape validation happens one layer up
// (STYLE.md "Interfaces"). Activations are bf16 ([rows, n] row-major), weights are the
// checkpoint's bytes ([out, in] e4m3 with ue8m0 128x128 block scales).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ss::cuda {

// The most shared memory, static and dynamic, one block may take on SM 8.6 (cudaDevAttrMax-
// SharedMemoryPerBlockOptin of an RTX 3090: 99 KiB). Every kernel here keeps to it, also where the
// device allows more (an H200: 227 KiB), so that what runs on the test machine runs on the target.
inline constexpr int kSm86MaxSharedPerBlock = 101376;

// Opts `kernel` in to `bytes` of dynamic shared memory: cudaErrorInvalidValue, nothing set, where
// its static shared memory and `bytes` together pass kSm86MaxSharedPerBlock. Wrap it in
// OncePerDevice (fp8_common.cuh).
inline cudaError_t OptInSharedMemory(const void* kernel, int bytes) {
  cudaFuncAttributes a{};
  const cudaError_t e = cudaFuncGetAttributes(&a, kernel);
  if (e != cudaSuccess) return e;
  if (a.sharedSizeBytes + static_cast<size_t>(bytes) > kSm86MaxSharedPerBlock) {
    return cudaErrorInvalidValue;
  }
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}

// HcPost's operands other than the sublayer output x (block_kernels.h's HcPost): the old streams
// `residual` [T, hc, dim], post [T, hc], comb [T, hc, hc] and the new streams `out` [T, hc, dim]
// (bf16; out must not alias residual in the kernels that take this struct). For the kernels that
// run HcPost on a result they have just formed.
struct HcPostOperands {
  const uint16_t* residual = nullptr;
  const float* post = nullptr;
  const float* comb = nullptr;
  int64_t hc = 0;
  int64_t dim = 0;
  uint16_t* out = nullptr;
  float* out_f32 = nullptr;  // set: also the new streams as fp32 (a stage's output), exact
};

// y[r] = bf16(g ⊙ x[r] · rsqrt(mean(x[r]²) + eps)), fp32 math. g: fp32 [n].
cudaError_t RmsNorm(const uint16_t* x, const float* g, int64_t rows, int64_t n, float eps,
                    uint16_t* y, cudaStream_t stream);

// Per-row activation quantisation of spec §5.2: 1x128 blocks, power-of-two scales from the
// fp32 bits of amax·(1/448) (amax floored at 1e-4), q = e4m3(clamp(x/s, ±448)).
// q: [rows, n] e4m3 bytes, s: [rows, ceil(n/128)] fp32.
cudaError_t QuantizeActE4m3(const uint16_t* x, int64_t rows, int64_t n, uint8_t* q, float* s,
                            cudaStream_t stream);

// RmsNorm, then QuantizeActE4m3 of its output, in one launch (one block per row): y, q and s
// are the same bits as the two calls give. For n = 1024, 2048 and 4096 the row stays in
// registers and shared memory between the two (one read of x and g).
cudaError_t RmsNormQuant(const uint16_t* x, const float* g, int64_t rows, int64_t n, float eps,
                         uint16_t* y, uint8_t* q, float* s, cudaStream_t stream);

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
// Fp8Linear picks the path: Fp8Gemv for rows ≤ kFp8GemvMaxRows (decode), Fp8Gemm above
// (prefill, verification). Where in % 128 != 0 or q/w are not 16-byte aligned it falls back to
// a plain fp32 kernel (one warp per output feature). The three may be called directly; each
// result is the same function of the inputs up to summation order.
inline constexpr int64_t kFp8GemvMaxRows = 8;

cudaError_t Fp8Linear(const uint8_t* q, const float* s_act, int64_t rows, const uint8_t* w,
                      const uint8_t* w_scale, int64_t out, int64_t in, uint16_t* y,
                      cudaStream_t stream);

// Fp8Linear on quantised activations, then HcPost of its bf16 result as the sublayer output:
// one launch in decode (rows ≤ kFp8GemvMaxRows on the fast path), the HcPost in the GEMV's
// epilogue (the same bits); otherwise the two launches (y needed).
cudaError_t Fp8LinearHcPost(const uint8_t* q, const float* s_act, int64_t rows, const uint8_t* w,
                            const uint8_t* w_scale, int64_t out, int64_t in, uint16_t* y,
                            const HcPostOperands& hp, cudaStream_t stream);

// Fp8Linear of two weight matrices on the same activations (the shared expert's w1 and w3): for
// rows ≤ kFp8GemvMaxRows on the fast path, one Fp8Gemv launch whose blocks cover both (a 2-8 MiB
// matrix alone leaves the GPU mostly waiting on launch and tail latency). Each output is what
// Fp8Gemv computes with the launch's warps per block, which follow the blocks of both together:
// where that equals each matrix's own count (every matrix at least one block per SM), the bits
// are the two Fp8Gemv calls'. Otherwise the two Fp8Linear calls.
cudaError_t Fp8LinearPair(const uint8_t* q, const float* s_act, int64_t rows, int64_t in,
                          const uint8_t* w0, const uint8_t* w_scale0, int64_t out0, uint16_t* y0,
                          const uint8_t* w1, const uint8_t* w_scale1, int64_t out1, uint16_t* y1,
                          cudaStream_t stream);

// Decode GEMV, bound by the weight bytes: one block per one or two tiles of 16 output features
// (the mma's A operand), its warps taking K's 128-blocks in turn, the ≤ 8 activation rows the B
// operand, so each
// weight byte is read once for all rows and batch 8 costs about what batch 1 does. More rows
// run in passes of 8. Falls back to the plain kernel where in % 128 != 0 or q/w are unaligned.
// Only static shared memory: safe to call during CUDA-graph capture.
cudaError_t Fp8Gemv(const uint8_t* q, const float* s_act, int64_t rows, const uint8_t* w,
                    const uint8_t* w_scale, int64_t out, int64_t in, uint16_t* y,
                    cudaStream_t stream);

// Prefill GEMM: 32/64/128 x 128 output tiles (the tallest that still fills about every SM), K
// in 128-blocks through a 3-stage cp.async pipeline of raw e4m3 codes (up to 97.5 KiB of dynamic
// shared memory, within SM 8.6's 99 KiB), decoded per fragment. Needs in % 128 == 0 and 16-byte
// aligned q and w; returns cudaErrorInvalidValue otherwise. The first call per tile height on a
// device sets the kernel's shared-memory opt-in (cudaFuncSetAttribute): make one call before
// capturing a CUDA graph that contains it.
cudaError_t Fp8Gemm(const uint8_t* q, const float* s_act, int64_t rows, const uint8_t* w,
                    const uint8_t* w_scale, int64_t out, int64_t in, uint16_t* y,
                    cudaStream_t stream);

// The plain fallback: any in, any alignment; fp32 products and sums on the CUDA cores.
cudaError_t Fp8LinearGeneric(const uint8_t* q, const float* s_act, int64_t rows, const uint8_t* w,
                             const uint8_t* w_scale, int64_t out, int64_t in, uint16_t* y,
                             cudaStream_t stream);

// The same four with an fp32 output: y[r, o] = Σ_b (Σ_{i∈b} q·w) · s_a · s_w as summed, without
// the final bf16 rounding. A TP rank's share of a row-parallel projection (wo_b, the shared
// expert's w2) is this over its slice of `in` (whole 128-blocks, so the activation quantisation
// is the one of the full row); the ranks' partials summed in fp32 by the all-reduce and rounded
// to bf16 once equal Linear8 up to fp32 summation order. The same kernels, templated on the
// output type: the bf16 variants' arithmetic is unchanged.
cudaError_t Fp8Linear(const uint8_t* q, const float* s_act, int64_t rows, const uint8_t* w,
                      const uint8_t* w_scale, int64_t out, int64_t in, float* y,
                      cudaStream_t stream);
cudaError_t Fp8Gemv(const uint8_t* q, const float* s_act, int64_t rows, const uint8_t* w,
                    const uint8_t* w_scale, int64_t out, int64_t in, float* y, cudaStream_t stream);
cudaError_t Fp8Gemm(const uint8_t* q, const float* s_act, int64_t rows, const uint8_t* w,
                    const uint8_t* w_scale, int64_t out, int64_t in, float* y, cudaStream_t stream);
cudaError_t Fp8LinearGeneric(const uint8_t* q, const float* s_act, int64_t rows, const uint8_t* w,
                             const uint8_t* w_scale, int64_t out, int64_t in, float* y,
                             cudaStream_t stream);

// ---- Elementwise combine and conversion (elementwise.cu) ------------------------------------------

// y[i] = bf16(routed[i] + bf16(shared[i])), fp32 add, round to nearest even, i < n: the MoE
// combine of the reference (model::MoeForward: the shared expert's output is bf16, the routed sum
// fp32) on the all-reduced sums of the TP ranks' shared-expert and routed-expert partials.
cudaError_t MoeCombineF32(const float* shared, const float* routed, int64_t n, uint16_t* y,
                          cudaStream_t stream);

// y[i] = bf16(x[i]) (round to nearest even), i < n: the all-reduced sum rounded once, as the
// single-GPU projection rounds its fp32 accumulator.
cudaError_t RoundF32ToBf16(const float* x, int64_t n, uint16_t* y, cudaStream_t stream);

// y[i] = bf16(routed[i] + shared[i]) in fp32 (the MoE combine, model::MoeForward: the shared
// expert's bf16 output plus the routed experts' fp32 sum); a null shared or routed reads 0.
cudaError_t MoeCombineBf16(const uint16_t* shared, const float* routed, int64_t n, uint16_t* y,
                           cudaStream_t stream);

// y[i] = float(x[i]): bf16 streams to the interface's fp32 streams (exact).
cudaError_t Bf16ToF32(const uint16_t* x, int64_t n, float* y, cudaStream_t stream);

// Addresses of the kernels' entry points, for attribute queries (ptxVersion) in tests.
const void* RmsNormKernel();
const void* RmsNormQuantKernel();
const void* RmsNormQuantRegsKernel();  // RmsNormQuant for n = 4096 (and 1024, 2048)
const void* QuantizeActE4m3Kernel();
const void* Fp8LinearHcPostKernel();   // Fp8LinearHcPost's decode launch
const void* Fp8LinearKernel();         // the decode GEMV
const void* Fp8GemmKernel();           // the prefill GEMM (128-row tiles)
const void* Fp8LinearGenericKernel();  // the plain fallback
const void* MoeCombineF32Kernel();
const void* RoundF32ToBf16Kernel();
const void* MoeCombineBf16Kernel();
const void* Bf16ToF32Kernel();

}  // namespace ss::cuda
