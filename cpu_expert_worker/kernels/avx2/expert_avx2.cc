// Linear4Rows for AVX2 + FMA (Zen 2 and later). Compiled with -mavx2 -mfma -mf16c; see
// linear4.h for the contract, the activation record and why this file includes no library
// header.
//
// Integer dot products (linear4.h) without VNNI: a tile is 8 weight rows; a 128-wide K block of
// a row is two 32-byte chunks of packed nibbles, each holding two 32-groups (one per 128-bit
// lane).
//
// One activation row (decode): the record's sign mask is XORed into the packed bytes, the low
// and high nibbles are looked up (vpshufb) as 2·e2m1 in int8, and per plane two vpmaddubsw
// (u8 × s8, pairs summed in int16 without saturation: <= 2·240·12 each) are added and widened
// by one vpmaddwd with the plane's weight (1, 32, 1024), leaving each group's exact sum in four
// int32 lanes.
//
// Several activation rows: the call's records are first widened (WidenRecords: a signed int16
// plane H for all but the smallest values, and where a span holds those, an offset u8 plane L'),
// and each K block's weights into 2·e2m1 (int16 and int8) once per tile, in L1; a row's chunk then
// costs 4 vpmaddwd per weight row (plus 2 vpmaddubsw and a vpmaddwd where the span holds small
// values) and no sign or plane work.
//
// Either way integer adds reduce the 8 rows to one vector per group, converted to fp32 (the one
// rounding), scaled and added in K order exactly as the scalar definition does.
//
// Memory: the software prefetch runs ahead in consumption order (tile, K block, row; on into
// Linear4Args::next_w; how far and into which cache level: isa_shared.h, by CPU family), the next
// tile's scale rows one tile ahead.
#include <immintrin.h>

#include <cstdint>

#include "cpu_expert_worker/kernels/isa_driver.h"
#include "cpu_expert_worker/kernels/isa_shared.h"
#include "cpu_expert_worker/kernels/linear4.h"

namespace ss::expert::internal {
namespace {

constexpr int kRows = 8;

// ue8m0 bytes in dword lanes -> 2^(b-127) as fp32 bits (b = 0: the subnormal 2^-127,
// b = 255: NaN).
inline __m256i Ue8m0Bits(__m256i b) {
  __m256i bits = _mm256_slli_epi32(b, 23);
  bits = _mm256_blendv_epi8(bits, _mm256_set1_epi32(0x00400000),
                            _mm256_cmpeq_epi32(b, _mm256_setzero_si256()));
  return _mm256_blendv_epi8(bits, _mm256_set1_epi32(0x7fc00000),
                            _mm256_cmpeq_epi32(b, _mm256_set1_epi32(255)));
}

// st[kb] = the 4 ue8m0 scale bytes of K block kb of each of the tile's 8 rows (dword r = row
// r0 + r), for every K block: 8 K blocks at a time, one masked load per row and an 8x8 dword
// transpose (24 shuffles).
void TransposeScales(const Linear4Args& a, int64_t r0, __m256i* st) {
  const int64_t nkb = a.k / 128;
  const uint8_t* s = a.s + r0 * a.s_stride;
  for (int64_t kb0 = 0; kb0 < nkb; kb0 += 8) {
    const int64_t n = nkb - kb0 < 8 ? nkb - kb0 : 8;
    const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)),
                                         _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    __m256i x[8], t[8];
    for (int r = 0; r < 8; ++r) {
      x[r] = _mm256_maskload_epi32(reinterpret_cast<const int*>(s + r * a.s_stride + kb0 * 4), m);
    }
    for (int i = 0; i < 8; i += 2) {
      t[i] = _mm256_unpacklo_epi32(x[i], x[i + 1]);
      t[i + 1] = _mm256_unpackhi_epi32(x[i], x[i + 1]);
    }
    // x[4i + c], 128-bit lane L: rows 4i..4i+3 of K block kb0 + 4L + c.
    for (int i = 0; i < 8; i += 4) {
      x[i] = _mm256_unpacklo_epi64(t[i], t[i + 2]);
      x[i + 1] = _mm256_unpackhi_epi64(t[i], t[i + 2]);
      x[i + 2] = _mm256_unpacklo_epi64(t[i + 1], t[i + 3]);
      x[i + 3] = _mm256_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int c = 0; c < 4; ++c) {
      if (c < n) _mm256_store_si256(st + kb0 + c, _mm256_permute2x128_si256(x[c], x[4 + c], 0x20));
      if (4 + c < n) {
        _mm256_store_si256(st + kb0 + 4 + c, _mm256_permute2x128_si256(x[c], x[4 + c], 0x31));
      }
    }
  }
}

