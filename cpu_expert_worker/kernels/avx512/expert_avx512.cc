// Linear4Rows for AVX-512 F + BW (+ VL, DQ in the flags). Compiled with those flags alone; see
// linear4.h for the contract and for why this file includes no library header.
//
// The AVX2 scheme at twice the width: a tile is 16 weight rows; one 64-byte load per row and
// 128-wide K block holds its four 32-groups, one per 128-bit lane; vpshufb lookups into the
// upper bytes of the e2m1 fp32 bits and unpack/shift widening give 8 fp32 vectors whose
// products with the e4m3 activations are exact. Two unpack/shuffle levels and a 4x4 transpose
// of 128-bit lanes turn the 16 rows' accumulators into one vector per group, scaled and added in
// K order exactly as the scalar definition does.

// GCC 12 warns inside its own AVX-512 headers (the _mm512_undefined_* placeholders) once those
// intrinsics are inlined here; the warning is about the header, not this code.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstdint>
#include <cstring>

#include "cpu_expert_worker/kernels/linear4.h"

namespace ss::expert::internal {
namespace {

constexpr int kRows = 16;
// Activation rows served straight from the packed weights (each decoded vector feeds that
// many FMAs); more rows read a tile decoded once into L1, in register blocks of this size.
constexpr int kDirectMax = 4;
constexpr int64_t kPrefetchBlocks = 2;

// ue8m0 bytes in dword lanes -> 2^(b-127) as fp32 bits (b = 0: the subnormal 2^-127,
// b = 255: NaN).
inline __m512i Ue8m0Bits(__m512i b) {
  __m512i bits = _mm512_slli_epi32(b, 23);
  bits = _mm512_mask_mov_epi32(bits, _mm512_cmpeq_epi32_mask(b, _mm512_setzero_si512()),
                               _mm512_set1_epi32(0x00400000));
  return _mm512_mask_mov_epi32(bits, _mm512_cmpeq_epi32_mask(b, _mm512_set1_epi32(255)),
                               _mm512_set1_epi32(0x7fc00000));
}

// swT[g][r] = ue8m0 scale of group g of row r0 + r, for the tile's 16 rows: 4 groups at a time,
// one dword of 4 scale bytes per row and lane.
void TransposeScales(const Linear4Args& a, int64_t r0, float* swT) {
  const uint8_t* s[kRows];
  for (int r = 0; r < kRows; ++r) s[r] = a.s + (r0 + r) * a.s_stride;
  const __m512i lo = _mm512_set1_epi32(0xff);
  for (int64_t g = 0; g < a.k / 32; g += 4) {
    int32_t d[kRows];
    for (int r = 0; r < kRows; ++r) std::memcpy(&d[r], s[r] + g, 4);
    const __m512i v = _mm512_loadu_si512(d);
    for (int i = 0; i < 4; ++i) {
      const __m512i b = _mm512_and_si512(_mm512_srli_epi32(v, 8 * i), lo);
      _mm512_store_si512(swT + (g + i) * kRows, Ue8m0Bits(b));
    }
  }
}

// Bytes 3 and 2 of the fp32 bits of e2m1 code c (spec §2.4), repeated in every 128-bit lane.
inline __m512i TableHi() {
  return _mm512_broadcast_i32x4(_mm_setr_epi8(0x00, 0x3f, 0x3f, 0x3f, 0x40, 0x40, 0x40, 0x40,
                                              char(0x80), char(0xbf), char(0xbf), char(0xbf),
                                              char(0xc0), char(0xc0), char(0xc0), char(0xc0)));
}
inline __m512i TableLo() {
  return _mm512_broadcast_i32x4(_mm_setr_epi8(0x00, 0x00, char(0x80), char(0xc0), 0x00, 0x40,
                                              char(0x80), char(0xc0), 0x00, 0x00, char(0x80),
                                              char(0xc0), 0x00, 0x40, char(0x80), char(0xc0)));
}

struct Consts {
  __m512i nib = _mm512_set1_epi8(0x0f);
  __m512i thi = TableHi();
  __m512i tlo = TableLo();
  __m512i top = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
};

// Decodes 64 packed bytes (four 32-groups, one per 128-bit lane) into 8 fp32 vectors in the
// order of PermutedIndex(·, 4), calling use(j, vector) for j = 0..7.
template <class Use>
inline void DecodeChunk(const Consts& k, const uint8_t* p, Use&& use) {
  const __m512i v = _mm512_loadu_si512(p);
  const __m512i nib[2] = {_mm512_and_si512(v, k.nib),
                          _mm512_and_si512(_mm512_srli_epi16(v, 4), k.nib)};
  for (int h = 0; h < 2; ++h) {
    const __m512i b3 = _mm512_shuffle_epi8(k.thi, nib[h]);
    const __m512i b2 = _mm512_shuffle_epi8(k.tlo, nib[h]);
    const __m512i w0 = _mm512_unpacklo_epi8(b2, b3), w1 = _mm512_unpackhi_epi8(b2, b3);
    use(4 * h + 0, _mm512_castsi512_ps(_mm512_slli_epi32(w0, 16)));
    use(4 * h + 1, _mm512_castsi512_ps(_mm512_and_si512(w0, k.top)));
    use(4 * h + 2, _mm512_castsi512_ps(_mm512_slli_epi32(w1, 16)));
    use(4 * h + 3, _mm512_castsi512_ps(_mm512_and_si512(w1, k.top)));
  }
}

// Calls chunk(r, sums) for the 16 rows of a tile (sums: NT accumulators of 4 lanes per group)
// and reduces as rows complete: p[t][g] gets group g's sums with one row per lane.
template <int NT, class Chunk>
inline void RowsReduced(Chunk&& chunk, __m512 (&p)[NT][4]) {
  __m512 u[4][NT];
  for (int quad = 0; quad < 4; ++quad) {
    __m512 t2[2][NT];
    for (int pair = 0; pair < 2; ++pair) {
      __m512 c0[NT], c1[NT];
      chunk(4 * quad + 2 * pair, c0);
      chunk(4 * quad + 2 * pair + 1, c1);
      for (int t = 0; t < NT; ++t) {
        t2[pair][t] =
            _mm512_add_ps(_mm512_unpacklo_ps(c0[t], c1[t]), _mm512_unpackhi_ps(c0[t], c1[t]));
      }
    }
    for (int t = 0; t < NT; ++t) {
      u[quad][t] = _mm512_add_ps(_mm512_shuffle_ps(t2[0][t], t2[1][t], 0x44),
                                 _mm512_shuffle_ps(t2[0][t], t2[1][t], 0xee));
    }
  }
  for (int t = 0; t < NT; ++t) {
    const __m512 x0 = _mm512_shuffle_f32x4(u[0][t], u[1][t], 0x44);
    const __m512 x1 = _mm512_shuffle_f32x4(u[0][t], u[1][t], 0xee);
    const __m512 x2 = _mm512_shuffle_f32x4(u[2][t], u[3][t], 0x44);
    const __m512 x3 = _mm512_shuffle_f32x4(u[2][t], u[3][t], 0xee);
    p[t][0] = _mm512_shuffle_f32x4(x0, x2, 0x88);
    p[t][1] = _mm512_shuffle_f32x4(x0, x2, 0xdd);
    p[t][2] = _mm512_shuffle_f32x4(x1, x3, 0x88);
    p[t][3] = _mm512_shuffle_f32x4(x1, x3, 0xdd);
  }
}

// acc + Σ_g p[g]·sa·sw[g] over the four groups of a K block in K order, the scalar's rounding.
inline __m512 Accumulate(__m512 acc, const __m512 (&p)[4], float sa, const float* sw) {
  const __m512 s = _mm512_set1_ps(sa);
  for (int g = 0; g < 4; ++g)
    acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_mul_ps(p[g], s), _mm512_load_ps(sw + g * kRows)));
  return acc;
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

// Prefetches K block kb + kPrefetchBlocks of the tile's rows. The row streams are 2 KB apart
// in w1/w3 and so share a few L1 sets: a short distance keeps prefetched lines from evicting
// each other (measured on Zen 4 from DRAM: 2 blocks ahead doubles AVX-512 decode throughput;
// 8 blocks, a whole tile ahead, or running on into the next tile is as slow as none).
inline void Prefetch(const Linear4Args& a, int64_t r0, int64_t kb) {
  const int64_t at = kb + kPrefetchBlocks;
  if (at >= a.k / 128) return;
  for (int r = 0; r < kRows; ++r) {
    _mm_prefetch(reinterpret_cast<const char*>(a.w + (r0 + r) * a.w_stride + at * 64), _MM_HINT_T0);
  }
}

// NT activation rows straight from the packed weights: each decoded vector feeds NT FMAs.
template <int NT>
void TileDirect(const Linear4Args& a, int64_t r0, const float* swT) {
  const Consts k;
  __m512 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t kb = 0; kb < a.k / 128; ++kb) {
    Prefetch(a, r0, kb);
    const int64_t off = kb * 128;
    __m512 p[NT][4];
    RowsReduced<NT>(
        [&](int r, __m512* s) {
          // Two chains per activation row so FMA latency overlaps; the per-lane sums are
          // exact, so their order does not change the bits.
          __m512 s2[2][NT];
          for (int t = 0; t < NT; ++t) s2[0][t] = s2[1][t] = _mm512_setzero_ps();
          DecodeChunk(k, a.w + (r0 + r) * a.w_stride + off / 2, [&](int j, __m512 f) {
            for (int t = 0; t < NT; ++t)
              s2[j & 1][t] =
                  _mm512_fmadd_ps(f, _mm512_load_ps(a.q[t] + off + j * 16), s2[j & 1][t]);
          });
          for (int t = 0; t < NT; ++t) s[t] = _mm512_add_ps(s2[0][t], s2[1][t]);
        },
        p);
    for (int t = 0; t < NT; ++t)
      acc[t] = Accumulate(acc[t], p[t], a.sa[t][kb], swT + kb * 4 * kRows);
  }
  for (int t = 0; t < NT; ++t) Store(a.epilogue, a.y[t] + r0, acc[t]);
}

