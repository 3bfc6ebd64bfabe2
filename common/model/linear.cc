#include "common/model/linear.h"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/codecs.h"
#include "common/int_math.h"

namespace ss::model {
namespace {

constexpr int64_t kBlock = 128;  // activation and FP8 weight block
constexpr int64_t kFp4Group = 32;
// Below kParallelMinWork multiply-adds a parallel region costs more than it saves (and with
// more threads than free cores OpenMP's barrier spinning makes small regions very slow).
constexpr int64_t kParallelWork = kParallelMinWork;

struct Tables {
  std::array<float, 256> e4m3;
  std::array<float, 256> ue8m0;
  std::array<float, 16> e2m1;
  std::array<double, 256> e4m3d;  // the same values widened (exact)
  std::array<double, 16> e2m1d;
  Tables() {
    for (int i = 0; i < 256; ++i) {
      e4m3[i] = E4m3ToFloat(static_cast<uint8_t>(i));
      ue8m0[i] = Ue8m0ToFloat(static_cast<uint8_t>(i));
      e4m3d[i] = e4m3[i];
    }
    for (int i = 0; i < 16; ++i) {
      e2m1[i] = E2m1ToFloat(static_cast<uint8_t>(i));
      e2m1d[i] = e2m1[i];
    }
  }
};
const Tables& T() {
  static const Tables t;
  return t;
}

// Quantises each row of x: q [rows, in] e4m3 values as floats, sa [rows, ceil(in/128)].
void QuantizeRows(const float* x, int64_t rows, int64_t in, std::vector<float>& qv,
                  std::vector<float>& sa) {
  const int64_t nb = CeilDiv(in, kBlock);
  qv.resize(rows * in);
  sa.resize(rows * nb);
  std::vector<uint8_t> q(in);
  const auto& t = T();
  for (int64_t r = 0; r < rows; ++r) {
    QuantizeActE4m3(x + r * in, in, kBlock, q.data(), sa.data() + r * nb);
    for (int64_t i = 0; i < in; ++i) qv[r * in + i] = t.e4m3[q[i]];
  }
}

}  // namespace

float Fp8Weight::At(int64_t o, int64_t i) const {
  const int64_t nbi = CeilDiv(in, kBlock);
  return T().e4m3[w[o * in + i]] * T().ue8m0[s[(o / kBlock) * nbi + i / kBlock]];
}

namespace {

// Row o of an FP8 weight dequantised (the float products e4m3 · ue8m0, exact), as floats or
// widened to doubles.
template <typename Out>
void Fp8Row(const Fp8Weight& w, int64_t o, Out* dst) {
  const int64_t nbi = CeilDiv(w.in, kBlock);
  const auto& t = T();
  const uint8_t* wo = w.w + o * w.in;
  const uint8_t* so = w.s + (o / kBlock) * nbi;
  for (int64_t b = 0; b < nbi; ++b) {
    const float sw = t.ue8m0[so[b]];
    for (int64_t i = b * kBlock; i < std::min(w.in, (b + 1) * kBlock); ++i) {
      dst[i] = t.e4m3[wo[i]] * sw;
    }
  }
}

// Row r of a bf16 matrix as floats or doubles.
template <typename Out>
void Bf16Row(const Bf16Matrix& m, int64_t r, Out* dst) {
  for (int64_t c = 0; c < m.cols; ++c) dst[c] = m.At(r, c);
}

}  // namespace

void Fp8Weight::Row(int64_t o, float* dst) const { Fp8Row(*this, o, dst); }

void Bf16Matrix::Row(int64_t r, float* out) const { Bf16Row(*this, r, out); }

namespace {

// Exact multi-sums, vectorised. Two facts make every result bit-identical to the scalar
// loops (DotF32, and the per-block sums of Linear8/Linear4):
//  - a float x float product is exact in double (48 significant bits), so fma(a, b, c) rounds
//    exactly like c + a·b, and FMA may be used;
//  - the per-block sums of Linear8/Linear4 are exact in double in ANY order (products are
//    multiples of 2^-18 below 2^18, at most 128 per block), so those may be vectorised along
//    K; DotF32-ordered sums (LinearF32 & co) may not, and are vectorised across rows instead,
//    each still adding its products in K order.
// A tile of kTile weight rows is decoded to doubles once per call and shared by the batch:
// that, and the one pass over the weights, is what batching amortises.
// (Internal helpers only, all inlined: the AVX-argument ABI note does not apply.)
#pragma GCC diagnostic ignored "-Wpsabi"
typedef double V2 __attribute__((vector_size(16)));
typedef double V4 __attribute__((vector_size(32)));
constexpr int kTile = 8;     // weight rows (outputs) per tile
constexpr int64_t kPad = 8;  // rows of transposed activations are padded to a multiple of this

// An unaligned view of doubles as V (no copy through the stack).
template <typename V>
using Unaligned [[gnu::vector_size(sizeof(V)), gnu::aligned(8), gnu::may_alias]] = double;
template <typename V>
[[gnu::always_inline]] inline V Load(const double* p) {
  return *reinterpret_cast<const Unaligned<V>*>(p);
}
template <typename V>
[[gnu::always_inline]] inline void Store(double* p, V v) {
  *reinterpret_cast<Unaligned<V>*>(p) = v;
}
template <typename V>
[[gnu::always_inline]] inline V Splat(double x) {
  V v;
  for (size_t l = 0; l < sizeof(V) / sizeof(double); ++l) v[l] = x;
  return v;
}
// c + a·b (exact products: one rounding either way).
[[gnu::always_inline]] inline V2 MulAdd(V2 a, V2 b, V2 c) { return c + a * b; }
[[gnu::target("avx2,fma")]] inline V4 MulAdd(V4 a, V4 b, V4 c) {
  return reinterpret_cast<V4>(_mm256_fmadd_pd(
      reinterpret_cast<__m256d>(a), reinterpret_cast<__m256d>(b), reinterpret_cast<__m256d>(c)));
}

// K-ordered sums, vectorised across rows: out[k·rp + c0 + j] = Σ_{i0 ≤ i < i1}
// xt[i·rp + c0 + j]·wd[k·n + i] for K weight rows and RV vectors of (transposed) rows from c0.
template <typename V, int RV, int K>
inline void OrderedTile(const double* xt, int64_t rp, int64_t c0, const double* wd, int64_t n,
                        int64_t i0, int64_t i1, double* out) {
  constexpr int kLanes = sizeof(V) / sizeof(double);
  V acc[K][RV] = {};
  for (int64_t i = i0; i < i1; ++i) {
    V xv[RV];
    for (int v = 0; v < RV; ++v) xv[v] = Load<V>(xt + i * rp + c0 + v * kLanes);
    for (int k = 0; k < K; ++k) {
      const V b = Splat<V>(wd[k * n + i]);
      for (int v = 0; v < RV; ++v) acc[k][v] = MulAdd(xv[v], b, acc[k][v]);
    }
  }
  for (int k = 0; k < K; ++k) {
    for (int v = 0; v < RV; ++v) Store(out + k * rp + c0 + v * kLanes, acc[k][v]);
  }
}

// Every row of xt ([n][rp]) against the kTile rows of wd ([kTile][n]): out [kTile][rp].
// Eight accumulators at a time: 8 weight rows x 1 vector of rows, or 4 x 2.
template <typename V>
inline void OrderedRowsIn(const double* xt, int64_t rp, int64_t rows, const double* wd, int64_t n,
                          double* out) {
  constexpr int kLanes = sizeof(V) / sizeof(double);
  for (int64_t c = 0; c < rows; c += 2 * kLanes) {
    if (rows - c > kLanes) {
      OrderedTile<V, 2, 4>(xt, rp, c, wd, n, 0, n, out);
      OrderedTile<V, 2, 4>(xt, rp, c, wd + 4 * n, n, 0, n, out + 4 * rp);
    } else {
      OrderedTile<V, 1, 8>(xt, rp, c, wd, n, 0, n, out);
    }
  }
}

// Order-free sums, vectorised along K: out[r·kTile + k] = Σ_{i0 ≤ i < i1} q[r·ldq + i]·
// wd[k·n + i] for RR rows from r0 and K weight rows from k0.
template <typename V, int RR, int K>
inline void BlockTile(const double* q, int64_t ldq, int64_t r0, const double* wd, int64_t n,
                      int64_t k0, int64_t i0, int64_t i1, double* out) {
  constexpr int kLanes = sizeof(V) / sizeof(double);
  V acc[RR][K] = {};
  int64_t i = i0;
  for (; i + kLanes <= i1; i += kLanes) {
    V qv[RR];
    for (int r = 0; r < RR; ++r) qv[r] = Load<V>(q + (r0 + r) * ldq + i);
    for (int k = 0; k < K; ++k) {
      const V w = Load<V>(wd + (k0 + k) * n + i);
      for (int r = 0; r < RR; ++r) acc[r][k] = MulAdd(qv[r], w, acc[r][k]);
    }
  }
  for (int r = 0; r < RR; ++r) {
    for (int k = 0; k < K; ++k) {
      double sum = 0.0;
      for (int l = 0; l < kLanes; ++l) sum += acc[r][k][l];
      for (int64_t j = i; j < i1; ++j) sum += q[(r0 + r) * ldq + j] * wd[(k0 + k) * n + j];
      out[(r0 + r) * kTile + k0 + k] = sum;
    }
  }
}

// Every row of q ([rows, ldq]) against the kTile rows of wd over [i0, i1): out [rows, kTile].
template <typename V>
inline void BlockRowsIn(const double* q, int64_t ldq, int64_t rows, const double* wd, int64_t n,
                        int64_t i0, int64_t i1, double* out) {
  int64_t r = 0;
  for (; r + 2 <= rows; r += 2) {
    BlockTile<V, 2, 4>(q, ldq, r, wd, n, 0, i0, i1, out);
    BlockTile<V, 2, 4>(q, ldq, r, wd, n, 4, i0, i1, out);
  }
  if (r < rows) BlockTile<V, 1, 8>(q, ldq, r, wd, n, 0, i0, i1, out);
}

// 256-bit vectors with FMA where the CPU has AVX2, else SSE2's 128-bit ones: the same sums in
// either. The entry points flatten the templates into themselves, so each is compiled for its
// ISA. There is no 512-bit variant: on an AVX-512 CPU it is slower than the AVX2 one
// (bench/RESULTS.md, "Batched, vectorised exact linears").
std::atomic<LinearIsa> g_forced_isa{LinearIsa::kAuto};
LinearIsa ActiveIsa() {
  static const LinearIsa best = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")
                                    ? LinearIsa::kAvx2
                                    : LinearIsa::kSse2;
  const LinearIsa forced = g_forced_isa.load(std::memory_order_relaxed);
  return forced == LinearIsa::kAuto ? best : forced;
}
using OrderedRowsFn = void (*)(const double*, int64_t, int64_t, const double*, int64_t, double*);
using BlockRowsFn = void (*)(const double*, int64_t, int64_t, const double*, int64_t, int64_t,
                             int64_t, double*);
[[gnu::target("avx2,fma"), gnu::flatten]] void OrderedRowsAvx2(const double* xt, int64_t rp,
                                                               int64_t rows, const double* wd,
                                                               int64_t n, double* out) {
  OrderedRowsIn<V4>(xt, rp, rows, wd, n, out);
}
[[gnu::flatten]] void OrderedRowsSse2(const double* xt, int64_t rp, int64_t rows, const double* wd,
                                      int64_t n, double* out) {
  OrderedRowsIn<V2>(xt, rp, rows, wd, n, out);
}
[[gnu::target("avx2,fma"), gnu::flatten]] void BlockRowsAvx2(const double* q, int64_t ldq,
                                                             int64_t rows, const double* wd,
                                                             int64_t n, int64_t i0, int64_t i1,
                                                             double* out) {
  BlockRowsIn<V4>(q, ldq, rows, wd, n, i0, i1, out);
}
[[gnu::flatten]] void BlockRowsSse2(const double* q, int64_t ldq, int64_t rows, const double* wd,
                                    int64_t n, int64_t i0, int64_t i1, double* out) {
  BlockRowsIn<V2>(q, ldq, rows, wd, n, i0, i1, out);
}
OrderedRowsFn PickOrderedRows() {
  return ActiveIsa() == LinearIsa::kAvx2 ? OrderedRowsAvx2 : OrderedRowsSse2;
}
BlockRowsFn PickBlockRows() {
  return ActiveIsa() == LinearIsa::kAvx2 ? BlockRowsAvx2 : BlockRowsSse2;
}

int64_t PaddedRows(int64_t rows) { return RoundUp(rows, kPad); }

// Per-thread scratch, reused across calls (no allocation or zeroing per tile).
struct Scratch {
  std::vector<double> wd, out;
  std::vector<float> acc;
};
Scratch& ThreadScratch() {
  thread_local Scratch s;
  return s;
}

// The kTile weight rows of tile o0 as doubles [kTile][n] through row(o, double* dst); a tile's
// missing rows (past outs) repeat its last row and are never read back.
template <typename RowFn>
void DecodeTile(RowFn&& row, int64_t o0, int64_t outs, int64_t n, std::vector<double>& wd) {
  wd.resize(kTile * n);
  for (int64_t k = 0; k < kTile; ++k) {
    double* dst = wd.data() + k * n;
    if (o0 + k < outs) {
      row(o0 + k, dst);
    } else {
      std::copy(dst - n, dst, dst);
    }
  }
}

// y[r·ldy + o] = float(Σ_i x[r·ldx + i]·W[o, i]) in i order for W [outs, n] given row by row
// through row(o, double* dst).
template <typename RowFn>
void LinearRowsBy(RowFn&& row, int64_t outs, int64_t n, const float* x, int64_t ldx, int64_t rows,
                  float* y, int64_t ldy) {
  const int64_t rp = PaddedRows(rows);
  std::vector<double> xt(n * rp, 0.0);  // x transposed: [n][rp], zero padded
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < n; ++i) xt[i * rp + r] = x[r * ldx + i];
  }
  const int64_t tiles = CeilDiv(outs, kTile);
  const OrderedRowsFn dot = PickOrderedRows();
#pragma omp parallel for schedule(static) if (outs * n * rows >= kParallelWork)
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t o0 = t * kTile, m = std::min<int64_t>(kTile, outs - o0);
    Scratch& sc = ThreadScratch();
    DecodeTile(row, o0, outs, n, sc.wd);
    sc.out.resize(kTile * rp);
    dot(xt.data(), rp, rows, sc.wd.data(), n, sc.out.data());
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t k = 0; k < m; ++k) y[r * ldy + o0 + k] = static_cast<float>(sc.out[k * rp + r]);
    }
  }
}

