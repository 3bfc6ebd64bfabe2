// The expert kernels against their definitions (STYLE.md "Backend comparison"):
//  * every available ISA against the scalar kernel over many shapes (T, routing, slices), by
//    normalised error and bit for bit, and with non-finite activations;
//  * the scalar kernel with one slice and per-expert bf16 rounding against the reference
//    model's routed sum (ss::model::RoutedExpert, ascending expert order), bit for bit, on
//    synthetic experts and on tiny-a;
//  * the sum of n > 1 slice partials against the reference, within one bf16 ulp;
//  * error cases.
// The activation quantiser and the dispatch table: act_quant_test.cc. An ISA this CPU lacks is
// skipped with a message, never emulated.
#include "cpu_expert_worker/kernels/expert_kernels.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/bf16.h"
#include "common/codecs.h"
#include "common/model/linear.h"
#include "common/model/moe.h"
#include "common/model/weights.h"
#include "cpu_expert_worker/kernels/dispatch.h"
#include "cpu_expert_worker/kernels/linear4.h"
#include "tests/cpu_expert_worker/expert_kernels_harness.h"

namespace ss::expert::kernels_test {
namespace {

constexpr char kTinyA[] = "tests/data/tiny-a";

// ---------------------------------------------------------------------------------------------
// The op comparison: every SIMD variant against the scalar kernel, slice by slice.

class SimdVsScalar : public IsaTest {};

TEST_P(SimdVsScalar, AllShapes) {
  const std::vector<Case> cases = HarnessCases();
  double worst = 0.0;
  int64_t bits = 0, total = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const CaseData& d = Data(i);
    for (int64_t s = 0; s < c.slices; ++s) {
      std::vector<float> out;
      const ExpertCall call = MakeCall(c, d, s, out);
      ASSERT_TRUE(RunKernel(*kernel_, call).ok()) << c.Name();
      const Diff diff = Compare(out, d.scalar_out[s]);
      EXPECT_LE(diff.rms_rel, 1e-6) << c.Name() << " slice " << s << " max_abs " << diff.max_abs;
      // Exact integer group sums: bit for bit (kernels/linear4.h).
      EXPECT_EQ(diff.bits_differ, 0) << c.Name() << " slice " << s;
      worst = std::max(worst, diff.rms_rel);
      bits += diff.bits_differ;
      total += static_cast<int64_t>(out.size());
    }
  }
  std::printf("[%s vs scalar] %zu cases: worst rms_rel %.3g, %ld of %ld outputs differ in bits\n",
              kernel_->name, cases.size(), worst, bits, total);
}

// Random nibbles with weight scales at the bottom of the ue8m0 range (byte 0 is the subnormal
// 2^-127) mixed with ordinary ones: the SIMD scale decoding must match the scalar table.
TEST_P(SimdVsScalar, ExtremeWeightScales) {
  const int64_t dim = 256, inter = 256, E = 4, T = 6, k = 2;
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> byte(0, 255), pick(0, 9);
  std::vector<SynthExpert> experts(E);
  auto fill = [&](Mxfp4& m, int64_t rows, int64_t cols) {
    m.w.resize(rows * cols / 2);
    m.s.resize(rows * cols / 32);
    for (auto& b : m.w) b = static_cast<uint8_t>(byte(rng));
    for (auto& b : m.s) {
      const int p = pick(rng);
      b = static_cast<uint8_t>(p < 4 ? p : 118 + p);
    }
  };
  std::vector<ExpertSliceView> views;
  for (SynthExpert& e : experts) {
    fill(e.w1, inter, dim);
    fill(e.w3, inter, dim);
    fill(e.w2, dim, inter);
    views.push_back(*SliceExpert(e.Matrices(), dim, inter, 0, 1));
  }
  const std::vector<uint16_t> x = RandomBf16(T * dim, 1.0f, rng);
  const Routing r = MakeRouting(Route::kUniform, T, k, E, rng);
  std::vector<float> want(T * dim), got(T * dim);
  ExpertCall call{
      T, dim,   k,     inter,      x.data(), r.ids.data(), r.weights.data(), views.data(),
      E, 10.0f, false, want.data()};
  ASSERT_TRUE(RunKernel(Scalar(), call).ok());
  call.out = got.data();
  ASSERT_TRUE(RunKernel(*kernel_, call).ok());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
}

// A non-finite activation (x = inf or NaN: its block's e4m3 codes hold a NaN) makes every output
// of its token NaN in the scalar definition; the SIMD variants flag such blocks in the record and
// give NaN at the same places, the other tokens bit for bit.
TEST_P(SimdVsScalar, NonFiniteActivationsGiveNaNWhereTheScalarDoes) {
  const int64_t dim = 256, inter = 256, E = 4, T = 3, k = 2;
  const SynthLayer& layer = Layer(dim, inter, E);
  std::vector<ExpertSliceView> views;
  for (const SynthExpert& e : layer.experts) {
    views.push_back(*SliceExpert(e.Matrices(), dim, inter, 0, 1));
  }
  std::mt19937 rng(5);
  std::vector<uint16_t> x = RandomBf16(T * dim, 1.0f, rng);
  x[7] = FloatToBf16(std::numeric_limits<float>::infinity());               // token 0
  x[2 * dim + 200] = FloatToBf16(std::numeric_limits<float>::quiet_NaN());  // token 2
  const Routing r = MakeRouting(Route::kUniform, T, k, E, rng);
  std::vector<float> want(T * dim), got(T * dim);
  ExpertCall call{
      T, dim,   k,     inter,      x.data(), r.ids.data(), r.weights.data(), views.data(),
      E, 10.0f, false, want.data()};
  ASSERT_TRUE(RunKernel(Scalar(), call).ok());
  call.out = got.data();
  ASSERT_TRUE(RunKernel(*kernel_, call).ok());
  for (int64_t i = 0; i < T * dim; ++i) {
    ASSERT_EQ(std::isnan(got[i]), std::isnan(want[i])) << "output " << i;
    if (!std::isnan(want[i])) {
      ASSERT_EQ(std::memcmp(&got[i], &want[i], 4), 0) << "output " << i;
    }
  }
  EXPECT_TRUE(std::isnan(want[0]) && std::isnan(want[2 * dim]) && !std::isnan(want[dim]));
}

// Decode calls (one token) whose 64-element activation spans hold every combination of the
// three planes (linear4.h: |q| >= 16, [0.5, 16), < 0.5) being nonzero: the AVX2 kernel's
// plane-skipping paths. Each 128-block's largest |x| is 400 (scale 1, q = e4m3(x)).
TEST_P(SimdVsScalar, EveryPlaneCombination) {
  const int64_t dim = 512, inter = 256, E = 2;
  const SynthLayer& layer = Layer(dim, inter, E);
  std::vector<ExpertSliceView> views;
  for (const SynthExpert& e : layer.experts) {
    views.push_back(*SliceExpert(e.Matrices(), dim, inter, 0, 1));
  }
  std::mt19937 rng(17);
  const float lo[3] = {0.01f, 0.6f, 20.0f}, hi[3] = {0.4f, 12.0f, 400.0f};
  auto draw = [&](int plane) {
    std::uniform_real_distribution<float> u(lo[plane], hi[plane]);
    return (rng() & 1) != 0 ? u(rng) : -u(rng);
  };
  std::vector<uint16_t> all;  // every token's row, for one multi-row call at the end
  for (int token = 0; token < 4; ++token) {
    std::vector<uint16_t> x(dim, 0);
    for (int64_t span = 0; span < dim / 64; ++span) {
      // Span 2i + 1 of token t gets mask (4t + i) % 8 (all eight over the tokens); span 2i
      // holds the block maximum, so plane 2 and mask (4t + i) | 4.
      const int i = static_cast<int>(span / 2);
      int mask = (4 * token + i) % 8;
      if (span % 2 == 0) mask |= 4;
      std::vector<int> planes;
      for (int p = 0; p < 3; ++p) {
        if ((mask >> p & 1) != 0) planes.push_back(p);
      }
      for (int64_t j = 0; j < 64; ++j) {
        float v = 0.0f;
        if (!planes.empty() && (j < 3 || rng() % 4 != 0)) {
          v = draw(planes[j < 3 ? j % planes.size() : rng() % planes.size()]);
        }
        x[span * 64 + j] = FloatToBf16(v);
      }
      if (span % 2 == 0) x[span * 64 + 5] = FloatToBf16(400.0f);
    }
    const int32_t id = token % 2;
    const float weight = 1.0f;
    std::vector<float> want(dim), got(dim);
    ExpertCall call{1,       dim,          1, inter, x.data(), &id,
                    &weight, views.data(), E, 0.0f,  false,    want.data()};
    ASSERT_TRUE(RunKernel(Scalar(), call).ok());
    call.out = got.data();
    ASSERT_TRUE(RunKernel(*kernel_, call).ok());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
        << "token " << token;
    all.insert(all.end(), x.begin(), x.end());
  }
  // The same rows in one call on one expert: the multi-row path sees every combination too.
  const std::vector<int32_t> ids(4, 1);
  const std::vector<float> weights(4, 1.0f);
  std::vector<float> want(4 * dim), got(4 * dim);
  ExpertCall call{4, dim,  1,     inter,      all.data(), ids.data(), weights.data(), views.data(),
                  E, 0.0f, false, want.data()};
  ASSERT_TRUE(RunKernel(Scalar(), call).ok());
  call.out = got.data();
  ASSERT_TRUE(RunKernel(*kernel_, call).ok());
  EXPECT_EQ(Compare(got, want).bits_differ, 0) << "four rows";
}

// ---------------------------------------------------------------------------------------------
// Against the reference model.

class AgainstModel : public IsaTest {};

// Against ss::model::RoutedExpert summed in ascending expert order (MoeForward's routed part):
//  * n = 1 with round_expert_outputs: bit for bit (scalar), rms_rel <= 1e-6 (SIMD);
//  * n > 1: the slices' fp32 partials summed and rounded once are within one bf16 ulp of the
//    same experts run as one unrounded slice for >= 99% of outputs (what slicing changes is
//    only the fp32 summation order of w2). Against the reference itself they can only be as
//    close as the reference's own per-expert bf16 rounding allows (the reference rounds each
//    expert's output before the sum, which no partial-sum split can reproduce): no further from
//    it than the unsliced, unrounded result, and rms_rel <= 2^-8.
TEST_P(AgainstModel, SyntheticSlicesSum) {
  const std::vector<Case> cases = HarnessCases();
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    if (c.T > 64) continue;  // the reference model is slow; T = 300 is covered by the harness
    const CaseData& d = Data(i);
    const SynthLayer& layer = Layer(c.dim, c.inter, c.num_experts);
    std::vector<model::ExpertWeights> ew;
    for (const SynthExpert& e : layer.experts) ew.push_back(e.Model(c.dim, c.inter));
    const std::vector<float> want =
        ModelRoutedSum(ew, d.x, d.routing, c.T, c.top_k, c.dim, c.limit);
    // The same experts as one slice.
    Case whole = c;
    whole.slices = 1;
    CaseData d1 = d;
    d1.views.clear();
    for (const SynthExpert& e : layer.experts)
      d1.views.push_back(*SliceExpert(e.Matrices(), c.dim, c.inter, 0, 1));
    std::vector<float> rounded, one;
    ExpertCall call = MakeCall(whole, d1, 0, rounded);
    call.round_expert_outputs = true;
    ASSERT_TRUE(RunKernel(*kernel_, call).ok());
    const Diff exact = Compare(rounded, want);
    if (GetParam() == Isa::kScalar) {
      EXPECT_EQ(exact.bits_differ, 0) << c.Name() << " max_abs " << exact.max_abs;
    } else {
      EXPECT_LE(exact.rms_rel, 1e-6) << c.Name();
    }
    if (c.slices == 1) continue;

    ASSERT_TRUE(RunKernel(*kernel_, MakeCall(whole, d1, 0, one)).ok());
    std::vector<float> sum(c.T * c.dim, 0.0f);
    for (int64_t s = 0; s < c.slices; ++s) {
      std::vector<float> out;
      ASSERT_TRUE(RunKernel(*kernel_, MakeCall(c, d, s, out)).ok());
      for (size_t j = 0; j < sum.size(); ++j) sum[j] += out[j];
    }
    int64_t vs_one = 0, vs_model = 0, one_vs_model = 0, vs_model2 = 0;
    for (size_t j = 0; j < sum.size(); ++j) {
      const float got = RoundBf16(sum[j]), ref = RoundBf16(want[j]);
      vs_one += Bf16Ulps(got, RoundBf16(one[j])) <= 1;
      vs_model += Bf16Ulps(got, ref) <= 1;
      vs_model2 += Bf16Ulps(got, ref) <= 2;
      one_vs_model += Bf16Ulps(RoundBf16(one[j]), ref) <= 1;
    }
    const double n = static_cast<double>(sum.size());
    std::vector<float> got_bf16(sum.size());
    for (size_t j = 0; j < sum.size(); ++j) got_bf16[j] = RoundBf16(sum[j]);
    const double rms = Compare(got_bf16, want).rms_rel;
    EXPECT_GE(vs_one / n, 0.99) << c.Name();
    EXPECT_GE(vs_model / n, one_vs_model / n - 0.005) << c.Name();
    EXPECT_LE(rms, 1.0 / 256) << c.Name();
    std::printf(
        "[%s] %s: bf16(sum of slices) within 1 ulp of: one slice %.4f, reference %.4f (one "
        "slice: %.4f; within 2 ulp %.4f); rms_rel vs reference %.2e\n",
        kernel_->name, c.Name().c_str(), vs_one / n, vs_model / n, one_vs_model / n, vs_model2 / n,
        rms);
  }
}

