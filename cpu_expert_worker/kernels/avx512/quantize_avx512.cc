// QuantizeActAvx512: the activation quantiser of the AVX-512 and AMX kernels (expert_avx512.cc,
// expert_amx.cc), writing ss::QuantizeActE4m3's codes and scales and the AVX-512 activation
// records (linear4.h). Compiled with the AVX-512 flags alone, so, like expert_avx512.cc, it
// includes no library header.
#include <cstdint>

#include "cpu_expert_worker/kernels/avx512/avx512_shared.h"
#include "cpu_expert_worker/kernels/isa_shared.h"
#include "cpu_expert_worker/kernels/linear4.h"

namespace ss::expert::internal {
namespace {

// The activation quantiser's code for 16 values y = x / s (see QuantizeActAvx512).
struct QuantConsts {
  __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  __m512 qmax = _mm512_set1_ps(448.0f), sub_max = _mm512_set1_ps(0.015625f);
  __m512 magic = _mm512_set1_ps(16384.0f);
  __m512i magic_bits = _mm512_set1_epi32(0x46800000);
  __m512i round_bias = _mm512_set1_epi32(0x7ffff), one = _mm512_set1_epi32(1);
  __m512i code_bias = _mm512_set1_epi32(120 << 3), code_max = _mm512_set1_epi32(0x7e);
};

inline __m512i Codes(const QuantConsts& k, __m512 v, __m512 sv) {
  const __m512 y = _mm512_div_ps(v, sv);
  const __m512i sign = _mm512_srli_epi32(
      _mm512_andnot_si512(_mm512_castps_si512(k.abs_mask), _mm512_castps_si512(y)), 24);
  const __m512 a = _mm512_min_ps(_mm512_and_ps(y, k.abs_mask), k.qmax);
  const __m512i ai = _mm512_castps_si512(a);
  const __m512i r = _mm512_add_epi32(
      ai, _mm512_add_epi32(k.round_bias, _mm512_and_si512(_mm512_srli_epi32(ai, 20), k.one)));
  __m512i c = _mm512_min_epi32(_mm512_sub_epi32(_mm512_srli_epi32(r, 20), k.code_bias), k.code_max);
  const __m512i cs = _mm512_sub_epi32(_mm512_castps_si512(_mm512_add_ps(a, k.magic)), k.magic_bits);
  c = _mm512_mask_mov_epi32(c, _mm512_cmp_ps_mask(a, k.sub_max, _CMP_LT_OQ), cs);
  c = _mm512_or_si512(c, sign);
  return _mm512_mask_mov_epi32(c, _mm512_cmp_ps_mask(y, y, _CMP_UNORD_Q), _mm512_set1_epi32(0x7f));
}

// Writes the three plane bytes of 16 codes at `pos` of a record; returns the NaN lanes.
inline __mmask16 PlaneBytes(__m512i c, uint8_t* rec, int64_t pos) {
  const __m512i mag = _mm512_and_si512(c, _mm512_set1_epi32(0x7f));
  const __m512i e = _mm512_srli_epi32(mag, 3);
  const __m512i m =
      _mm512_or_si512(_mm512_and_si512(mag, _mm512_set1_epi32(7)),
                      _mm512_slli_epi32(_mm512_min_epi32(e, _mm512_set1_epi32(1)), 3));
  const __m512i b =
      _mm512_max_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), _mm512_setzero_si512());
  const __mmask16 ge10 = _mm512_cmpge_epi32_mask(b, _mm512_set1_epi32(10));
  const __mmask16 le4 = _mm512_cmple_epi32_mask(b, _mm512_set1_epi32(4));
  const __m512i p2 = _mm512_maskz_sllv_epi32(ge10, m, _mm512_sub_epi32(b, _mm512_set1_epi32(10)));
  const __m512i p1 = _mm512_maskz_sllv_epi32(static_cast<__mmask16>(~(ge10 | le4)), m,
                                             _mm512_sub_epi32(b, _mm512_set1_epi32(5)));
  const __m512i p0 = _mm512_maskz_sllv_epi32(le4, m, b);
  _mm_store_si128(reinterpret_cast<__m128i*>(rec + kPlaneOffset[2] + pos),
                  _mm512_cvtepi32_epi8(p2));
  _mm_store_si128(reinterpret_cast<__m128i*>(rec + kPlaneOffset[1] + pos),
                  _mm512_cvtepi32_epi8(p1));
  _mm_store_si128(reinterpret_cast<__m128i*>(rec + kPlaneOffset[0] + pos),
                  _mm512_cvtepi32_epi8(p0));
  return _mm512_cmpeq_epi32_mask(mag, _mm512_set1_epi32(0x7f));
}

}  // namespace

// ss::QuantizeActE4m3 for one 128-block, 16 lanes at a time: the power-of-two scale from the
// fp32 bits of max(amax, 1e-4) · fp32(1/448); e4m3 RNE by integer rounding of the fp32 bits
// (mantissa to 3 bits, a carry bumps the exponent) and, below 2^-6, by adding 2^14 (whose ulp
// is the subnormal step 2^-9), both in the default round-to-nearest-even mode. The record is
// built from the block permuted into plane order first (even elements, then odd).
void QuantizeActAvx512(const float* x, int64_t n, uint8_t* codes, float* scales, float* q,
                       const float*) {
  const QuantConsts k;
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  for (int64_t b = 0; b < n; b += 128) {
    __m512 v[8];
    __m512 amax = _mm512_setzero_ps();
    for (int j = 0; j < 8; ++j) {
      v[j] = _mm512_loadu_ps(x + b + 16 * j);
      // NaN in the first operand returns the second: NaN is skipped, as std::max skips it.
      amax = _mm512_max_ps(_mm512_and_ps(v[j], k.abs_mask), amax);
    }
    float am = _mm512_reduce_max_ps(amax);
    const float s = BlockScale(am);
    scales[b / 128] = s;
    const __m512 sv = _mm512_set1_ps(s);
    if (codes != nullptr) {
      for (int j = 0; j < 8; ++j) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + b + 16 * j),
                         _mm512_cvtepi32_epi8(Codes(k, v[j], sv)));
      }
    }
    if (q == nullptr) continue;
    uint8_t* rec = reinterpret_cast<uint8_t*>(q) + b / 128 * kRecordBytes;
    alignas(64) uint8_t ordered[128];  // the codes in plane order
    __mmask16 nan = 0;
    for (int i = 0; i < 4; ++i) {
      for (int h = 0; h < 2; ++h) {
        const __m512 pv = _mm512_permutex2var_ps(v[2 * i], h == 0 ? even : odd, v[2 * i + 1]);
        const __m512i c = Codes(k, pv, sv);
        const int64_t pos = h * 64 + i * 16;
        nan |= PlaneBytes(c, rec, pos);
        _mm_store_si128(reinterpret_cast<__m128i*>(ordered + pos), _mm512_cvtepi32_epi8(c));
      }
    }
    const __m512i ce = _mm512_load_si512(ordered), co = _mm512_load_si512(ordered + 64);
    const __m512i sign =
        _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ce, 4), _mm512_set1_epi8(0x08)),
                        _mm512_and_si512(co, _mm512_set1_epi8(static_cast<char>(0x80))));
    _mm512_store_si512(rec + kSignOffset, sign);
    StoreRecordScale(rec, s, nan != 0);
  }
}

}  // namespace ss::expert::internal
