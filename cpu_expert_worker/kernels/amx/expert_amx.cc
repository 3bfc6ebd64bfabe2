// Linear4Rows on AMX-INT8 tiles (Sapphire Rapids and later) for calls of several activation
// rows; calls of fewer rows run the AVX-512 kernel, whose records (QuantizeActAvx512) and weight
// tiles (16 rows) this variant reads. Compiled with the AVX-512 flags plus -mamx-tile
// -mamx-int8; see linear4.h for the contract and why this file includes no library header.
//
// Exact sums on tiles (linear4.h): TDPBUSD multiplies the u8 bytes of A's rows by the s8 bytes
// of B's columns and adds them into int32 lanes without saturation. For one 32-group, a token's
// A row is 64 bytes, [the plane's magnitudes of the group's non-negative elements | of its
// negative ones] (the other half's elements zero), and a weight row's B column is
// [2·e2m1 | −2·e2m1] over the same elements in the same order (even elements, then odd: the
// record's order and the packed nibbles'). One TDPBUSD thus leaves one plane's exact signed
// group sums for 16 tokens × 16 weight rows; the three planes' sums, shifted by 5 between them,
// give each group's exact sum, which is converted to fp32 (the one rounding), scaled and added in
// K order exactly as the scalar definition does.
//
// Order of work: weight rows in blocks of kAmxRowBlock; per K block, every token's record is
// split into A rows and the block's weights are decoded into B tiles (a 16x16 dword transpose
// per tile and nibble half) once; then per group, in K order, each token tile's three A tiles
// are loaded and every weight tile runs three TDPBUSD and adds its 16 x 16 results to fp32
// accumulators (scratch).
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
constexpr int64_t kMinTileRows = 10;

// Tile registers (GCC's tile intrinsics paste the number into the instruction, so the code
// writes literals): tmm0..2 = plane p's sums C[p], tmm3 = the B tile, tmm4..6 = plane p's token
// rows A[p].
constexpr int kTilesUsed = 7;

// Palette 1, tiles 0..6 of 16 rows x 64 bytes.
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

// The B tiles of one K block of 16 weight rows (w: their K block, `row` bytes apart): tile g
// (bt + g·kTileBytes) holds group g, row kk dword n = weight row n's K positions 4kk..4kk+3 of
// [even 16 | odd 16 | −even 16 | −odd 16] as 2·e2m1 in s8.
inline void DecodeWeights(const uint8_t* w, int64_t row, uint8_t* bt) {
  const __m512i nib = _mm512_set1_epi8(0x0f), lut = E2m1Table(), zero = _mm512_setzero_si512();
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
        _mm512_store_si512(b + half * 4 + kk, t[4 * g + kk]);
        _mm512_store_si512(b + 8 + half * 4 + kk, _mm512_sub_epi8(zero, t[4 * g + kk]));
      }
    }
  }
}

// The A rows of one token's K block (record `rec`): row (g, p) at at + ((g·3 + p)·padded + i)·64
// = [plane p's bytes of group g where the element is non-negative | where it is negative].
inline void BuildRows(const uint8_t* rec, uint8_t* at, int64_t padded, int64_t i) {
  const __m512i sx = _mm512_load_si512(rec + kSignOffset);
  const __mmask64 ne = _mm512_test_epi8_mask(sx, _mm512_set1_epi8(0x08));
  const __mmask64 no = _mm512_test_epi8_mask(sx, _mm512_set1_epi8(static_cast<char>(0x80)));
  for (int p = 0; p < 3; ++p) {
    const __m512i e = _mm512_load_si512(rec + kPlaneOffset[p]);
    const __m512i o = _mm512_load_si512(rec + kPlaneOffset[p] + 64);
    const __m512i ep = _mm512_maskz_mov_epi8(~ne, e), en = _mm512_maskz_mov_epi8(ne, e);
    const __m512i op = _mm512_maskz_mov_epi8(~no, o), on = _mm512_maskz_mov_epi8(no, o);
    // Row g = [ep | op | en | on] lane g: a 4x4 transpose of 128-bit lanes.
    const __m512i t0 = _mm512_shuffle_i32x4(ep, op, 0x44), t1 = _mm512_shuffle_i32x4(ep, op, 0xee);
    const __m512i t2 = _mm512_shuffle_i32x4(en, on, 0x44), t3 = _mm512_shuffle_i32x4(en, on, 0xee);
    const __m512i rows[4] = {_mm512_shuffle_i32x4(t0, t2, 0x88), _mm512_shuffle_i32x4(t0, t2, 0xdd),
                             _mm512_shuffle_i32x4(t1, t3, 0x88),
                             _mm512_shuffle_i32x4(t1, t3, 0xdd)};
    for (int g = 0; g < 4; ++g) _mm512_store_si512(at + ((g * 3 + p) * padded + i) * 64, rows[g]);
  }
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

// acc[j] += fp32(C2·2^10 + C1·2^5 + C0 of token j)·sa[j]·sw for j < count (acc rows `stride`
// floats apart): one group's results, the scalar's roundings.
inline void AddGroup(const int32_t* ct, const float* sa, const float* sw, float* acc,
                     int64_t stride, int64_t count) {
  const __m512 swv = _mm512_load_ps(sw);
  for (int64_t j = 0; j < count; ++j) {
    __m512i v = _mm512_slli_epi32(_mm512_load_si512(ct + 512 + j * 16), 5);
    v = _mm512_slli_epi32(_mm512_add_epi32(v, _mm512_load_si512(ct + 256 + j * 16)), 5);
    v = _mm512_add_epi32(v, _mm512_load_si512(ct + j * 16));
    const __m512 f =
        _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(v), _mm512_set1_ps(sa[j])), swv);
    float* at = acc + j * stride;
    _mm512_store_ps(at, _mm512_add_ps(_mm512_load_ps(at), f));
  }
}