// The four groups' scales of one K block (st[kb]) as fp32, one vector per group (lane = row).
// Bytes 1..254 are 2^(b-127) by a shift alone; a 0 (the subnormal 2^-127) or 255 (NaN) takes
// the full decode.
inline void GroupScales(__m256i v, __m256 (&sw)[4]) {
  const __m256i special = _mm256_or_si256(_mm256_cmpeq_epi8(v, _mm256_setzero_si256()),
                                          _mm256_cmpeq_epi8(v, _mm256_set1_epi8(-1)));
  if (_mm256_testz_si256(special, special)) {
    const __m256i exp = _mm256_set1_epi32(0x7f800000);
    sw[0] = _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(v, 23), exp));
    sw[1] = _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(v, 15), exp));
    sw[2] = _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(v, 7), exp));
    sw[3] = _mm256_castsi256_ps(_mm256_and_si256(_mm256_srli_epi32(v, 1), exp));
    return;
  }
  for (int i = 0; i < 4; ++i) {
    sw[i] = _mm256_castsi256_ps(
        Ue8m0Bits(_mm256_and_si256(_mm256_srli_epi32(v, 8 * i), _mm256_set1_epi32(0xff))));
  }
}

// 2·e2m1(code) as int8, in both 128-bit lanes.
inline __m256i E2m1Table() {
  return _mm256_broadcastsi128_si256(
      _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12));
}

// v, as a value the compiler cannot see through. For the decode loops' vector constants: under
// register pressure GCC 12 rebuilds a set1 constant at every use from a general register (movabs,
// vmovq, vpbroadcast: two more shuffle-port uops a weight row), where an opaque one is kept or
// spilled once and read back as a free memory operand (bench/RESULTS.md, session 40).
inline __m256i Opaque(__m256i v) {
  asm("" : "+x"(v));
  return v;
}

// One activation record's planes for a 32-byte chunk c of a K block: [plane][even, odd].
struct Planes {
  __m256i p[3][2];
  const __m256i* unit;  // [p] plane p's unit 2^(5p) in 16 int16 lanes, the caller's
  Planes(const uint8_t* rec, int c, const __m256i* units) : unit(units) {
    for (int i = 0; i < 3; ++i) {
      p[i][0] = _mm256_load_si256(reinterpret_cast<const __m256i*>(rec + kPlaneOffset[i] + c * 64));
      p[i][1] =
          _mm256_load_si256(reinterpret_cast<const __m256i*>(rec + kPlaneOffset[i] + c * 64 + 32));
    }
  }
};

// The exact group sums (4 int32 lanes per group, two groups) of one row's chunk.
inline __m256i DotPlanes(const Planes& pl, __m256i we, __m256i wo) {
  const __m256i m2 =
      _mm256_add_epi16(_mm256_maddubs_epi16(pl.p[2][0], we), _mm256_maddubs_epi16(pl.p[2][1], wo));
  const __m256i m1 =
      _mm256_add_epi16(_mm256_maddubs_epi16(pl.p[1][0], we), _mm256_maddubs_epi16(pl.p[1][1], wo));
  const __m256i m0 =
      _mm256_add_epi16(_mm256_maddubs_epi16(pl.p[0][0], we), _mm256_maddubs_epi16(pl.p[0][1], wo));
  return _mm256_add_epi32(
      _mm256_add_epi32(_mm256_madd_epi16(m2, pl.unit[2]), _mm256_madd_epi16(m1, pl.unit[1])),
      _mm256_madd_epi16(m0, pl.unit[0]));
}

// Plane p's unit 2^(5p) in 16 int16 lanes.
alignas(32) constexpr int16_t kPlaneUnit[3][16] = {
    {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1},
    {32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32},
    {1024, 1024, 1024, 1024, 1024, 1024, 1024, 1024, 1024, 1024, 1024, 1024, 1024, 1024, 1024,
     1024}};