// tiny-a: its experts straight from the checkpoint's mmap, its router on realistic FFN inputs
// (embeddings of a prompt through the block's ffn_norm), a hash layer and a learned layer.
TEST_P(AgainstModel, TinyABitExact) {
  auto loaded = model::LoadModelWeights(kTinyA);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const model::ModelWeights& w = **loaded;
  const ModelConfig& cfg = w.config;
  const int64_t dim = cfg.dim, inter = cfg.moe_inter_dim, k = cfg.n_activated_experts;
  const int64_t E = cfg.n_routed_experts;
  const float limit = static_cast<float>(cfg.swiglu_limit);
  for (int layer : {0, 3, 6}) {
    for (int64_t T : {1, 7, 64}) {
      const model::MoeWeights& moe = w.blocks[layer].moe;
      std::vector<int64_t> tokens(T);
      for (int64_t t = 0; t < T; ++t) tokens[t] = (t * 389 + layer * 17 + 5) % cfg.vocab_size;
      std::vector<float> xf(T * dim), row(dim);
      std::vector<uint16_t> x(T * dim);
      for (int64_t t = 0; t < T; ++t) {
        w.embed.Row(tokens[t], row.data());
        model::RmsNorm(row.data(), w.blocks[layer].ffn_norm.data(), dim,
                       static_cast<float>(cfg.norm_eps), xf.data() + t * dim);
        for (int64_t d = 0; d < dim; ++d) x[t * dim + d] = FloatToBf16(xf[t * dim + d]);
      }
      const model::RouterResult rr = model::Route(moe, cfg, xf.data(), tokens.data(), T);
      const Routing r{rr.indices, rr.weights};
      const std::vector<float> want = ModelRoutedSum(moe.experts, x, r, T, k, dim, limit);

      std::vector<ExpertSliceView> views;
      for (const model::ExpertWeights& e : moe.experts) {
        const ExpertMatrices m{e.w1.w, e.w1.s, e.w3.w, e.w3.s, e.w2.w, e.w2.s};
        auto v = SliceExpert(m, dim, inter, 0, 1);
        ASSERT_TRUE(v.ok()) << v.status();
        views.push_back(*v);
        // I = 128 cannot be cut in two: each half would split an activation block of w2's input.
        EXPECT_FALSE(SliceExpert(m, dim, inter, 0, 2).ok());
      }
      std::vector<float> out(T * dim);
      ExpertCall call;
      call.num_tokens = T;
      call.dim = dim;
      call.top_k = k;
      call.inter_slice = inter;
      call.x = x.data();
      call.expert_ids = r.ids.data();
      call.expert_weights = r.weights.data();
      call.experts = views.data();
      call.num_experts = E;
      call.swiglu_limit = limit;
      call.round_expert_outputs = true;
      call.out = out.data();
      ASSERT_TRUE(RunKernel(*kernel_, call).ok());
      const Diff diff = Compare(out, want);
      if (GetParam() == Isa::kScalar) {
        EXPECT_EQ(diff.bits_differ, 0) << "layer " << layer << " T " << T;
      } else {
        EXPECT_LE(diff.rms_rel, 1e-6) << "layer " << layer << " T " << T;
      }
      std::printf("[%s] tiny-a layer %d T=%ld: %ld of %ld outputs differ from the reference\n",
                  kernel_->name, layer, T, diff.bits_differ, T * dim);
    }
  }
}