// The block-scaled low-precision linears (Linear8, Linear4): e4m3 activations qv [rows, in]
// with scales sa [rows, ceil(in/128)] times weights whose unscaled values row(o, double* dst)
// writes, scaled per (o, K block of `group`) by wscale(o, g); per-block sums are exact in any
// order, then acc += float(part)·sa·sw in K order; bf16 output.
template <typename RowFn, typename ScaleFn>
void LinearBlocked(RowFn&& row, ScaleFn&& wscale, int64_t outs, int64_t in, int64_t group,
                   const std::vector<float>& qv, const std::vector<float>& sa, int64_t rows,
                   float* y) {
  const std::vector<double> qd(qv.begin(), qv.end());
  const int64_t nb = CeilDiv(in, kBlock);
  const int64_t ng = CeilDiv(in, group);
  const int64_t tiles = CeilDiv(outs, kTile);
  const BlockRowsFn dot = PickBlockRows();
#pragma omp parallel for schedule(static) if (outs * in * rows >= kParallelWork)
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t o0 = t * kTile, m = std::min<int64_t>(kTile, outs - o0);
    Scratch& sc = ThreadScratch();
    DecodeTile(row, o0, outs, in, sc.wd);
    sc.out.resize(rows * kTile);
    sc.acc.assign(rows * kTile, 0.0f);
    for (int64_t g = 0; g < ng; ++g) {
      const int64_t i0 = g * group, i1 = std::min(in, i0 + group);
      dot(qd.data(), in, rows, sc.wd.data(), in, i0, i1, sc.out.data());
      for (int64_t k = 0; k < m; ++k) {
        const float sw = wscale(o0 + k, g);
        for (int64_t r = 0; r < rows; ++r) {
          sc.acc[r * kTile + k] +=
              static_cast<float>(sc.out[r * kTile + k]) * sa[r * nb + i0 / kBlock] * sw;
        }
      }
    }
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t k = 0; k < m; ++k) y[r * outs + o0 + k] = RoundBf16(sc.acc[r * kTile + k]);
    }
  }
}

}  // namespace

