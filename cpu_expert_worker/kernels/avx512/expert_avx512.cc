// Linear4Rows for AVX-512 F + BW + VNNI (+ VL, DQ in the flags). Compiled with those flags
// alone; see linear4.h for the contract, the activation record and why this file includes no
// library header.
//
// Integer dot products (linear4.h): a tile is 16 weight rows; per 128-wide K block a row is one
// 64-byte load of packed nibbles (its four 32-groups, one per 128-bit lane). For one activation
// row the record's sign mask is XORed into the packed bytes, the low and high nibbles are looked
// up (vpshufb) as 2·e2m1 in int8, and six vpdpbusd against the three u8 planes, shifted by 5
// between planes, leave each group's exact sum in four int32 lanes. Integer adds reduce the 16
// rows to one vector per group (one row per lane), which is converted to fp32 (the one
// rounding), scaled and added in K order exactly as the scalar definition does.
//
// Several activation rows: as in the AVX2 kernel, the call's records are first widened into a
// signed int16 plane (and where a block holds its smallest values, an offset u8 plane), each K
// block's weights into 2·e2m1 int16 and int8 once per tile, in L1; a row's K block then costs 4
// vpdpwssd per weight row (plus 2 vpdpbusd where the block holds small values) and no sign work.
//
// Memory: weights are read once per call in tile, K block, row order; a software prefetch runs
// ahead in that order (and on into Linear4Args::next_w; how far and into which cache level:
// isa_shared.h, by CPU family), the next tile's scale rows one tile ahead.

#include <cstdint>

#include "cpu_expert_worker/kernels/avx512/avx512_shared.h"
#include "cpu_expert_worker/kernels/isa_driver.h"
#include "cpu_expert_worker/kernels/isa_shared.h"
#include "cpu_expert_worker/kernels/linear4.h"

namespace ss::expert::internal {
namespace {

constexpr int kRows = 16;

// st[kb] = the 4 ue8m0 scale bytes of K block kb of each of the tile's 16 rows (dword r = row
// r0 + r), for every K block: 16 K blocks at a time, one masked load per row and a 16x16 dword
// transpose.
void TransposeScales(const Linear4Args& a, int64_t r0, __m512i* st) {
  const int64_t nkb = a.k / 128;
  const uint8_t* s = a.s + r0 * a.s_stride;
  for (int64_t kb0 = 0; kb0 < nkb; kb0 += 16) {
    const int64_t n = nkb - kb0 < 16 ? nkb - kb0 : 16;
    const __mmask16 m = static_cast<__mmask16>((1u << n) - 1);
    __m512i x[16], t[16];
    for (int r = 0; r < 16; ++r) x[r] = _mm512_maskz_loadu_epi32(m, s + r * a.s_stride + kb0 * 4);
    Transpose16(x, t);  // t[c]: K block kb0 + c of the 16 rows
    for (int c = 0; c < n; ++c) _mm512_store_si512(st + kb0 + c, t[c]);
  }
}

// One activation record's planes for a K block: [plane][even, odd].
struct Planes {
  __m512i p[3][2];
  explicit Planes(const uint8_t* rec) {
    for (int i = 0; i < 3; ++i) {
      p[i][0] = _mm512_load_si512(rec + kPlaneOffset[i]);
      p[i][1] = _mm512_load_si512(rec + kPlaneOffset[i] + 64);
    }
  }
};

// The exact group sums (4 int32 lanes per group) of one row's K block: we/wo are the even/odd
// elements' 2·e2m1 values with the activation signs folded in.
inline __m512i DotPlanes(const Planes& pl, __m512i we, __m512i wo) {
  __m512i c = _mm512_dpbusd_epi32(_mm512_setzero_si512(), pl.p[2][0], we);
  c = _mm512_dpbusd_epi32(c, pl.p[2][1], wo);
  c = _mm512_slli_epi32(c, 5);
  c = _mm512_dpbusd_epi32(c, pl.p[1][0], we);
  c = _mm512_dpbusd_epi32(c, pl.p[1][1], wo);
  c = _mm512_slli_epi32(c, 5);
  c = _mm512_dpbusd_epi32(c, pl.p[0][0], we);
  return _mm512_dpbusd_epi32(c, pl.p[0][1], wo);
}

// 16 rows' group sums -> g[q] = group q's sums with row r in lane r (integer adds: exact).
inline void Reduce(const __m512i (&res)[kRows], __m512i (&g)[4]) {
  __m512i t1[8], t2[4];
  for (int i = 0; i < 8; ++i) {
    t1[i] = _mm512_add_epi32(_mm512_unpacklo_epi32(res[2 * i], res[2 * i + 1]),
                             _mm512_unpackhi_epi32(res[2 * i], res[2 * i + 1]));
  }
  for (int i = 0; i < 4; ++i) {
    t2[i] = _mm512_add_epi32(_mm512_unpacklo_epi64(t1[2 * i], t1[2 * i + 1]),
                             _mm512_unpackhi_epi64(t1[2 * i], t1[2 * i + 1]));
  }
  const __m512i x0 = _mm512_shuffle_i32x4(t2[0], t2[1], 0x44);
  const __m512i x1 = _mm512_shuffle_i32x4(t2[0], t2[1], 0xee);
  const __m512i x2 = _mm512_shuffle_i32x4(t2[2], t2[3], 0x44);
  const __m512i x3 = _mm512_shuffle_i32x4(t2[2], t2[3], 0xee);
  g[0] = _mm512_shuffle_i32x4(x0, x2, 0x88);
  g[1] = _mm512_shuffle_i32x4(x0, x2, 0xdd);
  g[2] = _mm512_shuffle_i32x4(x1, x3, 0x88);
  g[3] = _mm512_shuffle_i32x4(x1, x3, 0xdd);
}

// acc + Σ_q fp32(g[q])·sa'·sw[q] over the four groups of a K block in K order: the scalar's
// roundings (fp32(S)·sa' = fp32(S·2^-10)·sa exactly, both being powers of two apart).
inline __m512 Accumulate(__m512 acc, const __m512i (&g)[4], float sa, const __m512 (&sw)[4]) {
  const __m512 s = _mm512_set1_ps(sa);
  for (int q = 0; q < 4; ++q) {
    acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(g[q]), s), sw[q]));
  }
  return acc;
}

