#include "common/model/indexer.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/bf16.h"
#include "common/codecs.h"
#include "common/model/linear.h"
#include "common/rope.h"

namespace ss::model {

void IndexerProject(const IndexerWeights& w, const float* x, const float* qr, int64_t S, float* q,
                    float* wts) {
  Linear8(w.wq_b, qr, S, q);
  LinearBf16(w.weights_proj, x, S, wts);
}

IndexerResult IndexerSelect(const IndexerWeights& w, const ModelConfig& c,
                            const std::vector<float>& rope_freqs, const float* x, const float* qr,
                            int64_t S, int64_t start, const std::vector<float>& keys,
                            const float* q_proj, const float* w_proj) {
  const int64_t nh = c.index_n_heads, hd = c.index_head_dim, rd = c.rope_head_dim;
  const int64_t ratio = 4;
  IndexerResult res;
  res.n_blocks = (start + S) / ratio;
  res.k = std::min(c.index_topk, res.n_blocks);
  res.sel.assign(S * res.k, -1);
  res.scores.assign(S * res.n_blocks, -INFINITY);

  std::vector<float> q(S * nh * hd), wts(S * nh);
  if (q_proj != nullptr && w_proj != nullptr) {
    std::copy_n(q_proj, S * nh * hd, q.data());
    std::copy_n(w_proj, S * nh, wts.data());
  } else {
    IndexerProject(w, x, qr, S, q.data(), wts.data());
  }
  const float wscale = static_cast<float>(std::pow(static_cast<double>(hd), -0.5) *
                                          std::pow(static_cast<double>(nh), -0.5));
  std::vector<float> cs(rd / 2), sn(rd / 2);
  for (int64_t s = 0; s < S; ++s) {
    RopeCosSin(rope_freqs, start + s, cs.data(), sn.data());
    for (int64_t h = 0; h < nh; ++h) {
      float* qh = q.data() + (s * nh + h) * hd;
      ApplyRope(qh + hd - rd, static_cast<int>(rd / 2), cs.data(), sn.data(), false);
      HadamardInplace(qh, hd);
      Fp4SimInplace(qh, hd, 32);
    }
    for (int64_t h = 0; h < nh; ++h) wts[s * nh + h] = RoundBf16(wts[s * nh + h] * wscale);
  }

#pragma omp parallel for schedule(static) if (S * res.n_blocks * nh * hd >= kParallelMinWork)
  for (int64_t s = 0; s < S; ++s) {
    const int64_t eligible = (start + s + 1) / ratio;
    float* sc = res.scores.data() + s * res.n_blocks;
    std::vector<float> dots(nh);
    for (int64_t j = 0; j < eligible; ++j) {
      // Four heads' dot products with key j at a time (each DotF32's own sum).
      const float* key = keys.data() + j * hd;
      int64_t h = 0;
      for (; h + 4 <= nh; h += 4) {
        const float* qh[4];
        for (int k = 0; k < 4; ++k) qh[k] = q.data() + (s * nh + h + k) * hd;
        DotF32x4(key, qh, hd, dots.data() + h);
      }
      for (; h < nh; ++h) dots[h] = DotF32(q.data() + (s * nh + h) * hd, key, hd);
      double total = 0.0;
      for (h = 0; h < nh; ++h) {
        total += RoundBf16(std::max(RoundBf16(dots[h]), 0.0f) * wts[s * nh + h]);
      }
      sc[j] = RoundBf16(static_cast<float>(total));
    }
    std::vector<int32_t> order(res.n_blocks);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return sc[a] > sc[b]; });
    for (int64_t i = 0; i < res.k; ++i) {
      res.sel[s * res.k + i] = order[i] < eligible ? order[i] : -1;
    }
  }
  return res;
}

}  // namespace ss::model
