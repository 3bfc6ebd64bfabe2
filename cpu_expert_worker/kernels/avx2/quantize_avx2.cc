// QuantizeActAvx2: the activation quantiser of the AVX2 kernels (expert_avx2.cc), writing
// ss::QuantizeActE4m3's codes and scales and the AVX2 activation records (linear4.h). Compiled
// with -mavx2 -mfma -mf16c, so, like expert_avx2.cc, it includes no library header.
#include <immintrin.h>

#include <cstdint>

#include "cpu_expert_worker/kernels/isa_shared.h"
#include "cpu_expert_worker/kernels/linear4.h"

namespace ss::expert::internal {
namespace {

// The activation quantiser's code for 8 values y = x / s (see QuantizeActAvx2).
struct QuantConsts {
  __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 qmax = _mm256_set1_ps(448.0f), sub_max = _mm256_set1_ps(0.015625f);
  __m256 magic = _mm256_set1_ps(16384.0f);
  __m256i magic_bits = _mm256_set1_epi32(0x46800000);
  __m256i round_bias = _mm256_set1_epi32(0x7ffff), one = _mm256_set1_epi32(1);
  __m256i code_bias = _mm256_set1_epi32(120 << 3), code_max = _mm256_set1_epi32(0x7e);
  __m256i pack_order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
};

inline __m256i Codes(const QuantConsts& k, __m256 v, __m256 sv) {
  const __m256 y = _mm256_div_ps(v, sv);
  const __m256i sign = _mm256_srli_epi32(
      _mm256_andnot_si256(_mm256_castps_si256(k.abs_mask), _mm256_castps_si256(y)), 24);
  const __m256 a = _mm256_min_ps(_mm256_and_ps(y, k.abs_mask), k.qmax);
  const __m256i ai = _mm256_castps_si256(a);
  const __m256i r = _mm256_add_epi32(
      ai, _mm256_add_epi32(k.round_bias, _mm256_and_si256(_mm256_srli_epi32(ai, 20), k.one)));
  __m256i c = _mm256_min_epi32(_mm256_sub_epi32(_mm256_srli_epi32(r, 20), k.code_bias), k.code_max);
  const __m256i cs = _mm256_sub_epi32(_mm256_castps_si256(_mm256_add_ps(a, k.magic)), k.magic_bits);
  c = _mm256_blendv_epi8(c, cs, _mm256_castps_si256(_mm256_cmp_ps(a, k.sub_max, _CMP_LT_OQ)));
  c = _mm256_or_si256(c, sign);
  return _mm256_blendv_epi8(c, _mm256_set1_epi32(0x7f),
                            _mm256_castps_si256(_mm256_cmp_ps(y, y, _CMP_UNORD_Q)));
}

// Four vectors of 8 int32 values in 0..255 -> 32 bytes in order.
inline __m256i PackBytes(const QuantConsts& k, const __m256i (&c)[4]) {
  const __m256i p01 = _mm256_packus_epi32(c[0], c[1]);
  const __m256i p23 = _mm256_packus_epi32(c[2], c[3]);
  return _mm256_permutevar8x32_epi32(_mm256_packus_epi16(p01, p23), k.pack_order);
}

// The three planes of 8 codes: out[p] = plane p's value (int32 lanes).
inline void PlaneValues(__m256i c, __m256i (&out)[3]) {
  const __m256i mag = _mm256_and_si256(c, _mm256_set1_epi32(0x7f));
  const __m256i e = _mm256_srli_epi32(mag, 3);
  const __m256i m =
      _mm256_or_si256(_mm256_and_si256(mag, _mm256_set1_epi32(7)),
                      _mm256_slli_epi32(_mm256_min_epi32(e, _mm256_set1_epi32(1)), 3));
  const __m256i b =
      _mm256_max_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), _mm256_setzero_si256());
  const __m256i ge10 = _mm256_cmpgt_epi32(b, _mm256_set1_epi32(9));
  const __m256i le4 = _mm256_cmpgt_epi32(_mm256_set1_epi32(5), b);
  // Shift counts outside 0..31 give 0 in vpsllvd; the masks pick each plane's binades.
  out[2] = _mm256_and_si256(ge10, _mm256_sllv_epi32(m, _mm256_sub_epi32(b, _mm256_set1_epi32(10))));
  out[1] = _mm256_andnot_si256(_mm256_or_si256(ge10, le4),
                               _mm256_sllv_epi32(m, _mm256_sub_epi32(b, _mm256_set1_epi32(5))));
  out[0] = _mm256_and_si256(le4, _mm256_sllv_epi32(m, b));
}

}  // namespace

