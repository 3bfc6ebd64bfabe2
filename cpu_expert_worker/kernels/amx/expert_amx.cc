// Linear4Rows on AMX-INT8 tiles (Sapphire Rapids and later) for calls of several activation
// rows; calls of fewer rows run the AVX-512 kernel, whose records (QuantizeActAvx512) and weight
// tiles (16 rows) this variant reads. Compiled with the AVX-512 flags plus -mavx512vbmi
// -mamx-tile -mamx-int8; see linear4.h for the contract and why this file includes no library
// header.
//
// Exact sums on tiles (linear4.h): TDPBSSD multiplies the s8 bytes of A's rows by the s8 bytes of
// B's columns and adds them into int32 lanes without saturation. A token's signed activation value
// v = ±(plane2·2^10 + plane1·2^5 + plane0) (each element lives in one plane) is split into s8
// parts v = X + 2^11·Y, X = Xl + 10·Xh (|Y| <= 120, |Xh| <= 102, |Xl| <= 105), found from the
// record's planes with byte arithmetic and a 64-entry table. For one 32-group a token's X row is
// [Xl | Xh] and its Y row [Y | 0] over the group's elements (even ones, then odd: the record's
// order and the packed nibbles'), and a weight row's B column is [2·e2m1 | 10·2·e2m1]; so two
// TDPBSSD leave C_X = Σ X·w and C_Y = Σ Y·w for 16 tokens × 16 weight rows, and C_X + 2^11·C_Y
// is the group's exact sum, converted to fp32 (the one rounding), scaled and added in K order
// exactly as the scalar definition does.
//
// Order of work: weight rows in blocks of kAmxRowBlock; per K block, every token's record is
// split into A rows and the block's weights are decoded into B tiles (a 16x16 dword transpose
// per tile and nibble half) once; then per group, in K order, each token tile's two A tiles are
// loaded and every weight tile runs two TDPBSSD and adds its 16 x 16 results to fp32
// accumulators (scratch), one weight tile behind.
#include <cstdint>
#include <cstring>

#include "cpu_expert_worker/kernels/avx512/avx512_shared.h"
#include "cpu_expert_worker/kernels/isa_shared.h"
#include "cpu_expert_worker/kernels/linear4.h"