// One activation row (decode): the sign is folded into the packed bytes, one XOR per row.
template <bool kTiled, class PF>
void TileOne(const Linear4Args& a, int64_t r0, const __m512i* st, PF& pf) {
  const __m512i nib = _mm512_set1_epi8(0x0f), lut = E2m1Table();
  __m512 acc = _mm512_setzero_ps();
  const uint8_t* w = TileBase(a, a.w, r0);
  const int64_t row = RowStep<kTiled>(a), kb_step = Steps(a).kb;
  const uint8_t* rec = Record(a, 0, 0);
  for (int64_t kb = 0; kb < a.k / 128; ++kb, w += kb_step, rec += kRecordBytes) {
    pf.Aim(r0, kb);
    const typename PF::Rows lines = pf.Targets();
    const Planes pl(rec);
    const __m512i sx = _mm512_load_si512(rec + kSignOffset);
    __m512i res[kRows];
#pragma GCC unroll 16
    for (int r = 0; r < kRows; ++r) {
      lines.Row(r);
      const __m512i v = _mm512_xor_si512(_mm512_loadu_si512(w + r * row), sx);
      const __m512i we = _mm512_shuffle_epi8(lut, _mm512_and_si512(v, nib));
      const __m512i wo = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(v, 4), nib));
      res[r] = DotPlanes(pl, we, wo);
    }
    __m512i g[4];
    Reduce(res, g);
    __m512 sw[4];
    GroupScales(_mm512_load_si512(st + kb), sw);
    acc = Accumulate(acc, g, RecordScale(rec), sw);
  }
  Store(a.epilogue, a.y[0] + r0, acc);
}

// Wide records for calls of several activation rows, as the AVX2 kernel's (see there): per row
// and K block int16 H[4] (vector v = 2·(odd) + (high 8 of each 128-bit lane), the plane bytes
// widened by _mm512_unpack{lo,hi}_epi8, each 128-bit lane one group) and, where the block holds
// a value with b <= 2, u8 L'[2] (even, odd) against H - 8. Records [kb][i].
constexpr int kWideShift = 3;  // WideMeta::low: the block holds an L value

