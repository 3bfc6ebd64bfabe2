#include "common/model/model.h"

#include <sched.h>

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/model/attention.h"
#include "common/model/hyper_connection.h"
#include "common/model/linear.h"
#include "common/rope.h"
#include "common/status.h"

namespace ss::model {
namespace {

// How long the row-group threads poll for the next group after one ends: long enough to bridge
// the attention and MoE halves of a block, short of the routed experts' call, so an idle pool
// leaves the cores to the expert worker.
constexpr int kRowGroupSpinUs = 50;

// The CPUs this process may run on (sched_getaffinity), at least 1.
int AllowedCpus() {
  cpu_set_t set;
  return sched_getaffinity(0, sizeof(set), &set) == 0 ? std::max(1, CPU_COUNT(&set)) : 1;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> Model::Load(const WeightSource& source, ModelOptions options,
                                                   const TensorFilter& materialize) {
  ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(source));
  std::unique_ptr<Checkpoint> ckpt;
  if (source.dummy()) {
    std::unique_ptr<ThreadPool> pool;
    const int threads = AllowedCpus();
    if (threads > 1) {
      ThreadPoolOptions po;
      po.num_threads = threads;
      po.spin_us = 0;
      po.name = "ss-dummy";
      ASSIGN_OR_RETURN(pool, ThreadPool::Create(po));
    }
    ASSIGN_OR_RETURN(ckpt, MakeDummyCheckpoint(config, source.seed, materialize, pool.get(),
                                               source.router_skew));
  } else {
    ASSIGN_OR_RETURN(ckpt, Checkpoint::Open(source.model_dir));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<ModelWeights> w,
                   BindModelWeights(std::move(config), std::move(ckpt)));
  return FromWeights(std::move(w), options);
}

absl::StatusOr<std::unique_ptr<Model>> Model::Load(const std::string& dir, ModelOptions options) {
  ASSIGN_OR_RETURN(std::unique_ptr<ModelWeights> w, LoadModelWeights(dir));
  return FromWeights(std::move(w), options);
}

absl::StatusOr<std::unique_ptr<Model>> Model::FromWeights(std::unique_ptr<ModelWeights> w,
                                                          ModelOptions options) {
  std::unique_ptr<Model> m(new Model());
  m->w_ = std::move(w);
  m->options_ = options;
  int threads = options.row_group_threads;
  if (threads <= 0) threads = AllowedCpus();
  threads = std::min(threads, kMaxRowGroupThreads);
  if (threads > 1) {
    ThreadPoolOptions po;
    po.num_threads = threads;
    po.spin_us = kRowGroupSpinUs;
    po.name = "ss-rows";
    ASSIGN_OR_RETURN(m->pool_, ThreadPool::Create(po));
  }
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

namespace {

// Calls of at most this many rows (decode steps, small chunks) run their chunks in concurrent row
// groups; larger ones parallelise inside the ops (kParallelMinWork).
constexpr int64_t kMaxGroupedRows = 64;

// A contiguous run of a call's chunks: chunks [c0, c1), rows [r0, r0 + n).
struct RowGroup {
  size_t c0 = 0, c1 = 0;
  int64_t r0 = 0, n = 0;
};

// Splits the chunks into at most `max_groups` contiguous runs of about equal rows (one group when
// max_groups <= 1 or a state appears twice: its chunks must then run in order).
std::vector<RowGroup> SplitRows(std::span<const ChunkRef> chunks, int64_t T, int max_groups) {
  const int64_t n_chunks = static_cast<int64_t>(chunks.size());
  int64_t g = std::min<int64_t>(max_groups, n_chunks);
  for (size_t i = 0; i < chunks.size() && g > 1; ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (chunks[i].state == chunks[j].state) g = 1;
    }
  }
  std::vector<RowGroup> groups;
  RowGroup cur;
  int64_t row = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    cur.n += chunks[i].n;
    row += chunks[i].n;
    cur.c1 = i + 1;
    const int64_t left = n_chunks - static_cast<int64_t>(i) - 1;
    const int64_t want = static_cast<int64_t>(groups.size()) + 1;  // groups closed after this one
    const bool full = row * g >= T * want;
    if (left == 0 || (full && want < g && left >= g - want)) {
      groups.push_back(cur);
      cur = RowGroup{i + 1, i + 1, row, 0};
    }
  }
  return groups;
}

}  // namespace

absl::Status Model::RunBlockImpl(int64_t layer, std::span<const ChunkRef> chunks, const float* h_in,
                                 float* h_out, BlockTrace* trace, const RoutedExperts* experts,
                                 BlockTimings* timings) const {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  const ModelConfig& c = config();
  const BlockWeights& bw = Block(layer);
  const int64_t hc = c.hc_mult, dim = c.dim, HD = c.n_heads * c.head_dim;
  const float hc_eps = static_cast<float>(c.hc_eps), eps = static_cast<float>(c.norm_eps);
  int64_t T = 0;
  for (const ChunkRef& ch : chunks) T += ch.n;
  std::vector<int64_t> ids, positions;
  for (const ChunkRef& ch : chunks) {
    ids.insert(ids.end(), ch.tokens, ch.tokens + ch.n);
    for (int64_t s = 0; s < ch.n; ++s) positions.push_back(ch.start + s);
  }
  // Sequences never interact and every step is per row or per chunk, so contiguous groups of
  // chunks can run their per-row work concurrently (small steps only: larger ones parallelise
  // inside the ops); the routed experts then run once for all rows.
  const int max_groups = trace == nullptr ? RowGroupLimit(T) : 1;
  const std::vector<RowGroup> groups = SplitRows(chunks, T, max_groups);
  const int64_t G = static_cast<int64_t>(groups.size());

  std::vector<HcSplit> split(T);
  std::vector<float> y(T * dim), xn(T * dim), a(T * dim), mid(T * hc * dim), f(T * dim);
  std::vector<float> o(T * HD), shared(T * dim), acc(T * dim);
  const int64_t mix = c.mix_hc();
  std::vector<float> mixes(T * mix);
  // Rows [r0, r0 + n): hyper-connection pre-mix of h, then the sublayer norm into xn.
  auto pre = [&](int64_t r0, int64_t n, const float* h, const HcWeights& hw,
                 const std::vector<float>& g) {
    HcMixesRows(h + r0 * hc * dim, n, hc, dim, hw, eps, mixes.data() + r0 * mix);
#pragma omp parallel for schedule(static) if (n * hc * dim * mix >= kParallelMinWork)
    for (int64_t t = r0; t < r0 + n; ++t) {
      const std::vector<float> m(mixes.begin() + t * mix, mixes.begin() + (t + 1) * mix);
      split[t] = HcPreFromMixes(h + t * hc * dim, m, hc, dim, hw, c.hc_sinkhorn_iters, hc_eps,
                                y.data() + t * dim);
      RmsNorm(y.data() + t * dim, g.data(), dim, eps, xn.data() + t * dim);
    }
  };
  auto post = [&](int64_t r0, int64_t n, const float* sub, const float* h, float* out) {
#pragma omp parallel for schedule(static) if (n * hc * hc * dim >= kParallelMinWork)
    for (int64_t t = r0; t < r0 + n; ++t) {
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

  const int64_t ratio = Ratio(layer);
  AttentionParams ap{&c, ratio == 0 ? &rope_plain_ : &rope_compressed_, options_.kv_fp8_sim_rounds};
  // A group's attention sublayer: its rows' projections at once (the weights are decoded once per
  // group, not once per sequence), the stateful core per sequence, the output projections at once.
  auto attention = [&](const RowGroup& g) {
    pre(g.r0, g.n, h_in, bw.hc_attn, bw.attn_norm);
    AttentionRows rows;
    AttentionProject(bw.attn, ap, xn.data() + g.r0 * dim, positions.data() + g.r0, g.n, &rows);
    int64_t row = 0;
    for (size_t i = g.c0; i < g.c1; ++i) {
      const ChunkRef& ch = chunks[i];
      IndexerResult idx;
      AttentionTrace at{&idx};
      AttentionCore(bw.attn, ap, ch.state->layers[layer], xn.data() + (g.r0 + row) * dim, rows, row,
                    ch.n, ch.start, o.data() + (g.r0 + row) * HD, &at);
      if (trace) trace->indexer.push_back(std::move(idx));
      row += ch.n;
    }
    AttentionOutput(bw.attn, ap, o.data() + g.r0 * HD, positions.data() + g.r0, g.n,
                    a.data() + g.r0 * dim);
    post(g.r0, g.n, a.data(), h_in, mid.data());
  };
  // A group's share of the MoE sublayer on this side: pre-mix, router, shared expert.
  std::vector<RouterResult> routes(G);
  const float limit = options_.shared_expert_clamp ? static_cast<float>(c.swiglu_limit) : 0.0f;
  auto moe_rows = [&](int64_t gi) {
    const RowGroup& g = groups[gi];
    pre(g.r0, g.n, mid.data(), bw.hc_ffn, bw.ffn_norm);
    routes[gi] = Route(bw.moe, c, xn.data() + g.r0 * dim, ids.data() + g.r0, g.n);
    SharedExpert(bw.moe, xn.data() + g.r0 * dim, g.n, limit, shared.data() + g.r0 * dim);
  };

  EachRowGroup(G, [&](int64_t gi) { attention(groups[gi]); });
  if (trace) keep_split(trace->hc_attn_split);
  const auto t1 = Clock::now();

  EachRowGroup(G, moe_rows);
  if (trace) keep_split(trace->hc_ffn_split);
  RouterResult r = std::move(routes[0]);
  for (int64_t gi = 1; gi < G; ++gi) {
    r.indices.insert(r.indices.end(), routes[gi].indices.begin(), routes[gi].indices.end());
    r.weights.insert(r.weights.end(), routes[gi].weights.begin(), routes[gi].weights.end());
  }
  const auto t2 = Clock::now();
  RETURN_IF_ERROR(MoeRouted(bw.moe, c, layer, xn.data(), r, T, experts, acc.data()));
  const auto t3 = Clock::now();
  EachRowGroup(G, [&](int64_t gi) {
    const RowGroup& g = groups[gi];
    MoeCombine(acc.data() + g.r0 * dim, shared.data() + g.r0 * dim, g.n * dim,
               f.data() + g.r0 * dim);
    post(g.r0, g.n, f.data(), mid.data(), h_out);
  });
  if (trace) {
    trace->attn_out = std::move(a);
    trace->moe_out = std::move(f);
    trace->router = std::move(r);
  }
  if (timings) {
    const double moe = std::chrono::duration<double>(Clock::now() - t1).count();
    const double routed = std::chrono::duration<double>(t3 - t2).count();
    timings->attention += std::chrono::duration<double>(t1 - t0).count();
    timings->moe += moe - routed;
    timings->moe_cpu += routed;
  }
  return absl::OkStatus();
}

int Model::RowGroupLimit(int64_t rows) const {
  return pool_ && rows <= kMaxGroupedRows ? pool_->size() : 1;
}

void Model::EachRowGroup(int64_t groups, absl::FunctionRef<void(int64_t)> fn) const {
  if (groups > 1 && pool_->ParallelFor(groups, [&](int64_t g, int) { fn(g); }).ok()) return;
  for (int64_t g = 0; g < groups; ++g) fn(g);
}

void Model::Logits(const float* streams, float* logits) const {
  const std::vector<float> row = LogitsRows({&streams, 1}).front();
  std::copy(row.begin(), row.end(), logits);
}

std::vector<std::vector<float>> Model::LogitsRows(std::span<const float* const> streams) const {
  const ModelConfig& c = config();
  const int64_t n = static_cast<int64_t>(streams.size()), V = c.vocab_size;
  std::vector<float> u(n * c.dim), flat(n * V);
  // Rows [r0, r1): head collapse, norm, head (row groups on the pool as in RunBlock).
  auto rows = [&](int64_t r0, int64_t r1) {
    std::vector<float> z(c.dim);
    for (int64_t i = r0; i < r1; ++i) {
      HcHead(streams[i], c.hc_mult, c.dim, w_->hc_head, static_cast<float>(c.hc_eps),
             static_cast<float>(c.norm_eps), z.data());
      RmsNorm(z.data(), w_->norm.data(), c.dim, static_cast<float>(c.norm_eps),
              u.data() + i * c.dim);
    }
    LinearF32(w_->head, u.data() + r0 * c.dim, r1 - r0, flat.data() + r0 * V);
  };
  const int64_t G = std::min<int64_t>(RowGroupLimit(n), n);
  EachRowGroup(G, [&](int64_t g) { rows(g * n / G, (g + 1) * n / G); });
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
