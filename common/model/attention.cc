#include "common/model/attention.h"

#include <algorithm>
#include <cmath>

#include "common/bf16.h"
#include "common/codecs.h"
#include "common/model/compressor.h"
#include "common/model/linear.h"
#include "common/rope.h"

namespace ss::model {
namespace {

constexpr int64_t kSoftmaxChunk = 64;

}  // namespace

void HeadNormBf16(float* q, int64_t n, float eps) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += RoundBf16(q[i] * q[i]);
  const float mean = RoundBf16(static_cast<float>(sum) * (1.0f / static_cast<float>(n)));
  const float r = RoundBf16(1.0f / std::sqrt(RoundBf16(mean + eps)));
  for (int64_t i = 0; i < n; ++i) q[i] = RoundBf16(q[i] * r);
}

void SparseAttendHead(const float* q, const std::vector<const float*>& cand, int64_t d, float scale,
                      float sink, float* out) {
  std::vector<float> acc(d, 0.0f), s(kSoftmaxChunk);
  std::vector<double> pv(d);
  float m = -INFINITY, l = 0.0f;
  const int64_t n = static_cast<int64_t>(cand.size());
  for (int64_t c0 = 0; c0 < n; c0 += kSoftmaxChunk) {
    const int64_t c1 = std::min(n, c0 + kSoftmaxChunk);
    float cmax = m;
    int64_t i = c0;
    for (; i + 4 <= c1; i += 4) {  // four candidates at a time (each DotF32's own sum)
      const float* b[4];
      float dots[4];
      for (int k = 0; k < 4; ++k) b[k] = cand[i + k] ? cand[i + k] : q;
      DotF32x4(q, b, d, dots);
      for (int k = 0; k < 4; ++k) s[i + k - c0] = cand[i + k] ? dots[k] * scale : -INFINITY;
    }
    for (; i < c1; ++i) s[i - c0] = cand[i] ? DotF32(q, cand[i], d) * scale : -INFINITY;
    for (i = c0; i < c1; ++i) cmax = std::max(cmax, s[i - c0]);
    const float alpha = std::exp(m - cmax);
    m = cmax;
    double psum = 0.0;
    std::fill(pv.begin(), pv.end(), 0.0);
    for (int64_t i = c0; i < c1; ++i) {
      const float p = std::exp(s[i - c0] - m);
      psum += p;
      if (!cand[i]) continue;
      const double pr = RoundBf16(p);
      for (int64_t j = 0; j < d; ++j) pv[j] += pr * cand[i][j];
    }
    l = l * alpha + static_cast<float>(psum);
    for (int64_t j = 0; j < d; ++j) acc[j] = acc[j] * alpha + static_cast<float>(pv[j]);
  }
  l += std::exp(sink - m);
  for (int64_t j = 0; j < d; ++j) out[j] = RoundBf16(acc[j] / l);
}

LayerState NewLayerState(const ModelConfig& c, int64_t ratio) {
  LayerState st;
  st.window.assign(c.window_size * c.head_dim, 0.0f);
  if (ratio > 0) st.compressor.Reset(ratio, c.head_dim);
  if (ratio == 4) st.index_compressor.Reset(ratio, c.index_head_dim);
  return st;
}