void ForceLinearIsaForTesting(LinearIsa isa) { g_forced_isa.store(isa); }

void Linear8(const Fp8Weight& w, const float* x, int64_t rows, float* y) {
  // e4m3 x e4m3 products are multiples of 2^-18 below 2^18, so up to 128 of them sum exactly
  // in double in ANY order.
  std::vector<float> qv, sa;
  QuantizeRows(x, rows, w.in, qv, sa);
  const int64_t nbi = CeilDiv(w.in, kBlock);
  const auto& t = T();
  LinearBlocked(
      [&](int64_t o, double* dst) {
        const uint8_t* codes = w.w + o * w.in;
        for (int64_t i = 0; i < w.in; ++i) dst[i] = t.e4m3d[codes[i]];
      },
      [&](int64_t o, int64_t b) { return t.ue8m0[w.s[(o / kBlock) * nbi + b]]; }, w.out, w.in,
      kBlock, qv, sa, rows, y);
}

void Linear4(const Fp4Weight& w, const float* x, int64_t rows, float* y) {
  // e2m1 x e4m3 products sum exactly in double in any order, as in Linear8.
  std::vector<float> qv, sa;
  QuantizeRows(x, rows, w.in, qv, sa);
  const int64_t ng = w.in / kFp4Group;
  const auto& t = T();
  LinearBlocked(
      [&](int64_t o, double* dst) {
        const uint8_t* packed = w.w + o * (w.in / 2);
        for (int64_t j = 0; j < w.in / 2; ++j) {
          dst[2 * j] = t.e2m1d[packed[j] & 0xf];
          dst[2 * j + 1] = t.e2m1d[packed[j] >> 4];
        }
      },
      [&](int64_t o, int64_t g) { return t.ue8m0[w.s[o * ng + g]]; }, w.out, w.in, kFp4Group, qv,
      sa, rows, y);
}

