// The expert kernels against their definitions (STYLE.md "Backend comparison"):
//  * every available ISA against the scalar kernel over many shapes (T, routing, slices), by
//    normalised error and bit for bit, and with non-finite activations;
//  * the scalar kernel with one slice and per-expert bf16 rounding against the reference
//    model's routed sum (ss::model::RoutedExpert, ascending expert order), bit for bit, on
//    synthetic experts and on tiny-a;
//  * the sum of n > 1 slice partials against the reference, within one bf16 ulp;
//  * error cases; the dispatch table.
// An ISA this CPU lacks is skipped with a message, never emulated.
#include "cpu_expert_worker/kernels/expert_kernels.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
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

namespace ss::expert {
namespace {

constexpr char kTinyA[] = "tests/data/tiny-a";

// ---------------------------------------------------------------------------------------------
// Synthetic experts quantised with the real codecs (spec §9.4): W ~ N(0, 1/fan_in), MXFP4 in
// 1x32 blocks with s = 2^ceil(log2(amax/6)).

struct Mxfp4 {
  std::vector<uint8_t> w, s;
};

Mxfp4 QuantizeFp4(int64_t rows, int64_t cols, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f / std::sqrt(static_cast<float>(cols)));
  Mxfp4 m;
  m.w.assign(rows * cols / 2, 0);
  m.s.assign(rows * cols / 32, 0);
  std::vector<float> v(32);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < cols / 32; ++g) {
      float amax = 0.0f;
      for (auto& x : v) amax = std::max(amax, std::fabs(x = nd(rng)));
      const float s = Pow2Scale(amax, kFp4AmaxFloor, kE2m1Max);
      m.s[r * (cols / 32) + g] = Ue8m0FromPow2(s);
      for (int j = 0; j < 32; ++j) {
        const uint8_t code = FloatToE2m1(v[j] / s);
        uint8_t& byte = m.w[(r * cols + g * 32 + j) / 2];
        byte |= (j % 2 == 0) ? code : static_cast<uint8_t>(code << 4);
      }
    }
  }
  return m;
}

struct SynthExpert {
  Mxfp4 w1, w3, w2;
  ExpertMatrices Matrices() const {
    return {w1.w.data(), w1.s.data(), w3.w.data(), w3.s.data(), w2.w.data(), w2.s.data()};
  }
  model::ExpertWeights Model(int64_t dim, int64_t inter) const {
    model::ExpertWeights e;
    e.w1 = {w1.w.data(), w1.s.data(), inter, dim};
    e.w3 = {w3.w.data(), w3.s.data(), inter, dim};
    e.w2 = {w2.w.data(), w2.s.data(), dim, inter};
    return e;
  }
};

struct SynthLayer {
  int64_t dim, inter;
  std::vector<SynthExpert> experts;
};

const SynthLayer& Layer(int64_t dim, int64_t inter, int64_t num_experts) {
  static std::map<std::tuple<int64_t, int64_t, int64_t>, std::unique_ptr<SynthLayer>> cache;
  auto& slot = cache[{dim, inter, num_experts}];
  if (!slot) {
    slot = std::make_unique<SynthLayer>();
    slot->dim = dim;
    slot->inter = inter;
    std::mt19937 rng(static_cast<uint32_t>(dim * 7919 + inter * 31 + num_experts));
    for (int64_t e = 0; e < num_experts; ++e) {
      SynthExpert x;
      x.w1 = QuantizeFp4(inter, dim, rng);
      x.w3 = QuantizeFp4(inter, dim, rng);
      x.w2 = QuantizeFp4(dim, inter, rng);
      slot->experts.push_back(std::move(x));
    }
  }
  return *slot;
}

// ---------------------------------------------------------------------------------------------
// Inputs, the reference, comparisons.

struct Routing {
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

enum class Route { kUniform, kSkewed };

// Uniform: ids drawn with replacement (so a row may repeat an id); skewed: every token goes to
// the same one or two experts. Weights are positive and sum to 1.5 (route_scale) per token.
Routing MakeRouting(Route how, int64_t T, int64_t k, int64_t E, std::mt19937& rng) {
  Routing r;
  r.ids.resize(T * k);
  r.weights.resize(T * k);
  std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(E - 1));
  std::uniform_real_distribution<float> w(0.1f, 1.0f);
  const int32_t hot[2] = {static_cast<int32_t>(E / 3), static_cast<int32_t>(E - 2)};
  for (int64_t t = 0; t < T; ++t) {
    float sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      r.ids[t * k + j] = how == Route::kUniform ? id(rng) : hot[j % 2];
      sum += r.weights[t * k + j] = w(rng);
    }
    for (int64_t j = 0; j < k; ++j) r.weights[t * k + j] = r.weights[t * k + j] / sum * 1.5f;
  }
  return r;
}