inline bool WidenBlock(const uint8_t* rec, __m512i* out) {
  const __m512i zero = _mm512_setzero_si512(), sx = _mm512_load_si512(rec + kSignOffset);
  const __m512i neg[2] = {
      _mm512_movm_epi8(_mm512_test_epi8_mask(sx, _mm512_set1_epi8(0x08))),
      _mm512_movm_epi8(_mm512_test_epi8_mask(sx, _mm512_set1_epi8(static_cast<char>(0x80))))};
  __m512i p[2][3], low[2];
  __mmask64 any = 0;
  for (int h = 0; h < 2; ++h) {
    for (int i = 0; i < 3; ++i) p[h][i] = _mm512_load_si512(rec + kPlaneOffset[i] + h * 64);
    const __mmask64 small =
        _mm512_testn_epi8_mask(p[h][0], _mm512_set1_epi8(static_cast<char>(0xc0)));
    low[h] = _mm512_maskz_mov_epi8(small, p[h][0]);
    p[h][0] = _mm512_maskz_mov_epi8(~small, p[h][0]);
    any |= _mm512_test_epi8_mask(low[h], low[h]);
  }
  const bool has_low = any != 0;
  const __m512i offset = _mm512_set1_epi16(has_low ? 8 : 0);
  for (int h = 0; h < 2; ++h) {
    for (int half = 0; half < 2; ++half) {
      const auto widen = [&](__m512i b, __m512i hi) {
        return half == 0 ? _mm512_unpacklo_epi8(b, hi) : _mm512_unpackhi_epi8(b, hi);
      };
      const __m512i m = widen(neg[h], neg[h]);
      const __m512i hv = _mm512_add_epi16(
          _mm512_add_epi16(_mm512_srli_epi16(widen(p[h][0], zero), kWideShift),
                           _mm512_slli_epi16(widen(p[h][1], zero), 5 - kWideShift)),
          _mm512_slli_epi16(widen(p[h][2], zero), 10 - kWideShift));
      out[2 * h + half] = _mm512_sub_epi16(_mm512_sub_epi16(_mm512_xor_si512(hv, m), m), offset);
    }
    if (has_low) {
      out[4 + h] = _mm512_add_epi8(_mm512_sub_epi8(_mm512_xor_si512(low[h], neg[h]), neg[h]),
                                   _mm512_set1_epi8(64));
    }
  }
  return has_low;
}

void WidenRecords(const Linear4Args& a, uint8_t* wide, WideMeta* meta) {
  for (int64_t i = 0; i < a.n; ++i) {
    for (int64_t kb = 0; kb < a.k / 128; ++kb) {
      const uint8_t* rec = Record(a, i, kb);
      WideMeta& m = meta[kb * a.n + i];
      m.scale = RecordScale(rec);
      m.low = WidenBlock(rec, reinterpret_cast<__m512i*>(wide + (kb * a.n + i) * kWideBytes));
    }
  }
}

// A K block of the tile's 16 weight rows, 2·e2m1 in the wide orders: [row][6], int16 W[4] as H's,
// then int8 (even, odd) as L''s.
constexpr int kWideVecs = 6;
inline void WidenWeights(const uint8_t* w, int64_t row, __m512i* wv) {
  const __m512i nib = _mm512_set1_epi8(0x0f), lut = E2m1Table();
  for (int r = 0; r < kRows; ++r) {
    const __m512i v = _mm512_loadu_si512(w + r * row);
    const __m512i e[2] = {_mm512_shuffle_epi8(lut, _mm512_and_si512(v, nib)),
                          _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(v, 4), nib))};
    __m512i* out = wv + r * kWideVecs;
    for (int h = 0; h < 2; ++h) {
      const __m512i sign = _mm512_movm_epi8(_mm512_movepi8_mask(e[h]));
      _mm512_store_si512(out + 2 * h, _mm512_unpacklo_epi8(e[h], sign));
      _mm512_store_si512(out + 2 * h + 1, _mm512_unpackhi_epi8(e[h], sign));
      _mm512_store_si512(out + 4 + h, e[h]);
    }
  }
}

