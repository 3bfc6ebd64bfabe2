// Linear4Rows for AVX2 + FMA (Zen 2 and later). Compiled with -mavx2 -mfma -mf16c; see
// linear4.h for the contract and for why this file includes no library header.
//
// A tile is 8 weight rows (the lanes of the accumulator). Per 128-wide K block and row, two
// 32-byte loads hold four 32-groups; each is split into low/high nibbles, looked up with
// vpshufb into the two upper bytes of the e2m1 value's fp32 bits, and widened to fp32 by
// unpacking and shifting (no int->float conversion). Products with the e4m3 activations are
// exact in fp32 and each lane sums 8 of them; two hadd levels and a lane swap turn the 8 rows'
// accumulators into one vector per group, which is scaled and added in K order exactly as the
// scalar definition does. Weight bytes are read once per tile; 1-3 activation rows share each
// decoded vector in registers, more rows read a decoded tile from L1.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "cpu_expert_worker/kernels/linear4.h"

namespace ss::expert::internal {
namespace {

constexpr int kRows = 8;
// Activation rows per register block when reading a decoded tile. Up to 3 rows are served
// straight from the packed weights; from 4 on, decoding a tile once into L1 is as fast
// (measured on Zen 4: 16 vector registers run out first).
constexpr int kBlockRows = 4;
constexpr int64_t kPrefetchBlocks = 2;

// ue8m0 bytes in dword lanes -> 2^(b-127) as fp32 bits (b = 0: the subnormal 2^-127,
// b = 255: NaN).
inline __m256i Ue8m0Bits(__m256i b) {
  __m256i bits = _mm256_slli_epi32(b, 23);
  bits = _mm256_blendv_epi8(bits, _mm256_set1_epi32(0x00400000),
                            _mm256_cmpeq_epi32(b, _mm256_setzero_si256()));
  return _mm256_blendv_epi8(bits, _mm256_set1_epi32(0x7fc00000),
                            _mm256_cmpeq_epi32(b, _mm256_set1_epi32(255)));
}

// swT[g][r] = ue8m0 scale of group g of row r0 + r, for the tile's 8 rows: 4 groups at a time,
// one dword of 4 scale bytes per row and lane.
void TransposeScales(const Linear4Args& a, int64_t r0, float* swT) {
  const uint8_t* s[kRows];
  for (int r = 0; r < kRows; ++r) s[r] = a.s + (r0 + r) * a.s_stride;
  const __m256i lo = _mm256_set1_epi32(0xff);
  for (int64_t g = 0; g < a.k / 32; g += 4) {
    int32_t d[kRows];
    for (int r = 0; r < kRows; ++r) std::memcpy(&d[r], s[r] + g, 4);
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(d));
    for (int i = 0; i < 4; ++i) {
      const __m256i b = _mm256_and_si256(_mm256_srli_epi32(v, 8 * i), lo);
      _mm256_store_si256(reinterpret_cast<__m256i*>(swT + (g + i) * kRows), Ue8m0Bits(b));
    }
  }
}

// Bytes 3 and 2 of the fp32 bits of e2m1 code c (spec §2.4), repeated in both 128-bit lanes.
inline __m256i TableHi() {
  return _mm256_setr_epi8(0x00, 0x3f, 0x3f, 0x3f, 0x40, 0x40, 0x40, 0x40,  //
                          char(0x80), char(0xbf), char(0xbf), char(0xbf),  //
                          char(0xc0), char(0xc0), char(0xc0), char(0xc0),  //
                          0x00, 0x3f, 0x3f, 0x3f, 0x40, 0x40, 0x40, 0x40,  //
                          char(0x80), char(0xbf), char(0xbf), char(0xbf),  //
                          char(0xc0), char(0xc0), char(0xc0), char(0xc0));
}
inline __m256i TableLo() {
  return _mm256_setr_epi8(0x00, 0x00, char(0x80), char(0xc0), 0x00, 0x40, char(0x80), char(0xc0),
                          0x00, 0x00, char(0x80), char(0xc0), 0x00, 0x40, char(0x80), char(0xc0),
                          0x00, 0x00, char(0x80), char(0xc0), 0x00, 0x40, char(0x80), char(0xc0),
                          0x00, 0x00, char(0x80), char(0xc0), 0x00, 0x40, char(0x80), char(0xc0));
}

struct Consts {
  __m256i nib = _mm256_set1_epi8(0x0f);
  __m256i thi = TableHi();
  __m256i tlo = TableLo();
  __m256i top = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
};

// Decodes 32 packed bytes (two 32-groups, one per 128-bit lane) into 8 fp32 vectors in the
// order of PermutedIndex(·, 2), calling use(j, vector) for j = 0..7.
template <class Use>
inline void DecodeChunk(const Consts& k, const uint8_t* p, Use&& use) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  const __m256i nib[2] = {_mm256_and_si256(v, k.nib),
                          _mm256_and_si256(_mm256_srli_epi16(v, 4), k.nib)};
  for (int h = 0; h < 2; ++h) {
    const __m256i b3 = _mm256_shuffle_epi8(k.thi, nib[h]);
    const __m256i b2 = _mm256_shuffle_epi8(k.tlo, nib[h]);
    const __m256i w0 = _mm256_unpacklo_epi8(b2, b3), w1 = _mm256_unpackhi_epi8(b2, b3);
    use(4 * h + 0, _mm256_castsi256_ps(_mm256_slli_epi32(w0, 16)));
    use(4 * h + 1, _mm256_castsi256_ps(_mm256_and_si256(w0, k.top)));
    use(4 * h + 2, _mm256_castsi256_ps(_mm256_slli_epi32(w1, 16)));
    use(4 * h + 3, _mm256_castsi256_ps(_mm256_and_si256(w1, k.top)));
  }
}