namespace ss::expert::internal {
namespace {

constexpr int kRows = 16;            // weight rows of a B tile, tokens of an A tile
constexpr int kTileBytes = 1024;     // 16 rows of 64 bytes
constexpr int64_t kWeightAhead = 2;  // K blocks the weight prefetch runs ahead
// Calls of fewer activation rows run the AVX-512 kernel: a tile of 16 rows would be mostly
// padding (bench/RESULTS.md, the AMX rows by call size).
constexpr int64_t kMinTileRows = 8;

// Tile registers (GCC's tile intrinsics paste the number into the instruction, so the code
// writes literals): tmm3 = the X rows, tmm4 = the Y rows; for even weight tiles tmm0 = C_X,
// tmm1 = C_Y, tmm2 = the B tile, for odd ones tmm5, tmm6, tmm7 (a tile's epilogue runs while the
// next tile's instructions do).
constexpr int kTilesUsed = 8;

// Plane 1's split: for r = plane1 − 64·round(plane1 / 64) in [−32, 31], at index r mod 64,
// X = 32·r = xl + 10·xh.
struct Plane1Split {
  alignas(64) int8_t xh[64];
  alignas(64) int8_t xl[64];
  constexpr Plane1Split() : xh(), xl() {
    for (int i = 0; i < 64; ++i) {
      const int x = 32 * (i < 32 ? i : i - 64);
      int h = (x + 5) / 10;
      if ((x + 5) % 10 != 0 && x + 5 < 0) --h;  // floor
      xh[i] = static_cast<int8_t>(h);
      xl[i] = static_cast<int8_t>(x - 10 * h);
    }
  }
};
constexpr Plane1Split kPlane1Split;

// Palette 1, tiles 0..4 of 16 rows x 64 bytes.
struct alignas(64) TileConfig {
  uint8_t palette_id = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
  TileConfig() {
    for (int t = 0; t < kTilesUsed; ++t) {
      colsb[t] = 64;
      rows[t] = kRows;
    }
  }
};

// The B tiles of one K block of 16 weight rows (w: their K block, `row` bytes apart): tile g
// (bt + g·kTileBytes) holds group g, row kk dword n = weight row n's K positions 4kk..4kk+3 of
// [even 16 | odd 16 | 10·even 16 | 10·odd 16] as 2·e2m1 in s8 (|10·2·e2m1| <= 120).
inline void DecodeWeights(const uint8_t* w, int64_t row, uint8_t* bt) {
  const __m512i nib = _mm512_set1_epi8(0x0f), lut = E2m1Table();
  for (int half = 0; half < 2; ++half) {
    __m512i v[16], t[16];
    for (int r = 0; r < kRows; ++r) {
      __m512i x = _mm512_loadu_si512(w + r * row);
      if (half == 1) x = _mm512_srli_epi16(x, 4);
      v[r] = _mm512_shuffle_epi8(lut, _mm512_and_si512(x, nib));
    }
    Transpose16(v, t);  // t[4g + kk]: lane g's dword kk of every row
    for (int g = 0; g < 4; ++g) {
      __m512i* b = reinterpret_cast<__m512i*>(bt + g * kTileBytes);
      for (int kk = 0; kk < 4; ++kk) {
        const __m512i x = t[4 * g + kk], x2 = _mm512_add_epi8(x, x);
        const __m512i x4 = _mm512_add_epi8(x2, x2), x8 = _mm512_add_epi8(x4, x4);
        _mm512_store_si512(b + half * 4 + kk, x);
        _mm512_store_si512(b + 8 + half * 4 + kk, _mm512_add_epi8(x8, x2));
      }
    }
  }
}

// One half (even or odd elements, `off` 0 or 64 within each plane) of a record's K block as
// signed parts v = xl + 10·xh + 2^11·y, negated where `neg` is set. Byte arithmetic wraps: every
// true result fits in s8.
inline void Parts(const uint8_t* rec, int off, __mmask64 neg, __m512i& xl, __m512i& xh,
                  __m512i& y) {
  const __m512i zero = _mm512_setzero_si512();
  const __m512i p2 = _mm512_load_si512(rec + kPlaneOffset[2] + off);
  const __m512i p1 = _mm512_load_si512(rec + kPlaneOffset[1] + off);
  const __m512i p0 = _mm512_load_si512(rec + kPlaneOffset[0] + off);
  // Plane 2, |v| = 2^10·p2: y = ceil(p2 / 2), and X = −2^10 = −4 + 10·(−102) where p2 is odd.
  const __m512i y2 = _mm512_avg_epu8(p2, zero);
  const __mmask64 odd = _mm512_test_epi8_mask(p2, _mm512_set1_epi8(1));
  // Plane 1, |v| = 32·p1: y = round(p1 / 64) = ((p1 >> 1) + 16) >> 5, X = 32·(p1 − 64·y).
  const __m512i h1 = _mm512_add_epi8(
      _mm512_and_si512(_mm512_srli_epi16(p1, 1), _mm512_set1_epi8(0x7f)), _mm512_set1_epi8(16));
  const __m512i y1 = _mm512_and_si512(_mm512_srli_epi16(h1, 5), _mm512_set1_epi8(0x07));
  const __m512i r = _mm512_sub_epi8(
      p1, _mm512_and_si512(_mm512_slli_epi16(y1, 6), _mm512_set1_epi8(static_cast<char>(0xc0))));
  // Plane 0, |v| = p0 = (p0 − 10·(p0 >> 4)) + 10·(p0 >> 4).
  const __m512i h0 = _mm512_and_si512(_mm512_srli_epi16(p0, 4), _mm512_set1_epi8(0x0f));
  const __m512i tens = _mm512_broadcast_i32x4(
      _mm_setr_epi8(0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110, 120, static_cast<char>(130),
                    static_cast<char>(140), static_cast<char>(150)));
  const __m512i l0 = _mm512_sub_epi8(p0, _mm512_shuffle_epi8(tens, h0));
  // Each element is in one plane: the others contribute zeros.
  const __m512i xh_t = _mm512_load_si512(kPlane1Split.xh),
                xl_t = _mm512_load_si512(kPlane1Split.xl);
  y = _mm512_add_epi8(y2, y1);
  xh = _mm512_add_epi8(_mm512_maskz_mov_epi8(odd, _mm512_set1_epi8(-102)),
                       _mm512_add_epi8(_mm512_permutexvar_epi8(r, xh_t), h0));
  xl = _mm512_add_epi8(_mm512_maskz_mov_epi8(odd, _mm512_set1_epi8(-4)),
                       _mm512_add_epi8(_mm512_permutexvar_epi8(r, xl_t), l0));
  y = _mm512_mask_sub_epi8(y, neg, zero, y);
  xh = _mm512_mask_sub_epi8(xh, neg, zero, xh);
  xl = _mm512_mask_sub_epi8(xl, neg, zero, xl);
}

// Row g of four vectors' 128-bit lanes: [a.lane g | b.lane g | c.lane g | d.lane g], g = 0..3.
inline void LaneTranspose(__m512i a, __m512i b, __m512i c, __m512i d, __m512i (&rows)[4]) {
  const __m512i t0 = _mm512_shuffle_i32x4(a, b, 0x44), t1 = _mm512_shuffle_i32x4(a, b, 0xee);
  const __m512i t2 = _mm512_shuffle_i32x4(c, d, 0x44), t3 = _mm512_shuffle_i32x4(c, d, 0xee);
  rows[0] = _mm512_shuffle_i32x4(t0, t2, 0x88);
  rows[1] = _mm512_shuffle_i32x4(t0, t2, 0xdd);
  rows[2] = _mm512_shuffle_i32x4(t1, t3, 0x88);
  rows[3] = _mm512_shuffle_i32x4(t1, t3, 0xdd);
}

// The A rows of one token's K block (record `rec`): group g's X row [xl | xh] at xt + g·64 and
// Y row [y | 0] at yt + g·64, each over [even 16 | odd 16] elements.
inline void BuildRows(const uint8_t* rec, uint8_t* xt, uint8_t* yt) {
  const __m512i sx = _mm512_load_si512(rec + kSignOffset);
  const __mmask64 ne = _mm512_test_epi8_mask(sx, _mm512_set1_epi8(0x08));
  const __mmask64 no = _mm512_test_epi8_mask(sx, _mm512_set1_epi8(static_cast<char>(0x80)));
  __m512i xle, xhe, ye, xlo, xho, yo;
  Parts(rec, 0, ne, xle, xhe, ye);
  Parts(rec, 64, no, xlo, xho, yo);
  __m512i rows[4];
  LaneTranspose(xle, xlo, xhe, xho, rows);
  for (int g = 0; g < 4; ++g) _mm512_store_si512(xt + g * 64, rows[g]);
  LaneTranspose(ye, yo, _mm512_setzero_si512(), _mm512_setzero_si512(), rows);
  for (int g = 0; g < 4; ++g) _mm512_store_si512(yt + g * 64, rows[g]);
}

// The four groups' weight scales of one K block of 16 weight rows: sw + g·16, lane = row.
inline void WeightScales(const Linear4Args& a, int64_t r0, int64_t kb, float* sw) {
  const __m512i idx =
      _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                         _mm512_set1_epi32(static_cast<int>(a.s_stride)));
  const __m512i v = _mm512_i32gather_epi32(idx, a.s + r0 * a.s_stride + kb * 4, 1);
  __m512 g[4];
  GroupScales(v, g);
  for (int q = 0; q < 4; ++q) _mm512_store_ps(sw + q * 16, g[q]);
}

// acc[j] += fp32(C_X + 2^11·C_Y of token j)·sa[j]·sw for j < count (acc rows `stride` floats
// apart): one group's results, the scalar's roundings.
inline void AddGroup(const int32_t* ct, const float* sa, const float* sw, float* acc,
                     int64_t stride, int64_t count) {
  const __m512 swv = _mm512_load_ps(sw);
  for (int64_t j = 0; j < count; ++j) {
    const __m512i v = _mm512_add_epi32(_mm512_load_si512(ct + j * 16),
                                       _mm512_slli_epi32(_mm512_load_si512(ct + 256 + j * 16), 11));
    const __m512 f =
        _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(v), _mm512_set1_ps(sa[j])), swv);
    float* at = acc + j * stride;
    _mm512_store_ps(at, _mm512_add_ps(_mm512_load_ps(at), f));
  }
}