// One activation row's K block (its wide vectors at x) against the tile's 16 widened rows: g as
// Reduce gives it; L' only if kLow.
template <bool kLow>
inline void BlockWide(const __m512i* wv, const __m512i* x, __m512i (&g)[4]) {
  const __m512i h[4] = {_mm512_load_si512(x), _mm512_load_si512(x + 1), _mm512_load_si512(x + 2),
                        _mm512_load_si512(x + 3)};
  __m512i res[kRows];
#pragma GCC unroll 16
  for (int r = 0; r < kRows; ++r) {
    const __m512i* w = wv + r * kWideVecs;
    __m512i c = _mm512_dpwssd_epi32(_mm512_setzero_si512(), h[0], _mm512_load_si512(w));
    c = _mm512_dpwssd_epi32(c, h[1], _mm512_load_si512(w + 1));
    c = _mm512_dpwssd_epi32(c, h[2], _mm512_load_si512(w + 2));
    c = _mm512_dpwssd_epi32(c, h[3], _mm512_load_si512(w + 3));
    if (kLow) {
      c = _mm512_slli_epi32(c, kWideShift);
      c = _mm512_dpbusd_epi32(c, _mm512_load_si512(x + 4), _mm512_load_si512(w + 4));
      c = _mm512_dpbusd_epi32(c, _mm512_load_si512(x + 5), _mm512_load_si512(w + 5));
    }
    res[r] = c;
  }
  Reduce(res, g);
  if (!kLow) {
    for (int q = 0; q < 4; ++q) g[q] = _mm512_slli_epi32(g[q], kWideShift);
  }
}

// Any number of activation rows, from their wide records: each K block's weights are widened
// once into `wv` (L1) and every activation row runs against them.
template <bool kTiled, class PF>
void TileMany(const Linear4Args& a, int64_t r0, const __m512i* st, float* acc, __m512i* wv,
              const uint8_t* wide, const WideMeta* meta, PF& pf) {
  for (int64_t i = 0; i < a.n * kRows; ++i) acc[i] = 0.0f;
  const uint8_t* w = TileBase(a, a.w, r0);
  const int64_t row = RowStep<kTiled>(a), kb_step = Steps(a).kb;
  for (int64_t kb = 0; kb < a.k / 128; ++kb, w += kb_step) {
    pf.Step(r0, kb);
    WidenWeights(w, row, wv);
    __m512 sw[4];
    GroupScales(_mm512_load_si512(st + kb), sw);
    const uint8_t* x = wide + kb * a.n * kWideBytes;
    const WideMeta* m = meta + kb * a.n;
    for (int64_t i = 0; i < a.n; ++i, x += kWideBytes) {
      const __m512i* xv = reinterpret_cast<const __m512i*>(x);
      __m512i g[4];
      m[i].low != 0 ? BlockWide<true>(wv, xv, g) : BlockWide<false>(wv, xv, g);
      float* at = acc + i * kRows;
      _mm512_store_ps(at, Accumulate(_mm512_load_ps(at), g, m[i].scale, sw));
    }
  }
  for (int64_t i = 0; i < a.n; ++i) Store(a.epilogue, a.y[i] + r0, _mm512_load_ps(acc + i * kRows));
}

// This file's kernel, for isa_driver.h.
struct Kernel {
  using Vec = __m512i;
  static constexpr int kRows = internal::kRows, kWideVecs = kRows * internal::kWideVecs;
  static void Scales(const Linear4Args& a, int64_t r0, Vec* st) { TransposeScales(a, r0, st); }
  template <bool kTiled, class PF>
  static void One(const Linear4Args& a, int64_t r0, const Vec* st, PF& pf) {
    TileOne<kTiled>(a, r0, st, pf);
  }
  template <bool kTiled, class X, class PF>
  static void Many(const Linear4Args& a, int64_t r0, const X& x, PF& pf) {
    TileMany<kTiled>(a, r0, x.st, x.acc, x.wv, x.wide, x.meta, pf);
  }
  static void Widen(const Linear4Args& a, uint8_t* wide, WideMeta* meta) {
    WidenRecords(a, wide, meta);
  }
};

}  // namespace

void Linear4Avx512(const Linear4Args& a) { Linear4Pair<Kernel>(a, nullptr); }

void Linear4PairAvx512(const Linear4Args& a, const Linear4Args& b) { Linear4Pair<Kernel>(a, &b); }

}  // namespace ss::expert::internal