// Activation rows i0..i0+NT against a K block decoded into `wdec` ([16 rows][128]).
template <int NT>
void BlockFromBuffer(const Linear4Args& a, int64_t i0, int64_t kb, const float* wdec,
                     const float* swT, float* acc) {
  const int64_t off = kb * 128;
  __m512 p[NT][4];
  RowsReduced<NT>(
      [&](int r, __m512* s) {
        const float* wr = wdec + r * 128;
        for (int t = 0; t < NT; ++t) s[t] = _mm512_setzero_ps();
        for (int j = 0; j < 8; ++j) {
          const __m512 f = _mm512_load_ps(wr + 16 * j);
          for (int t = 0; t < NT; ++t)
            s[t] = _mm512_fmadd_ps(f, _mm512_load_ps(a.q[i0 + t] + off + j * 16), s[t]);
        }
      },
      p);
  for (int t = 0; t < NT; ++t) {
    float* at = acc + (i0 + t) * kRows;
    _mm512_store_ps(at,
                    Accumulate(_mm512_load_ps(at), p[t], a.sa[i0 + t][kb], swT + kb * 4 * kRows));
  }
}

// Any number of activation rows: each K block of the tile is decoded once and read back from
// L1 for every row.
void TileBuffered(const Linear4Args& a, int64_t r0, const float* swT, float* acc, float* wdec) {
  const Consts k;
  for (int64_t i = 0; i < a.n * kRows; ++i) acc[i] = 0.0f;
  for (int64_t kb = 0; kb < a.k / 128; ++kb) {
    Prefetch(a, r0, kb);
    for (int r = 0; r < kRows; ++r) {
      float* out = wdec + r * 128;
      DecodeChunk(k, a.w + (r0 + r) * a.w_stride + kb * 64,
                  [&](int j, __m512 f) { _mm512_store_ps(out + 16 * j, f); });
    }
    int64_t i0 = 0;
    for (; i0 + kDirectMax <= a.n; i0 += kDirectMax) BlockFromBuffer<4>(a, i0, kb, wdec, swT, acc);
    switch (a.n - i0) {
      case 3:
        BlockFromBuffer<3>(a, i0, kb, wdec, swT, acc);
        break;
      case 2:
        BlockFromBuffer<2>(a, i0, kb, wdec, swT, acc);
        break;
      case 1:
        BlockFromBuffer<1>(a, i0, kb, wdec, swT, acc);
        break;
      default:
        break;
    }
  }
  for (int64_t i = 0; i < a.n; ++i) Store(a.epilogue, a.y[i] + r0, _mm512_load_ps(acc + i * kRows));
}

}  // namespace