std::vector<uint16_t> RandomBf16(int64_t n, float sigma, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, sigma);
  std::vector<uint16_t> x(n);
  for (auto& v : x) v = FloatToBf16(nd(rng));
  return x;
}

// The reference model's routed sum (MoeForward without the shared expert and final rounding).
std::vector<float> ModelRoutedSum(const std::vector<model::ExpertWeights>& experts,
                                  const std::vector<uint16_t>& x, const Routing& r, int64_t T,
                                  int64_t k, int64_t dim, float limit) {
  std::vector<float> acc(T * dim, 0.0f), xs, ws, ys;
  for (int64_t e = 0; e < static_cast<int64_t>(experts.size()); ++e) {
    std::vector<int64_t> rows;
    xs.clear();
    ws.clear();
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t j = 0; j < k; ++j) {
        if (r.ids[t * k + j] != e) continue;
        rows.push_back(t);
        for (int64_t d = 0; d < dim; ++d) xs.push_back(Bf16ToFloat(x[t * dim + d]));
        ws.push_back(r.weights[t * k + j]);
      }
    }
    if (rows.empty()) continue;
    ys.resize(rows.size() * dim);
    model::RoutedExpert(experts[e], xs.data(), ws.data(), static_cast<int64_t>(rows.size()), limit,
                        ys.data());
    for (size_t i = 0; i < rows.size(); ++i)
      for (int64_t d = 0; d < dim; ++d) acc[rows[i] * dim + d] += ys[i * dim + d];
  }
  return acc;
}

struct Diff {
  double rms_rel = 0.0, max_abs = 0.0;
  int64_t bits_differ = 0;
};

Diff Compare(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0.0, den = 0.0;
  Diff d;
  for (size_t i = 0; i < got.size(); ++i) {
    const double e = static_cast<double>(got[i]) - want[i];
    num += e * e;
    den += static_cast<double>(want[i]) * want[i];
    d.max_abs = std::max(d.max_abs, std::fabs(e));
    d.bits_differ += got[i] != want[i];
  }
  d.rms_rel = den > 0.0 ? std::sqrt(num / den) : std::sqrt(num);
  return d;
}

// Distance in bf16 ulps between two bf16-valued floats (ordered integer representation).
int64_t Bf16Ulps(float a, float b) {
  auto ord = [](float f) {
    const int32_t u = FloatToBf16(f);
    return (u & 0x8000) ? -(u & 0x7fff) : u;
  };
  return std::abs(static_cast<int64_t>(ord(a)) - ord(b));
}

// Runs `kernel` with a workspace of exactly the advertised size.
absl::Status RunKernel(const ExpertKernel& kernel, const ExpertCall& call) {
  std::vector<uint8_t> ws(ExpertWorkspaceBytes(call));
  return kernel.run(call, ws.data(), ws.size());
}

const ExpertKernel& Scalar() { return **KernelFor(Isa::kScalar); }

// One harness case: a layer of synthetic experts, T tokens, a routing, n slices.
struct Case {
  int64_t T, dim, inter, num_experts, top_k, slices;
  Route route;
  float limit, x_sigma;
  std::string Name() const {
    char b[160];
    std::snprintf(b, sizeof b, "T=%ld dim=%ld I=%ld E=%ld k=%ld n=%ld %s limit=%g sigma=%g", T, dim,
                  inter, num_experts, top_k, slices,
                  route == Route::kUniform ? "uniform" : "skewed", limit, x_sigma);
    return b;
  }
};

std::vector<Case> HarnessCases() {
  std::vector<Case> cases;
  for (int64_t T : {1, 2, 7, 64, 300}) {
    for (Route route : {Route::kUniform, Route::kSkewed}) {
      for (int64_t n : {1, 2, 3}) {
        const int64_t inter = n == 2 ? 256 : 384;  // I/n a multiple of 128
        const int64_t k = route == Route::kUniform ? 4 : 2;
        cases.push_back({T, 256, inter, 16, k, n, route, 10.0f, 1.0f});
      }
    }
  }
  // Other widths, a tight clamp that bites, no clamp, large activations, top-6 of 32.
  cases.push_back({7, 384, 256, 8, 3, 2, Route::kUniform, 0.5f, 1.0f});
  cases.push_back({5, 512, 512, 8, 6, 4, Route::kUniform, 0.0f, 3.0f});
  cases.push_back({3, 128, 128, 4, 2, 1, Route::kUniform, 10.0f, 8.0f});
  cases.push_back({9, 1024, 256, 32, 6, 1, Route::kUniform, 10.0f, 1.0f});
  // n tokens on one expert: every register-block path and remainder of the SIMD kernels.
  for (int64_t T : {3, 4, 5, 6, 8, 9})
    cases.push_back({T, 128, 256, 4, 1, 2, Route::kSkewed, 10.0f, 1.0f});
  return cases;
}

