// Hyper-connection math (spec §3.3) on synthetic inputs: the Sinkhorn projection's invariants,
// one hand-computed split, and the index conventions of HcPre / HcPost (comb[j][k]: new stream k
// takes comb[j][k] of old stream j).
#include "common/model/hyper_connection.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "common/bf16.h"

namespace ss::model {
namespace {

constexpr float kEps = 1e-6f;

// Distributions of tiny-a's init (cases.json -> init): fn N(0, 0.02), base N(0, 0.5),
// scale U(0.5, 1.5).
HcWeights RandomWeights(std::mt19937& rng, int64_t hc, int64_t dim) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uni(0.5f, 1.5f);
  HcWeights w;
  const int64_t mix = (2 + hc) * hc;
  w.fn.resize(mix * hc * dim);
  for (float& v : w.fn) v = normal(rng) * 0.02f;
  w.base.resize(mix);
  for (float& v : w.base) v = normal(rng) * 0.5f;
  w.scale = {uni(rng), uni(rng), uni(rng)};
  return w;
}

// Spec §3.3.2 in double precision, the reference for the fp32 implementation.
void SinkhornDouble(const std::vector<float>& mixes, const HcWeights& w, int64_t hc, int64_t iters,
                    double eps, std::vector<double>& c) {
  c.resize(hc * hc);
  for (int64_t i = 0; i < hc * hc; ++i) {
    c[i] = static_cast<double>(mixes[2 * hc + i]) * w.scale[2] + w.base[2 * hc + i];
  }
  auto cols = [&] {
    for (int64_t k = 0; k < hc; ++k) {
      double sum = 0;
      for (int64_t j = 0; j < hc; ++j) sum += c[j * hc + k];
      for (int64_t j = 0; j < hc; ++j) c[j * hc + k] /= sum + eps;
    }
  };
  for (int64_t j = 0; j < hc; ++j) {
    double mx = c[j * hc], sum = 0;
    for (int64_t k = 1; k < hc; ++k) mx = std::max(mx, c[j * hc + k]);
    for (int64_t k = 0; k < hc; ++k) sum += c[j * hc + k] = std::exp(c[j * hc + k] - mx);
    for (int64_t k = 0; k < hc; ++k) c[j * hc + k] = c[j * hc + k] / sum + eps;
  }
  cols();
  for (int64_t it = 1; it < iters; ++it) {
    for (int64_t j = 0; j < hc; ++j) {
      double sum = 0;
      for (int64_t k = 0; k < hc; ++k) sum += c[j * hc + k];
      for (int64_t k = 0; k < hc; ++k) c[j * hc + k] /= sum + eps;
    }
    cols();
  }
}

TEST(HcSplitSinkhorn, RandomSplitsAreDoublyStochastic) {
  std::mt19937 rng(1234);
  // Mixing logits of unit-RMS streams through fn ~ N(0, 0.02) over hc*dim = 1024 values have a
  // standard deviation of about 0.64; N(0, 1) covers that with margin.
  std::normal_distribution<float> normal(0.0f, 1.0f);
  constexpr int64_t hc = 4, iters = 20, trials = 1000;
  double worst_col = 0, worst_row = 0, worst_vs_double = 0;
  int64_t rows_within_1e3 = 0;
  std::vector<double> ref;
  for (int64_t trial = 0; trial < trials; ++trial) {
    const HcWeights w = RandomWeights(rng, hc, 1);
    std::vector<float> mixes((2 + hc) * hc);
    for (float& v : mixes) v = normal(rng);
    const HcSplit s = HcSplitSinkhorn(mixes, w, hc, iters, kEps);
    ASSERT_EQ(s.pre.size(), static_cast<size_t>(hc));
    ASSERT_EQ(s.post.size(), static_cast<size_t>(hc));
    ASSERT_EQ(s.comb.size(), static_cast<size_t>(hc * hc));
    for (int64_t i = 0; i < hc; ++i) {
      EXPECT_GT(s.pre[i], kEps) << "trial " << trial << " pre[" << i << "]";
      EXPECT_LT(s.pre[i], 1.0f + kEps) << "trial " << trial << " pre[" << i << "]";
      EXPECT_GT(s.post[i], 0.0f) << "trial " << trial << " post[" << i << "]";
      EXPECT_LT(s.post[i], 2.0f) << "trial " << trial << " post[" << i << "]";
    }
    SinkhornDouble(mixes, w, hc, iters, kEps, ref);
    double row_err = 0;
    for (int64_t a = 0; a < hc; ++a) {
      double col = 0, row = 0;
      for (int64_t b = 0; b < hc; ++b) {
        EXPECT_GT(s.comb[a * hc + b], 0.0f) << "trial " << trial;
        col += s.comb[b * hc + a];
        row += s.comb[a * hc + b];
        worst_vs_double =
            std::max(worst_vs_double, std::fabs(s.comb[a * hc + b] - ref[a * hc + b]));
      }
      worst_col = std::max(worst_col, std::fabs(col - 1.0));
      row_err = std::max(row_err, std::fabs(row - 1.0));
    }
    worst_row = std::max(worst_row, row_err);
    rows_within_1e3 += row_err <= 1e-3;
  }
  std::printf(
      "%lld trials: worst |column sum - 1| = %.3g, worst |row sum - 1| = %.3g, row sums within "
      "1e-3: %lld, worst |comb - double reference| = %.3g\n",
      static_cast<long long>(trials), worst_col, worst_row, static_cast<long long>(rows_within_1e3),
      worst_vs_double);
  // The last step normalises columns (with +eps in the denominator): exact up to eps and
  // rounding.
  EXPECT_LE(worst_col, 1e-5);
  // Rows are only as good as 20 iterations make them: exact arithmetic leaves a tail of slowly
  // converging matrices (measured: 1 of these 1000 draws beyond 1e-3, at 2.4e-3; a double
  // precision Sinkhorn on wider logits reaches 1e-2).
  EXPECT_GE(rows_within_1e3, trials * 99 / 100);
  EXPECT_LE(worst_row, 1e-2);
  EXPECT_LE(worst_vs_double, 1e-5);
}

// hc = 2, one iteration: row softmax + eps, then column normalisation. Expected values were
// computed in double precision from the formulas of spec §3.3.2.
TEST(HcSplitSinkhorn, HandComputedTwoStreamsOneIteration) {
  HcWeights w;
  w.base = {0.1f, -0.2f, 0.0f, 0.3f, 0.0f, 0.25f, 0.5f, -0.5f};
  w.scale = {1.0f, 0.5f, 2.0f};
  const std::vector<float> mixes = {0.5f, -1.0f, 2.0f, 0.25f, 1.0f, -2.0f, 0.5f, 3.0f};
  const HcSplit s = HcSplitSinkhorn(mixes, w, 2, 1, kEps);
  const double pre[2] = {0.6456573062257954, 0.23147621650098238};
  const double post[2] = {1.4621171572600098, 1.2093581694280187};
  const double comb[4] = {0.9822744215516985, 0.0032213933764500225, 0.017724593048504406,
                          0.9967775915903736};
  for (int i = 0; i < 2; ++i) {
    EXPECT_NEAR(s.pre[i], pre[i], 1e-6) << "pre[" << i << "]";
    EXPECT_NEAR(s.post[i], post[i], 1e-6) << "post[" << i << "]";
  }
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(s.comb[i], comb[i], 1e-6) << "comb[" << i << "]";
}

TEST(HcMixes, MatchesDoublePrecisionFormula) {
  std::mt19937 rng(7);
  constexpr int64_t hc = 4, dim = 64;
  const HcWeights w = RandomWeights(rng, hc, dim);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(hc * dim);
  for (float& v : x) v = RoundBf16(normal(rng));
  const std::vector<float> mixes = HcMixes(x.data(), hc, dim, w, kEps);
  ASSERT_EQ(mixes.size(), w.base.size());
  double ms = 0;
  for (float v : x) ms += static_cast<double>(v) * v;
  const double r = 1.0 / std::sqrt(ms / (hc * dim) + kEps);
  for (size_t m = 0; m < mixes.size(); ++m) {
    double dot = 0;
    for (int64_t i = 0; i < hc * dim; ++i) {
      dot += static_cast<double>(x[i]) * w.fn[m * hc * dim + i];
    }
    EXPECT_NEAR(mixes[m], dot * r, 1e-5 * (1.0 + std::fabs(dot * r))) << "mix " << m;
  }
}

// Distinct bf16 values per stream, so a wrong stream shows.
std::vector<float> TaggedStreams(int64_t hc, int64_t dim) {
  std::vector<float> r(hc * dim);
  for (int64_t s = 0; s < hc; ++s) {
    for (int64_t i = 0; i < dim; ++i) r[s * dim + i] = RoundBf16(100.0f * (s + 1) + 0.25f * i);
  }
  return r;
}

TEST(HcPost, PermutationCombCopiesStreamJToStreamK) {
  constexpr int64_t hc = 4, dim = 8;
  const std::vector<float> residual = TaggedStreams(hc, dim);
  const std::vector<float> x(dim, 3.0f);
  const int64_t perm[hc] = {2, 0, 3, 1};  // old stream j goes to new stream perm[j]
  HcSplit s;
  s.pre.assign(hc, 0.0f);
  s.post.assign(hc, 0.0f);
  s.comb.assign(hc * hc, 0.0f);
  for (int64_t j = 0; j < hc; ++j) s.comb[j * hc + perm[j]] = 1.0f;
  std::vector<float> out(hc * dim, -1.0f);
  HcPost(x.data(), residual.data(), s, hc, dim, out.data());
  for (int64_t j = 0; j < hc; ++j) {
    for (int64_t i = 0; i < dim; ++i) {
      EXPECT_EQ(out[perm[j] * dim + i], residual[j * dim + i])
          << "old stream " << j << " -> new stream " << perm[j] << ", element " << i;
    }
  }
}

TEST(HcPost, PostScalesTheSublayerOutputPerNewStream) {
  constexpr int64_t hc = 4, dim = 8;
  const std::vector<float> residual = TaggedStreams(hc, dim);
  std::vector<float> x(dim);
  for (int64_t i = 0; i < dim; ++i) x[i] = RoundBf16(1.0f + 0.5f * i);
  HcSplit s;
  s.pre.assign(hc, 0.0f);
  s.post = {0.0f, 0.5f, 1.0f, 2.0f};
  s.comb.assign(hc * hc, 0.0f);
  for (int64_t j = 0; j < hc; ++j) s.comb[j * hc + j] = 1.0f;
  std::vector<float> out(hc * dim);
  HcPost(x.data(), residual.data(), s, hc, dim, out.data());
  for (int64_t k = 0; k < hc; ++k) {
    for (int64_t i = 0; i < dim; ++i) {
      EXPECT_EQ(out[k * dim + i], RoundBf16(s.post[k] * x[i] + residual[k * dim + i]))
          << "stream " << k << ", element " << i;
    }
  }
}

// With fn = 0 the mixing logits vanish and pre[s] = sigmoid(base[s]) + eps, so a large base on
// one stream and a very negative base on the others makes HcPre select that stream.
TEST(HcPre, PreWeightsStreamS) {
  constexpr int64_t hc = 4, dim = 16;
  const std::vector<float> x = TaggedStreams(hc, dim);
  for (int64_t pick = 0; pick < hc; ++pick) {
    HcWeights w;
    w.fn.assign((2 + hc) * hc * hc * dim, 0.0f);
    w.base.assign((2 + hc) * hc, 0.0f);
    for (int64_t s = 0; s < hc; ++s) w.base[s] = s == pick ? 30.0f : -30.0f;
    w.scale = {1.0f, 1.0f, 1.0f};
    std::vector<float> y(dim);
    const HcSplit split = HcPre(x.data(), hc, dim, w, 20, kEps, kEps, y.data());
    for (int64_t i = 0; i < dim; ++i) {
      EXPECT_EQ(y[i], x[pick * dim + i]) << "picked stream " << pick << ", element " << i;
    }
    const HcSplit ref = HcSplitSinkhorn(std::vector<float>((2 + hc) * hc, 0.0f), w, hc, 20, kEps);
    EXPECT_EQ(split.pre, ref.pre);
    EXPECT_EQ(split.post, ref.post);
    EXPECT_EQ(split.comb, ref.comb);
  }
}

}  // namespace
}  // namespace ss::model
