// The vectorised activation quantiser against its definition (every ISA, bit for bit), a call
// fed pre-quantised rows against one fed x, the dispatch table and the record layout's helpers.
// An ISA this CPU lacks is skipped with a message, never emulated.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/bf16.h"
#include "common/codecs.h"
#include "cpu_expert_worker/kernels/dispatch.h"
#include "cpu_expert_worker/kernels/expert_kernels.h"
#include "cpu_expert_worker/kernels/linear4.h"
#include "tests/cpu_expert_worker/expert_kernels_harness.h"

namespace ss::expert::kernels_test {
namespace {

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
}  // namespace ss::expert::kernels_test
