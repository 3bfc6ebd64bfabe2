// CUDA compressor, indexer, grouped output projection and LM head kernels
// (gpu_worker/kernels/compressor_kernels.h) against the CPU reference (label gpu): on tiny-a
// weights with the golden blocks160 activations (CSA layers 2 and 4, HCA layers 3 and 5) and at
// Flash shapes with synthetic data. Without a CUDA device every test that needs one skips with a
// message.
//
// Each comparison prints rms_rel, max_rel and bit_identical. Two kinds of run:
//  * isolated: the kernel gets the reference's own inputs (e.g. the compressor the host's exact
//    fp32 V/G, the scores the host-prepared q and weights). The kernels mirror the reference's
//    arithmetic, so these are bit-identical but for rare ulps of exp (and must be ≥ 99.9%);
//  * chain: the device computes the inputs too (fp32 GEMV instead of the exact double sums,
//    the existing Fp8Linear for the indexer's wq_b), so an ulp before a bf16/FP8/FP4 rounding can
//    flip it: the fraction is reported and the bar is looser (rms_rel ≤ 1e-2; selections equal
//    as sets except near-ties).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/bf16.h"
#include "common/codecs.h"
#include "common/golden/golden.h"
#include "common/model/compressor.h"
#include "common/model/hyper_connection.h"
#include "common/model/indexer.h"
#include "common/model/linear.h"
#include "common/model/state.h"
#include "common/model/weights.h"
#include "common/model_config.h"
#include "common/rope.h"
#include "common/safetensors.h"
#include "gpu_worker/kernels/block_kernels.h"
#include "gpu_worker/kernels/compressor_kernels.h"
#include "gpu_worker/kernels/kernels.h"
#include "gtest/gtest.h"
#include "tests/gpu_worker/gpu_test_util.h"