inline void PrefetchLine(const uint8_t* p) {
  asm volatile("prefetcht0 %0" : : "m"(*reinterpret_cast<const char*>(p)));
}

// Weight rows [r0, r0 + rows) (rows a multiple of 16, at most kAmxRowBlock) for every token.
void RowBlock(const Linear4Args& a, int64_t r0, int64_t rows) {
  const int64_t tiles = rows / kRows, nkb = a.k / 128, padded = (a.n + 15) / 16 * 16;
  const int64_t step = a.w_tile_rows != 0 ? 64 : Steps(a).row, kb_step = Steps(a).kb;
  uint8_t* bt = reinterpret_cast<uint8_t*>(a.scratch);              // [tile][group] B tiles
  uint8_t* at = bt + kAmxRowBlock / kRows * 4 * kTileBytes;         // [group][plane][token] A rows
  int32_t* ct = reinterpret_cast<int32_t*>(at + padded * 12 * 64);  // [plane][16][16]
  float* sw = reinterpret_cast<float*>(ct + 3 * 256);               // [tile][group][16]
  float* sa = sw + kAmxRowBlock / kRows * 64;                       // [padded]
  float* acc = sa + padded;                                         // [n][kAmxRowBlock]
  for (int64_t i = 0; i < a.n * kAmxRowBlock; ++i) acc[i] = 0.0f;
  for (int64_t i = a.n; i < padded; ++i) {  // padding tokens: zero rows, results unread
    for (int r = 0; r < 12; ++r) {
      _mm512_store_si512(at + (r * padded + i) * 64, _mm512_setzero_si512());
    }
  }
  for (int64_t kb = 0; kb < nkb; ++kb) {
    for (int64_t i = 0; i < a.n; ++i) {
      const uint8_t* rec = Record(a, i, kb);
      if (kb + 1 < nkb) {
        for (int64_t off = 0; off < kRecordBytes; off += 64) PrefetchLine(rec + kRecordBytes + off);
      }
      BuildRows(rec, at, padded, i);
      sa[i] = RecordScale(rec);
    }
    for (int64_t t = 0; t < tiles; ++t) {
      const uint8_t* w = TileBase(a, a.w, r0 + t * kRows) + kb * kb_step;
      if (kb + kWeightAhead < nkb) {
        for (int r = 0; r < kRows; ++r) PrefetchLine(w + kWeightAhead * kb_step + r * step);
      }
      DecodeWeights(w, step, bt + t * 4 * kTileBytes);
      WeightScales(a, r0 + t * kRows, kb, sw + t * 64);
    }
    // Groups in K order; each token tile's three A tiles stay loaded across the weight tiles.
    for (int g = 0; g < 4; ++g) {
      for (int64_t j0 = 0; j0 < a.n; j0 += kRows) {
        const uint8_t* ag = at + (g * 3 * padded + j0) * 64;
        _tile_loadd(4, ag, 64);
        _tile_loadd(5, ag + padded * 64, 64);
        _tile_loadd(6, ag + 2 * padded * 64, 64);
        const int64_t count = a.n - j0 < kRows ? a.n - j0 : kRows;
        for (int64_t t = 0; t < tiles; ++t) {
          _tile_loadd(3, bt + (t * 4 + g) * kTileBytes, 64);
          _tile_zero(0);
          _tile_zero(1);
          _tile_zero(2);
          _tile_dpbusd(0, 4, 3);
          _tile_dpbusd(1, 5, 3);
          _tile_dpbusd(2, 6, 3);
          _tile_stored(0, ct, 64);
          _tile_stored(1, ct + 256, 64);
          _tile_stored(2, ct + 512, 64);
          AddGroup(ct, sa + j0, sw + (t * 4 + g) * 16, acc + j0 * kAmxRowBlock + t * kRows,
                   kAmxRowBlock, count);
        }
      }
    }
  }
  for (int64_t i = 0; i < a.n; ++i) {
    for (int64_t t = 0; t < tiles; ++t) {
      Store(a.epilogue, a.y[i] + r0 + t * kRows,
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
    RowBlock(a, r0, a.rows - r0 < kAmxRowBlock ? a.rows - r0 : kAmxRowBlock);
  }
  _tile_release();
}

}  // namespace ss::expert::internal
