#include "common/model/linear.h"

#include <array>
#include <cmath>
#include <vector>

#include "common/codecs.h"

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
  Tables() {
    for (int i = 0; i < 256; ++i) {
      e4m3[i] = E4m3ToFloat(static_cast<uint8_t>(i));
      ue8m0[i] = Ue8m0ToFloat(static_cast<uint8_t>(i));
    }
    for (int i = 0; i < 16; ++i) e2m1[i] = E2m1ToFloat(static_cast<uint8_t>(i));
  }
};
const Tables& T() {
  static const Tables t;
  return t;
}

// Quantises each row of x: q [rows, in] e4m3 values as floats, sa [rows, ceil(in/128)].
void QuantizeRows(const float* x, int64_t rows, int64_t in, std::vector<float>& qv,
                  std::vector<float>& sa) {
  const int64_t nb = (in + kBlock - 1) / kBlock;
  qv.resize(rows * in);
  sa.resize(rows * nb);
  std::vector<uint8_t> q(in);
  for (int64_t r = 0; r < rows; ++r) {
    QuantizeActE4m3(x + r * in, in, kBlock, q.data(), sa.data() + r * nb);
    for (int64_t i = 0; i < in; ++i) qv[r * in + i] = T().e4m3[q[i]];
  }
}

}  // namespace

float Fp8Weight::At(int64_t o, int64_t i) const {
  const int64_t nbi = (in + kBlock - 1) / kBlock;
  return T().e4m3[w[o * in + i]] * T().ue8m0[s[(o / kBlock) * nbi + i / kBlock]];
}

void Fp8Weight::Row(int64_t o, float* dst) const {
  const int64_t nbi = (in + kBlock - 1) / kBlock;
  const auto& t = T();
  const uint8_t* wo = w + o * in;
  const uint8_t* so = s + (o / kBlock) * nbi;
  for (int64_t b = 0; b < nbi; ++b) {
    const float sw = t.ue8m0[so[b]];
    for (int64_t i = b * kBlock; i < std::min(in, (b + 1) * kBlock); ++i) dst[i] = t.e4m3[wo[i]] * sw;
  }
}

void Bf16Matrix::Row(int64_t r, float* out) const {
  for (int64_t c = 0; c < cols; ++c) out[c] = At(r, c);
}

void Linear8(const Fp8Weight& w, const float* x, int64_t rows, float* y) {
  std::vector<float> qv, sa;
  QuantizeRows(x, rows, w.in, qv, sa);
  const int64_t nb = (w.in + kBlock - 1) / kBlock;
  const auto& t = T();
#pragma omp parallel for schedule(static) if (w.out * w.in * rows >= kParallelWork)
  for (int64_t o = 0; o < w.out; ++o) {
    std::vector<float> wrow(w.in);
    for (int64_t i = 0; i < w.in; ++i) wrow[i] = t.e4m3[w.w[o * w.in + i]];
    for (int64_t r = 0; r < rows; ++r) {
      const float* q = qv.data() + r * w.in;
      float acc = 0.0f;
      for (int64_t b = 0; b < nb; ++b) {
        const int64_t i0 = b * kBlock, i1 = std::min(w.in, i0 + kBlock);
        // e4m3 x e4m3 products are multiples of 2^-18 below 2^18, so up to 128 of them sum
        // exactly in double in ANY order: the vectorised reduction is bit-identical.
        double part = 0.0;
#pragma omp simd reduction(+ : part)
        for (int64_t i = i0; i < i1; ++i) part += static_cast<double>(q[i]) * wrow[i];
        const float sw = t.ue8m0[w.s[(o / kBlock) * nb + b]];
        acc += static_cast<float>(part) * sa[r * nb + b] * sw;
      }
      y[r * w.out + o] = RoundBf16(acc);
    }
  }
}

void Linear4(const Fp4Weight& w, const float* x, int64_t rows, float* y) {
  std::vector<float> qv, sa;
  QuantizeRows(x, rows, w.in, qv, sa);
  const int64_t nb = (w.in + kBlock - 1) / kBlock;
  const int64_t ng = w.in / kFp4Group;
  const auto& t = T();
#pragma omp parallel for schedule(static) if (w.out * w.in * rows >= kParallelWork)
  for (int64_t o = 0; o < w.out; ++o) {
    std::vector<float> wrow(w.in);
    const uint8_t* packed = w.w + o * (w.in / 2);
    for (int64_t j = 0; j < w.in / 2; ++j) {
      wrow[2 * j] = t.e2m1[packed[j] & 0xf];
      wrow[2 * j + 1] = t.e2m1[packed[j] >> 4];
    }
    for (int64_t r = 0; r < rows; ++r) {
      const float* q = qv.data() + r * w.in;
      float acc = 0.0f;
      for (int64_t g = 0; g < ng; ++g) {
        double part = 0.0;  // exact in any order (e2m1 x e4m3 products), as in Linear8
#pragma omp simd reduction(+ : part)
        for (int64_t i = g * kFp4Group; i < (g + 1) * kFp4Group; ++i) {
          part += static_cast<double>(q[i]) * wrow[i];
        }
        const float sw = t.ue8m0[w.s[o * ng + g]];
        acc += static_cast<float>(part) * sa[r * nb + g * kFp4Group / kBlock] * sw;
      }
      y[r * w.out + o] = RoundBf16(acc);
    }
  }
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
  // Four outputs per task: four independent sums (DotF32x4), each in DotF32's order.
  const int64_t groups = (w.rows + 3) / 4;
#pragma omp parallel for schedule(static) if (w.rows * w.cols * rows >= kParallelWork)
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t o0 = g * 4, n = std::min<int64_t>(4, w.rows - o0);
    std::vector<float> wrows(4 * w.cols);
    const float* b[4];
    for (int64_t k = 0; k < 4; ++k) {
      b[k] = wrows.data() + std::min(k, n - 1) * w.cols;
      if (k < n) w.Row(o0 + k, wrows.data() + k * w.cols);
    }
    float out[4];
    for (int64_t r = 0; r < rows; ++r) {
      DotF32x4(x + r * w.cols, b, w.cols, out);
      for (int64_t k = 0; k < n; ++k) y[r * w.rows + o0 + k] = out[k];
    }
  }
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