float DotF32(const float* a, const float* b, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(a[i]) * b[i];
  return static_cast<float>(s);
}

void DotF32x4(const float* a, const float* const* b, int64_t n, float* out) {
  double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double ai = a[i];
    s0 += ai * b[0][i];
    s1 += ai * b[1][i];
    s2 += ai * b[2][i];
    s3 += ai * b[3][i];
  }
  out[0] = static_cast<float>(s0);
  out[1] = static_cast<float>(s1);
  out[2] = static_cast<float>(s2);
  out[3] = static_cast<float>(s3);
}

void LinearF32(const Bf16Matrix& w, const float* x, int64_t rows, float* y) {
  LinearRowsBy([&](int64_t o, double* dst) { Bf16Row(w, o, dst); }, w.rows, w.cols, x, w.cols, rows,
               y, w.rows);
}

void LinearRowsF32(const float* w, int64_t outs, int64_t n, const float* x, int64_t rows,
                   float* y) {
  LinearRowsBy([&](int64_t o, double* dst) { std::copy(w + o * n, w + (o + 1) * n, dst); }, outs, n,
               x, n, rows, y, outs);
}

void LinearFp8RowsF32(const Fp8Weight& w, int64_t o0, int64_t outs, const float* x, int64_t ldx,
                      int64_t rows, float* y, int64_t ldy) {
  LinearRowsBy([&](int64_t o, double* dst) { Fp8Row(w, o0 + o, dst); }, outs, w.in, x, ldx, rows, y,
               ldy);
}

void LinearBf16(const Bf16Matrix& w, const float* x, int64_t rows, float* y) {
  LinearF32(w, x, rows, y);
  for (int64_t i = 0; i < rows * w.rows; ++i) y[i] = RoundBf16(y[i]);
}

float MeanSquare(const float* x, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const float sq = x[i] * x[i];
    s += sq;
  }
  return static_cast<float>(s) * (1.0f / static_cast<float>(n));
}

void RmsNorm(const float* x, const float* g, int64_t n, float eps, float* y) {
  const float r = 1.0f / std::sqrt(MeanSquare(x, n) + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = RoundBf16(g[i] * (x[i] * r));
}

}  // namespace ss::model