// Two of a chunk's planes, a and b, and their units (kPlaneUnit): for a chunk whose third plane
// is all zero.
struct TwoPlanes {
  __m256i p[2][2];
  const __m256i* unit[2];
  TwoPlanes(const uint8_t* rec, int c, int a, int b) {
    const int idx[2] = {a, b};
    for (int i = 0; i < 2; ++i) {
      const uint8_t* pp = rec + kPlaneOffset[idx[i]] + c * 64;
      p[i][0] = _mm256_load_si256(reinterpret_cast<const __m256i*>(pp));
      p[i][1] = _mm256_load_si256(reinterpret_cast<const __m256i*>(pp + 32));
      unit[i] = reinterpret_cast<const __m256i*>(kPlaneUnit[idx[i]]);
    }
  }
};

// DotPlanes for a chunk whose third plane is all zero: 4 vpmaddubsw and 2 vpmaddwd instead of 6
// and 3.
inline __m256i DotPlanes(const TwoPlanes& pl, __m256i we, __m256i wo) {
  const __m256i ma =
      _mm256_add_epi16(_mm256_maddubs_epi16(pl.p[0][0], we), _mm256_maddubs_epi16(pl.p[0][1], wo));
  const __m256i mb =
      _mm256_add_epi16(_mm256_maddubs_epi16(pl.p[1][0], we), _mm256_maddubs_epi16(pl.p[1][1], wo));
  return _mm256_add_epi32(_mm256_madd_epi16(ma, _mm256_load_si256(pl.unit[0])),
                          _mm256_madd_epi16(mb, _mm256_load_si256(pl.unit[1])));
}

// The 8 rows' sums of a chunk, dot(r) for r = 0..7 (4 int32 lanes per group, two groups) -> ga /
// gb = its two groups' sums with row r in lane r. Rows are reduced in pairs as they finish, so no
// more than two rows' sums are live: with a chunk's operands and constants, the 16 ymm registers
// hold everything (a decode chunk with all three planes still spills about two vectors).
template <class Dot>
inline void ReduceRows(const Dot& dot, __m256i& ga, __m256i& gb) {
  __m256i t2[2];
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h) {
    __m256i t1[2];
#pragma GCC unroll 2
    for (int q = 0; q < 2; ++q) {
      const __m256i r0 = dot(4 * h + 2 * q), r1 = dot(4 * h + 2 * q + 1);
      t1[q] = _mm256_add_epi32(_mm256_unpacklo_epi32(r0, r1), _mm256_unpackhi_epi32(r0, r1));
    }
    t2[h] =
        _mm256_add_epi32(_mm256_unpacklo_epi64(t1[0], t1[1]), _mm256_unpackhi_epi64(t1[0], t1[1]));
  }
  ga = _mm256_permute2x128_si256(t2[0], t2[1], 0x20);
  gb = _mm256_permute2x128_si256(t2[0], t2[1], 0x31);
}

// acc + fp32(ga)·sa'·sw[0] + fp32(gb)·sa'·sw[1]: two consecutive groups in K order, the
// scalar's roundings.
inline __m256 Accumulate(__m256 acc, __m256i ga, __m256i gb, float sa, __m256 swa, __m256 swb) {
  const __m256 s = _mm256_set1_ps(sa);
  acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(ga), s), swa));
  return _mm256_add_ps(acc, _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(gb), s), swb));
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

inline __m256i Load(const uint8_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

// One activation row's chunk c of a K block against the tile's 8 rows (w: their K block, `row`
// bytes apart), its planes in `pl` (Planes or TwoPlanes): ga / gb as ReduceRows gives them; with
// `lines` (Prefetch::Rows), each row requests its prefetch lines. The sign is folded into the
// packed bytes, one XOR per row.
template <class P, class Rows>
inline void ChunkOne(const uint8_t* w, int64_t row, const uint8_t* rec, int c, const P& pl,
                     const Rows* lines, __m256i& ga, __m256i& gb) {
  const __m256i nib = Opaque(_mm256_set1_epi8(0x0f)), lut = E2m1Table();
  const __m256i sx = Load(rec + kSignOffset + c * 32);
  auto dot = [&](int r) {
    if (lines != nullptr) lines->Row(r);
    const __m256i v = _mm256_xor_si256(Load(w + r * row + c * 32), sx);
    const __m256i we = _mm256_shuffle_epi8(lut, _mm256_and_si256(v, nib));
    const __m256i wo = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(v, 4), nib));
    return DotPlanes(pl, we, wo);
  };
  ReduceRows(dot, ga, gb);
}

