#include "common/model/model.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/model/attention.h"
#include "common/model/hyper_connection.h"
#include "common/model/linear.h"
#include "common/rope.h"
#include "common/status.h"

namespace ss::model {

absl::StatusOr<std::unique_ptr<Model>> Model::Load(const std::string& dir, ModelOptions options) {
  std::unique_ptr<Model> m(new Model());
  ASSIGN_OR_RETURN(m->w_, LoadModelWeights(dir));
  m->options_ = options;
  m->rope_plain_ = LayerRopeFrequencies(m->config(), 0);
  m->rope_compressed_ = LayerRopeFrequencies(m->config(), 4);
  return m;
}

const BlockWeights& Model::Block(int64_t layer) const {
  const int64_t n = config().n_layers;
  return layer < n ? w_->blocks[layer] : w_->mtp[layer - n].block;
}

int64_t Model::Ratio(int64_t layer) const { return config().compress_ratios[layer]; }

SequenceState Model::NewSequence() const {
  SequenceState s;
  const ModelConfig& c = config();
  for (int64_t l = 0; l < c.n_layers + c.n_mtp_layers; ++l) {
    s.layers.push_back(NewLayerState(c, Ratio(l)));
  }
  return s;
}

void Model::EmbedStreams(const int64_t* ids, int64_t n, float* out) const {
  const int64_t hc = config().hc_mult, dim = config().dim;
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t s = 0; s < hc; ++s) w_->embed.Row(ids[t], out + (t * hc + s) * dim);
  }
}

void Model::RunBlock(int64_t layer, std::span<const ChunkRef> chunks, const float* h_in,
                     float* h_out, BlockTrace* trace) const {
  // Local experts cannot fail.
  (void)RunBlockImpl(layer, chunks, h_in, h_out, trace, nullptr, nullptr);
}

absl::Status Model::RunBlock(int64_t layer, std::span<const ChunkRef> chunks, const float* h_in,
                             float* h_out, const RoutedExperts* experts,
                             BlockTimings* timings) const {
  return RunBlockImpl(layer, chunks, h_in, h_out, nullptr, experts, timings);
}