void AttentionProject(const AttentionWeights& w, const AttentionParams& p, const float* x,
                      const int64_t* positions, int64_t T, AttentionRows* rows) {
  const ModelConfig& c = *p.config;
  const int64_t H = c.n_heads, Dh = c.head_dim, rd = c.rope_head_dim, qlr = c.q_lora_rank;
  const float eps = static_cast<float>(c.norm_eps);
  // Query path.
  std::vector<float> qa(T * qlr);
  rows->qr.resize(T * qlr);
  rows->q.resize(T * H * Dh);
  Linear8(w.wq_a, x, T, qa.data());
  for (int64_t t = 0; t < T; ++t)
    RmsNorm(qa.data() + t * qlr, w.q_norm.data(), qlr, eps, rows->qr.data() + t * qlr);
  Linear8(w.wq_b, rows->qr.data(), T, rows->q.data());
  // KV path.
  std::vector<float> kva(T * Dh);
  rows->kv.resize(T * Dh);
  Linear8(w.wkv, x, T, kva.data());
  std::vector<float> cs(rd / 2), sn(rd / 2);
  for (int64_t t = 0; t < T; ++t) {
    RopeCosSin(*p.rope_freqs, positions[t], cs.data(), sn.data());
    for (int64_t h = 0; h < H; ++h) {
      float* qh = rows->q.data() + (t * H + h) * Dh;
      HeadNormBf16(qh, Dh, eps);
      ApplyRope(qh + Dh - rd, static_cast<int>(rd / 2), cs.data(), sn.data(), false);
    }
    float* e = rows->kv.data() + t * Dh;
    RmsNorm(kva.data() + t * Dh, w.kv_norm.data(), Dh, eps, e);
    ApplyRope(e + Dh - rd, static_cast<int>(rd / 2), cs.data(), sn.data(), false);
    Fp8SimInplace(e, Dh - rd, 64, p.kv_fp8_sim_rounds);
  }
  // The compressors' and the indexer's projections are per row too.
  if (w.has_compressor) {
    const int64_t width = w.compressor.wkv.rows;
    rows->comp_kv.resize(T * width);
    rows->comp_score.resize(T * width);
    CompressorProject(w.compressor, x, T, rows->comp_kv.data(), rows->comp_score.data());
  }
  if (w.has_indexer) {
    const int64_t width = w.indexer.compressor.wkv.rows;
    rows->icomp_kv.resize(T * width);
    rows->icomp_score.resize(T * width);
    CompressorProject(w.indexer.compressor, x, T, rows->icomp_kv.data(), rows->icomp_score.data());
    rows->idx_q.resize(T * c.index_n_heads * c.index_head_dim);
    rows->idx_w.resize(T * c.index_n_heads);
    IndexerProject(w.indexer, x, rows->qr.data(), T, rows->idx_q.data(), rows->idx_w.data());
  }
}

void AttentionCore(const AttentionWeights& w, const AttentionParams& p, LayerState& st,
                   const float* x, const AttentionRows& rows, int64_t row0, int64_t S,
                   int64_t start, float* o_out, AttentionTrace* trace) {
  const ModelConfig& c = *p.config;
  const int64_t dim = c.dim, H = c.n_heads, Dh = c.head_dim, rd = c.rope_head_dim;
  const int64_t W = c.window_size, ratio = w.ratio, qlr = c.q_lora_rank;
  const float eps = static_cast<float>(c.norm_eps);
  const int64_t end = start + S;
  const float* q = rows.q.data() + row0 * H * Dh;
  const float* kv = rows.kv.data() + row0 * Dh;

  // Compressors first (spec §3.14): every block completing inside the chunk exists before any
  // query of the chunk attends.
  if (w.has_compressor) {
    CompressorParams cp{CompressorKind::kMain, rd, eps, p.kv_fp8_sim_rounds, p.rope_freqs};
    const int64_t width = w.compressor.wkv.rows;
    CompressorFeed(w.compressor, cp, st.compressor, x, S, dim, start, st.compressed,
                   rows.comp_kv.data() + row0 * width, rows.comp_score.data() + row0 * width);
  }
  IndexerResult idx;
  if (w.has_indexer) {
    CompressorParams cp{CompressorKind::kIndexer, rd, eps, p.kv_fp8_sim_rounds, p.rope_freqs};
    const int64_t width = w.indexer.compressor.wkv.rows;
    CompressorFeed(w.indexer.compressor, cp, st.index_compressor, x, S, dim, start, st.index_keys,
                   rows.icomp_kv.data() + row0 * width, rows.icomp_score.data() + row0 * width);
    const int64_t nh = c.index_n_heads;
    idx = IndexerSelect(w.indexer, c, *p.rope_freqs, x, rows.qr.data() + row0 * qlr, S, start,
                        st.index_keys, rows.idx_q.data() + row0 * nh * c.index_head_dim,
                        rows.idx_w.data() + row0 * nh);
  }

  auto raw_entry = [&](int64_t t) -> const float* {
    return t >= start ? kv + (t - start) * Dh : st.window.data() + (t % W) * Dh;
  };
  const int64_t win_width = start == 0 ? std::min(S, W) : W;
  const float scale = static_cast<float>(std::pow(static_cast<double>(Dh), -0.5));
#pragma omp parallel for schedule( \
    dynamic) if (S * H * (W + end / std::max <int64_t>(ratio, 1)) * Dh >= kParallelMinWork)
  for (int64_t sh = 0; sh < S * H; ++sh) {
    const int64_t s = sh / H, h = sh % H, pos = start + s;
    std::vector<const float*> cand;
    const int64_t first = std::max<int64_t>(0, pos - W + 1);
    for (int64_t t = first; t <= pos; ++t) cand.push_back(raw_entry(t));
    cand.resize(std::max<int64_t>(win_width, static_cast<int64_t>(cand.size())), nullptr);
    if (ratio > 0 && !w.has_indexer) {
      const int64_t complete = (pos + 1) / ratio;
      for (int64_t j = 0; j < end / ratio; ++j) {
        cand.push_back(j < complete ? st.compressed.data() + j * Dh : nullptr);
      }
    } else if (w.has_indexer) {
      for (int64_t i = 0; i < idx.k; ++i) {
        const int32_t j = idx.sel[s * idx.k + i];
        cand.push_back(j >= 0 ? st.compressed.data() + j * Dh : nullptr);
      }
    }
    SparseAttendHead(q + sh * Dh, cand, Dh, scale, w.attn_sink[h], o_out + sh * Dh);
  }

  // The chunk's raw KV enters the window ring (the last W positions survive).
  for (int64_t t = std::max(start, end - W); t < end; ++t) {
    std::copy_n(kv + (t - start) * Dh, Dh, st.window.data() + (t % W) * Dh);
  }
  if (trace && trace->indexer) *trace->indexer = std::move(idx);
}

