#include "common/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "common/bf16.h"

namespace ss {

std::vector<float> RopeFrequencies(int rope_dim, double base, const YarnConfig* yarn) {
  const int pairs = rope_dim / 2;
  std::vector<float> f(pairs);
  const float base_f = static_cast<float>(base);
  for (int i = 0; i < pairs; ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(rope_dim);
    f[i] = 1.0f / std::pow(base_f, e);
  }
  if (yarn != nullptr && yarn->original_seq_len > 0) {
    auto corr_dim = [&](double rotations) {
      return rope_dim *
             std::log(static_cast<double>(yarn->original_seq_len) /
                      (rotations * 2 * std::numbers::pi)) /
             (2 * std::log(base));
    };
    double low = std::max(std::floor(corr_dim(yarn->beta_fast)), 0.0);
    double high = std::min(std::ceil(corr_dim(yarn->beta_slow)), static_cast<double>(rope_dim - 1));
    if (low == high) high += 0.001;
    const float factor = static_cast<float>(yarn->factor);
    for (int i = 0; i < pairs; ++i) {
      float ramp =
          (static_cast<float>(i) - static_cast<float>(low)) / static_cast<float>(high - low);
      ramp = std::clamp(ramp, 0.0f, 1.0f);
      const float smooth = 1.0f - ramp;
      f[i] = f[i] / factor * (1.0f - smooth) + f[i] * smooth;
    }
  }
  return f;
}

std::vector<float> LayerRopeFrequencies(const ModelConfig& c, int64_t ratio) {
  const int rd = static_cast<int>(c.rope_head_dim);
  if (ratio == 0) return RopeFrequencies(rd, c.rope_theta, nullptr);
  return RopeFrequencies(rd, c.compress_rope_theta, c.has_yarn ? &c.yarn : nullptr);
}

void RopeCosSin(const std::vector<float>& freqs, int64_t pos, float* cos_out, float* sin_out) {
  const float p = static_cast<float>(pos);
  for (size_t i = 0; i < freqs.size(); ++i) {
    const double angle = static_cast<double>(p * freqs[i]);
    cos_out[i] = static_cast<float>(std::cos(angle));
    sin_out[i] = static_cast<float>(std::sin(angle));
  }
}

void ApplyRope(float* v, int pairs, const float* cos_v, const float* sin_v, bool inverse) {
  for (int i = 0; i < pairs; ++i) {
    const float a = v[2 * i], b = v[2 * i + 1];
    const float c = cos_v[i];
    const float s = inverse ? -sin_v[i] : sin_v[i];
    v[2 * i] = RoundBf16(a * c - b * s);
    v[2 * i + 1] = RoundBf16(a * s + b * c);
  }
}

}  // namespace ss
