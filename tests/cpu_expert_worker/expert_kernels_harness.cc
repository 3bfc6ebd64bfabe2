#include "tests/cpu_expert_worker/expert_kernels_harness.h"

#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <tuple>

#include "common/bf16.h"
#include "common/codecs.h"

namespace ss::expert::kernels_test {

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

int64_t Bf16Ulps(float a, float b) {
  auto ord = [](float f) {
    const int32_t u = FloatToBf16(f);
    return (u & 0x8000) ? -(u & 0x7fff) : u;
  };
  return std::abs(static_cast<int64_t>(ord(a)) - ord(b));
}

absl::Status RunKernel(const ExpertKernel& kernel, const ExpertCall& call) {
  std::vector<uint8_t> ws(ExpertWorkspaceBytes(call));
  return kernel.run(call, ws.data(), ws.size());
}

const ExpertKernel& Scalar() { return **KernelFor(Isa::kScalar); }

std::string Case::Name() const {
  char b[160];
  std::snprintf(b, sizeof b, "T=%ld dim=%ld I=%ld E=%ld k=%ld n=%ld %s limit=%g sigma=%g", T, dim,
                inter, num_experts, top_k, slices, route == Route::kUniform ? "uniform" : "skewed",
                limit, x_sigma);
  return b;
}

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

std::string IsaParamName(const testing::TestParamInfo<Isa>& info) { return IsaName(info.param); }

}  // namespace ss::expert::kernels_test