// One activation row (decode). A chunk whose record marks a plane all zero (the plane mask)
// skips it: 4 vpmaddubsw and 2 vpmaddwd per row instead of 6 and 3. The gain depends on the
// data (bench/RESULTS.md): plane 0 holds |q| < 0.5 (under ~2^-10 of the block's largest
// value), rare in a Gaussian row and common in a SwiGLU output; a span far below its block's
// largest value may need no plane 2 instead. The branch is the same for the tile's 8 rows and
// repeats tile after tile (one token), so it predicts well.
template <bool kTiled, class PF>
void TileOne(const Linear4Args& a, int64_t r0, const __m256i* st, PF& pf) {
  __m256 acc = _mm256_setzero_ps();
  const uint8_t* w = TileBase(a, a.w, r0);
  const int64_t row = RowStep<kTiled>(a), kb_step = Steps(a).kb;
  const uint8_t* rec = Record(a, 0, 0);
  const __m256i units[3] = {Opaque(_mm256_set1_epi16(1)), Opaque(_mm256_set1_epi16(32)),
                            Opaque(_mm256_set1_epi16(1024))};
  for (int64_t kb = 0; kb < a.k / 128; ++kb, w += kb_step, rec += kRecordBytes) {
    pf.Aim(r0, kb);
    const typename PF::Rows lines = pf.Targets();
    const float sa = RecordScale(rec);
    __m256 sw[4];
    GroupScales(_mm256_load_si256(st + kb), sw);
    // Chunk 0 requests the rows' prefetch lines; chunk 1 none.
    auto chunk = [&](int c, const typename PF::Rows* chunk_lines) {
      const int mask = rec[kPlaneMaskOffset + c];
      __m256i ga, gb;
      if (mask == 7) {
        ChunkOne(w, row, rec, c, Planes(rec, c, units), chunk_lines, ga, gb);
      } else {
        // Two planes that include every nonzero one.
        const int hi = (mask & 4) != 0 ? 2 : 1, lo = (mask & 1) != 0 || hi == 1 ? 0 : 1;
        ChunkOne(w, row, rec, c, TwoPlanes(rec, c, hi, lo), chunk_lines, ga, gb);
      }
      acc = Accumulate(acc, ga, gb, sa, sw[2 * c], sw[2 * c + 1]);
    };
    chunk(0, &lines);
    chunk(1, static_cast<const typename PF::Rows*>(nullptr));
  }
  Store(a.epilogue, a.y[0] + r0, acc);
}

// The multi-row path reads WIDE RECORDS, built per call from the activation records (WidenRecords).
// With A = M·2^b as in linear4.h: H = ±A/8 for b >= 3 (<= 15·2^11, exact), L = ±A for b <= 2
// (<= 60), so ±A = 8·H + L. Per row and K block, for chunk c (elements 64c..64c+63, in the
// record's plane order): int16 H[4], vector v = 2·(odd) + (high 8 of each 128-bit lane), i.e. the
// order _mm256_unpack{lo,hi}_epi8 gives the plane bytes; then u8 L'[2] (even, odd: plane order).
// A span with no L value stores H and no L'; one with an L value (bit c of WideMeta::low) stores
// H - 8 and L' = L + 64 (4..124): 8·(H - 8) + (L + 64) = ±A element by element, and L' is
// unsigned, for vpmaddubsw against the signed weights. So one vpmaddwd takes 16 weights, signs
// included, and the rare small values cost one vpmaddubsw per 32.
// Records [kb][i]: a K block's rows are one sequential stream.
constexpr int64_t kWideChunk = kWideBytes / 2;
constexpr int kWideShift = 3;  // ±A = H·2^kWideShift + L; WideMeta::low: bit c, span c holds one