absl::Status Model::RunBlockImpl(int64_t layer, std::span<const ChunkRef> chunks, const float* h_in,
                                 float* h_out, BlockTrace* trace, const RoutedExperts* experts,
                                 BlockTimings* timings) const {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  const ModelConfig& c = config();
  const BlockWeights& bw = Block(layer);
  const int64_t hc = c.hc_mult, dim = c.dim;
  const float hc_eps = static_cast<float>(c.hc_eps), eps = static_cast<float>(c.norm_eps);
  int64_t T = 0;
  for (const ChunkRef& ch : chunks) T += ch.n;
  std::vector<int64_t> ids;
  for (const ChunkRef& ch : chunks) ids.insert(ids.end(), ch.tokens, ch.tokens + ch.n);

  std::vector<HcSplit> split(T);
  std::vector<float> y(T * dim), xn(T * dim), a(T * dim), mid(T * hc * dim), f(T * dim);
  const int64_t mix = c.mix_hc();
  std::vector<float> mixes(T * mix);
  auto pre = [&](const float* h, const HcWeights& hw, const std::vector<float>& g) {
    HcMixesRows(h, T, hc, dim, hw, eps, mixes.data());
#pragma omp parallel for schedule(static) if (T * hc * dim * mix >= kParallelMinWork)
    for (int64_t t = 0; t < T; ++t) {
      const std::vector<float> m(mixes.begin() + t * mix, mixes.begin() + (t + 1) * mix);
      split[t] = HcPreFromMixes(h + t * hc * dim, m, hc, dim, hw, c.hc_sinkhorn_iters, hc_eps,
                                y.data() + t * dim);
      RmsNorm(y.data() + t * dim, g.data(), dim, eps, xn.data() + t * dim);
    }
  };
  auto post = [&](const float* sub, const float* h, float* out) {
#pragma omp parallel for schedule(static) if (T * hc * hc * dim >= kParallelMinWork)
    for (int64_t t = 0; t < T; ++t) {
      HcPost(sub + t * dim, h + t * hc * dim, split[t], hc, dim, out + t * hc * dim);
    }
  };
  auto keep_split = [&](std::vector<std::vector<float>>& dst) {
    for (const HcSplit& s : split) {
      std::vector<float> v = s.pre;
      v.insert(v.end(), s.post.begin(), s.post.end());
      v.insert(v.end(), s.comb.begin(), s.comb.end());
      dst.push_back(std::move(v));
    }
  };

  pre(h_in, bw.hc_attn, bw.attn_norm);
  if (trace) keep_split(trace->hc_attn_split);
  const int64_t ratio = Ratio(layer);
  AttentionParams ap{&c, ratio == 0 ? &rope_plain_ : &rope_compressed_, options_.kv_fp8_sim_rounds};
  // Every row's projections at once (the weights are decoded once per block call, not once per
  // sequence), the stateful core per sequence, the output projections at once again.
  std::vector<int64_t> positions(T);
  {
    int64_t row = 0;
    for (const ChunkRef& ch : chunks) {
      for (int64_t s = 0; s < ch.n; ++s) positions[row++] = ch.start + s;
    }
  }
  AttentionRows rows;
  AttentionProject(bw.attn, ap, xn.data(), positions.data(), T, &rows);
  std::vector<float> o(T * c.n_heads * c.head_dim);
  int64_t row = 0;
  for (const ChunkRef& ch : chunks) {
    IndexerResult idx;
    AttentionTrace at{&idx};
    AttentionCore(bw.attn, ap, ch.state->layers[layer], xn.data() + row * dim, rows, row, ch.n,
                  ch.start, o.data() + row * c.n_heads * c.head_dim, &at);
    if (trace) trace->indexer.push_back(std::move(idx));
    row += ch.n;
  }
  AttentionOutput(bw.attn, ap, o.data(), positions.data(), T, a.data());
  post(a.data(), h_in, mid.data());
  const auto t1 = Clock::now();

  pre(mid.data(), bw.hc_ffn, bw.ffn_norm);
  if (trace) keep_split(trace->hc_ffn_split);
  MoeTimings mt;
  RETURN_IF_ERROR(MoeForward(bw.moe, c, options_.shared_expert_clamp, layer, xn.data(), ids.data(),
                             T, experts, f.data(), trace ? &trace->router : nullptr, &mt));
  post(f.data(), mid.data(), h_out);
  if (trace) {
    trace->attn_out = std::move(a);
    trace->moe_out = std::move(f);
  }
  if (timings) {
    const double moe = std::chrono::duration<double>(Clock::now() - t1).count();
    timings->attention += std::chrono::duration<double>(t1 - t0).count();
    timings->moe += moe - mt.routed;
    timings->moe_cpu += mt.routed;
  }
  return absl::OkStatus();
}

void Model::Logits(const float* streams, float* logits) const {
  const std::vector<float> row = LogitsRows({&streams, 1}).front();
  std::copy(row.begin(), row.end(), logits);
}

std::vector<std::vector<float>> Model::LogitsRows(std::span<const float* const> streams) const {
  const ModelConfig& c = config();
  const int64_t n = static_cast<int64_t>(streams.size()), V = c.vocab_size;
  std::vector<float> z(c.dim), u(n * c.dim), flat(n * V);
  for (int64_t i = 0; i < n; ++i) {
    HcHead(streams[i], c.hc_mult, c.dim, w_->hc_head, static_cast<float>(c.hc_eps),
           static_cast<float>(c.norm_eps), z.data());
    RmsNorm(z.data(), w_->norm.data(), c.dim, static_cast<float>(c.norm_eps), u.data() + i * c.dim);
  }
  LinearF32(w_->head, u.data(), n, flat.data());
  std::vector<std::vector<float>> logits;
  for (int64_t i = 0; i < n; ++i)
    logits.emplace_back(flat.begin() + i * V, flat.begin() + (i + 1) * V);
  return logits;
}