struct CaseData {
  std::vector<uint16_t> x;
  Routing routing;
  std::vector<ExpertSliceView> views;          // [slices][E]
  std::vector<std::vector<float>> scalar_out;  // per slice
};

ExpertCall MakeCall(const Case& c, const CaseData& d, int64_t slice, std::vector<float>& out) {
  out.assign(c.T * c.dim, -1.0f);
  ExpertCall call;
  call.num_tokens = c.T;
  call.dim = c.dim;
  call.top_k = c.top_k;
  call.inter_slice = c.inter / c.slices;
  call.x = d.x.data();
  call.expert_ids = d.routing.ids.data();
  call.expert_weights = d.routing.weights.data();
  call.experts = d.views.data() + slice * c.num_experts;
  call.num_experts = c.num_experts;
  call.swiglu_limit = c.limit;
  call.out = out.data();
  return call;
}

// Inputs and scalar outputs per case, computed once for all ISAs.
const CaseData& Data(size_t index) {
  static std::map<size_t, std::unique_ptr<CaseData>> cache;
  auto& slot = cache[index];
  if (slot) return *slot;
  const Case c = HarnessCases()[index];
  slot = std::make_unique<CaseData>();
  CaseData& d = *slot;
  std::mt19937 rng(static_cast<uint32_t>(1000 + index));
  const SynthLayer& layer = Layer(c.dim, c.inter, c.num_experts);
  d.x = RandomBf16(c.T * c.dim, c.x_sigma, rng);
  d.routing = MakeRouting(c.route, c.T, c.top_k, c.num_experts, rng);
  for (int64_t s = 0; s < c.slices; ++s) {
    for (const SynthExpert& e : layer.experts) {
      auto v = SliceExpert(e.Matrices(), c.dim, c.inter, s, c.slices);
      EXPECT_TRUE(v.ok()) << v.status();
      d.views.push_back(*v);
    }
  }
  for (int64_t s = 0; s < c.slices; ++s) {
    std::vector<float> out;
    const ExpertCall call = MakeCall(c, d, s, out);
    const absl::Status st = RunKernel(Scalar(), call);
    EXPECT_TRUE(st.ok()) << st;
    d.scalar_out.push_back(std::move(out));
  }
  return d;
}

class IsaTest : public testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (!IsaSupported(GetParam())) {
      GTEST_SKIP() << "this CPU does not support " << IsaName(GetParam())
                   << "; its kernels are not run here";
    }
    kernel_ = *KernelFor(GetParam());
  }
  const ExpertKernel* kernel_ = nullptr;
};

std::string IsaParamName(const testing::TestParamInfo<Isa>& info) { return IsaName(info.param); }

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

// ---------------------------------------------------------------------------------------------
// The vectorised activation quantiser (ExpertKernel::quantize_act) against ss::QuantizeActE4m3:
// codes and scales bit for bit. Every ISA (scalar too: it wraps the definition).

class ActQuant : public IsaTest {
 protected:
  // Quantises `x` (a multiple of 128 values) with the kernel and the definition; compares bits.
  void Check(const std::vector<float>& x, const char* what) {
    ASSERT_EQ(x.size() % kActBlock, 0u);
    const size_t n = x.size(), nb = n / kActBlock;
    std::vector<uint8_t> want_q(n), got_q(n, 0xaa);
    std::vector<float> want_s(nb), got_s(nb, -1.0f);
    QuantizeActE4m3(x.data(), n, kActBlock, want_q.data(), want_s.data());
    kernel_->quantize_act(x.data(), static_cast<int64_t>(n), got_q.data(), got_s.data());
    for (size_t b = 0; b < nb; ++b) {
      ASSERT_EQ(std::memcmp(&want_s[b], &got_s[b], 4), 0)
          << what << ": block " << b << " scale " << want_s[b] << " vs " << got_s[b];
    }
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(want_q[i], got_q[i]) << what << ": element " << i << " x = " << x[i] << " (scale "
                                     << want_s[i / kActBlock] << ")";
    }
    ++checked_;
  }
  int checked_ = 0;
};