// One record's chunk c -> its wide vectors (H[4], L'[2]); returns whether it holds an L value. A
// plane-0 value (b <= 4) of at least 64 has b >= 3 (M >= 8 unless b = 0), so it belongs to H.
inline bool WidenChunk(const uint8_t* rec, int c, __m256i* out) {
  const __m256i zero = _mm256_setzero_si256(), sx = Load(rec + kSignOffset + c * 32);
  const __m256i neg[2] = {
      _mm256_cmpeq_epi8(_mm256_and_si256(sx, _mm256_set1_epi8(0x08)), _mm256_set1_epi8(0x08)),
      _mm256_cmpeq_epi8(_mm256_and_si256(sx, _mm256_set1_epi8(static_cast<char>(0x80))),
                        _mm256_set1_epi8(static_cast<char>(0x80)))};
  __m256i p[2][3], low[2];
  for (int h = 0; h < 2; ++h) {
    for (int i = 0; i < 3; ++i) p[h][i] = Load(rec + kPlaneOffset[i] + c * 64 + h * 32);
    const __m256i small = _mm256_cmpeq_epi8(
        _mm256_and_si256(p[h][0], _mm256_set1_epi8(static_cast<char>(0xc0))), zero);
    low[h] = _mm256_and_si256(small, p[h][0]);
    p[h][0] = _mm256_andnot_si256(small, p[h][0]);
  }
  const __m256i any = _mm256_or_si256(low[0], low[1]);
  const bool has_low = !_mm256_testz_si256(any, any);
  const __m256i offset = _mm256_set1_epi16(has_low ? 8 : 0);
  for (int h = 0; h < 2; ++h) {
    for (int half = 0; half < 2; ++half) {
      const auto widen = [&](__m256i b, __m256i hi) {
        return half == 0 ? _mm256_unpacklo_epi8(b, hi) : _mm256_unpackhi_epi8(b, hi);
      };
      const __m256i m = widen(neg[h], neg[h]);
      const __m256i hv = _mm256_add_epi16(
          _mm256_add_epi16(_mm256_srli_epi16(widen(p[h][0], zero), kWideShift),
                           _mm256_slli_epi16(widen(p[h][1], zero), 5 - kWideShift)),
          _mm256_slli_epi16(widen(p[h][2], zero), 10 - kWideShift));
      out[2 * h + half] = _mm256_sub_epi16(_mm256_sub_epi16(_mm256_xor_si256(hv, m), m), offset);
    }
    if (has_low) {
      out[4 + h] = _mm256_add_epi8(_mm256_sub_epi8(_mm256_xor_si256(low[h], neg[h]), neg[h]),
                                   _mm256_set1_epi8(64));
    }
  }
  return has_low;
}

// Every record of the call into wide records ([kb][i], kWideBytes each) and their meta.
void WidenRecords(const Linear4Args& a, uint8_t* wide, WideMeta* meta) {
  for (int64_t i = 0; i < a.n; ++i) {
    for (int64_t kb = 0; kb < a.k / 128; ++kb) {
      const uint8_t* rec = Record(a, i, kb);
      uint8_t* out = wide + (kb * a.n + i) * kWideBytes;
      WideMeta& m = meta[kb * a.n + i];
      m.scale = RecordScale(rec);
      m.low = 0;
      for (int c = 0; c < 2; ++c) {
        m.low |= (WidenChunk(rec, c, reinterpret_cast<__m256i*>(out + c * kWideChunk)) ? 1 : 0)
                 << c;
      }
    }
  }
}

// A K block of the tile's 8 weight rows, 2·e2m1 in the wide orders: [row][chunk][6], the int16
// vectors W[4] as H's, then the int8 vectors (even, odd) as L''s.
constexpr int kWideVecs = 6;
inline void WidenWeights(const uint8_t* w, int64_t row, __m256i* wv) {
  const __m256i nib = _mm256_set1_epi8(0x0f), lut = E2m1Table(), zero = _mm256_setzero_si256();
  for (int r = 0; r < kRows; ++r) {
    for (int c = 0; c < 2; ++c) {
      const __m256i v = Load(w + r * row + c * 32);
      const __m256i e[2] = {
          _mm256_shuffle_epi8(lut, _mm256_and_si256(v, nib)),
          _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(v, 4), nib))};
      __m256i* out = wv + (r * 2 + c) * kWideVecs;
      for (int h = 0; h < 2; ++h) {
        const __m256i sign = _mm256_cmpgt_epi8(zero, e[h]);
        _mm256_store_si256(out + 2 * h, _mm256_unpacklo_epi8(e[h], sign));
        _mm256_store_si256(out + 2 * h + 1, _mm256_unpackhi_epi8(e[h], sign));
        _mm256_store_si256(out + 4 + h, e[h]);
      }
    }
  }
}

