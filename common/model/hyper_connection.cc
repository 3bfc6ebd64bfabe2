#include "common/model/hyper_connection.h"

#include <algorithm>
#include <cmath>

#include "common/bf16.h"
#include "common/model/linear.h"

namespace ss::model {
namespace {

float Sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

}  // namespace

void HcMixesRows(const float* streams, int64_t T, int64_t hc, int64_t dim, const HcWeights& w,
                 float norm_eps, float* mixes) {
  const int64_t n = hc * dim;
  const int64_t mix = static_cast<int64_t>(w.base.size());
  LinearRowsF32(w.fn.data(), mix, n, streams, T, mixes);
  for (int64_t t = 0; t < T; ++t) {
    const float r = 1.0f / std::sqrt(MeanSquare(streams + t * n, n) + norm_eps);
    for (int64_t m = 0; m < mix; ++m) mixes[t * mix + m] *= r;
  }
}

std::vector<float> HcMixes(const float* streams, int64_t hc, int64_t dim, const HcWeights& w,
                           float norm_eps) {
  std::vector<float> mixes(w.base.size());
  HcMixesRows(streams, 1, hc, dim, w, norm_eps, mixes.data());
  return mixes;
}

HcSplit HcSplitSinkhorn(const std::vector<float>& mixes, const HcWeights& w, int64_t hc,
                        int64_t iters, float eps) {
  HcSplit s;
  s.pre.resize(hc);
  s.post.resize(hc);
  s.comb.resize(hc * hc);
  for (int64_t i = 0; i < hc; ++i) {
    s.pre[i] = Sigmoid(mixes[i] * w.scale[0] + w.base[i]) + eps;
    s.post[i] = 2.0f * Sigmoid(mixes[hc + i] * w.scale[1] + w.base[hc + i]);
  }
  std::vector<float>& c = s.comb;
  for (int64_t i = 0; i < hc * hc; ++i) c[i] = mixes[2 * hc + i] * w.scale[2] + w.base[2 * hc + i];
  auto normalize_cols = [&] {
    for (int64_t k = 0; k < hc; ++k) {
      float sum = 0.0f;
      for (int64_t j = 0; j < hc; ++j) sum += c[j * hc + k];
      for (int64_t j = 0; j < hc; ++j) c[j * hc + k] = c[j * hc + k] / (sum + eps);
    }
  };
  // Row softmax (+eps), then column normalisation: the first of `iters` iterations.
  for (int64_t j = 0; j < hc; ++j) {
    float* row = c.data() + j * hc;
    const float mx = *std::max_element(row, row + hc);
    float sum = 0.0f;
    for (int64_t k = 0; k < hc; ++k) {
      row[k] = std::exp(row[k] - mx);
      sum += row[k];
    }
    for (int64_t k = 0; k < hc; ++k) row[k] = row[k] / sum + eps;
  }
  normalize_cols();
  for (int64_t it = 1; it < iters; ++it) {
    for (int64_t j = 0; j < hc; ++j) {
      float* row = c.data() + j * hc;
      float sum = 0.0f;
      for (int64_t k = 0; k < hc; ++k) sum += row[k];
      for (int64_t k = 0; k < hc; ++k) row[k] = row[k] / (sum + eps);
    }
    normalize_cols();
  }
  return s;
}

HcSplit HcPreFromMixes(const float* streams, const std::vector<float>& mixes, int64_t hc,
                       int64_t dim, const HcWeights& w, int64_t iters, float hc_eps, float* y) {
  HcSplit s = HcSplitSinkhorn(mixes, w, hc, iters, hc_eps);
  for (int64_t i = 0; i < dim; ++i) {
    float acc = s.pre[0] * streams[i];
    for (int64_t k = 1; k < hc; ++k) acc += s.pre[k] * streams[k * dim + i];
    y[i] = RoundBf16(acc);
  }
  return s;
}

HcSplit HcPre(const float* streams, int64_t hc, int64_t dim, const HcWeights& w, int64_t iters,
              float hc_eps, float norm_eps, float* y) {
  return HcPreFromMixes(streams, HcMixes(streams, hc, dim, w, norm_eps), hc, dim, w, iters, hc_eps,
                        y);
}

void HcPost(const float* x, const float* residual, const HcSplit& s, int64_t hc, int64_t dim,
            float* out) {
  for (int64_t k = 0; k < hc; ++k) {
    for (int64_t i = 0; i < dim; ++i) {
      float acc = s.comb[k] * residual[i];
      for (int64_t j = 1; j < hc; ++j) acc += s.comb[j * hc + k] * residual[j * dim + i];
      out[k * dim + i] = RoundBf16(s.post[k] * x[i] + acc);
    }
  }
}

void HcHead(const float* streams, int64_t hc, int64_t dim, const HcWeights& w, float hc_eps,
            float norm_eps, float* z) {
  const std::vector<float> mixes = HcMixes(streams, hc, dim, w, norm_eps);
  std::vector<float> pre(hc);
  for (int64_t s = 0; s < hc; ++s) pre[s] = Sigmoid(mixes[s] * w.scale[0] + w.base[s]) + hc_eps;
  for (int64_t i = 0; i < dim; ++i) {
    float acc = pre[0] * streams[i];
    for (int64_t s = 1; s < hc; ++s) acc += pre[s] * streams[s * dim + i];
    z[i] = RoundBf16(acc);
  }
}

}  // namespace ss::model
