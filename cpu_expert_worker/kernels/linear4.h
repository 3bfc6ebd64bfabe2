// Internal: the one ISA-specific operation behind every expert kernel, and the ISA-independent
// driver around it (expert_kernels.cc).
//
// Linear4Rows computes, for n activation rows and `rows` MXFP4 weight rows of length k,
//   y[i][r] (epilogue) Σ_{g in K order} fp32(exact Σ_{j<32} q[i][32g+j]·e2m1(w[r][32g+j]))
//                                       · sa[i][g/4] · ue8m0(s[r][g])
// with the fp32 accumulator starting at +0, exactly as ss::model::Linear4 does. The activation
// rows hold e4m3 values as floats, permuted within each run of `groups_per_vector` 32-groups to
// the order in which the ISA decodes nibbles (PermutedIndex below); the scalar definition uses
// the natural order (groups_per_vector = 0).
//
// ISA translation units (avx2/, avx512/) are compiled with extra -m flags, so they include no
// header that could emit an inline function (absl, <vector>, <algorithm>): a linker could keep
// that AVX copy for everyone. This header is plain data and declarations only.
#pragma once

#include <cstdint>

namespace ss::expert::internal {

enum class Epilogue : int {
  kStoreBf16 = 0,  // y[i][r] = bf16(acc)          (w1/w3 outputs)
  kAddF32 = 1,     // y[i][r] += acc               (w2 partial into the fp32 output)
  kAddBf16 = 2,    // y[i][r] += bf16(acc)         (w2 with round_expert_outputs)
};

struct Linear4Args {
  const uint8_t* w = nullptr;  // row r at w + r·w_stride, k/2 bytes
  int64_t w_stride = 0;
  const uint8_t* s = nullptr;  // row r at s + r·s_stride, k/32 bytes
  int64_t s_stride = 0;
  int64_t rows = 0;                  // a multiple of 16
  int64_t k = 0;                     // a multiple of 128
  int64_t n = 0;                     // activation rows, >= 1
  const float* const* q = nullptr;   // [n] -> k permuted e4m3 values
  const float* const* sa = nullptr;  // [n] -> k/128 activation scales
  float* const* y = nullptr;  // [n] -> rows outputs; entries may repeat (then added in i order)
  Epilogue epilogue = Epilogue::kStoreBf16;
  float* scratch = nullptr;  // Linear4ScratchFloats(k, n) floats, 64-byte aligned
};

// Scratch every variant may use: transposed weight scales [k/32][16], accumulators [n][16],
// one decoded tile [16][128], one decoded row [k].
inline constexpr int64_t Linear4ScratchFloats(int64_t k, int64_t n) {
  return (k / 32) * 16 + n * 16 + 16 * 128 + k;
}

using Linear4Fn = void (*)(const Linear4Args&);

void Linear4Scalar(const Linear4Args& a);  // ref/expert_ref.cc: the definition
void Linear4Avx2(const Linear4Args& a);    // avx2/expert_avx2.cc (AVX2 + FMA)
void Linear4Avx512(const Linear4Args& a);  // avx512/expert_avx512.cc (F, BW, VL, DQ)

// The activation quantiser of every variant: exactly ss::QuantizeActE4m3(x, n, 128, codes,
// scales) (codes and scales bit-identical) for n a multiple of 128; `scales` gets n/128 floats,
// `codes` (n bytes) may be null. If `q` is not null it also gets e4m3[code] (e4m3: the 256-entry
// ss::E4m3ToFloat table) for every element, in the ISA's PermutedIndex(·, gpv) layout (64-byte
// aligned). Scalar: internal::QuantizeActScalar (expert_kernels.cc, gpv 0).
using QuantizeActFn = void (*)(const float* x, int64_t n, uint8_t* codes, float* scales, float* q,
                               const float* e4m3);
void QuantizeActAvx2(const float* x, int64_t n, uint8_t* codes, float* scales, float* q,
                     const float* e4m3);  // gpv 2
void QuantizeActAvx512(const float* x, int64_t n, uint8_t* codes, float* scales, float* q,
                       const float* e4m3);  // gpv 4

// Where natural element `e` of a K-row lands in the permuted layout of an ISA that decodes
// `gpv` 32-groups per vector (AVX2: 2, AVX-512: 4; 0 = natural order). Within each run of gpv
// groups, vector v (0..7) holds in lane L (group L of the run) the elements
// 4d + 2·(v&1) + 16·((v>>1)&1) + (v>>2), d = 0..3: the order in which splitting a byte vector
// into low/high nibbles, widening bytes to words and words to dwords produces them.
inline constexpr int64_t PermutedIndex(int64_t e, int gpv) {
  if (gpv == 0) return e;
  const int64_t run = 32 * gpv, lane = e % run / 32, j = e % 32;
  // j = 4d + 2·(v&1) + 16·((v>>1)&1) + (v>>2): bit 0 is v>>2, bit 1 is v&1, bits 2-3 are d,
  // bit 4 is (v>>1)&1.
  const int64_t v = (j & 1) * 4 + ((j >> 4) & 1) * 2 + ((j >> 1) & 1), d = (j >> 2) & 3;
  return e / run * run + v * 4 * gpv + lane * 4 + d;
}

// inv[p] = the natural element of a 128-block that lands at p in the layout of `gpv`.
struct InversePermutation {
  int32_t inv[128];
  constexpr explicit InversePermutation(int gpv) : inv{} {
    for (int e = 0; e < 128; ++e) inv[PermutedIndex(e, gpv)] = e;
  }
};

}  // namespace ss::expert::internal