// Σ_v x[v]·w[v] over a chunk's four int16 vectors (vpmaddwd): 4 int32 lanes per group.
inline __m256i Madd4(const __m256i (&x)[4], const __m256i* w) {
  return _mm256_add_epi32(_mm256_add_epi32(_mm256_madd_epi16(x[0], _mm256_load_si256(w)),
                                           _mm256_madd_epi16(x[1], _mm256_load_si256(w + 1))),
                          _mm256_add_epi32(_mm256_madd_epi16(x[2], _mm256_load_si256(w + 2)),
                                           _mm256_madd_epi16(x[3], _mm256_load_si256(w + 3))));
}

// One activation row's chunk c (its wide vectors at x) against the tile's 8 widened weight rows:
// ga / gb as ReduceRows gives them; L' only if kLow.
template <bool kLow>
inline void ChunkWide(const __m256i* wv, const __m256i* x, int c, __m256i& ga, __m256i& gb) {
  const __m256i h[4] = {_mm256_load_si256(x), _mm256_load_si256(x + 1), _mm256_load_si256(x + 2),
                        _mm256_load_si256(x + 3)};
  auto dot = [&](int r) {
    const __m256i* w = wv + (r * 2 + c) * kWideVecs;
    const __m256i hs = Madd4(h, w);
    if (!kLow) return hs;
    const __m256i l =
        _mm256_add_epi16(_mm256_maddubs_epi16(_mm256_load_si256(x + 4), _mm256_load_si256(w + 4)),
                         _mm256_maddubs_epi16(_mm256_load_si256(x + 5), _mm256_load_si256(w + 5)));
    return _mm256_add_epi32(_mm256_slli_epi32(hs, kWideShift),
                            _mm256_madd_epi16(l, _mm256_set1_epi16(1)));
  };
  ReduceRows(dot, ga, gb);
  if (!kLow) {  // the units of H, after the (linear) reduction
    ga = _mm256_slli_epi32(ga, kWideShift);
    gb = _mm256_slli_epi32(gb, kWideShift);
  }
}

// Any number of activation rows, from their wide records: each K block's weights are widened
// once into `wv` (L1) and every activation row runs against them.
template <bool kTiled, class PF>
void TileMany(const Linear4Args& a, int64_t r0, const __m256i* st, float* acc, __m256i* wv,
              const uint8_t* wide, const WideMeta* meta, PF& pf) {
  for (int64_t i = 0; i < a.n * kRows; ++i) acc[i] = 0.0f;
  const uint8_t* w = TileBase(a, a.w, r0);
  const int64_t row = RowStep<kTiled>(a), kb_step = Steps(a).kb;
  for (int64_t kb = 0; kb < a.k / 128; ++kb, w += kb_step) {
    pf.Step(r0, kb);
    WidenWeights(w, row, wv);
    __m256 sw[4];
    GroupScales(_mm256_load_si256(st + kb), sw);
    const uint8_t* x = wide + kb * a.n * kWideBytes;
    const WideMeta* m = meta + kb * a.n;
    for (int64_t i = 0; i < a.n; ++i, x += kWideBytes) {
      float* at = acc + i * kRows;
      __m256 ai = _mm256_load_ps(at);
      for (int c = 0; c < 2; ++c) {
        const __m256i* xc = reinterpret_cast<const __m256i*>(x + c * kWideChunk);
        __m256i ga, gb;
        if ((m[i].low >> c & 1) != 0) {
          ChunkWide<true>(wv, xc, c, ga, gb);
        } else {
          ChunkWide<false>(wv, xc, c, ga, gb);
        }
        ai = Accumulate(ai, ga, gb, m[i].scale, sw[2 * c], sw[2 * c + 1]);
      }
      _mm256_store_ps(at, ai);
    }
  }
  for (int64_t i = 0; i < a.n; ++i) Store(a.epilogue, a.y[i] + r0, _mm256_load_ps(acc + i * kRows));
}

// This file's kernel, for isa_driver.h.
struct Kernel {
  using Vec = __m256i;
  static constexpr int kRows = internal::kRows, kWideVecs = kRows * 2 * internal::kWideVecs;
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

void Linear4Avx2(const Linear4Args& a) { Linear4Pair<Kernel>(a, nullptr); }

void Linear4PairAvx2(const Linear4Args& a, const Linear4Args& b) { Linear4Pair<Kernel>(a, &b); }

}  // namespace ss::expert::internal
