// Internal: the one ISA-specific operation behind every expert kernel, and the ISA-independent
// driver around it (expert_kernels.cc).
//
// Linear4Rows computes, for n activation rows and `rows` MXFP4 weight rows of length k,
//   y[i][r] (epilogue) Σ_{g in K order} fp32(exact Σ_{j<32} q[i][32g+j]·e2m1(w[r][32g+j]))
//                                       · sa[i][g/4] · ue8m0(s[r][g])
// with the fp32 accumulator starting at +0, exactly as ss::model::Linear4 does.
//
// Activation rows. The scalar definition reads the e4m3 values as floats in natural order. The
// SIMD variants read an ACTIVATION RECORD per 128-block instead (same size: 512 bytes = 128
// floats, so every buffer sized in floats fits either), written by the same ISA's quantiser:
//   bytes [0, 384)   three u8 PLANES of 128 bytes (offset kPlaneOffset[p]), together holding
//                    A = |q|·2^9, an integer < 2^18 with at most 4 significant bits M·2^b:
//                      plane 2 = A >> 10 if b >= 10, plane 1 = A >> 5 if 5 <= b <= 9,
//                      plane 0 = A if b <= 4 (each <= 240), the others 0;
//                    so A = plane2·2^10 + plane1·2^5 + plane0.
//                    Within each span of `span` elements (AVX2 64, AVX-512 128: one vector of
//                    packed weight bytes) the even elements come first, then the odd ones
//                    (PlanePosition): the order of the low and high nibbles of the packed bytes.
//   bytes [384, 448) the SIGN MASK: byte j has bit 3 set if element 2j is negative and bit 7 if
//                    element 2j+1 is: XORed into weight byte j it moves the activation's sign
//                    into the e2m1 codes.
//   bytes [448, 452) fp32 sa·2^-10 (the block's scale times the unit of A·2e2m1), or NaN when
//                    the block holds a NaN code (then every output it touches is NaN, as in the
//                    reference; NaN payloads may differ).
//   bytes [452, 454) AVX2 only, the PLANE MASK: byte 452 + c has bit p set if plane p holds a
//                    nonzero value in span c (elements 64c..64c+63); the kernel skips an
//                    all-zero plane. Not written by the AVX-512 quantiser. Bytes [454, 512):
//                    unused.
// With 2·e2m1 in [-12, 12] as int8 (one table lookup per nibble), a 32-group's exact partial is
// the int32 Σ_p 2^(5p) Σ_j plane_p[j]·w[j] (u8 × s8 dot products: vpdpbusd, or vpmaddubsw +
// vpmaddwd), |Σ| < 2^27, and its conversion to fp32 rounds once, exactly where the scalar
// definition rounds its exact double sum: the SIMD variants are BIT-IDENTICAL to the scalar
// definition, whatever the inputs (NaN payloads aside).
//
// ISA translation units (avx2/, avx512/) are compiled with extra -m flags, so they include no
// header that could emit an inline function (absl, <vector>, <algorithm>): a linker could keep
// that AVX copy for everyone. This header is plain data and declarations only (its constexpr
// function is used in constant expressions only).
#pragma once

#include <cstdint>

