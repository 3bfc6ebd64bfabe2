#include "common/model/compressor.h"

#include <algorithm>
#include <cmath>

#include "common/bf16.h"
#include "common/codecs.h"
#include "common/model/linear.h"
#include "common/rope.h"

namespace ss::model {
namespace {

// Softmax-pools `count` (logit, value) pairs per channel into out[d]: the pairs of channel ch are
// (score[slot_i*width + off_i + ch], kv[...]) for the listed slots/offsets.
void Pool(const CompressorState& st, const std::vector<std::pair<int64_t, int64_t>>& taps,
          int64_t d, float* out) {
  std::vector<float> e(taps.size());
  for (int64_t ch = 0; ch < d; ++ch) {
    float mx = -INFINITY;
    for (const auto& [slot, off] : taps) mx = std::max(mx, st.score[slot * st.width + off + ch]);
    double sum = 0.0;
    for (size_t i = 0; i < taps.size(); ++i) {
      const auto& [slot, off] = taps[i];
      e[i] = std::exp(st.score[slot * st.width + off + ch] - mx);
      sum += e[i];
    }
    const float fsum = static_cast<float>(sum);
    double acc = 0.0;
    for (size_t i = 0; i < taps.size(); ++i) {
      const auto& [slot, off] = taps[i];
      const float prob = e[i] / fsum;
      acc += static_cast<double>(st.kv[slot * st.width + off + ch] * prob);
    }
    out[ch] = static_cast<float>(acc);
  }
}

}  // namespace

void CompressorProject(const CompressorWeights& w, const float* x, int64_t n, float* kv,
                       float* score) {
  LinearF32(w.wkv, x, n, kv);
  LinearF32(w.wgate, x, n, score);
}

void CompressorFeed(const CompressorWeights& w, const CompressorParams& p, CompressorState& st,
                    const float* x, int64_t n, int64_t dim, int64_t start,
                    std::vector<float>& entries, const float* kv_proj, const float* score_proj) {
  const int64_t m = w.ratio, d = w.head_dim, width = st.width;
  const bool overlap = m == 4;
  std::vector<float> kv_own, score_own;
  if (kv_proj == nullptr || score_proj == nullptr) {
    kv_own.resize(n * width);
    score_own.resize(n * width);
    CompressorProject(w, x, n, kv_own.data(), score_own.data());
    kv_proj = kv_own.data();
    score_proj = score_own.data();
  }
  const float* kv = kv_proj;
  const float* score = score_proj;
  std::vector<float> c(d), k(d), cs(p.rope_head_dim / 2), sn(p.rope_head_dim / 2);
  std::vector<std::pair<int64_t, int64_t>> taps;
  for (int64_t t = 0; t < n; ++t) {
    const int64_t pos = start + t, r = pos % m;
    const int64_t slot = overlap ? m + r : r;
    for (int64_t i = 0; i < width; ++i) {
      st.kv[slot * width + i] = kv[t * width + i];
      st.score[slot * width + i] = score[t * width + i] + w.ape[r * width + i];
    }
    if ((pos + 1) % m != 0) continue;
    taps.clear();
    if (overlap) {
      for (int64_t s = 0; s < m; ++s) taps.emplace_back(s, 0);      // previous block, A half
      for (int64_t s = m; s < 2 * m; ++s) taps.emplace_back(s, d);  // this block, B half
    } else {
      for (int64_t s = 0; s < m; ++s) taps.emplace_back(s, 0);
    }
    Pool(st, taps, d, c.data());
    if (overlap) {
      std::copy(st.kv.begin() + m * width, st.kv.end(), st.kv.begin());
      std::copy(st.score.begin() + m * width, st.score.end(), st.score.begin());
    }
    for (int64_t i = 0; i < d; ++i) c[i] = RoundBf16(c[i]);
    RmsNorm(c.data(), w.norm.data(), d, p.norm_eps, k.data());
    const int64_t rd = p.rope_head_dim;
    RopeCosSin(*p.rope_freqs, pos + 1 - m, cs.data(), sn.data());
    ApplyRope(k.data() + d - rd, static_cast<int>(rd / 2), cs.data(), sn.data(), false);
    if (p.kind == CompressorKind::kMain) {
      Fp8SimInplace(k.data(), d - rd, 64, p.kv_fp8_sim_rounds);
    } else {
      HadamardInplace(k.data(), d);
      Fp4SimInplace(k.data(), d, 32);
    }
    entries.insert(entries.end(), k.begin(), k.end());
  }
}

}  // namespace ss::model
