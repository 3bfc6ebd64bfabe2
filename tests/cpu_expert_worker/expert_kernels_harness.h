// The fixtures the expert-kernel tests share (expert_kernels_test.cc, act_quant_test.cc):
// synthetic MXFP4 experts quantised with the real codecs, routings, the reference model's routed
// sum, comparisons, and the harness cases with their inputs and scalar outputs (computed once a
// process). IsaTest skips an ISA this CPU lacks with a message, never emulates it.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/model/moe.h"
#include "cpu_expert_worker/kernels/dispatch.h"
#include "cpu_expert_worker/kernels/expert_kernels.h"

namespace ss::expert::kernels_test {

// ---------------------------------------------------------------------------------------------
// Synthetic experts quantised with the real codecs (spec §9.4): W ~ N(0, 1/fan_in), MXFP4 in
// 1x32 blocks with s = 2^ceil(log2(amax/6)).

struct Mxfp4 {
  std::vector<uint8_t> w, s;
};

Mxfp4 QuantizeFp4(int64_t rows, int64_t cols, std::mt19937& rng);

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

// The layer of that shape (seeded by it), built once a process.
const SynthLayer& Layer(int64_t dim, int64_t inter, int64_t num_experts);

// ---------------------------------------------------------------------------------------------
// Inputs, the reference, comparisons.

struct Routing {
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

enum class Route { kUniform, kSkewed };

// Uniform: ids drawn with replacement (so a row may repeat an id); skewed: every token goes to
// the same one or two experts. Weights are positive and sum to 1.5 (route_scale) per token.
Routing MakeRouting(Route how, int64_t T, int64_t k, int64_t E, std::mt19937& rng);

// n bf16 values ~ N(0, sigma).
std::vector<uint16_t> RandomBf16(int64_t n, float sigma, std::mt19937& rng);

// The reference model's routed sum (MoeForward without the shared expert and final rounding).
std::vector<float> ModelRoutedSum(const std::vector<model::ExpertWeights>& experts,
                                  const std::vector<uint16_t>& x, const Routing& r, int64_t T,
                                  int64_t k, int64_t dim, float limit);

struct Diff {
  double rms_rel = 0.0, max_abs = 0.0;
  int64_t bits_differ = 0;
};

Diff Compare(const std::vector<float>& got, const std::vector<float>& want);

// Distance in bf16 ulps between two bf16-valued floats (ordered integer representation).
int64_t Bf16Ulps(float a, float b);

// Runs `kernel` with a workspace of exactly the advertised size.
absl::Status RunKernel(const ExpertKernel& kernel, const ExpertCall& call);

const ExpertKernel& Scalar();

// ---------------------------------------------------------------------------------------------
// The harness cases.

// One harness case: a layer of synthetic experts, T tokens, a routing, n slices.
struct Case {
  int64_t T, dim, inter, num_experts, top_k, slices;
  Route route;
  float limit, x_sigma;
  std::string Name() const;
};

std::vector<Case> HarnessCases();

struct CaseData {
  std::vector<uint16_t> x;
  Routing routing;
  std::vector<ExpertSliceView> views;          // [slices][E]
  std::vector<std::vector<float>> scalar_out;  // per slice
};

// Case c's call for one slice, writing into `out` (sized and filled with -1 here).
ExpertCall MakeCall(const Case& c, const CaseData& d, int64_t slice, std::vector<float>& out);

// Inputs and scalar outputs of HarnessCases()[index], computed once a process for all ISAs.
const CaseData& Data(size_t index);

// A test over every ISA: skipped where the CPU lacks it; kernel_ is its kernel.
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

std::string IsaParamName(const testing::TestParamInfo<Isa>& info);

}  // namespace ss::expert::kernels_test