// Calls chunk(r, sums) for the 8 rows of a tile (sums: NT per-activation-row accumulators of
// [4 lanes of group A | 4 lanes of group B]) and reduces pairwise as rows complete, so few
// accumulators are live: pa/pb get the group A/B sums with one row per lane.
template <int NT, class Chunk>
inline void RowsReduced(Chunk&& chunk, __m256 (&pa)[NT], __m256 (&pb)[NT]) {
  __m256 q[2][NT];
  for (int quad = 0; quad < 2; ++quad) {
    __m256 hh[2][NT];
    for (int pair = 0; pair < 2; ++pair) {
      __m256 c0[NT], c1[NT];
      chunk(4 * quad + 2 * pair, c0);
      chunk(4 * quad + 2 * pair + 1, c1);
      for (int t = 0; t < NT; ++t) hh[pair][t] = _mm256_hadd_ps(c0[t], c1[t]);
    }
    for (int t = 0; t < NT; ++t) q[quad][t] = _mm256_hadd_ps(hh[0][t], hh[1][t]);
  }
  for (int t = 0; t < NT; ++t) {
    pa[t] = _mm256_permute2f128_ps(q[0][t], q[1][t], 0x20);
    pb[t] = _mm256_permute2f128_ps(q[0][t], q[1][t], 0x31);
  }
}

// acc + pa·sa·sw[0] + pb·sa·sw[1]: two consecutive groups in K order, the scalar's rounding.
inline __m256 Accumulate(__m256 acc, __m256 pa, __m256 pb, float sa, const float* sw) {
  const __m256 s = _mm256_set1_ps(sa);
  acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_mul_ps(pa, s), _mm256_load_ps(sw)));
  return _mm256_add_ps(acc, _mm256_mul_ps(_mm256_mul_ps(pb, s), _mm256_load_ps(sw + kRows)));
}

// ss::RoundBf16 on 8 lanes (round to nearest even; NaN -> quiet NaN).
inline __m256 RoundBf16(__m256 v) {
  const __m256i u = _mm256_castps_si256(v), top = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i r =
      _mm256_and_si256(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb)), top);
  const __m256i nan = _mm256_or_si256(_mm256_and_si256(u, top), _mm256_set1_epi32(0x00400000));
  return _mm256_blendv_ps(_mm256_castsi256_ps(r), _mm256_castsi256_ps(nan),
                          _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
}

