// The host sampler's rule (gpu_worker/sampler.h) written out plainly, for sampler_test and
// bench/sampler_bench.cc: the whole vocabulary sorted where a cut needs the order. Slow on
// purpose; the sampler must draw what it draws.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "gpu_worker/sampler.h"
#include "gpu_worker/sampler_math.h"

namespace ss::gpu::testing_util {

// The documented rule written out plainly: weights by WeightExp; with a cut, every id sorted by
// (logit desc, id asc) and the weights summed in that order (without one, SumWeights in id
// order), the top-k cut, min_p, the smallest prefix reaching top_p, the draw.
inline int32_t ReferenceDraw(const std::vector<float>& logits, const SamplingConfig& c,
                             int64_t position) {
  const int64_t vocab = static_cast<int64_t>(logits.size());
  std::vector<int32_t> ids(vocab);
  for (int64_t i = 0; i < vocab; ++i) ids[i] = static_cast<int32_t>(i);
  auto by_logit = [&](int32_t a, int32_t b) { return logits[a] > logits[b]; };
  const int32_t best = *std::min_element(ids.begin(), ids.end(), by_logit);
  if (c.temperature == 0.0f) return best;
  const bool cut = (c.top_k > 0 && c.top_k < vocab) || (c.top_p > 0.0f && c.top_p < 1.0f);
  if (cut) std::stable_sort(ids.begin(), ids.end(), by_logit);
  if (c.top_k > 0 && c.top_k < vocab) ids.resize(c.top_k);
  std::vector<double> p;
  double total = 0.0;
  for (const int32_t id : ids) {
    double w = WeightExp((static_cast<double>(logits[id]) - logits[best]) / c.temperature);
    if (w < c.min_p) w = 0.0;
    p.push_back(w);
    total += w;
  }
  if (!cut) total = SumWeights(p);
  size_t kept = ids.size();
  if (c.top_p > 0.0f && c.top_p < 1.0f) {
    double cum = 0.0;
    for (size_t i = 0; i < ids.size(); ++i) {
      cum += p[i];
      if (cum >= c.top_p * total) {
        kept = i + 1;
        total = cum;
        break;
      }
    }
  }
  const double target = UniformDraw(c.seed, position) * total;
  double cum = 0.0;
  for (size_t i = 0; i < kept; ++i) {
    cum += p[i];
    if (target < cum) return ids[i];
  }
  return ids[0];
}

}  // namespace ss::gpu::testing_util