void Linear4Avx512(const Linear4Args& a) {
  const int64_t ng = a.k / 32;
  float* swT = a.scratch;        // [ng][16]
  float* acc = swT + ng * 16;    // [n][16]
  float* wdec = acc + a.n * 16;  // [16][128]
  for (int64_t r0 = 0; r0 < a.rows; r0 += kRows) {
    TransposeScales(a, r0, swT);
    switch (a.n) {
      case 1:
        TileDirect<1>(a, r0, swT);
        break;
      case 2:
        TileDirect<2>(a, r0, swT);
        break;
      case 3:
        TileDirect<3>(a, r0, swT);
        break;
      case 4:
        TileDirect<4>(a, r0, swT);
        break;
      default:
        TileBuffered(a, r0, swT, acc, wdec);
        break;
    }
  }
}


// ss::QuantizeActE4m3 for one 128-block, 16 lanes at a time: the power-of-two scale from the
// fp32 bits of max(amax, 1e-4) · fp32(1/448); e4m3 RNE by integer rounding of the fp32 bits
// (mantissa to 3 bits, a carry bumps the exponent) and, below 2^-6, by adding 2^14 (whose ulp
// is the subnormal step 2^-9), both in the default round-to-nearest-even mode.
void QuantizeActAvx512(const float* x, int64_t n, uint8_t* codes, float* scales, float* q,
                       const float* e4m3) {
  static constexpr InversePermutation kInv(4);
  const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  const __m512 qmax = _mm512_set1_ps(448.0f), sub_max = _mm512_set1_ps(0.015625f);
  const __m512 magic = _mm512_set1_ps(16384.0f);
  const __m512i magic_bits = _mm512_set1_epi32(0x46800000);
  const __m512i round_bias = _mm512_set1_epi32(0x7ffff), one = _mm512_set1_epi32(1);
  const __m512i code_bias = _mm512_set1_epi32(120 << 3), code_max = _mm512_set1_epi32(0x7e);
  for (int64_t b = 0; b < n; b += 128) {
    __m512 v[8];
    __m512 amax = _mm512_setzero_ps();
    for (int j = 0; j < 8; ++j) {
      v[j] = _mm512_loadu_ps(x + b + 16 * j);
      // NaN in the first operand returns the second: NaN is skipped, as std::max skips it.
      amax = _mm512_max_ps(_mm512_and_ps(v[j], abs_mask), amax);
    }
    float am = _mm512_reduce_max_ps(amax);
    if (am < 1e-4f) am = 1e-4f;
    const float prod = am * (1.0f / 448.0f);
    uint32_t bits;
    std::memcpy(&bits, &prod, 4);
    uint32_t biased = ((bits >> 23) & 0xff) + ((bits & 0x7fffffu) != 0);
    if (biased > 255) biased = 255;  // 2^128 and beyond: inf, as ldexp gives
    const uint32_t sbits = biased << 23;
    float s;
    std::memcpy(&s, &sbits, 4);
    scales[b / 128] = s;
    const __m512 sv = _mm512_set1_ps(s);
    alignas(64) float dec[128];
    for (int j = 0; j < 8; ++j) {
      const __m512 y = _mm512_div_ps(v[j], sv);
      const __m512i sign = _mm512_srli_epi32(
          _mm512_andnot_si512(_mm512_castps_si512(abs_mask), _mm512_castps_si512(y)), 24);
      const __m512 a = _mm512_min_ps(_mm512_and_ps(y, abs_mask), qmax);
      const __m512i ai = _mm512_castps_si512(a);
      const __m512i r = _mm512_add_epi32(
          ai, _mm512_add_epi32(round_bias, _mm512_and_si512(_mm512_srli_epi32(ai, 20), one)));
      __m512i c = _mm512_min_epi32(_mm512_sub_epi32(_mm512_srli_epi32(r, 20), code_bias), code_max);
      const __m512i cs =
          _mm512_sub_epi32(_mm512_castps_si512(_mm512_add_ps(a, magic)), magic_bits);
      c = _mm512_mask_mov_epi32(c, _mm512_cmp_ps_mask(a, sub_max, _CMP_LT_OQ), cs);
      c = _mm512_or_si512(c, sign);
      c = _mm512_mask_mov_epi32(c, _mm512_cmp_ps_mask(y, y, _CMP_UNORD_Q), _mm512_set1_epi32(0x7f));
      if (codes != nullptr) _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + b + 16 * j),
                                             _mm512_cvtepi32_epi8(c));
      if (q != nullptr) _mm512_store_ps(dec + 16 * j, _mm512_i32gather_ps(c, e4m3, 4));
    }
    if (q != nullptr) {
      for (int j = 0; j < 8; ++j) {
        const __m512i idx = _mm512_loadu_si512(kInv.inv + 16 * j);
        _mm512_store_ps(q + b + 16 * j, _mm512_i32gather_ps(idx, dec, 4));
      }
    }
  }
}

}  // namespace ss::expert::internal