inline void Store(Epilogue e, float* y, __m256 acc) {
  switch (e) {
    case Epilogue::kStoreBf16:
      _mm256_storeu_ps(y, RoundBf16(acc));
      break;
    case Epilogue::kAddF32:
      _mm256_storeu_ps(y, _mm256_add_ps(_mm256_loadu_ps(y), acc));
      break;
    case Epilogue::kAddBf16:
      _mm256_storeu_ps(y, _mm256_add_ps(_mm256_loadu_ps(y), RoundBf16(acc)));
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
  __m256 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t kb = 0; kb < a.k / 128; ++kb) {
    Prefetch(a, r0, kb);
    for (int h = 0; h < 2; ++h) {
      const int64_t off = kb * 128 + h * 64;
      __m256 pa[NT], pb[NT];
      RowsReduced<NT>(
          [&](int r, __m256* s) {
            for (int t = 0; t < NT; ++t) s[t] = _mm256_setzero_ps();
            DecodeChunk(k, a.w + (r0 + r) * a.w_stride + off / 2, [&](int j, __m256 f) {
              for (int t = 0; t < NT; ++t)
                s[t] = _mm256_fmadd_ps(f, _mm256_load_ps(a.q[t] + off + j * 8), s[t]);
            });
          },
          pa, pb);
      for (int t = 0; t < NT; ++t)
        acc[t] = Accumulate(acc[t], pa[t], pb[t], a.sa[t][kb], swT + (off / 32) * kRows);
    }
  }
  for (int t = 0; t < NT; ++t) Store(a.epilogue, a.y[t] + r0, acc[t]);
}

// Activation rows i0..i0+NT against a K block decoded into `wdec` ([2 chunks][8 rows][64]).
template <int NT>
void BlockFromBuffer(const Linear4Args& a, int64_t i0, int64_t kb, const float* wdec,
                     const float* swT, float* acc) {
  for (int h = 0; h < 2; ++h) {
    const int64_t off = kb * 128 + h * 64;
    __m256 pa[NT], pb[NT];
    RowsReduced<NT>(
        [&](int r, __m256* s) {
          const float* wr = wdec + (h * kRows + r) * 64;
          for (int t = 0; t < NT; ++t) s[t] = _mm256_setzero_ps();
          for (int j = 0; j < 8; ++j) {
            const __m256 f = _mm256_load_ps(wr + 8 * j);
            for (int t = 0; t < NT; ++t)
              s[t] = _mm256_fmadd_ps(f, _mm256_load_ps(a.q[i0 + t] + off + j * 8), s[t]);
          }
        },
        pa, pb);
    for (int t = 0; t < NT; ++t) {
      float* at = acc + (i0 + t) * kRows;
      _mm256_store_ps(at, Accumulate(_mm256_load_ps(at), pa[t], pb[t], a.sa[i0 + t][kb],
                                     swT + (off / 32) * kRows));
    }
  }
}

// Any number of activation rows: each K block of the tile is decoded once and read back from
// L1 for every row.
void TileBuffered(const Linear4Args& a, int64_t r0, const float* swT, float* acc, float* wdec) {
  const Consts k;
  for (int64_t i = 0; i < a.n * kRows; ++i) acc[i] = 0.0f;
  for (int64_t kb = 0; kb < a.k / 128; ++kb) {
    Prefetch(a, r0, kb);
    for (int h = 0; h < 2; ++h) {
      for (int r = 0; r < kRows; ++r) {
        float* out = wdec + (h * kRows + r) * 64;
        DecodeChunk(k, a.w + (r0 + r) * a.w_stride + kb * 64 + h * 32,
                    [&](int j, __m256 f) { _mm256_store_ps(out + 8 * j, f); });
      }
    }
    int64_t i0 = 0;
    for (; i0 + kBlockRows <= a.n; i0 += kBlockRows) BlockFromBuffer<4>(a, i0, kb, wdec, swT, acc);
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
  for (int64_t i = 0; i < a.n; ++i) Store(a.epilogue, a.y[i] + r0, _mm256_load_ps(acc + i * kRows));
}

}  // namespace

void Linear4Avx2(const Linear4Args& a) {
  const int64_t ng = a.k / 32;
  float* swT = a.scratch;        // [ng][8]
  float* acc = swT + ng * 16;    // [n][8]
  float* wdec = acc + a.n * 16;  // [16][64] floats, 64-byte aligned
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
      default:
        TileBuffered(a, r0, swT, acc, wdec);
        break;
    }
  }
}