absl::Status Model::ValidateChunks(std::span<const ChunkRef> chunks) const {
  const ModelConfig& c = config();
  for (size_t i = 0; i < chunks.size(); ++i) {
    const ChunkRef& ch = chunks[i];
    if (ch.state == nullptr || ch.n <= 0 || ch.tokens == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("chunk ", i, ": empty or without state"));
    }
    if (static_cast<int64_t>(ch.state->layers.size()) != c.n_layers + c.n_mtp_layers) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk ", i, ": state was not made by this model"));
    }
    if (ch.start < 0) return absl::InvalidArgumentError(absl::StrCat("chunk ", i, ": start < 0"));
    for (int64_t t = 0; t < ch.n; ++t) {
      if (ch.tokens[t] < 0 || ch.tokens[t] >= c.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat("chunk ", i, ": token id ", ch.tokens[t],
                                                       " outside [0, ", c.vocab_size, ")"));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::vector<float>>> Model::Forward(
    std::span<const ChunkRef> chunks, std::vector<float>* final_streams) const {
  std::vector<ChunkRef> cs(chunks.begin(), chunks.end());
  for (ChunkRef& ch : cs) {
    if (ch.state) ch.start = ch.state->next_pos;
  }
  RETURN_IF_ERROR(ValidateChunks(cs));
  const ModelConfig& c = config();
  const int64_t hc = c.hc_mult, dim = c.dim;
  int64_t T = 0;
  for (const ChunkRef& ch : cs) T += ch.n;
  std::vector<float> h(T * hc * dim), h2(T * hc * dim);
  int64_t row = 0;
  for (const ChunkRef& ch : cs) {
    EmbedStreams(ch.tokens, ch.n, h.data() + row * hc * dim);
    row += ch.n;
  }
  for (int64_t l = 0; l < c.n_layers; ++l) {
    RunBlock(l, cs, h.data(), h2.data(), nullptr);
    h.swap(h2);
  }
  std::vector<const float*> last;
  row = 0;
  for (ChunkRef& ch : cs) {
    row += ch.n;
    last.push_back(h.data() + (row - 1) * hc * dim);
    ch.state->next_pos += ch.n;
  }
  std::vector<std::vector<float>> logits = LogitsRows(last);
  if (final_streams) *final_streams = std::move(h);
  return logits;
}

absl::StatusOr<std::vector<std::vector<float>>> Model::MtpForward(int64_t k,
                                                                  std::span<const ChunkRef> chunks,
                                                                  const float* h_main) const {
  const ModelConfig& c = config();
  if (k < 0 || k >= c.n_mtp_layers) {
    return absl::InvalidArgumentError(absl::StrCat("no MTP block ", k, " in this checkpoint"));
  }
  RETURN_IF_ERROR(ValidateChunks(chunks));
  const MtpWeights& mw = w_->mtp[k];
  const int64_t hc = c.hc_mult, dim = c.dim;
  const float eps = static_cast<float>(c.norm_eps);
  int64_t T = 0;
  for (const ChunkRef& ch : chunks) T += ch.n;
  std::vector<float> e(T * dim), en(T * dim), ep(T * dim), hs(T * hc * dim), hp(T * hc * dim);
  std::vector<float> x(T * hc * dim), out(T * hc * dim);
  int64_t row = 0;
  for (const ChunkRef& ch : chunks) {
    for (int64_t t = 0; t < ch.n; ++t) w_->embed.Row(ch.tokens[t], e.data() + (row + t) * dim);
    row += ch.n;
  }
  for (int64_t t = 0; t < T; ++t)
    RmsNorm(e.data() + t * dim, mw.enorm.data(), dim, eps, en.data() + t * dim);
  for (int64_t r = 0; r < T * hc; ++r)
    RmsNorm(h_main + r * dim, mw.hnorm.data(), dim, eps, hs.data() + r * dim);
  Linear8(mw.e_proj, en.data(), T, ep.data());
  Linear8(mw.h_proj, hs.data(), T * hc, hp.data());
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t s = 0; s < hc; ++s) {
      for (int64_t i = 0; i < dim; ++i) {
        const int64_t j = (t * hc + s) * dim + i;
        x[j] = RoundBf16(ep[t * dim + i] + hp[j]);
      }
    }
  }
  RunBlock(c.n_layers + k, chunks, x.data(), out.data(), nullptr);
  std::vector<std::vector<float>> logits;
  std::vector<float> z(dim), u(dim);
  row = 0;
  for (const ChunkRef& ch : chunks) {
    row += ch.n;
    HcHead(out.data() + (row - 1) * hc * dim, hc, dim, mw.hc_head, static_cast<float>(c.hc_eps),
           eps, z.data());
    RmsNorm(z.data(), mw.norm.data(), dim, eps, u.data());
    logits.emplace_back(c.vocab_size);
    LinearF32(w_->head, u.data(), 1, logits.back().data());
  }
  return logits;
}

}  // namespace ss::model