inline void PrefetchLine(const uint8_t* p) {
  asm volatile("prefetcht0 %0" : : "m"(*reinterpret_cast<const char*>(p)));
}

// Weight rows of one or two calls sharing their activations (q, sa, n, k; the first's scratch):
// `rows` rows from r0 of each, at most kAmxRowBlock together.
struct Segment {
  const Linear4Args* a;
  int64_t r0, rows;
};

// The segments' weight rows (multiples of 16) for every token: each K block's records are split
// once for all of them.
void RowBlock(const Segment* seg, int nseg) {
  const Linear4Args& a = *seg[0].a;             // the activations, shared
  const Linear4Args* ta[kAmxRowBlock / kRows];  // per weight tile: its call and first row
  int64_t tr[kAmxRowBlock / kRows];
  int64_t tiles = 0;
  for (int s = 0; s < nseg; ++s) {
    for (int64_t r = 0; r < seg[s].rows; r += kRows, ++tiles) {
      ta[tiles] = seg[s].a;
      tr[tiles] = seg[s].r0 + r;
    }
  }
  const int64_t nkb = a.k / 128, padded = (a.n + 15) / 16 * 16;
  uint8_t* bt = reinterpret_cast<uint8_t*>(a.scratch);             // [tile][group] B tiles
  uint8_t* xt = bt + kAmxRowBlock / kRows * 4 * kTileBytes;        // [token][group] X rows
  uint8_t* yt = xt + padded * 4 * 64;                              // [token][group] Y rows
  int32_t* ct = reinterpret_cast<int32_t*>(yt + padded * 4 * 64);  // 2 x C_X, C_Y [16][16]
  float* sw = reinterpret_cast<float*>(ct + 4 * 256);              // [tile][group][16]
  float* sa = sw + kAmxRowBlock / kRows * 64;                      // [padded]
  float* acc = sa + padded;                                        // [n][kAmxRowBlock]
  for (int64_t i = 0; i < a.n * kAmxRowBlock; ++i) acc[i] = 0.0f;
  for (int64_t i = a.n * 4 * 64; i < padded * 4 * 64; i += 64) {  // padding tokens: zero rows
    _mm512_store_si512(xt + i, _mm512_setzero_si512());
    _mm512_store_si512(yt + i, _mm512_setzero_si512());
  }
  for (int64_t kb = 0; kb < nkb; ++kb) {
    for (int64_t i = 0; i < a.n; ++i) {
      const uint8_t* rec = Record(a, i, kb);
      if (kb + 1 < nkb) {
        for (int64_t off = 0; off < kRecordBytes; off += 64) PrefetchLine(rec + kRecordBytes + off);
      }
      BuildRows(rec, xt + i * 4 * 64, yt + i * 4 * 64);
      sa[i] = RecordScale(rec);
    }
    for (int64_t t = 0; t < tiles; ++t) {
      const Linear4Args& w_args = *ta[t];
      const int64_t step = w_args.w_tile_rows != 0 ? 64 : Steps(w_args).row;
      const int64_t kb_step = Steps(w_args).kb;
      const uint8_t* w = TileBase(w_args, w_args.w, tr[t]) + kb * kb_step;
      if (kb + kWeightAhead < nkb) {
        for (int r = 0; r < kRows; ++r) PrefetchLine(w + kWeightAhead * kb_step + r * step);
      }
      DecodeWeights(w, step, bt + t * 4 * kTileBytes);
      WeightScales(w_args, tr[t], kb, sw + t * 64);
    }
    // Groups in K order; each token tile's A tiles stay loaded across the weight tiles.
    for (int g = 0; g < 4; ++g) {
      for (int64_t j0 = 0; j0 < a.n; j0 += kRows) {
        _tile_loadd(3, xt + (j0 * 4 + g) * 64, 4 * 64);
        _tile_loadd(4, yt + (j0 * 4 + g) * 64, 4 * 64);
        const int64_t count = a.n - j0 < kRows ? a.n - j0 : kRows;
        // Software-pipelined: weight tile t's tile work, then tile t - 1's epilogue.
        for (int64_t t = 0; t <= tiles; ++t) {
          if (t < tiles) {
            int32_t* c = ct + (t & 1) * 512;
            if ((t & 1) == 0) {
              _tile_loadd(2, bt + (t * 4 + g) * kTileBytes, 64);
              _tile_zero(0);
              _tile_zero(1);
              _tile_dpbssd(0, 3, 2);
              _tile_dpbssd(1, 4, 2);
              _tile_stored(0, c, 64);
              _tile_stored(1, c + 256, 64);
            } else {
              _tile_loadd(7, bt + (t * 4 + g) * kTileBytes, 64);
              _tile_zero(5);
              _tile_zero(6);
              _tile_dpbssd(5, 3, 7);
              _tile_dpbssd(6, 4, 7);
              _tile_stored(5, c, 64);
              _tile_stored(6, c + 256, 64);
            }
          }
          if (t > 0) {
            const int64_t u = t - 1;
            AddGroup(ct + (u & 1) * 512, sa + j0, sw + (u * 4 + g) * 16,
                     acc + j0 * kAmxRowBlock + u * kRows, kAmxRowBlock, count);
          }
        }
      }
    }
  }
  for (int64_t i = 0; i < a.n; ++i) {
    for (int64_t t = 0; t < tiles; ++t) {
      Store(ta[t]->epilogue, ta[t]->y[i] + tr[t],
            _mm512_load_ps(acc + i * kAmxRowBlock + t * kRows));
    }
  }
}

}  // namespace

void Linear4Amx(const Linear4Args& a) {
  if (a.n < kMinTileRows) {
    Linear4Avx512(a);
    return;
  }
  const TileConfig config;
  _tile_loadconfig(&config);
  for (int64_t r0 = 0; r0 < a.rows; r0 += kAmxRowBlock) {
    const Segment seg{&a, r0, a.rows - r0 < kAmxRowBlock ? a.rows - r0 : kAmxRowBlock};
    RowBlock(&seg, 1);
  }
  _tile_release();
}

void Linear4PairAmx(const Linear4Args& a, const Linear4Args& b) {
  if (a.n < kMinTileRows) {
    Linear4PairAvx512(a, b);
    return;
  }
  if (a.rows + b.rows > kAmxRowBlock) {
    Linear4Amx(a);
    Linear4Amx(b);
    return;
  }
  const TileConfig config;
  _tile_loadconfig(&config);
  const Segment seg[2] = {{&a, 0, a.rows}, {&b, 0, b.rows}};
  RowBlock(seg, 2);
  _tile_release();
}

}  // namespace ss::expert::internal