void AttentionOutput(const AttentionWeights& w, const AttentionParams& p, float* o,
                     const int64_t* positions, int64_t T, float* out) {
  const ModelConfig& c = *p.config;
  const int64_t H = c.n_heads, Dh = c.head_dim, rd = c.rope_head_dim;
  // De-rotate with the query position, then the grouped low-rank projection.
  const int64_t G = c.o_groups, R = c.o_lora_rank, gin = H * Dh / G;
  std::vector<float> cs(rd / 2), sn(rd / 2), z(T * G * R);
  for (int64_t t = 0; t < T; ++t) {
    RopeCosSin(*p.rope_freqs, positions[t], cs.data(), sn.data());
    for (int64_t h = 0; h < H; ++h) {
      ApplyRope(o + (t * H + h) * Dh + Dh - rd, static_cast<int>(rd / 2), cs.data(), sn.data(),
                true);
    }
  }
  // Per group g: z[t, g, :] = o[t, g's heads] · wo_a[g·R .. (g+1)·R)ᵀ, each sum in DotF32's order.
  for (int64_t g = 0; g < G; ++g) {
    LinearFp8RowsF32(w.wo_a, g * R, R, o + g * gin, H * Dh, T, z.data() + g * R, G * R);
  }
  for (float& v : z) v = RoundBf16(v);
  Linear8(w.wo_b, z.data(), T, out);
}

void AttentionForward(const AttentionWeights& w, const AttentionParams& p, LayerState& st,
                      const float* x, int64_t S, int64_t start, float* out, AttentionTrace* trace) {
  const ModelConfig& c = *p.config;
  std::vector<int64_t> positions(S);
  for (int64_t s = 0; s < S; ++s) positions[s] = start + s;
  AttentionRows rows;
  AttentionProject(w, p, x, positions.data(), S, &rows);
  std::vector<float> o(S * c.n_heads * c.head_dim);
  AttentionCore(w, p, st, x, rows, 0, S, start, o.data(), trace);
  AttentionOutput(w, p, o.data(), positions.data(), S, out);
}

}  // namespace ss::model