// ss::QuantizeActE4m3 for one 128-block, 8 lanes at a time: the power-of-two scale from the
// fp32 bits of max(amax, 1e-4) · fp32(1/448); e4m3 RNE by integer rounding of the fp32 bits
// (mantissa to 3 bits, a carry bumps the exponent) and, below 2^-6, by adding 2^14 (whose ulp
// is the subnormal step 2^-9), both in the default round-to-nearest-even mode. The record is
// built from each 64-element span permuted into plane order first (even elements, then odd).
void QuantizeActAvx2(const float* x, int64_t n, uint8_t* codes, float* scales, float* q,
                     const float*) {
  const QuantConsts k;
  for (int64_t b = 0; b < n; b += 128) {
    __m256 v[16];
    __m256 amax = _mm256_setzero_ps();
    for (int j = 0; j < 16; ++j) {
      v[j] = _mm256_loadu_ps(x + b + 8 * j);
      // NaN in the first operand returns the second: NaN is skipped, as std::max skips it.
      amax = _mm256_max_ps(_mm256_and_ps(v[j], k.abs_mask), amax);
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
    float am = _mm_cvtss_f32(m4);
    const float s = BlockScale(am);
    scales[b / 128] = s;
    const __m256 sv = _mm256_set1_ps(s);
    if (codes != nullptr) {
      for (int j = 0; j < 16; j += 4) {
        const __m256i c[4] = {Codes(k, v[j], sv), Codes(k, v[j + 1], sv), Codes(k, v[j + 2], sv),
                              Codes(k, v[j + 3], sv)};
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + b + 8 * j), PackBytes(k, c));
      }
    }
    if (q == nullptr) continue;
    uint8_t* rec = reinterpret_cast<uint8_t*>(q) + b / 128 * kRecordBytes;
    __m256i nan = _mm256_setzero_si256();
    for (int span = 0; span < 2; ++span) {
      __m256i half_codes[2];    // even, odd elements of the span, as bytes
      __m256i nonzero[3] = {};  // per plane: the OR of its values
      for (int h = 0; h < 2; ++h) {
        __m256i c[4], planes[3][4];
        for (int i = 0; i < 4; ++i) {
          const __m256 lo = v[span * 8 + 2 * i], hi = v[span * 8 + 2 * i + 1];
          const __m256 sh =
              h == 0 ? _mm256_shuffle_ps(lo, hi, 0x88) : _mm256_shuffle_ps(lo, hi, 0xdd);
          const __m256 pv = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(sh), 0xd8));
          c[i] = Codes(k, pv, sv);
          __m256i pl[3];
          PlaneValues(c[i], pl);
          for (int p = 0; p < 3; ++p) planes[p][i] = pl[p];
          for (int p = 0; p < 3; ++p) nonzero[p] = _mm256_or_si256(nonzero[p], pl[p]);
          nan = _mm256_or_si256(nan,
                                _mm256_cmpeq_epi32(_mm256_and_si256(c[i], _mm256_set1_epi32(0x7f)),
                                                   _mm256_set1_epi32(0x7f)));
        }
        const int64_t pos = span * 64 + h * 32;
        for (int p = 0; p < 3; ++p) {
          _mm256_store_si256(reinterpret_cast<__m256i*>(rec + kPlaneOffset[p] + pos),
                             PackBytes(k, planes[p]));
        }
        half_codes[h] = PackBytes(k, c);
      }
      const __m256i sign = _mm256_or_si256(
          _mm256_and_si256(_mm256_srli_epi16(half_codes[0], 4), _mm256_set1_epi8(0x08)),
          _mm256_and_si256(half_codes[1], _mm256_set1_epi8(static_cast<char>(0x80))));
      _mm256_store_si256(reinterpret_cast<__m256i*>(rec + kSignOffset + span * 32), sign);
      int mask = 0;
      for (int p = 0; p < 3; ++p) mask |= _mm256_testz_si256(nonzero[p], nonzero[p]) ? 0 : 1 << p;
      rec[kPlaneMaskOffset + span] = static_cast<uint8_t>(mask);
    }
    StoreRecordScale(rec, s, !_mm256_testz_si256(nan, nan));
  }
}

}  // namespace ss::expert::internal