// A slice read through the checkpoint's strides equals the same slice copied compactly, and
// the same slice with its weights tiled (ExpertSliceView::tile_rows, the expert store's layout).
TEST_P(AgainstModel, CompactCopyEqualsCheckpointView) {
  const int64_t dim = 256, inter = 384, E = 4, T = 5, k = 2, n = 3;
  const SynthLayer& layer = Layer(dim, inter, E);
  std::mt19937 rng(7);
  const std::vector<uint16_t> x = RandomBf16(T * dim, 1.0f, rng);
  const Routing r = MakeRouting(Route::kUniform, T, k, E, rng);
  const int64_t is = inter / n;
  std::vector<std::vector<uint8_t>> store;
  for (int64_t s = 0; s < n; ++s) {
    std::vector<ExpertSliceView> views, compact, tiled8, tiled16;
    for (const SynthExpert& e : layer.experts) {
      const ExpertSliceView v = *SliceExpert(e.Matrices(), dim, inter, s, n);
      views.push_back(v);
      ExpertSliceView c = v;
      auto copy = [&store](const uint8_t* p, int64_t rows, int64_t len, int64_t stride) {
        std::vector<uint8_t> b(rows * len);
        for (int64_t i = 0; i < rows; ++i) std::memcpy(b.data() + i * len, p + i * stride, len);
        store.push_back(std::move(b));
        return store.back().data();
      };
      c.w1 = copy(v.w1, is, dim / 2, dim / 2);
      c.w1_scale = copy(v.w1_scale, is, dim / 32, dim / 32);
      c.w3 = copy(v.w3, is, dim / 2, dim / 2);
      c.w3_scale = copy(v.w3_scale, is, dim / 32, dim / 32);
      c.w2 = copy(v.w2, dim, is / 2, v.w2_stride);
      c.w2_scale = copy(v.w2_scale, dim, is / 32, v.w2_scale_stride);
      c.w2_stride = is / 2;
      c.w2_scale_stride = is / 32;
      compact.push_back(c);
      for (const int64_t tr : {8, 16}) {
        ExpertSliceView t = c;
        auto tile = [&store, tr](const uint8_t* p, int64_t rows, int64_t len) {
          std::vector<uint8_t> b(rows * len);
          TileWeightRows(b.data(), p, rows, len, len, tr);
          store.push_back(std::move(b));
          return store.back().data();
        };
        t.w1 = tile(c.w1, is, dim / 2);
        t.w3 = tile(c.w3, is, dim / 2);
        t.w2 = tile(c.w2, dim, is / 2);
        t.tile_rows = tr;
        (tr == 8 ? tiled8 : tiled16).push_back(t);
      }
    }
    std::vector<float> a(T * dim), b(T * dim);
    ExpertCall call{
        T, dim,   k,     is,      x.data(), r.ids.data(), r.weights.data(), views.data(),
        E, 10.0f, false, a.data()};
    ASSERT_TRUE(RunKernel(*kernel_, call).ok());
    call.experts = compact.data();
    call.out = b.data();
    ASSERT_TRUE(RunKernel(*kernel_, call).ok());
    EXPECT_EQ(Compare(a, b).bits_differ, 0) << "slice " << s;
    // Tiles of 8 rows suit the scalar and AVX2 kernels (8-row tiles), not AVX-512's 16.
    for (const auto* tiled : {&tiled8, &tiled16}) {
      const int64_t tr = tiled->front().tile_rows;
      std::vector<float> c(T * dim);
      call.experts = tiled->data();
      call.out = c.data();
      const absl::Status st = RunKernel(*kernel_, call);
      if (kernel_->tile_rows != 0 && tr % kernel_->tile_rows != 0) {
        EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
        continue;
      }
      ASSERT_TRUE(st.ok()) << st;
      EXPECT_EQ(Compare(a, c).bits_differ, 0) << "slice " << s << " in tiles of " << tr;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Errors: reported before anything is written, never a crash.

class Errors : public IsaTest {
 protected:
  static constexpr int64_t kDim = 256, kInter = 256, kE = 8, kT = 3, kK = 2;
  void SetUp() override {
    IsaTest::SetUp();
    if (IsSkipped()) return;
    const SynthLayer& layer = Layer(kDim, kInter, kE);
    for (const SynthExpert& e : layer.experts)
      views_.push_back(*SliceExpert(e.Matrices(), kDim, kInter, 0, 1));
    std::mt19937 rng(3);
    x_ = RandomBf16(kT * kDim, 1.0f, rng);
    r_ = MakeRouting(Route::kUniform, kT, kK, kE, rng);
    out_.assign(kT * kDim, 42.0f);
    call_ = {
        kT, kDim,  kK,    kInter,     x_.data(), r_.ids.data(), r_.weights.data(), views_.data(),
        kE, 10.0f, false, out_.data()};
  }
  absl::Status Run(const ExpertCall& call) {
    std::vector<uint8_t> ws(ExpertWorkspaceBytes(call_) + 4096);
    return kernel_->run(call, ws.data(), ws.size());
  }
  bool OutUntouched() const {
    for (float v : out_)
      if (v != 42.0f) return false;
    return true;
  }
  std::vector<ExpertSliceView> views_;
  std::vector<uint16_t> x_;
  Routing r_;
  std::vector<float> out_;
  ExpertCall call_;
};

TEST_P(Errors, ValidCallRuns) { EXPECT_TRUE(Run(call_).ok()); }

TEST_P(Errors, ExpertNotHeldNamesTheId) {
  r_.ids[1 * kK + 1] = 5;
  views_[5] = ExpertSliceView{};
  const absl::Status st = Run(call_);
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound) << st;
  EXPECT_NE(st.message().find("expert 5"), std::string::npos) << st;
  EXPECT_TRUE(OutUntouched());
}

TEST_P(Errors, IdOutOfRange) {
  for (int32_t bad : {static_cast<int32_t>(kE), -1, 1 << 30}) {
    r_.ids[kT * kK - 1] = bad;
    const absl::Status st = Run(call_);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find(std::to_string(bad)), std::string::npos) << st;
    EXPECT_TRUE(OutUntouched());
  }
}

TEST_P(Errors, PartiallyNullViewOrShortStride) {
  views_[r_.ids[0]].w2_scale = nullptr;
  absl::Status st = Run(call_);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("w2_scale"), std::string::npos) << st;
  views_[r_.ids[0]] =
      *SliceExpert(Layer(kDim, kInter, kE).experts[r_.ids[0]].Matrices(), kDim, kInter, 0, 1);
  views_[r_.ids[0]].w2_stride = kInter / 2 - 1;
  st = Run(call_);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_TRUE(OutUntouched());
  // Tiles of another height, or tiles with a strided w2 (the checkpoint view of a slice).
  views_[r_.ids[0]] =
      *SliceExpert(Layer(kDim, kInter, kE).experts[r_.ids[0]].Matrices(), kDim, kInter, 0, 1);
  views_[r_.ids[0]].tile_rows = 12;
  st = Run(call_);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("tile_rows"), std::string::npos) << st;
  views_[r_.ids[0]].tile_rows = 16;
  views_[r_.ids[0]].w2_stride = kInter / 2 + 64;
  st = Run(call_);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_TRUE(OutUntouched());
}