namespace ss::cuda {
namespace {

using namespace testing_util;  // NOLINT: the shared GPU test helpers

class CompressorIndexerTest : public testing_util::GpuTest {};

// Random e4m3 codes (NaN codes 0x7f/0xff excluded) and ue8m0 scale bytes in [lo, hi].
std::vector<uint8_t> RandomE4m3(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> v(n);
  for (uint8_t& b : v) {
    uint8_t c = static_cast<uint8_t>(rng() & 0xff);
    if ((c & 0x7f) == 0x7f) c ^= 0x01;
    b = c;
  }
  return v;
}
std::vector<uint8_t> RandomScales(size_t n, int lo, int hi, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> d(lo, hi);
  std::vector<uint8_t> v(n);
  for (uint8_t& b : v) b = static_cast<uint8_t>(d(rng));
  return v;
}

model::Bf16Matrix MatrixOf(const std::vector<uint16_t>& bits, int64_t rows, int64_t cols) {
  return model::Bf16Matrix{reinterpret_cast<const uint8_t*>(bits.data()), rows, cols};
}

// Elements whose bits differ (the compressor state holds −inf, which Compare does not take).
int64_t BitMismatches(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return static_cast<int64_t>(std::max(a.size(), b.size()));
  int64_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += std::memcmp(&a[i], &b[i], 4) != 0;
  return n;
}

// Scores with −inf: the masks must agree exactly; the finite values are compared.
golden::Closeness ReportScores(const std::string& what, const std::vector<float>& got,
                               const std::vector<float>& ref) {
  EXPECT_EQ(got.size(), ref.size()) << what;
  std::vector<float> g, r;
  int64_t mask_diff = 0;
  for (size_t i = 0; i < std::min(got.size(), ref.size()); ++i) {
    const bool gi = std::isinf(got[i]) && got[i] < 0, ri = std::isinf(ref[i]) && ref[i] < 0;
    if (gi != ri) {
      ++mask_diff;
    } else if (!ri) {
      g.push_back(got[i]);
      r.push_back(ref[i]);
    }
  }
  EXPECT_EQ(mask_diff, 0) << what;
  return Report(what + " (finite)", g, r);
}

// ---- tiny-a data -----------------------------------------------------------------------------

const model::ModelWeights& TinyA() {
  static const std::unique_ptr<model::ModelWeights> w = [] {
    auto r = model::LoadModelWeights(kTinyA);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? std::move(*r) : nullptr;
  }();
  return *w;
}

const Checkpoint& TinyABlocks() {
  static const std::unique_ptr<Checkpoint> g = [] {
    auto r = Checkpoint::OpenFiles({std::string(kTinyA) + "/golden_blocks.safetensors"});
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? std::move(*r) : nullptr;
  }();
  return *g;
}

std::vector<float> GoldenBf16(const std::string& name, const std::vector<int64_t>& shape) {
  auto t = TinyABlocks().Get(name, DType::kBF16, shape);
  EXPECT_TRUE(t.ok()) << t.status();
  if (!t.ok()) return {};
  std::vector<float> v((*t)->numel());
  for (size_t i = 0; i < v.size(); ++i) {
    uint16_t b;
    std::memcpy(&b, (*t)->data + 2 * i, 2);
    v[i] = Bf16ToFloat(b);
  }
  return v;
}

// The blocks160 case: a 160-token prefill with the HC streams after every block.
struct Blocks160 {
  std::vector<int64_t> ids;
  std::vector<float> after_block;  // [n_layers, T, hc, dim]
  int64_t T = 0;
};

const Blocks160& B160() {
  static const Blocks160 s = [] {
    const ModelConfig& c = TinyA().config;
    Blocks160 r;
    auto t = TinyABlocks().GetAnyShape("blocks160.prompt_ids", DType::kI64);
    EXPECT_TRUE(t.ok()) << t.status();
    if (!t.ok()) return r;
    r.ids.resize((*t)->numel());
    std::memcpy(r.ids.data(), (*t)->data, r.ids.size() * 8);
    r.T = static_cast<int64_t>(r.ids.size());
    r.after_block = GoldenBf16("blocks160.hc_after_block", {c.n_layers, r.T, c.hc_mult, c.dim});
    return r;
  }();
  return s;
}

std::vector<float> StreamsIntoBlock(int64_t layer) {
  const ModelConfig& c = TinyA().config;
  const Blocks160& s = B160();
  const int64_t n = s.T * c.hc_mult * c.dim;
  if (layer > 0) {
    return std::vector<float>(s.after_block.begin() + (layer - 1) * n,
                              s.after_block.begin() + layer * n);
  }
  std::vector<float> h(n), row(c.dim);
  for (int64_t t = 0; t < s.T; ++t) {
    TinyA().embed.Row(s.ids[t], row.data());
    for (int64_t k = 0; k < c.hc_mult; ++k) {
      std::copy(row.begin(), row.end(), h.begin() + (t * c.hc_mult + k) * c.dim);
    }
  }
  return h;
}

// The attention input of block L on the golden streams: RMSNorm(HcPre(streams)).
std::vector<float> AttnInput(int64_t layer) {
  const ModelConfig& c = TinyA().config;
  const model::BlockWeights& b = TinyA().blocks[layer];
  const std::vector<float> streams = StreamsIntoBlock(layer);
  const int64_t T = B160().T, dim = c.dim;
  std::vector<float> y(dim), x(T * dim);
  for (int64_t t = 0; t < T; ++t) {
    model::HcPre(streams.data() + t * c.hc_mult * dim, c.hc_mult, dim, b.hc_attn,
                 c.hc_sinkhorn_iters, static_cast<float>(c.hc_eps), static_cast<float>(c.norm_eps),
                 y.data());
    model::RmsNorm(y.data(), b.attn_norm.data(), dim, static_cast<float>(c.norm_eps),
                   x.data() + t * dim);
  }
  return x;
}

// ---- compressor harness ------------------------------------------------------------------------

// One sequence fed to a compressor: rows x [n, dim] at positions start.., in steps of `chunks`.
struct CompressorSeq {
  std::vector<float> x;
  int64_t start = 0;
  std::vector<int64_t> chunks;
};

struct CompressorOut {
  std::vector<float> entries, kv, score;
};

model::CompressorParams HostParams(const CompressorShape& s, const std::vector<float>& freqs) {
  return model::CompressorParams{s.kind == CompressorKind::kMain ? model::CompressorKind::kMain
                                                                 : model::CompressorKind::kIndexer,
                                 s.rope_dim, s.norm_eps, s.fp8_round, &freqs};
}

CompressorOut HostCompressor(const model::CompressorWeights& w, const CompressorShape& shape,
                             const std::vector<float>& freqs, const CompressorSeq& q, int64_t dim) {
  const model::CompressorParams p = HostParams(shape, freqs);
  model::CompressorState st;
  st.Reset(w.ratio, w.head_dim);
  CompressorOut o;
  int64_t off = 0;
  for (const int64_t n : q.chunks) {
    model::CompressorFeed(w, p, st, q.x.data() + off * dim, n, dim, q.start + off, o.entries);
    off += n;
  }
  o.kv = st.kv;
  o.score = st.score;
  return o;
}

// Runs every sequence together, step i feeding chunk i of each (none once its chunks ran out),
// with V/G from the host's exact LinearF32 (isolated) or from LinearBf16F32 on the device
// (chain; `vg_dev` / `vg_host` then collect both for a report).
std::vector<CompressorOut> DeviceCompressor(const model::CompressorWeights& w,
                                            const CompressorShape& shape,
                                            const std::vector<float>& freqs,
                                            const std::vector<CompressorSeq>& seqs, int64_t dim,
                                            bool device_vg, std::vector<float>* vg_dev,
                                            std::vector<float>* vg_host) {
  const int64_t S = static_cast<int64_t>(seqs.size()), m = w.ratio, d = w.head_dim;
  const int64_t width = (m == 4 ? 2 : 1) * d, slots = (m == 4 ? 2 : 1) * m;
  std::vector<std::unique_ptr<DeviceBuffer<float>>> kv, sc;
  std::vector<float*> kv_ptr, sc_ptr;
  std::vector<int64_t> base(S + 1, 0);
  size_t steps = 0;
  for (int64_t s = 0; s < S; ++s) {
    kv.push_back(std::make_unique<DeviceBuffer<float>>(slots * width));
    sc.push_back(std::make_unique<DeviceBuffer<float>>(slots * width));
    kv_ptr.push_back(kv.back()->get());
    sc_ptr.push_back(sc.back()->get());
    EXPECT_EQ(CompressorResetState(kv_ptr[s], sc_ptr[s], slots * width, nullptr), cudaSuccess);
    const int64_t n = static_cast<int64_t>(seqs[s].x.size()) / dim;
    base[s + 1] = base[s] + (seqs[s].start + n) / m - seqs[s].start / m;
    steps = std::max(steps, seqs[s].chunks.size());
  }
  DeviceBuffer<float*> dkv(kv_ptr), dsc(sc_ptr);
  DeviceBuffer<float> dape(w.ape), dnorm(w.norm), dfreqs(freqs);
  DeviceBuffer<uint16_t> dwkv(MatrixBits(w.wkv)), dwgate(MatrixBits(w.wgate));
  DeviceBuffer<uint16_t> dentries(base[S] * d);
  std::vector<int64_t> off(S, 0), emitted(S, 0);
  for (size_t step = 0; step < steps; ++step) {
    std::vector<int64_t> start(S), row_begin(S + 1, 0), entry_begin(S);
    std::vector<float> x;
    int64_t max_new = 0;
    for (int64_t s = 0; s < S; ++s) {
      const int64_t n = step < seqs[s].chunks.size() ? seqs[s].chunks[step] : 0;
      start[s] = seqs[s].start + off[s];
      row_begin[s + 1] = row_begin[s] + n;
      entry_begin[s] = base[s] + emitted[s];
      x.insert(x.end(), seqs[s].x.begin() + off[s] * dim, seqs[s].x.begin() + (off[s] + n) * dim);
      const int64_t nn = (start[s] + n) / m - start[s] / m;
      max_new = std::max(max_new, nn);
      off[s] += n;
      emitted[s] += nn;
    }
    const int64_t rows = row_begin[S];
    std::vector<float> hv(rows * width), hg(rows * width);
    model::LinearF32(w.wkv, x.data(), rows, hv.data());
    model::LinearF32(w.wgate, x.data(), rows, hg.data());
    DeviceBuffer<float> dv(rows * width), dg(rows * width);
    if (device_vg) {
      DeviceBuffer<uint16_t> dx(ToBf16(x));
      EXPECT_EQ(LinearBf16F32(dx.get(), rows, dim, dwkv.get(), width, dv.get(), width, nullptr),
                cudaSuccess);
      EXPECT_EQ(LinearBf16F32(dx.get(), rows, dim, dwgate.get(), width, dg.get(), width, nullptr),
                cudaSuccess);
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      if (vg_dev != nullptr && rows > 0) {
        for (const DeviceBuffer<float>* b : {&dv, &dg}) {
          const std::vector<float> got = b->Get();
          vg_dev->insert(vg_dev->end(), got.begin(), got.begin() + rows * width);
        }
        vg_host->insert(vg_host->end(), hv.begin(), hv.end());
        vg_host->insert(vg_host->end(), hg.begin(), hg.end());
      }
    } else {
      dv.Put(hv);
      dg.Put(hg);
    }
    DeviceBuffer<int64_t> dstart(start), drow(row_begin), dentry(entry_begin);
    CompressorBatch batch{S, max_new, dstart.get(), drow.get(), dentry.get(), dkv.get(), dsc.get()};
    EXPECT_EQ(CompressorStep(dv.get(), dg.get(), width, dape.get(), dnorm.get(), dfreqs.get(),
                             shape, batch, dentries.get(), nullptr),
              cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  const std::vector<float> all = FromBf16(dentries.Get());
  std::vector<CompressorOut> out(S);
  for (int64_t s = 0; s < S; ++s) {
    out[s].entries.assign(all.begin() + base[s] * d, all.begin() + base[s + 1] * d);
    out[s].kv = kv[s]->Get();
    out[s].score = sc[s]->Get();
  }
  return out;
}

void CheckCompressor(const std::string& label, const model::CompressorWeights& w,
                     const CompressorShape& shape, const std::vector<float>& freqs,
                     const std::vector<CompressorSeq>& seqs, int64_t dim) {
  std::vector<CompressorOut> ref;
  std::vector<float> ref_entries, ref_state;
  for (const CompressorSeq& q : seqs) {
    ref.push_back(HostCompressor(w, shape, freqs, q, dim));
    ref_entries.insert(ref_entries.end(), ref.back().entries.begin(), ref.back().entries.end());
  }
  ASSERT_FALSE(ref_entries.empty()) << label;
  auto gather = [&](const std::vector<CompressorOut>& o) {
    std::vector<float> e;
    int64_t state_bits = 0;
    for (size_t s = 0; s < o.size(); ++s) {
      e.insert(e.end(), o[s].entries.begin(), o[s].entries.end());
      state_bits += BitMismatches(o[s].kv, ref[s].kv) + BitMismatches(o[s].score, ref[s].score);
    }
    return std::make_pair(e, state_bits);
  };

  // Isolated: the reference's exact V/G.
  const auto [iso, iso_state] =
      gather(DeviceCompressor(w, shape, freqs, seqs, dim, false, nullptr, nullptr));
  const golden::Closeness ci = Report(label + " entries (host V/G)", iso, ref_entries);
  std::printf("%-60s state elements differing: %ld\n", (label + " state (host V/G)").c_str(),
              static_cast<long>(iso_state));
  EXPECT_LE(ci.rms_rel, 1e-3) << label;
  EXPECT_GE(ci.bit_identical, 0.999) << label;
  EXPECT_EQ(iso_state, 0) << label;

  // Chain: V/G from the device GEMV.
  std::vector<float> vg_dev, vg_host;
  const auto [chain, chain_state] =
      gather(DeviceCompressor(w, shape, freqs, seqs, dim, true, &vg_dev, &vg_host));
  const golden::Closeness cv = Report(label + " V/G (LinearBf16F32)", vg_dev, vg_host);
  EXPECT_LE(cv.rms_rel, 1e-5) << label;
  const golden::Closeness cc = Report(label + " entries (device V/G)", chain, ref_entries);
  EXPECT_LE(cc.rms_rel, 1e-2) << label;
  EXPECT_GE(cc.bit_identical, 0.9) << label;

  // fp32 arithmetic (fp64 = false): expf, compensated fp32 sums, the fp32 Hadamard butterfly.
  CompressorShape f32 = shape;
  f32.fp64 = false;
  const auto [e32, e32_state] =
      gather(DeviceCompressor(w, f32, freqs, seqs, dim, false, nullptr, nullptr));
  const golden::Closeness c32 = Report(label + " entries (host V/G, fp32 math)", e32, ref_entries);
  EXPECT_LE(c32.rms_rel, 1e-2) << label;
  EXPECT_GE(c32.bit_identical, 0.99) << label;
  EXPECT_EQ(e32_state, 0) << label;
}

// ---- indexer helpers ---------------------------------------------------------------------------

// The reference's per-head q preparation (IndexerSelect): RoPE at the token's position on the
// last rd dims, Hadamard, FP4sim.
std::vector<float> HostPrepQ(std::vector<float> q, int64_t T, int64_t H, int64_t hd, int64_t rd,
                             const std::vector<float>& freqs, int64_t start) {
  std::vector<float> cs(rd / 2), sn(rd / 2);
  for (int64_t t = 0; t < T; ++t) {
    ss::RopeCosSin(freqs, start + t, cs.data(), sn.data());
    for (int64_t h = 0; h < H; ++h) {
      float* qh = q.data() + (t * H + h) * hd;
      ss::ApplyRope(qh + hd - rd, static_cast<int>(rd / 2), cs.data(), sn.data(), false);
      ss::HadamardInplace(qh, hd);
      ss::Fp4SimInplace(qh, hd, 32);
    }
  }
  return q;
}

float IndexerWeightScaleOf(int64_t H, int64_t hd) {
  return static_cast<float>(std::pow(static_cast<double>(hd), -0.5) *
                            std::pow(static_cast<double>(H), -0.5));
}

std::vector<float> HostWeights(const model::Bf16Matrix& proj, const std::vector<float>& x,
                               int64_t T, float scale) {
  std::vector<float> w(T * proj.rows);
  model::LinearBf16(proj, x.data(), T, w.data());
  for (float& v : w) v = RoundBf16(v * scale);
  return w;
}

// Selections per row: same order, same set, a set difference only at near-ties (every element
// of the symmetric difference scores within one bf16 ulp of the reference's k-th score), or bad.
struct SelAgreement {
  int64_t rows = 0, same_order = 0, same_set = 0, tie_only = 0, bad = 0;
};

SelAgreement CompareSel(const std::string& label, const std::vector<int32_t>& got,
                        const std::vector<int32_t>& ref, const std::vector<float>& ref_scores,
                        int64_t rows, int64_t k, int64_t n_cols) {
  SelAgreement a;
  for (int64_t r = 0; r < rows; ++r) {
    ++a.rows;
    const int32_t* g = got.data() + r * k;
    const int32_t* f = ref.data() + r * k;
    if (std::equal(g, g + k, f)) {
      ++a.same_order;
      ++a.same_set;
      continue;
    }
    const std::set<int32_t> sg(g, g + k), sf(f, f + k);
    if (sg == sf) {
      ++a.same_set;
      continue;
    }
    const float* sc = ref_scores.data() + r * n_cols;
    int32_t last = -1;
    for (int64_t i = 0; i < k; ++i) last = f[i] >= 0 ? f[i] : last;
    bool tie = last >= 0;
    if (tie) {
      const float kth = sc[last];
      int e2;
      std::frexp(kth, &e2);
      const float ulp = std::ldexp(1.0f, e2 - 8);
      std::vector<int32_t> diff;
      std::set_symmetric_difference(sg.begin(), sg.end(), sf.begin(), sf.end(),
                                    std::back_inserter(diff));
      for (const int32_t j : diff) {
        if (j < 0 || j >= n_cols || !(std::fabs(sc[j] - kth) <= ulp)) tie = false;
      }
    }
    ++(tie ? a.tie_only : a.bad);
  }
  std::printf("%-60s rows=%ld same_order=%ld same_set=%ld tie_only=%ld bad=%ld\n", label.c_str(),
              static_cast<long>(a.rows), static_cast<long>(a.same_order),
              static_cast<long>(a.same_set), static_cast<long>(a.tie_only),
              static_cast<long>(a.bad));
  return a;
}

struct IndexerInputs {
  const model::IndexerWeights* w;
  ModelConfig config;  // index_n_heads, index_head_dim, rope_head_dim, index_topk
  std::vector<float> freqs;
  std::vector<float> x, qr, keys;  // [S, dim], [S, q_lora_rank], [n_keys, hd]
  int64_t S, start, dim, qlr;
};

// The reference (IndexerSelect) against the device, isolated (the host's q after wq_b and its
// weights) and chained (device Fp8Linear, LinearBf16F32 and everything after).
void CheckIndexer(const std::string& label, const IndexerInputs& in) {
  const model::IndexerWeights& w = *in.w;
  const int64_t S = in.S, H = in.config.index_n_heads, hd = in.config.index_head_dim;
  const int64_t rd = in.config.rope_head_dim;
  const model::IndexerResult ref =
      model::IndexerSelect(w, in.config, in.freqs, in.x.data(), in.qr.data(), S, in.start, in.keys);
  const int64_t n_cols = ref.n_blocks, k = ref.k;
  ASSERT_GT(k, 0) << label;
  std::vector<float> q0(S * H * hd);
  model::Linear8(w.wq_b, in.qr.data(), S, q0.data());
  const std::vector<float> q_ref = HostPrepQ(q0, S, H, hd, rd, in.freqs, in.start);
  const float wscale = IndexerWeightScaleOf(H, hd);
  const std::vector<float> w_ref = HostWeights(w.weights_proj, in.x, S, wscale);

  std::vector<int64_t> pos(S);
  std::iota(pos.begin(), pos.end(), in.start);
  DeviceBuffer<int64_t> dpos(pos);
  DeviceBuffer<float> dfreqs(in.freqs), dcos(S * rd / 2), dsin(S * rd / 2);
  CUDA_ASSERT_OK(
      RopeCosSin(dfreqs.get(), rd / 2, dpos.get(), S, false, dcos.get(), dsin.get(), nullptr));
  DeviceBuffer<uint16_t> dkeys(ToBf16(in.keys));
  DeviceBuffer<float> dscores(S * n_cols), dproj(S * H);
  DeviceBuffer<int32_t> dsel(S * k);

  // Isolated pieces.
  DeviceBuffer<uint16_t> dq(ToBf16(q0));
  CUDA_ASSERT_OK(IndexerPrepQ(dq.get(), S, H, hd, rd, dcos.get(), dsin.get(), true, nullptr));
  CUDA_ASSERT_OK(cudaDeviceSynchronize());
  const golden::Closeness cq = Report(label + " IndexerPrepQ", FromBf16(dq.Get()), q_ref);
  EXPECT_LE(cq.rms_rel, 1e-3) << label;
  EXPECT_GE(cq.bit_identical, 0.999) << label;

  DeviceBuffer<uint16_t> dx(ToBf16(in.x)), dwp(MatrixBits(w.weights_proj)), dw(S * H);
  CUDA_ASSERT_OK(LinearBf16F32(dx.get(), S, in.dim, dwp.get(), H, dproj.get(), H, nullptr));
  CUDA_ASSERT_OK(IndexerWeightScale(dproj.get(), S * H, wscale, dw.get(), nullptr));
  CUDA_ASSERT_OK(cudaDeviceSynchronize());
  const std::vector<float> w_dev = FromBf16(dw.Get());
  const golden::Closeness cw = Report(label + " weights (GEMV + IndexerWeightScale)", w_dev, w_ref);
  EXPECT_LE(cw.rms_rel, 1e-2) << label;

  DeviceBuffer<uint16_t> dq_ref(ToBf16(q_ref)), dw_ref(ToBf16(w_ref));
  CUDA_ASSERT_OK(IndexerScores(dq_ref.get(), dw_ref.get(), dkeys.get(), nullptr, dpos.get(), S, H,
                               hd, 4, n_cols, dscores.get(), nullptr));
  CUDA_ASSERT_OK(IndexerTopK(dscores.get(), S, n_cols, k, dsel.get(), nullptr));
  CUDA_ASSERT_OK(cudaDeviceSynchronize());
  const golden::Closeness cs =
      ReportScores(label + " IndexerScores (host q, w)", dscores.Get(), ref.scores);
  EXPECT_LE(cs.rms_rel, 1e-3) << label;
  EXPECT_GE(cs.bit_identical, 0.999) << label;
  const SelAgreement si =
      CompareSel(label + " IndexerTopK (host q, w)", dsel.Get(), ref.sel, ref.scores, S, k, n_cols);
  EXPECT_EQ(si.bad, 0) << label;
  EXPECT_GE(si.same_order, (999 * S) / 1000) << label;

  // The device top-k of the reference's own scores must equal the reference's selection.
  DeviceBuffer<float> dref_scores(ref.scores);
  CUDA_ASSERT_OK(IndexerTopK(dref_scores.get(), S, n_cols, k, dsel.get(), nullptr));
  CUDA_ASSERT_OK(cudaDeviceSynchronize());
  EXPECT_EQ(dsel.Get(), ref.sel) << label << " top-k of the reference scores";

  // Chain: wq_b on the device (QuantizeActE4m3 + Fp8Linear), prep, device weights, scores, top-k.
  const model::Fp8Weight& wq = w.wq_b;
  const size_t sbytes = ((wq.out + 127) / 128) * ((wq.in + 127) / 128);
  DeviceBuffer<uint8_t> dwq(std::vector<uint8_t>(wq.w, wq.w + wq.out * wq.in));
  DeviceBuffer<uint8_t> dwqs(std::vector<uint8_t>(wq.s, wq.s + sbytes));
  DeviceBuffer<uint16_t> dqr(ToBf16(in.qr)), dq2(S * H * hd);
  DeviceBuffer<uint8_t> aq(S * in.qlr);
  DeviceBuffer<float> as(S * ((in.qlr + 127) / 128));
  CUDA_ASSERT_OK(QuantizeActE4m3(dqr.get(), S, in.qlr, aq.get(), as.get(), nullptr));
  CUDA_ASSERT_OK(
      Fp8Linear(aq.get(), as.get(), S, dwq.get(), dwqs.get(), wq.out, wq.in, dq2.get(), nullptr));
  CUDA_ASSERT_OK(IndexerPrepQ(dq2.get(), S, H, hd, rd, dcos.get(), dsin.get(), true, nullptr));
  CUDA_ASSERT_OK(IndexerScores(dq2.get(), dw.get(), dkeys.get(), nullptr, dpos.get(), S, H, hd, 4,
                               n_cols, dscores.get(), nullptr));
  CUDA_ASSERT_OK(IndexerTopK(dscores.get(), S, n_cols, k, dsel.get(), nullptr));
  CUDA_ASSERT_OK(cudaDeviceSynchronize());
  Report(label + " chain q (Fp8Linear + IndexerPrepQ)", FromBf16(dq2.Get()), q_ref);
  const golden::Closeness cc = ReportScores(label + " chain scores", dscores.Get(), ref.scores);
  EXPECT_LE(cc.rms_rel, 5e-2) << label;
  const SelAgreement sc =
      CompareSel(label + " chain top-k", dsel.Get(), ref.sel, ref.scores, S, k, n_cols);
  EXPECT_GE(sc.same_set + sc.tie_only, (9 * S) / 10) << label;
}

// The grouped output projection as attention.cc runs it.
std::vector<float> HostGroupedProjection(const std::vector<float>& o, int64_t T,
                                         const model::Fp8Weight& wa, int64_t G, int64_t R,
                                         int64_t gin) {
  std::vector<float> z(T * G * R);
#pragma omp parallel for schedule(static)
  for (int64_t gr = 0; gr < G * R; ++gr) {
    const int64_t g = gr / R;
    std::vector<float> wrow(gin);
    for (int64_t i = 0; i < gin; ++i) wrow[i] = wa.At(gr, i);
    for (int64_t s = 0; s < T; ++s) {
      z[s * G * R + gr] =
          RoundBf16(model::DotF32(o.data() + s * G * gin + g * gin, wrow.data(), gin));
    }
  }
  return z;
}

void CheckGroupedProjection(const std::string& label, const model::Fp8Weight& wa, int64_t T,
                            int64_t G, int64_t R, int64_t gin, uint64_t seed) {
  const std::vector<float> o = RandomBf16(T * G * gin, 1.0f, seed);
  const std::vector<float> ref = HostGroupedProjection(o, T, wa, G, R, gin);
  const size_t sbytes = ((wa.out + 127) / 128) * ((wa.in + 127) / 128);
  DeviceBuffer<uint8_t> dw(std::vector<uint8_t>(wa.w, wa.w + wa.out * wa.in));
  DeviceBuffer<uint8_t> ds(std::vector<uint8_t>(wa.s, wa.s + sbytes));
  DeviceBuffer<uint16_t> dout(ToBf16(o)), dz(T * G * R);
  CUDA_ASSERT_OK(
      GroupedOutputProjection(dout.get(), T, G, R, gin, dw.get(), ds.get(), dz.get(), nullptr));
  CUDA_ASSERT_OK(cudaDeviceSynchronize());
  const golden::Closeness c = Report(label, FromBf16(dz.Get()), ref);
  EXPECT_LE(c.rms_rel, 1e-3) << label;
  EXPECT_GE(c.bit_identical, 0.95) << label;
}

// First maximum (std::max_element), ignoring NaN; −1 when none.
int32_t HostArgmax(const float* v, int64_t n) {
  int32_t best = -1;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(v[i])) continue;
    if (best < 0 || v[i] > v[best]) best = static_cast<int32_t>(i);
  }
  return best;
}

// Logits for [T, V] in shards (row ranges), then argmax over the whole row and per shard with
// the (value, lower id) combination.
void CheckLmHead(const std::string& label, const std::vector<float>& u,
                 const std::vector<uint16_t>& head_bits, int64_t T, int64_t dim, int64_t V,
                 const std::vector<int64_t>& shard_ends) {
  const model::Bf16Matrix head = MatrixOf(head_bits, V, dim);
  std::vector<float> ref(T * V);
  model::LinearF32(head, u.data(), T, ref.data());
  DeviceBuffer<uint16_t> du(ToBf16(u)), dh(head_bits);
  DeviceBuffer<float> dl(T * V);
  int64_t begin = 0;
  for (const int64_t end : shard_ends) {
    CUDA_ASSERT_OK(LmHead(du.get(), T, dim, dh.get() + begin * dim, end - begin, dl.get() + begin,
                          V, nullptr));
    begin = end;
  }
  ASSERT_EQ(begin, V);
  DeviceBuffer<int32_t> dids(T);
  CUDA_ASSERT_OK(ArgmaxRows(dl.get(), T, V, V, 0, dids.get(), nullptr, nullptr));
  CUDA_ASSERT_OK(cudaDeviceSynchronize());
  const std::vector<float> logits = dl.Get();
  const golden::Closeness c = Report(label + " logits", logits, ref);
  EXPECT_LE(c.rms_rel, 1e-5) << label;
  const std::vector<int32_t> ids = dids.Get();
  int64_t same = 0, same_own = 0;
  for (int64_t t = 0; t < T; ++t) {
    same += ids[t] == HostArgmax(ref.data() + t * V, V);
    same_own += ids[t] == HostArgmax(logits.data() + t * V, V);
  }
  std::printf("%-60s rows=%ld argmax==ref=%ld argmax==host(own logits)=%ld\n",
              (label + " argmax").c_str(), static_cast<long>(T), static_cast<long>(same),
              static_cast<long>(same_own));
  EXPECT_EQ(same_own, T) << label;
  EXPECT_EQ(same, T) << label;

  // Per-shard argmax, combined by (larger value, then lower id).
  const int64_t n_shards = static_cast<int64_t>(shard_ends.size());
  DeviceBuffer<int32_t> sid(n_shards * T);
  DeviceBuffer<float> sval(n_shards * T);
  begin = 0;
  for (int64_t s = 0; s < n_shards; ++s) {
    CUDA_ASSERT_OK(ArgmaxRows(dl.get() + begin, T, shard_ends[s] - begin, V, begin,
                              sid.get() + s * T, sval.get() + s * T, nullptr));
    begin = shard_ends[s];
  }
  CUDA_ASSERT_OK(cudaDeviceSynchronize());
  const std::vector<int32_t> si = sid.Get();
  const std::vector<float> sv = sval.Get();
  for (int64_t t = 0; t < T; ++t) {
    int32_t bi = -1;
    float bv = 0.0f;
    for (int64_t s = 0; s < n_shards; ++s) {
      const int32_t i = si[s * T + t];
      const float v = sv[s * T + t];
      if (i >= 0 && (bi < 0 || v > bv || (v == bv && i < bi))) {
        bi = i;
        bv = v;
      }
    }
    EXPECT_EQ(bi, ids[t]) << label << " row " << t;
  }
}

// ---- tests --------------------------------------------------------------------------------------

TEST_F(CompressorIndexerTest, KernelsRunFromCompute86Ptx) {
  for (const auto& [name, fn] : std::vector<std::pair<std::string, const void*>>{
           {"LinearBf16F32", LinearBf16F32Kernel()},
           {"CompressorReset", CompressorResetKernel()},
           {"CompressorPool", CompressorPoolKernel()},
           {"CompressorPoolFp32", CompressorPoolFp32Kernel()},
           {"CompressorFinish", CompressorFinishKernel()},
           {"CompressorFinishFp32", CompressorFinishFp32Kernel()},
           {"CompressorUpdate", CompressorUpdateKernel()},
           {"HadamardFp4", HadamardFp4Kernel()},
           {"IndexerWeightScale", IndexerWeightScaleKernel()},
           {"IndexerScores", IndexerScoresKernel()},
           {"IndexerTopK", IndexerTopKKernel()},
           {"GroupedOutputProjection", GroupedOutputProjectionKernel()},
           {"Argmax", ArgmaxKernel()}}) {
    cudaFuncAttributes a{};
    CUDA_ASSERT_OK(cudaFuncGetAttributes(&a, fn));
    EXPECT_EQ(a.ptxVersion, 86) << name;
    EXPECT_LT(a.sharedSizeBytes, size_t{48} << 10) << name;
    std::printf("%-24s ptxVersion=%d binaryVersion=%d regs=%d smem=%zu local=%zu\n", name.c_str(),
                a.ptxVersion, a.binaryVersion, a.numRegs, a.sharedSizeBytes, a.localSizeBytes);
  }
}

// Size checks happen before any CUDA call, so this runs without a device.
TEST(CompressorIndexerLimits, OutOfRangeSizesAreRejectedWithoutLaunching) {
  constexpr cudaError_t kBad = cudaErrorInvalidValue;
  EXPECT_EQ(LinearBf16F32(nullptr, 1, 6, nullptr, 4, nullptr, 4, nullptr), kBad);
  EXPECT_EQ(LinearBf16F32(nullptr, 1, 8, nullptr, 4, nullptr, 3, nullptr), kBad);
  CompressorBatch one{1, 1, nullptr, nullptr, nullptr, nullptr, nullptr};
  CompressorShape s{CompressorKind::kMain, 4, 1024, 64, 1e-6f, true, true};
  EXPECT_EQ(
      CompressorStep(nullptr, nullptr, 2048, nullptr, nullptr, nullptr, s, one, nullptr, nullptr),
      kBad);
  s = CompressorShape{CompressorKind::kIndexer, 4, 96, 64, 1e-6f, true, true};
  EXPECT_EQ(
      CompressorStep(nullptr, nullptr, 192, nullptr, nullptr, nullptr, s, one, nullptr, nullptr),
      kBad);
  s = CompressorShape{CompressorKind::kMain, 128, 512, 63, 1e-6f, true, true};
  EXPECT_EQ(
      CompressorStep(nullptr, nullptr, 512, nullptr, nullptr, nullptr, s, one, nullptr, nullptr),
      kBad);
  s = CompressorShape{CompressorKind::kMain, 4, 512, 64, 1e-6f, true, true};
  EXPECT_EQ(
      CompressorStep(nullptr, nullptr, 512, nullptr, nullptr, nullptr, s, one, nullptr, nullptr),
      kBad);  // ld < 2·d for ratio 4
  EXPECT_EQ(HadamardFp4SimInplace(nullptr, 1, 16, true, nullptr), kBad);
  EXPECT_EQ(HadamardFp4SimInplace(nullptr, 1, 1024, true, nullptr), kBad);
  EXPECT_EQ(HadamardFp4SimInplace(nullptr, 1, 96, true, nullptr), kBad);
  EXPECT_EQ(IndexerScores(nullptr, nullptr, nullptr, nullptr, nullptr, 1, kIndexerMaxHeads + 1, 128,
                          4, 16, nullptr, nullptr),
            kBad);
  EXPECT_EQ(IndexerScores(nullptr, nullptr, nullptr, nullptr, nullptr, 1, 64, 256, 4, 16, nullptr,
                          nullptr),
            kBad);
  EXPECT_EQ(IndexerTopK(nullptr, 1, 4096, kIndexerMaxTopK + 1, nullptr, nullptr), kBad);
  EXPECT_EQ(IndexerTopK(nullptr, 1, 100, 101, nullptr, nullptr), kBad);
  EXPECT_EQ(GroupedOutputProjection(nullptr, 1, 8, 1024, 100, nullptr, nullptr, nullptr, nullptr),
            kBad);
  EXPECT_EQ(ArgmaxRows(nullptr, 1, 0, 0, 0, nullptr, nullptr, nullptr), kBad);
  // Nothing to do.
  CompressorBatch none{};
  s = CompressorShape{CompressorKind::kMain, 128, 512, 64, 1e-6f, true, true};
  EXPECT_EQ(
      CompressorStep(nullptr, nullptr, 512, nullptr, nullptr, nullptr, s, none, nullptr, nullptr),
      cudaSuccess);
  EXPECT_EQ(LinearBf16F32(nullptr, 0, 8, nullptr, 4, nullptr, 4, nullptr), cudaSuccess);
  EXPECT_EQ(IndexerTopK(nullptr, 0, 100, 10, nullptr, nullptr), cudaSuccess);
}

TEST_F(CompressorIndexerTest, LinearBf16F32MatchesReferenceOnTinyA) {
  const model::ModelWeights& w = TinyA();
  const int64_t dim = w.config.dim;
  const std::vector<float> x = AttnInput(2);
  const int64_t T = B160().T;
  for (const auto& [name, m] : std::vector<std::pair<std::string, const model::Bf16Matrix*>>{
           {"L2 compressor wkv", &w.blocks[2].attn.compressor.wkv},
           {"L2 indexer weights_proj", &w.blocks[2].attn.indexer.weights_proj},
           {"head", &w.head}}) {
    std::vector<float> ref(T * m->rows);
    model::LinearF32(*m, x.data(), T, ref.data());
    // Rows written with a stride (ld = rows + 3) to check ldy.
    const int64_t ld = m->rows + 3;
    DeviceBuffer<uint16_t> dx(ToBf16(x)), dw(MatrixBits(*m));
    DeviceBuffer<float> dy(T * ld);
    CUDA_ASSERT_OK(LinearBf16F32(dx.get(), T, dim, dw.get(), m->rows, dy.get(), ld, nullptr));
    CUDA_ASSERT_OK(cudaDeviceSynchronize());
    const std::vector<float> got = dy.Get();
    std::vector<float> packed(T * m->rows);
    for (int64_t t = 0; t < T; ++t) {
      std::copy_n(got.begin() + t * ld, m->rows, packed.begin() + t * m->rows);
    }
    const golden::Closeness c = Report("tiny-a LinearBf16F32 " + name, packed, ref);
    EXPECT_LE(c.rms_rel, 1e-5) << name;
  }
}

TEST_F(CompressorIndexerTest, CompressorMatchesReferenceOnTinyA) {
  const model::ModelWeights& w = TinyA();
  const ModelConfig& c = w.config;
  const int64_t T = B160().T;
  ASSERT_EQ(T, 160);
  for (const int64_t L : {int64_t{2}, int64_t{3}, int64_t{4}, int64_t{5}}) {
    const model::AttentionWeights& a = w.blocks[L].attn;
    const int64_t ratio = c.compress_ratio(L);
    const std::vector<float> x = AttnInput(L);
    const std::vector<float> freqs = LayerRopeFrequencies(c, ratio);
    // Sequence A from position 0 in uneven steps (prefill, decode, chunks across block edges);
    // sequence B, in the same batched calls, from position 1000 with a fresh state.
    const std::vector<CompressorSeq> seqs{
        {x, 0, {37, 1, 1, 1, 2, 5, 1, 64, 1, 47}},
        {x, 1000, {3, 1, 4, 100, 52}},
    };
    const std::string label = "tiny-a L" + std::to_string(L);
    ASSERT_TRUE(a.has_compressor);
    const CompressorShape main{CompressorKind::kMain,          ratio, c.head_dim, c.rope_head_dim,
                               static_cast<float>(c.norm_eps), true,  true};
    CheckCompressor(label + " main r" + std::to_string(ratio), a.compressor, main, freqs, seqs,
                    c.dim);
    if (a.has_indexer) {
      const CompressorShape idx{CompressorKind::kIndexer,
                                4,
                                c.index_head_dim,
                                c.rope_head_dim,
                                static_cast<float>(c.norm_eps),
                                true,
                                true};
      CheckCompressor(label + " indexer", a.indexer.compressor, idx, freqs, seqs, c.dim);
    }
  }
}

// Synthetic compressor weights with Flash shapes (dim 4096).
struct SyntheticCompressor {
  std::vector<uint16_t> wkv_bits, wgate_bits;
  model::CompressorWeights w;
  SyntheticCompressor(int64_t ratio, int64_t d, int64_t dim, uint64_t seed) {
    const int64_t width = (ratio == 4 ? 2 : 1) * d;
    wkv_bits = ToBf16(RandomBf16(width * dim, 1.0f / 64.0f, seed));
    wgate_bits = ToBf16(RandomBf16(width * dim, 1.0f / 64.0f, seed + 1));
    w.ratio = ratio;
    w.head_dim = d;
    w.ape = RandomF32(ratio * width, 0.5f, seed + 2);
    w.wkv = MatrixOf(wkv_bits, width, dim);
    w.wgate = MatrixOf(wgate_bits, width, dim);
    w.norm = RandomBf16(d, 0.1f, seed + 3);
    for (float& g : w.norm) g = RoundBf16(1.0f + g);
  }
};

TEST_F(CompressorIndexerTest, CompressorMatchesReferenceAtFlashShapes) {
  const int64_t dim = 4096, rd = 64;
  const YarnConfig yarn;
  const std::vector<float> freqs = RopeFrequencies(rd, 160000, &yarn);
  const std::vector<float> x = RandomBf16(300 * dim, 1.0f, 71);
  auto rows = [&](int64_t n) { return std::vector<float>(x.begin(), x.begin() + n * dim); };
  {
    SyntheticCompressor sc(4, 512, dim, 72);
    const CompressorShape s{CompressorKind::kMain, 4, 512, rd, 1e-6f, true, true};
    const std::vector<CompressorSeq> seqs{{rows(72), 0, {13, 1, 1, 1, 1, 40, 15}},
                                          {rows(40), 65533, {2, 1, 1, 36}}};
    CheckCompressor("flash main r4 d512", sc.w, s, freqs, seqs, dim);
    CompressorShape nr = s;
    nr.fp8_round = false;
    CheckCompressor("flash main r4 d512 (FP8sim without e4m3)", sc.w, nr, freqs, seqs, dim);
  }
  {
    SyntheticCompressor sc(128, 512, dim, 73);
    const CompressorShape s{CompressorKind::kMain, 128, 512, rd, 1e-6f, true, true};
    const std::vector<CompressorSeq> seqs{{rows(300), 0, {100, 1, 27, 1, 171}},
                                          {rows(140), 1048570, {6, 134}}};
    CheckCompressor("flash main r128 d512", sc.w, s, freqs, seqs, dim);
  }
  {
    SyntheticCompressor sc(4, 128, dim, 74);
    const CompressorShape s{CompressorKind::kIndexer, 4, 128, rd, 1e-6f, true, true};
    const std::vector<CompressorSeq> seqs{{rows(72), 0, {13, 1, 1, 1, 1, 40, 15}},
                                          {rows(40), 65533, {2, 1, 1, 36}}};
    CheckCompressor("flash indexer r4 d128", sc.w, s, freqs, seqs, dim);
  }
}

TEST_F(CompressorIndexerTest, HadamardFp4MatchesReference) {
  for (const int64_t n : {int64_t{32}, int64_t{128}, int64_t{512}}) {
    for (const bool wide : {false, true}) {
      // wide: magnitudes over 2^±12, where fp32 partial sums round.
      const int64_t rows = 2048;
      std::vector<float> x = RandomBf16(rows * n, 1.0f, 81 + n);
      if (wide) {
        std::mt19937_64 rng(82 + n);
        std::uniform_int_distribution<int> e(-12, 12);
        for (float& v : x) v = RoundBf16(std::ldexp(v, e(rng)));
      }
      std::vector<float> ref = x;
      for (int64_t r = 0; r < rows; ++r) {
        ss::HadamardInplace(ref.data() + r * n, n);
        ss::Fp4SimInplace(ref.data() + r * n, n, 32);
      }
      for (const bool fp64 : {true, false}) {
        DeviceBuffer<uint16_t> dx(ToBf16(x));
        CUDA_ASSERT_OK(HadamardFp4SimInplace(dx.get(), rows, n, fp64, nullptr));
        CUDA_ASSERT_OK(cudaDeviceSynchronize());
        const std::string label = "Hadamard" + std::to_string(n) + "+FP4sim " +
                                  (wide ? "wide-range " : "") + (fp64 ? "fp64" : "fp32");
        const golden::Closeness c = Report(label, FromBf16(dx.Get()), ref);
        if (fp64) {
          EXPECT_EQ(c.bit_identical, 1.0) << label;
        } else {
          EXPECT_LE(c.rms_rel, 5e-2) << label;
        }
      }
    }
  }
}

TEST_F(CompressorIndexerTest, IndexerMatchesReferenceOnTinyA) {
  const model::ModelWeights& w = TinyA();
  const ModelConfig& c = w.config;
  const int64_t T = B160().T, dim = c.dim, qlr = c.q_lora_rank;
  const float eps = static_cast<float>(c.norm_eps);
  for (const int64_t L : {int64_t{2}, int64_t{4}}) {
    const model::AttentionWeights& a = w.blocks[L].attn;
    ASSERT_TRUE(a.has_indexer);
    const std::vector<float> x = AttnInput(L);
    std::vector<float> qa(T * qlr), qr(T * qlr);
    model::Linear8(a.wq_a, x.data(), T, qa.data());
    for (int64_t t = 0; t < T; ++t) {
      model::RmsNorm(qa.data() + t * qlr, a.q_norm.data(), qlr, eps, qr.data() + t * qlr);
    }
    const std::vector<float> freqs = LayerRopeFrequencies(c, 4);
    model::CompressorState st;
    st.Reset(4, c.index_head_dim);
    std::vector<float> keys;
    const model::CompressorParams cp{model::CompressorKind::kIndexer, c.rope_head_dim, eps, true,
                                     &freqs};
    model::CompressorFeed(a.indexer.compressor, cp, st, x.data(), T, dim, 0, keys);
    CheckIndexer("tiny-a L" + std::to_string(L) + " indexer",
                 IndexerInputs{&a.indexer, c, freqs, x, qr, keys, T, 0, dim, qlr});
  }
}

TEST_F(CompressorIndexerTest, IndexerMatchesReferenceAtFlashShapes) {
  const int64_t H = 64, hd = 128, rd = 64, dim = 4096, qlr = 1024, n_keys = 16384;
  const YarnConfig yarn;
  ModelConfig c;
  c.index_n_heads = H;
  c.index_head_dim = hd;
  c.rope_head_dim = rd;
  c.index_topk = 512;
  const std::vector<uint8_t> wq = RandomE4m3(H * hd * qlr, 91);
  const std::vector<uint8_t> wqs = RandomScales((H * hd / 128) * (qlr / 128), 113, 116, 92);
  const std::vector<uint16_t> proj = ToBf16(RandomBf16(H * dim, 1.0f / 64.0f, 93));
  model::IndexerWeights iw;
  iw.wq_b = model::Fp8Weight{wq.data(), wqs.data(), H * hd, qlr};
  iw.weights_proj = MatrixOf(proj, H, dim);
  // Keys as the indexer compressor makes them: Hadamard-rotated, FP4-simulated.
  std::vector<float> keys = RandomBf16(n_keys * hd, 1.0f, 94);
  for (int64_t j = 0; j < n_keys; ++j) {
    ss::HadamardInplace(keys.data() + j * hd, hd);
    ss::Fp4SimInplace(keys.data() + j * hd, hd, 32);
  }
  const std::vector<float> freqs = RopeFrequencies(rd, 160000, &yarn);
  struct Case {
    const char* name;
    int64_t S, start;
  };
  for (const Case& k : {Case{"decode-like 16384 blocks", 4, 65532},
                        Case{"prefill 504..510 blocks (k 510, -1 entries)", 24, 2016},
                        Case{"prefill 2046..2048 blocks", 8, 8184}}) {
    const int64_t n_blocks = (k.start + k.S) / 4;
    IndexerInputs in{&iw,
                     c,
                     freqs,
                     RandomBf16(k.S * dim, 1.0f, 95 + k.S),
                     RandomBf16(k.S * qlr, 1.0f, 96 + k.S),
                     std::vector<float>(keys.begin(), keys.begin() + n_blocks * hd),
                     k.S,
                     k.start,
                     dim,
                     qlr};
    CheckIndexer(std::string("flash indexer ") + k.name, in);
  }

  // Two sequences in one IndexerScores/IndexerTopK call, each with its own keys in one pool.
  const int64_t SA = 4, startA = 65532, SB = 8, startB = 8184, nA = 16384, nB = 2048;
  const std::vector<float> xa = RandomBf16(SA * dim, 1.0f, 97),
                           qra = RandomBf16(SA * qlr, 1.0f, 98);
  const std::vector<float> xb = RandomBf16(SB * dim, 1.0f, 99),
                           qrb = RandomBf16(SB * qlr, 1.0f, 100);
  const std::vector<float> keys_a(keys.begin(), keys.begin() + nA * hd);
  std::vector<float> keys_b = RandomBf16(nB * hd, 1.0f, 101);
  for (int64_t j = 0; j < nB; ++j) {
    ss::HadamardInplace(keys_b.data() + j * hd, hd);
    ss::Fp4SimInplace(keys_b.data() + j * hd, hd, 32);
  }
  const model::IndexerResult ra =
      model::IndexerSelect(iw, c, freqs, xa.data(), qra.data(), SA, startA, keys_a);
  const model::IndexerResult rb =
      model::IndexerSelect(iw, c, freqs, xb.data(), qrb.data(), SB, startB, keys_b);
  std::vector<float> qa(SA * H * hd), qb(SB * H * hd);
  model::Linear8(iw.wq_b, qra.data(), SA, qa.data());
  model::Linear8(iw.wq_b, qrb.data(), SB, qb.data());
  std::vector<float> q = HostPrepQ(qa, SA, H, hd, rd, freqs, startA);
  const std::vector<float> qbp = HostPrepQ(qb, SB, H, hd, rd, freqs, startB);
  q.insert(q.end(), qbp.begin(), qbp.end());
  const float wscale = IndexerWeightScaleOf(H, hd);
  std::vector<float> wts = HostWeights(iw.weights_proj, xa, SA, wscale);
  const std::vector<float> wb = HostWeights(iw.weights_proj, xb, SB, wscale);
  wts.insert(wts.end(), wb.begin(), wb.end());
  std::vector<float> pool = keys_a;
  pool.insert(pool.end(), keys_b.begin(), keys_b.end());
  std::vector<int64_t> pos, offs;
  for (int64_t t = 0; t < SA; ++t) {
    pos.push_back(startA + t);
    offs.push_back(0);
  }
  for (int64_t t = 0; t < SB; ++t) {
    pos.push_back(startB + t);
    offs.push_back(nA);
  }
  const int64_t T = SA + SB, k = 512;
  DeviceBuffer<uint16_t> dq(ToBf16(q)), dw(ToBf16(wts)), dpool(ToBf16(pool));
  DeviceBuffer<int64_t> dpos(pos), doffs(offs);
  DeviceBuffer<float> dscores(T * nA);
  DeviceBuffer<int32_t> dsel(T * k);
  CUDA_ASSERT_OK(IndexerScores(dq.get(), dw.get(), dpool.get(), doffs.get(), dpos.get(), T, H, hd,
                               4, nA, dscores.get(), nullptr));
  CUDA_ASSERT_OK(IndexerTopK(dscores.get(), T, nA, k, dsel.get(), nullptr));
  CUDA_ASSERT_OK(cudaDeviceSynchronize());
  std::vector<float> ref_scores = ra.scores;
  std::vector<int32_t> ref_sel = ra.sel;
  for (int64_t t = 0; t < SB; ++t) {
    ref_scores.insert(ref_scores.end(), rb.scores.begin() + t * nB,
                      rb.scores.begin() + (t + 1) * nB);
    ref_scores.insert(ref_scores.end(), nA - nB, -INFINITY);
  }
  ref_sel.insert(ref_sel.end(), rb.sel.begin(), rb.sel.end());
  const golden::Closeness cs =
      ReportScores("flash indexer two sequences, one call: scores", dscores.Get(), ref_scores);
  EXPECT_GE(cs.bit_identical, 0.999);
  const SelAgreement sa = CompareSel("flash indexer two sequences, one call: top-k", dsel.Get(),
                                     ref_sel, ref_scores, T, k, nA);
  EXPECT_EQ(sa.bad, 0);

  // One token per call (few blocks: the decode tiles of 2 keys per warp) gives the batched call's
  // scores (64-key tiles) bit for bit.
  const std::vector<float> batched = dscores.Get();
  DeviceBuffer<float> done(nA);
  int64_t differing = 0;
  for (int64_t t = 0; t < T; ++t) {
    CUDA_ASSERT_OK(IndexerScores(dq.get() + t * H * hd, dw.get() + t * H, dpool.get(),
                                 doffs.get() + t, dpos.get() + t, 1, H, hd, 4, nA, done.get(),
                                 nullptr));
    CUDA_ASSERT_OK(cudaDeviceSynchronize());
    const std::vector<float> one = done.Get();
    for (int64_t j = 0; j < nA; ++j)
      differing += std::memcmp(&one[j], &batched[t * nA + j], 4) != 0;
  }
  std::printf("flash indexer one token per call vs batched: %lld of %lld scores differ\n",
              static_cast<long long>(differing), static_cast<long long>(T * nA));
  EXPECT_EQ(differing, 0);
}

// Top-k against the reference's stable sort on rows with heavy ties, masks, k = n_cols, fully
// masked rows and distinct values.
TEST_F(CompressorIndexerTest, TopKMatchesStableSort) {
  struct Case {
    const char* name;
    int64_t n_cols, k, levels;  // levels: distinct values (0: continuous)
  };
  for (const Case& c : {Case{"65536 cols k512 50 levels", 65536, 512, 50},
                        Case{"65536 cols k1024 continuous", 65536, 1024, 0},
                        Case{"5000 cols k512 3 levels", 5000, 512, 3},
                        Case{"1024 cols k1024 continuous", 1024, 1024, 0},
                        Case{"16384 cols k1 7 levels", 16384, 1, 7},
                        Case{"4096 cols k300 1 level", 4096, 300, 1}}) {
    const int64_t T = 12;
    std::mt19937_64 rng(c.n_cols + c.k);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> s(T * c.n_cols);
    std::vector<int32_t> ref(T * c.k);
    for (int64_t t = 0; t < T; ++t) {
      // Row t: eligible prefix of decreasing length, the rest −inf (row 1 fully masked).
      const int64_t eligible = t == 1 ? 0 : c.n_cols - (t * c.n_cols) / (T + 2);
      float* row = s.data() + t * c.n_cols;
      for (int64_t j = 0; j < c.n_cols; ++j) {
        float v = c.levels > 0 ? static_cast<float>(rng() % c.levels) - 7.0f : RoundBf16(nd(rng));
        row[j] = j < eligible ? v : -INFINITY;
      }
      std::vector<int32_t> order(c.n_cols);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(),
                       [&](int32_t a, int32_t b) { return row[a] > row[b]; });
      for (int64_t i = 0; i < c.k; ++i) ref[t * c.k + i] = order[i] < eligible ? order[i] : -1;
    }
    DeviceBuffer<float> ds(s);
    DeviceBuffer<int32_t> dsel(T * c.k);
    CUDA_ASSERT_OK(IndexerTopK(ds.get(), T, c.n_cols, c.k, dsel.get(), nullptr));
    CUDA_ASSERT_OK(cudaDeviceSynchronize());
    const std::vector<int32_t> got = dsel.Get();
    int64_t same = 0;
    for (int64_t t = 0; t < T; ++t) {
      same += std::equal(got.begin() + t * c.k, got.begin() + (t + 1) * c.k, ref.begin() + t * c.k);
    }
    std::printf("%-60s rows=%ld identical=%ld\n", (std::string("IndexerTopK ") + c.name).c_str(),
                static_cast<long>(T), static_cast<long>(same));
    EXPECT_EQ(same, T) << c.name;
  }
}

TEST_F(CompressorIndexerTest, GroupedOutputProjectionMatchesReference) {
  const model::ModelWeights& w = TinyA();
  const ModelConfig& c = w.config;
  const int64_t G = c.o_groups, R = c.o_lora_rank, gin = c.n_heads * c.head_dim / G;
  for (const int64_t L : {int64_t{2}, int64_t{3}}) {
    CheckGroupedProjection("tiny-a L" + std::to_string(L) + " wo_a T70", w.blocks[L].attn.wo_a, 70,
                           G, R, gin, 111 + L);
  }
  // Flash: 8 groups × 1024 rank × 4096 inputs, and a TP rank's 4, 2 and 1 groups (TP 2, 4, 8).
  const int64_t FR = 1024, Fin = 4096;
  for (const int64_t FG : {8, 4, 2, 1}) {
    const std::vector<uint8_t> wa = RandomE4m3(FG * FR * Fin, 112 + FG);
    const std::vector<uint8_t> ws = RandomScales((FG * FR / 128) * (Fin / 128), 117, 121, 113);
    const model::Fp8Weight fw{wa.data(), ws.data(), FG * FR, Fin};
    const std::string shape = "flash wo_a " + std::to_string(FG) + "x1024x4096";
    CheckGroupedProjection(shape + " T1", fw, 1, FG, FR, Fin, 114);
    CheckGroupedProjection(shape + " T9", fw, 9, FG, FR, Fin, 115);
  }
}

TEST_F(CompressorIndexerTest, LmHeadAndArgmaxMatchReferenceOnTinyA) {
  const model::ModelWeights& w = TinyA();
  const ModelConfig& c = w.config;
  const Blocks160& s = B160();
  const int64_t T = s.T, dim = c.dim, hc = c.hc_mult;
  const float eps = static_cast<float>(c.norm_eps);
  // Final streams = the last block's output; u = RMSNorm(HcHead(streams)) (Model::Logits).
  std::vector<float> u(T * dim), z(dim);
  const float* streams = s.after_block.data() + (c.n_layers - 1) * T * hc * dim;
  for (int64_t t = 0; t < T; ++t) {
    model::HcHead(streams + t * hc * dim, hc, dim, w.hc_head, static_cast<float>(c.hc_eps), eps,
                  z.data());
    model::RmsNorm(z.data(), w.norm.data(), dim, eps, u.data() + t * dim);
  }
  CheckLmHead("tiny-a LM head", u, MatrixBits(w.head), T, dim, c.vocab_size, {400, c.vocab_size});
}

TEST_F(CompressorIndexerTest, LmHeadAndArgmaxMatchReferenceAtFlashShapes) {
  const int64_t V = 129280, dim = 4096, T = 3;
  // A fast generator for the 0.5G-element head: xorshift, sum of two uniforms, bf16.
  std::vector<uint16_t> head(V * dim);
  uint64_t st = 0x9e3779b97f4a7c15ull;
  for (uint16_t& h : head) {
    st ^= st << 13;
    st ^= st >> 7;
    st ^= st << 17;
    const float a = static_cast<float>(st & 0xffff) / 65536.0f;
    const float b = static_cast<float>((st >> 16) & 0xffff) / 65536.0f;
    h = FloatToBf16((a + b - 1.0f) / 32.0f);
  }
  const std::vector<float> u = RandomBf16(T * dim, 1.0f, 121);
  // Rows 77777 and 100001: the same vector aligned with token 0's u, so token 0's maximum is an
  // exact tie that the lower id must win.
  for (int64_t i = 0; i < dim; ++i) {
    head[77777 * dim + i] = head[100001 * dim + i] = FloatToBf16(u[i] / 8.0f);
  }
  CheckLmHead("flash LM head 129280x4096", u, head, T, dim, V, {32320, 64640, 96960, V});
}

TEST_F(CompressorIndexerTest, ArgmaxTiesNanAndEmptyRows) {
  const int64_t n = 50000, T = 4;
  std::vector<float> l = RandomF32(T * n, 1.0f, 131);
  l[0 * n + 12345] = l[0 * n + 7] = 100.0f;  // tie: the lower id
  l[1 * n + 3] = NAN;                        // ignored
  l[1 * n + 40000] = 50.0f;
  for (int64_t i = 0; i < n; ++i) l[2 * n + i] = NAN;        // no value: −1
  for (int64_t i = 0; i < n; ++i) l[3 * n + i] = -INFINITY;  // all −inf: id 0
  DeviceBuffer<float> dl(l), dv(T);
  DeviceBuffer<int32_t> di(T);
  CUDA_ASSERT_OK(ArgmaxRows(dl.get(), T, n, n, 0, di.get(), dv.get(), nullptr));
  CUDA_ASSERT_OK(cudaDeviceSynchronize());
  const std::vector<int32_t> ids = di.Get();
  EXPECT_EQ(ids[0], 7);
  EXPECT_EQ(ids[1], 40000);
  EXPECT_EQ(ids[2], -1);
  EXPECT_EQ(ids[3], 0);
  for (int64_t t = 0; t < T; ++t) EXPECT_EQ(ids[t], HostArgmax(l.data() + t * n, n)) << t;
}

// Timings at Flash shapes, for information (not run by ctest; run with
// --gtest_also_run_disabled_tests). Numbers from an H200 running the compute_86 PTX do not
// transfer to an RTX 3090 (about 3x less bandwidth, 1/64-rate FP64), only the proportions.
template <typename Fn>
double MicrosPerCall(Fn&& fn, int reps) {
  fn();
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  cudaEventRecord(a);
  for (int i = 0; i < reps; ++i) fn();
  cudaEventRecord(b);
  cudaEventSynchronize(b);
  float ms = 0.0f;
  cudaEventElapsedTime(&ms, a, b);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  return 1000.0 * ms / reps;
}

TEST_F(CompressorIndexerTest, DISABLED_TimingsAtFlashShapes) {
  const int64_t H = 64, hd = 128, rd = 64, n_keys = 65536, dim = 4096, V = 129280;
  auto line = [](const char* what, double us) { std::printf("%-60s %10.1f us\n", what, us); };
  // Indexer.
  const std::vector<float> keys_f = RandomBf16(n_keys * hd, 1.0f, 141);
  DeviceBuffer<uint16_t> keys(ToBf16(keys_f)), q(ToBf16(RandomBf16(256 * H * hd, 1.0f, 142)));
  DeviceBuffer<uint16_t> w(ToBf16(RandomBf16(256 * H, 0.05f, 143)));
  CUDA_ASSERT_OK(HadamardFp4SimInplace(keys.get(), n_keys, hd, true, nullptr));
  std::vector<int64_t> pos_dec{4 * n_keys - 1}, pos_pre(256);
  for (int64_t t = 0; t < 256; ++t) pos_pre[t] = 4 * 16384 - 256 + t;
  DeviceBuffer<int64_t> dpos_dec(pos_dec), dpos_pre(pos_pre);
  DeviceBuffer<float> cs(256 * rd / 2), sn(256 * rd / 2),
      freqs(RopeFrequencies(rd, 160000, nullptr));
  CUDA_ASSERT_OK(
      RopeCosSin(freqs.get(), rd / 2, dpos_pre.get(), 256, false, cs.get(), sn.get(), nullptr));
  DeviceBuffer<float> scores(256 * 16384);
  DeviceBuffer<int32_t> sel(256 * 512);
  for (const bool fp64 : {true, false}) {
    line(fp64 ? "IndexerPrepQ T=1 (fp64 Hadamard)" : "IndexerPrepQ T=1 (fp32 Hadamard)",
         MicrosPerCall(
             [&] { IndexerPrepQ(q.get(), 1, H, hd, rd, cs.get(), sn.get(), fp64, nullptr); }, 50));
    line(
        fp64 ? "IndexerPrepQ T=256 (fp64 Hadamard)" : "IndexerPrepQ T=256 (fp32 Hadamard)",
        MicrosPerCall(
            [&] { IndexerPrepQ(q.get(), 256, H, hd, rd, cs.get(), sn.get(), fp64, nullptr); }, 20));
  }
  line("IndexerScores T=1 x 65536 blocks", MicrosPerCall(
                                               [&] {
                                                 IndexerScores(q.get(), w.get(), keys.get(),
                                                               nullptr, dpos_dec.get(), 1, H, hd, 4,
                                                               n_keys, scores.get(), nullptr);
                                               },
                                               20));
  line("IndexerTopK T=1 x 65536 k=512",
       MicrosPerCall([&] { IndexerTopK(scores.get(), 1, n_keys, 512, sel.get(), nullptr); }, 20));
  line("IndexerScores T=256 x 16384 blocks",
       MicrosPerCall(
           [&] {
             IndexerScores(q.get(), w.get(), keys.get(), nullptr, dpos_pre.get(), 256, H, hd, 4,
                           16384, scores.get(), nullptr);
           },
           5));
  line("IndexerTopK T=256 x 16384 k=512",
       MicrosPerCall([&] { IndexerTopK(scores.get(), 256, 16384, 512, sel.get(), nullptr); }, 5));
  // Output projection and head.
  {
    const std::vector<uint8_t> wa = RandomE4m3(8 * 1024 * 4096, 144);
    const std::vector<uint8_t> ws = RandomScales(64 * 32, 117, 121, 145);
    DeviceBuffer<uint8_t> dwa(wa), dws(ws);
    DeviceBuffer<uint16_t> o(ToBf16(RandomBf16(8 * 32768, 1.0f, 146))), z(8 * 8192);
    for (const int64_t T : {int64_t{1}, int64_t{8}}) {
      line(T == 1 ? "GroupedOutputProjection T=1" : "GroupedOutputProjection T=8",
           MicrosPerCall(
               [&] {
                 GroupedOutputProjection(o.get(), T, 8, 1024, 4096, dwa.get(), dws.get(), z.get(),
                                         nullptr);
               },
               20));
    }
  }
  {
    DeviceBuffer<uint16_t> head(V * dim), u(ToBf16(RandomBf16(8 * dim, 1.0f, 147)));
    CUDA_ASSERT_OK(cudaMemset(head.get(), 0x3c, V * dim * 2));
    DeviceBuffer<float> logits(8 * V);
    DeviceBuffer<int32_t> ids(8);
    for (const int64_t T : {int64_t{1}, int64_t{8}}) {
      line(T == 1 ? "LmHead T=1 (129280 x 4096)" : "LmHead T=8 (129280 x 4096)",
           MicrosPerCall([&] { LmHead(u.get(), T, dim, head.get(), V, logits.get(), V, nullptr); },
                         10));
    }
    line("ArgmaxRows T=8 x 129280",
         MicrosPerCall([&] { ArgmaxRows(logits.get(), 8, V, V, 0, ids.get(), nullptr, nullptr); },
                       20));
  }
  // Compressor: the fused wkv|wgate GEMV for a decode batch, a decode step of 64 sequences and a
  // 4096-token prefill chunk.
  for (const int64_t ratio : {int64_t{4}, int64_t{128}}) {
    const int64_t d = 512, width = (ratio == 4 ? 2 : 1) * d, slots = (ratio == 4 ? 2 : 1) * ratio;
    const int64_t S = 64, P = 4096;
    DeviceBuffer<uint16_t> wkv(ToBf16(RandomBf16(2 * width * dim, 1.0f / 64.0f, 148)));
    DeviceBuffer<uint16_t> x(ToBf16(RandomBf16(S * dim, 1.0f, 149)));
    DeviceBuffer<float> vg(P * 2 * width), ape(RandomF32(ratio * width, 0.5f, 150)),
        norm(std::vector<float>(d, 1.0f)), kv(S * slots * width), sc(S * slots * width);
    CUDA_ASSERT_OK(CompressorResetState(kv.get(), sc.get(), S * slots * width, nullptr));
    CUDA_ASSERT_OK(cudaMemset(vg.get(), 0, P * 2 * width * sizeof(float)));
    std::vector<float*> kvp(S), scp(S);
    std::vector<int64_t> start(S), rows(S + 1), ebeg(S);
    for (int64_t s = 0; s < S; ++s) {
      kvp[s] = kv.get() + s * slots * width;
      scp[s] = sc.get() + s * slots * width;
      start[s] = ratio * (8 * s + 1) - 1;  // every sequence completes a block
      rows[s + 1] = s + 1;
      ebeg[s] = s;
    }
    DeviceBuffer<float*> dkvp(kvp), dscp(scp);
    DeviceBuffer<int64_t> dstart(start), drows(rows), debeg(ebeg);
    DeviceBuffer<uint16_t> entries(P * d);
    const CompressorShape shape{CompressorKind::kMain, ratio, d, rd, 1e-6f, true, true};
    const std::string r = " ratio " + std::to_string(ratio);
    line(("LinearBf16F32 wkv|wgate T=64" + r).c_str(),
         MicrosPerCall(
             [&] {
               LinearBf16F32(x.get(), S, dim, wkv.get(), 2 * width, vg.get(), 2 * width, nullptr);
             },
             10));
    const CompressorBatch dec{S, 1, dstart.get(), drows.get(), debeg.get(), dkvp.get(), dscp.get()};
    std::vector<int64_t> pstart{0}, prow{0, P}, pbeg{0};
    DeviceBuffer<int64_t> dps(pstart), dpr(prow), dpb(pbeg);
    const CompressorBatch pre{1,         P / ratio,  dps.get(), dpr.get(),
                              dpb.get(), dkvp.get(), dscp.get()};
    for (const bool fp64 : {true, false}) {
      CompressorShape sh = shape;
      sh.fp64 = fp64;
      auto step = [&](const CompressorBatch& batch) {
        CompressorStep(vg.get(), vg.get() + width, 2 * width, ape.get(), norm.get(), freqs.get(),
                       sh, batch, entries.get(), nullptr);
      };
      const std::string m = r + (fp64 ? " (fp64)" : " (fp32)");
      line(("CompressorStep decode 64 sequences" + m).c_str(),
           MicrosPerCall([&] { step(dec); }, 20));
      line(("CompressorStep prefill 4096 tokens" + m).c_str(),
           MicrosPerCall([&] { step(pre); }, 5));
    }
  }
}

}  // namespace
}  // namespace ss::cuda