// ss::QuantizeActE4m3 for one 128-block, 8 lanes at a time: the power-of-two scale from the
// fp32 bits of max(amax, 1e-4) · fp32(1/448); e4m3 RNE by integer rounding of the fp32 bits
// (mantissa to 3 bits, a carry bumps the exponent) and, below 2^-6, by adding 2^14 (whose ulp
// is the subnormal step 2^-9), both in the default round-to-nearest-even mode.
void QuantizeActAvx2(const float* x, int64_t n, uint8_t* codes, float* scales, float* q,
                     const float* e4m3) {
  static constexpr InversePermutation kInv(2);
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 qmax = _mm256_set1_ps(448.0f), sub_max = _mm256_set1_ps(0.015625f);
  const __m256 magic = _mm256_set1_ps(16384.0f);
  const __m256i magic_bits = _mm256_set1_epi32(0x46800000);
  const __m256i round_bias = _mm256_set1_epi32(0x7ffff), one = _mm256_set1_epi32(1);
  const __m256i code_bias = _mm256_set1_epi32(120 << 3), code_max = _mm256_set1_epi32(0x7e);
  const __m256i pack_order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t b = 0; b < n; b += 128) {
    __m256 v[16];
    __m256 amax = _mm256_setzero_ps();
    for (int j = 0; j < 16; ++j) {
      v[j] = _mm256_loadu_ps(x + b + 8 * j);
      // NaN in the first operand returns the second: NaN is skipped, as std::max skips it.
      amax = _mm256_max_ps(_mm256_and_ps(v[j], abs_mask), amax);
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
    float am = _mm_cvtss_f32(m4);
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
    const __m256 sv = _mm256_set1_ps(s);
    alignas(64) float dec[128];
    __m256i c[16];
    for (int j = 0; j < 16; ++j) {
      const __m256 y = _mm256_div_ps(v[j], sv);
      const __m256i sign = _mm256_srli_epi32(
          _mm256_andnot_si256(_mm256_castps_si256(abs_mask), _mm256_castps_si256(y)), 24);
      const __m256 a = _mm256_min_ps(_mm256_and_ps(y, abs_mask), qmax);
      const __m256i ai = _mm256_castps_si256(a);
      const __m256i r = _mm256_add_epi32(
          ai, _mm256_add_epi32(round_bias, _mm256_and_si256(_mm256_srli_epi32(ai, 20), one)));
      __m256i cj =
          _mm256_min_epi32(_mm256_sub_epi32(_mm256_srli_epi32(r, 20), code_bias), code_max);
      const __m256i cs =
          _mm256_sub_epi32(_mm256_castps_si256(_mm256_add_ps(a, magic)), magic_bits);
      cj = _mm256_blendv_epi8(cj, cs, _mm256_castps_si256(_mm256_cmp_ps(a, sub_max, _CMP_LT_OQ)));
      cj = _mm256_or_si256(cj, sign);
      cj = _mm256_blendv_epi8(cj, _mm256_set1_epi32(0x7f),
                              _mm256_castps_si256(_mm256_cmp_ps(y, y, _CMP_UNORD_Q)));
      c[j] = cj;
      if (q != nullptr) _mm256_store_ps(dec + 8 * j, _mm256_i32gather_ps(e4m3, cj, 4));
    }
    if (codes != nullptr) {
      for (int j = 0; j < 16; j += 4) {
        const __m256i p01 = _mm256_packus_epi32(c[j], c[j + 1]);
        const __m256i p23 = _mm256_packus_epi32(c[j + 2], c[j + 3]);
        const __m256i p = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(p01, p23), pack_order);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + b + 8 * j), p);
      }
    }
    if (q != nullptr) {
      for (int j = 0; j < 16; ++j) {
        const __m256i idx = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kInv.inv + 8 * j));
        _mm256_store_ps(q + b + 8 * j, _mm256_i32gather_ps(dec, idx, 4));
      }
    }
  }
}

}  // namespace ss::expert::internal