TEST_P(Errors, BadShapes) {
  for (int64_t is : {int64_t{192}, int64_t{64}, int64_t{0}, int64_t{-128}}) {
    ExpertCall c = call_;
    c.inter_slice = is;
    const absl::Status st = Run(c);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << is;
    EXPECT_NE(st.message().find("inter_slice"), std::string::npos) << st;
  }
  ExpertCall c = call_;
  c.dim = 200;
  EXPECT_EQ(Run(c).code(), absl::StatusCode::kInvalidArgument);
  c = call_;
  c.top_k = 0;
  EXPECT_EQ(Run(c).code(), absl::StatusCode::kInvalidArgument);
  c = call_;
  c.num_experts = 0;
  EXPECT_EQ(Run(c).code(), absl::StatusCode::kInvalidArgument);
  c = call_;
  c.swiglu_limit = -1.0f;
  EXPECT_EQ(Run(c).code(), absl::StatusCode::kInvalidArgument);
  c = call_;
  c.swiglu_limit = std::nanf("");
  EXPECT_EQ(Run(c).code(), absl::StatusCode::kInvalidArgument);
  c = call_;
  c.num_tokens = -1;
  EXPECT_EQ(Run(c).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(OutUntouched());
}

TEST_P(Errors, NullPointers) {
  const auto nulled = [&](auto field) {
    ExpertCall c = call_;
    c.*field = nullptr;
    return Run(c);
  };
  EXPECT_EQ(nulled(&ExpertCall::x).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(nulled(&ExpertCall::expert_ids).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(nulled(&ExpertCall::expert_weights).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(nulled(&ExpertCall::experts).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(nulled(&ExpertCall::out).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(kernel_->run(call_, nullptr, 1 << 20).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(OutUntouched());
}

TEST_P(Errors, ShortWorkspace) {
  const size_t need = ExpertWorkspaceBytes(call_);
  std::vector<uint8_t> ws(need);
  const absl::Status st = kernel_->run(call_, ws.data(), need - 1);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_TRUE(OutUntouched());
  // Any alignment of the caller's pointer is fine with the advertised size.
  std::vector<uint8_t> big(need + 8);
  EXPECT_TRUE(kernel_->run(call_, big.data() + 3, need).ok());
}

TEST_P(Errors, NoTokensIsANoOp) {
  ExpertCall c;  // every pointer null
  c.num_tokens = 0;
  EXPECT_TRUE(kernel_->run(c, nullptr, 0).ok());
  c = call_;
  c.num_tokens = 0;
  EXPECT_TRUE(Run(c).ok());
  EXPECT_TRUE(OutUntouched());
}

// Every e4m3 code with both signs in the activations of a multi-row call (32 tokens on one
// expert: the AMX variant's tile path), each 128-block scaled so its codes are exactly the chosen
// ones (block maximum 448·s with s a power of two).
TEST_P(SimdVsScalar, ManyRowsSeeEveryActivationCode) {
  const int64_t dim = 512, inter = 256, E = 2, T = 32;
  const SynthLayer& layer = Layer(dim, inter, E);
  std::vector<ExpertSliceView> views;
  for (const SynthExpert& e : layer.experts) {
    views.push_back(*SliceExpert(e.Matrices(), dim, inter, 0, 1));
  }
  std::vector<uint16_t> x(T * dim);
  std::vector<int> seen(0x7f, 0);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t b = 0; b < dim / 128; ++b) {
      const float s = std::ldexp(1.0f, static_cast<int>((t + b) % 7) - 3);
      for (int64_t j = 0; j < 128; ++j) {
        const int code = j == 0 ? 0x7e : static_cast<int>((t * 37 + j * 11 + b * 5) % 0x7f);
        ++seen[code];
        const float v = s * E4m3ToFloat(static_cast<uint8_t>(code));
        x[t * dim + b * 128 + j] = FloatToBf16((t + j + b) % 2 != 0 ? -v : v);
      }
    }
  }
  for (int c = 0; c < 0x7f; ++c) ASSERT_GT(seen[c], 0) << c;
  const std::vector<int32_t> ids(T, 1);
  const std::vector<float> weights(T, 1.0f);
  std::vector<float> want(T * dim), got(T * dim);
  ExpertCall call{T, dim,  1,     inter,      x.data(), ids.data(), weights.data(), views.data(),
                  E, 0.0f, false, want.data()};
  ASSERT_TRUE(RunKernel(Scalar(), call).ok());
  call.out = got.data();
  ASSERT_TRUE(RunKernel(*kernel_, call).ok());
  EXPECT_EQ(Compare(got, want).bits_differ, 0);
}

INSTANTIATE_TEST_SUITE_P(Simd, SimdVsScalar, testing::Values(Isa::kAvx2, Isa::kAvx512, Isa::kAmx),
                         IsaParamName);
INSTANTIATE_TEST_SUITE_P(AllIsas, AgainstModel,
                         testing::Values(Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kAmx),
                         IsaParamName);
INSTANTIATE_TEST_SUITE_P(AllIsas, Errors,
                         testing::Values(Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kAmx),
                         IsaParamName);

}  // namespace
}  // namespace ss::expert::kernels_test