namespace ss::expert::internal {

enum class Epilogue : int {
  kStoreBf16 = 0,  // y[i][r] = bf16(acc)          (w1/w3 outputs)
  kAddF32 = 1,     // y[i][r] += acc               (w2 partial into the fp32 output)
  kAddBf16 = 2,    // y[i][r] += bf16(acc)         (w2 with round_expert_outputs)
};

// The activation record of a 128-block (see above).
inline constexpr int64_t kRecordBytes = 512;
inline constexpr int64_t kPlaneOffset[3] = {256, 128, 0};  // plane p at kPlaneOffset[p]
inline constexpr int64_t kSignOffset = 384;
inline constexpr int64_t kScaleOffset = 448;
inline constexpr int64_t kPlaneMaskOffset = 452;  // AVX2: one byte per 64-span

// Where element e (0..127) of a block lands in a plane, for vectors of `span` elements.
inline constexpr int64_t PlanePosition(int64_t e, int64_t span) {
  const int64_t j = e % span;
  return e / span * span + (j % 2) * (span / 2) + j / 2;
}

struct Linear4Args {
  const uint8_t* w = nullptr;  // row r at w + r·w_stride, k/2 bytes (w_tile_rows = 0)
  int64_t w_stride = 0;
  // 0: rows as above. T > 0: TILED (ExpertSliceView::tile_rows): the rows in tiles of T, tile t
  // at w + t·T·w_stride (w_stride = k/2), inside it K block kb's 64 bytes of its row j at
  // kb·T·64 + j·64 -- the order a kernel with T-row tiles reads them, one sequential stream. T is
  // a multiple of the kernel's tile (AVX-512 16, AVX2 8), and a call's first row (and next_w's)
  // the first row of one of its tiles.
  int64_t w_tile_rows = 0;
  const uint8_t* s = nullptr;  // row r at s + r·s_stride, k/32 bytes
  int64_t s_stride = 0;
  int64_t rows = 0;                  // a multiple of 16
  int64_t k = 0;                     // a multiple of 128
  int64_t n = 0;                     // activation rows, >= 1
  const float* const* q = nullptr;   // [n] -> k/128 records (SIMD) or k floats (scalar)
  const float* const* sa = nullptr;  // [n] -> k/128 activation scales
  float* const* y = nullptr;  // [n] -> rows outputs; entries may repeat (then added in i order)
  Epilogue epilogue = Epilogue::kStoreBf16;
  float* scratch = nullptr;  // Linear4ScratchFloats(k, n) floats, 64-byte aligned
  // Optional: the rows the caller reads next (same k and strides, `next_rows` of them). The
  // software prefetch runs on into them instead of stopping at the end of these rows.
  const uint8_t* next_w = nullptr;
  const uint8_t* next_s = nullptr;
  int64_t next_rows = 0;
};

// The AMX variant's row block: the weight rows whose K blocks it decodes together.
inline constexpr int64_t kAmxRowBlock = 256;

// Scratch of the AMX variant's tile path for n activation rows (padded to 16): decoded weight
// tiles [row tile][group] 1 KB each, the tokens' X and Y tile rows [row][group] 64 bytes each,
// two pairs of int32 result tiles, the weight scales [row tile][group][16] and activation scales of
// one K block, accumulators [n][kAmxRowBlock].
inline constexpr int64_t Linear4AmxScratchFloats(int64_t n) {
  const int64_t padded = (n + 15) / 16 * 16, tiles = kAmxRowBlock / 16;
  return tiles * 4 * 256 + padded * 2 * 4 * 16 + 4 * 256 + tiles * 4 * 16 + padded +
         n * kAmxRowBlock;
}

// Scratch every variant may use: transposed weight scales [k/32][16], accumulators [n][16],
// one decoded tile [16][128], one decoded row [k], the multi-row paths' wide records
// (384 bytes, 512 reserved) and their 8-byte meta per row and K block; or the AMX tile path's.
inline constexpr int64_t Linear4ScratchFloats(int64_t k, int64_t n) {
  const int64_t simd = (k / 32) * 16 + n * 16 + 16 * 128 + k + n * k + n * (k / 128) * 2,
                amx = Linear4AmxScratchFloats(n);
  return simd > amx ? simd : amx;
}

using Linear4Fn = void (*)(const Linear4Args&);
// Two calls whose activations are the same (q, sa, n, k; the first's scratch serves both):
// exactly Linear4(a) then Linear4(b). A variant may share work between them (gate_up's w1 and w3).
using Linear4PairFn = void (*)(const Linear4Args& a, const Linear4Args& b);

void Linear4Scalar(const Linear4Args& a);  // ref/expert_ref.cc: the definition
void Linear4Avx2(const Linear4Args& a);    // avx2/expert_avx2.cc (AVX2 + FMA)
void Linear4PairAvx2(const Linear4Args& a, const Linear4Args& b);  // widens the records once
void Linear4Avx512(const Linear4Args& a);  // avx512/expert_avx512.cc (F, BW, VL, DQ, VNNI)
void Linear4PairAvx512(const Linear4Args& a, const Linear4Args& b);  // widens the records once
// amx/expert_amx.cc (the AVX-512 set + VBMI, AMX-TILE, AMX-INT8): AVX-512 records and weight tiles;
// calls of few activation rows run Linear4Avx512. The calling thread must have permission to use
// the tile data state (dispatch.cc requests it for the process).
void Linear4Amx(const Linear4Args& a);
void Linear4PairAmx(const Linear4Args& a, const Linear4Args& b);  // splits the records once

// The activation quantiser of every variant: exactly ss::QuantizeActE4m3(x, n, 128, codes,
// scales) (codes and scales bit-identical) for n a multiple of 128; `scales` gets n/128 floats,
// `codes` (n bytes) may be null. If `q` is not null it also gets the ISA's activation layout
// (64-byte aligned): scalar e4m3[code] floats in natural order (e4m3: the 256-entry
// ss::E4m3ToFloat table); SIMD one record per 128-block (e4m3 unused).
// Scalar: internal::QuantizeActScalar (expert_kernels.cc).
using QuantizeActFn = void (*)(const float* x, int64_t n, uint8_t* codes, float* scales, float* q,
                               const float* e4m3);
// avx2/quantize_avx2.cc: span 64.
void QuantizeActAvx2(const float* x, int64_t n, uint8_t* codes, float* scales, float* q,
                     const float* e4m3);
// avx512/quantize_avx512.cc: span 128 (the AVX-512 and AMX kernels' records).
void QuantizeActAvx512(const float* x, int64_t n, uint8_t* codes, float* scales, float* q,
                       const float* e4m3);

}  // namespace ss::expert::internal
