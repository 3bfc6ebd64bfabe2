// Internal, for the AVX-512 translation units only (avx512/, amx/): vector code both compile
// with the AVX-512 flags. Everything is in an unnamed namespace ON PURPOSE, as in isa_shared.h:
// each including file compiles its own copy with its own flags and internal linkage.
#pragma once

// GCC 12 warns inside its own AVX-512 headers (the _mm512_undefined_* placeholders) once those
// intrinsics are inlined; the warning is about the header, not this code. (Clang has no
// -Wmaybe-uninitialized.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#pragma GCC diagnostic pop

#include "cpu_expert_worker/kernels/linear4.h"

namespace ss::expert::internal {
namespace {

// ue8m0 bytes in dword lanes -> 2^(b-127) as fp32 bits (b = 0: the subnormal 2^-127,
// b = 255: NaN).
inline __m512i Ue8m0Bits(__m512i b) {
  __m512i bits = _mm512_slli_epi32(b, 23);
  bits = _mm512_mask_mov_epi32(bits, _mm512_cmpeq_epi32_mask(b, _mm512_setzero_si512()),
                               _mm512_set1_epi32(0x00400000));
  return _mm512_mask_mov_epi32(bits, _mm512_cmpeq_epi32_mask(b, _mm512_set1_epi32(255)),
                               _mm512_set1_epi32(0x7fc00000));
}

// The four groups' scales of one K block (st[kb]) as fp32, one vector per group (lane = row).
// Bytes 1..254 are 2^(b-127) by a shift alone; a 0 (the subnormal 2^-127) or 255 (NaN) takes
// the full decode.
inline void GroupScales(__m512i v, __m512 (&sw)[4]) {
  const __mmask64 special = _mm512_cmpeq_epi8_mask(v, _mm512_setzero_si512()) |
                            _mm512_cmpeq_epi8_mask(v, _mm512_set1_epi8(-1));
  if (special == 0) {
    const __m512i exp = _mm512_set1_epi32(0x7f800000);
    sw[0] = _mm512_castsi512_ps(_mm512_and_si512(_mm512_slli_epi32(v, 23), exp));
    sw[1] = _mm512_castsi512_ps(_mm512_and_si512(_mm512_slli_epi32(v, 15), exp));
    sw[2] = _mm512_castsi512_ps(_mm512_and_si512(_mm512_slli_epi32(v, 7), exp));
    sw[3] = _mm512_castsi512_ps(_mm512_and_si512(_mm512_srli_epi32(v, 1), exp));
    return;
  }
  for (int i = 0; i < 4; ++i) {
    sw[i] = _mm512_castsi512_ps(
        Ue8m0Bits(_mm512_and_si512(_mm512_srli_epi32(v, 8 * i), _mm512_set1_epi32(0xff))));
  }
}

// 2·e2m1(code) as int8, in every 128-bit lane.
inline __m512i E2m1Table() {
  return _mm512_broadcast_i32x4(
      _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12));
}

// ss::RoundBf16 on 16 lanes (round to nearest even; NaN -> quiet NaN).
inline __m512 RoundBf16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v), top = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i r =
      _mm512_and_si512(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb)), top);
  const __m512i nan = _mm512_or_si512(_mm512_and_si512(u, top), _mm512_set1_epi32(0x00400000));
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_castsi512_ps(r),
                              _mm512_castsi512_ps(nan));
}

inline void Store(Epilogue e, float* y, __m512 acc) {
  switch (e) {
    case Epilogue::kStoreBf16:
      _mm512_storeu_ps(y, RoundBf16(acc));
      break;
    case Epilogue::kAddF32:
      _mm512_storeu_ps(y, _mm512_add_ps(_mm512_loadu_ps(y), acc));
      break;
    case Epilogue::kAddBf16:
      _mm512_storeu_ps(y, _mm512_add_ps(_mm512_loadu_ps(y), RoundBf16(acc)));
      break;
  }
}

// out[c] dword r = x[r] dword c (16x16 dwords; x is clobbered).
inline void Transpose16(__m512i (&x)[16], __m512i (&out)[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(x[i], x[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(x[i], x[i + 1]);
  }
  // x[4i + c], 128-bit lane L: rows 4i..4i+3 of column 4L + c.
  for (int i = 0; i < 16; i += 4) {
    x[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    x[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    x[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    x[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int c = 0; c < 4; ++c) {
    const __m512i p0 = _mm512_shuffle_i32x4(x[c], x[4 + c], 0x44);
    const __m512i p1 = _mm512_shuffle_i32x4(x[c], x[4 + c], 0xee);
    const __m512i p2 = _mm512_shuffle_i32x4(x[8 + c], x[12 + c], 0x44);
    const __m512i p3 = _mm512_shuffle_i32x4(x[8 + c], x[12 + c], 0xee);
    out[c] = _mm512_shuffle_i32x4(p0, p2, 0x88);
    out[4 + c] = _mm512_shuffle_i32x4(p0, p2, 0xdd);
    out[8 + c] = _mm512_shuffle_i32x4(p1, p3, 0x88);
    out[12 + c] = _mm512_shuffle_i32x4(p1, p3, 0xdd);
  }
}

}  // namespace
}  // namespace ss::expert::internal