// Values of `v` packed into 128-blocks, each block led by `lead` (which fixes the scale).
std::vector<float> Blocks(const std::vector<float>& v, float lead) {
  std::vector<float> x;
  for (size_t i = 0; i < v.size(); i += kActBlock - 1) {
    x.push_back(lead);
    for (size_t j = i; j < i + kActBlock - 1; ++j) x.push_back(j < v.size() ? v[j] : 0.0f);
  }
  return x;
}

TEST_P(ActQuant, EveryCodeBoundaryAndMidpoint) {
  // With a block maximum of 448 the scale is 1 and x/s = x: every e4m3 value, every midpoint
  // between neighbours (a tie: RNE), and the floats next to each, both signs, plus zeros.
  std::vector<float> grid;
  for (int c = 0; c <= 0x7e; ++c) grid.push_back(E4m3ToFloat(static_cast<uint8_t>(c)));
  std::vector<float> v;
  for (size_t i = 0; i < grid.size(); ++i) {
    for (float g : {grid[i], (i + 1 < grid.size() ? 0.5f * (grid[i] + grid[i + 1]) : 460.0f)}) {
      for (float f : {g, std::nextafter(g, 0.0f), std::nextafter(g, 1e9f)}) {
        v.push_back(f);
        v.push_back(-f);
      }
    }
  }
  for (float f : {0.0f, -0.0f, 1e-30f, -1e-30f, 1e-45f, 500.0f, -1e30f, 448.0f, 464.0f, 463.99f})
    v.push_back(f);
  Check(Blocks(v, 448.0f), "grid at scale 1");
  // The same grid under other power-of-two scales (exact multiples keep the boundaries).
  for (int e : {-20, -9, -1, 1, 7, 40}) {
    std::vector<float> w;
    for (float f : v) w.push_back(std::ldexp(std::max(-448.0f, std::min(448.0f, f)), e));
    Check(Blocks(w, std::ldexp(448.0f, e)), "grid scaled");
  }
}

TEST_P(ActQuant, ZeroBlocksPowersOfTwoAndTinyMaxima) {
  Check(std::vector<float>(512, 0.0f), "all zero");
  std::vector<float> negz(256, -0.0f);
  Check(negz, "all -0");
  // Block maxima at exact powers of two (the scale keeps the exponent) and just around them,
  // from below the 1e-4 floor to near the fp32 maximum.
  std::vector<float> x;
  for (int e = -149; e <= 127; ++e) {
    const float p = std::ldexp(1.0f, e);
    for (float m : {p, std::nextafter(p, 0.0f), std::nextafter(p, 1e38f), 448.0f * p / 256.0f}) {
      if (!std::isfinite(m)) continue;
      for (int64_t i = 0; i < kActBlock; ++i) {
        x.push_back(i == 0 ? m : m * static_cast<float>((i * 37) % 101 - 50) / 50.0f);
      }
    }
  }
  Check(x, "powers of two");
}

TEST_P(ActQuant, RandomRows) {
  std::mt19937 rng(1234);
  for (float sigma : {1e-6f, 1e-3f, 0.05f, 1.0f, 30.0f, 1e6f}) {
    std::normal_distribution<float> nd(0.0f, sigma);
    std::vector<float> x(4096);
    for (float& f : x) f = RoundBf16(nd(rng));
    Check(x, "random bf16");
    for (float& f : x) f = nd(rng);
    Check(x, "random fp32");
    // Outliers: one large value per block squeezes the rest towards the subnormal range.
    for (size_t i = 0; i < x.size(); i += kActBlock) x[i + rng() % kActBlock] = sigma * 3000.0f;
    Check(x, "random with outliers");
  }
  EXPECT_GT(checked_, 0);
}

// quantize_row writes what `run` computes internally, and a call fed those rows through
// ExpertCall::xq_rows gives the same bits as one fed x.
TEST_P(ActQuant, PreQuantisedCallIsBitIdentical) {
  const std::vector<Case> cases = HarnessCases();
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const CaseData& d = Data(i);
    const int64_t nb = c.dim / kActBlock;
    std::vector<float> q_store(c.T * c.dim + 16);
    float* q = q_store.data();
    q += (64 - reinterpret_cast<uintptr_t>(q) % 64) % 64 / sizeof(float);
    std::vector<float> sc(c.T * nb);
    std::vector<const float*> qrows(c.T), srows(c.T);
    for (int64_t t = 0; t < c.T; ++t) {
      kernel_->quantize_row(d.x.data() + t * c.dim, c.dim, q + t * c.dim, sc.data() + t * nb);
      qrows[t] = q + t * c.dim;
      srows[t] = sc.data() + t * nb;
      // Scales agree with the definition on the bf16 row.
      std::vector<float> xf(c.dim), want_s(nb);
      std::vector<uint8_t> codes(c.dim);
      for (int64_t j = 0; j < c.dim; ++j) xf[j] = Bf16ToFloat(d.x[t * c.dim + j]);
      QuantizeActE4m3(xf.data(), c.dim, kActBlock, codes.data(), want_s.data());
      ASSERT_EQ(std::memcmp(want_s.data(), sc.data() + t * nb, nb * 4), 0) << c.Name();
    }
    for (int64_t s = 0; s < c.slices; ++s) {
      std::vector<float> want, got;
      const ExpertCall call = MakeCall(c, d, s, want);
      ASSERT_TRUE(RunKernel(*kernel_, call).ok()) << c.Name();
      ExpertCall pre = MakeCall(c, d, s, got);
      pre.x = nullptr;
      pre.xq_rows = qrows.data();
      pre.xs_rows = srows.data();
      ASSERT_TRUE(RunKernel(*kernel_, pre).ok()) << c.Name();
      ASSERT_EQ(std::memcmp(want.data(), got.data(), want.size() * 4), 0) << c.Name();
      pre.xs_rows = nullptr;
      EXPECT_EQ(RunKernel(*kernel_, pre).code(), absl::StatusCode::kInvalidArgument);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllIsas, ActQuant,
                         testing::Values(Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kAmx),
                         IsaParamName);

// ---------------------------------------------------------------------------------------------
// Dispatch and helpers.

TEST(Dispatch, ParseAndDetect) {
  EXPECT_EQ(*ParseIsa("scalar"), Isa::kScalar);
  EXPECT_EQ(*ParseIsa("avx2"), Isa::kAvx2);
  EXPECT_EQ(*ParseIsa("avx512"), Isa::kAvx512);
  EXPECT_EQ(*ParseIsa("amx"), Isa::kAmx);
  EXPECT_EQ(*ParseIsa("auto"), DetectIsa());
  const auto bad = ParseIsa("sse4");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("sse4"), std::string::npos);
  EXPECT_TRUE(IsaSupported(DetectIsa()));
  std::printf("DetectIsa: %s (avx2 %s, avx512 %s, amx %s)\n", IsaName(DetectIsa()),
              IsaSupported(Isa::kAvx2) ? "yes" : "no", IsaSupported(Isa::kAvx512) ? "yes" : "no",
              IsaSupported(Isa::kAmx) ? "yes" : "no");
}

TEST(Dispatch, KernelForRefusesWhatTheCpuLacks) {
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kAmx}) {
    const auto k = KernelFor(isa);
    if (IsaSupported(isa)) {
      ASSERT_TRUE(k.ok()) << k.status();
      EXPECT_STREQ((*k)->name, IsaName(isa));
    } else {
      EXPECT_EQ(k.status().code(), absl::StatusCode::kFailedPrecondition);
    }
  }
  const auto bad = KernelFor(static_cast<Isa>(7));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("7"), std::string::npos);
  EXPECT_STREQ(IsaName(static_cast<Isa>(7)), "unknown");
}

TEST(Layout, PlanePositionIsAPermutation) {
  for (int64_t span : {64, 128}) {
    std::vector<int> seen(128, 0);
    for (int64_t e = 0; e < 128; ++e) ++seen.at(internal::PlanePosition(e, span));
    for (int v : seen) EXPECT_EQ(v, 1) << span;
  }
  static_assert(internal::kRecordBytes == kActBlock * sizeof(float));
}

TEST(Layout, SliceExpertValidates) {
  const SynthLayer& layer = Layer(256, 384, 4);
  const ExpertMatrices m = layer.experts[0].Matrices();
  EXPECT_TRUE(SliceExpert(m, 256, 384, 2, 3).ok());
  EXPECT_FALSE(SliceExpert(m, 256, 384, 3, 3).ok());  // index out of range
  EXPECT_FALSE(SliceExpert(m, 256, 384, 0, 2).ok());  // 192 is not a multiple of 128
  EXPECT_FALSE(SliceExpert(m, 200, 384, 0, 1).ok());  // dim
  EXPECT_FALSE(SliceExpert(ExpertMatrices{}, 256, 384, 0, 1).ok());
  const ExpertSliceView v = *SliceExpert(m, 256, 384, 1, 3);
  EXPECT_EQ(v.w1, m.w1 + 128 * 128);
  EXPECT_EQ(v.w2, m.w2 + 64);
  EXPECT_EQ(v.w2_stride, 192);
  EXPECT_EQ(v.w2_scale, m.w2_scale + 4);
  EXPECT_EQ(v.w2_scale_stride, 12);
}

}  // namespace
}  // namespace ss::expert
