// The host sampler (gpu_worker/sampler.h): greedy ties, temperature, top-k, top-p, min_p,
// logit_bias, seeded reproducibility by (seed, position), logprobs and parameter validation.
#include "gpu_worker/sampler.h"

#include <cmath>
#include <map>
#include <vector>

#include "gtest/gtest.h"

namespace ss::gpu {
namespace {

SamplingConfig Greedy() { return SamplingConfig{}; }

SamplingConfig Temp(float t, uint64_t seed = 7) {
  SamplingConfig c;
  c.temperature = t;
  c.seed = seed;
  return c;
}

int32_t Draw(const std::vector<float>& logits, const SamplingConfig& c, int64_t position) {
  auto r = SampleToken(logits.data(), static_cast<int64_t>(logits.size()), c, position);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? r->token : -1;
}

TEST(Sampler, GreedyTakesTheLowestIdAmongEqualMaxima) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f, 1.9f};
  EXPECT_EQ(Draw(logits, Greedy(), 0), 1);
  SamplingConfig c = Greedy();
  c.top_k = 3;
  c.top_p = 0.1f;
  c.seed = 99;  // ignored at temperature 0
  for (int64_t p = 0; p < 20; ++p) EXPECT_EQ(Draw(logits, c, p), 1);
}

TEST(Sampler, DrawDependsOnlyOnSeedAndPosition) {
  std::vector<float> logits(50);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = std::sin(static_cast<float>(i));
  for (int64_t p = 0; p < 100; ++p) {
    EXPECT_EQ(Draw(logits, Temp(1.0f, 42), p), Draw(logits, Temp(1.0f, 42), p));
    const double u = UniformDraw(42, p);
    EXPECT_GE(u, 0.0);
    EXPECT_LT(u, 1.0);
    EXPECT_EQ(u, UniformDraw(42, p));
  }
  int differ = 0;
  for (int64_t p = 0; p < 100; ++p)
    differ += Draw(logits, Temp(1.0f, 1), p) != Draw(logits, Temp(1.0f, 2), p);
  EXPECT_GT(differ, 30);  // other seeds draw other tokens
  EXPECT_NE(DefaultSeed(5, 1), DefaultSeed(5, 2));
  EXPECT_NE(DefaultSeed(5, 1), DefaultSeed(6, 1));
}

TEST(Sampler, FrequenciesFollowTheTemperedSoftmax) {
  const std::vector<float> logits = {1.0f, 0.0f, 2.0f, -1.0f};
  for (const float t : {0.5f, 1.0f, 2.0f}) {
    std::vector<double> p(logits.size());
    double z = 0.0;
    for (size_t i = 0; i < p.size(); ++i) z += p[i] = std::exp(logits[i] / t);
    std::map<int32_t, int> count;
    constexpr int kDraws = 20000;
    for (int64_t pos = 0; pos < kDraws; ++pos) ++count[Draw(logits, Temp(t, 3), pos)];
    for (size_t i = 0; i < p.size(); ++i) {
      EXPECT_NEAR(count[static_cast<int32_t>(i)] / static_cast<double>(kDraws), p[i] / z, 0.015)
          << "token " << i << " at temperature " << t;
    }
  }
}

TEST(Sampler, TopKKeepsTheKMostLikely) {
  const std::vector<float> logits = {3.0f, 1.0f, 3.0f, 2.9f, -4.0f};
  SamplingConfig c = Temp(5.0f);
  c.top_k = 1;
  for (int64_t p = 0; p < 50; ++p) EXPECT_EQ(Draw(logits, c, p), 0);  // tie: the lower id
  c.top_k = 2;
  std::map<int32_t, int> seen;
  for (int64_t p = 0; p < 400; ++p) ++seen[Draw(logits, c, p)];
  EXPECT_EQ(seen.size(), 2u);
  EXPECT_GT(seen[0], 0);
  EXPECT_GT(seen[2], 0);
  c.top_k = 100;  // more than the vocabulary: no cut
  seen.clear();
  for (int64_t p = 0; p < 2000; ++p) ++seen[Draw(logits, c, p)];
  EXPECT_EQ(seen.size(), 5u);
}

TEST(Sampler, TopPKeepsTheSmallestPrefixReachingP) {
  // Probabilities 0.5, 0.3, 0.2 (log space).
  const std::vector<float> logits = {std::log(0.3f), std::log(0.5f), std::log(0.2f)};
  SamplingConfig c = Temp(1.0f);
  c.top_p = 0.6f;  // {1: 0.5, 0: 0.3} reaches 0.8 >= 0.6
  std::map<int32_t, int> seen;
  for (int64_t p = 0; p < 4000; ++p) ++seen[Draw(logits, c, p)];
  EXPECT_EQ(seen.count(2), 0u);
  EXPECT_NEAR(seen[1] / 4000.0, 0.5 / 0.8, 0.03);
  c.top_p = 0.4f;  // the most likely alone
  for (int64_t p = 0; p < 100; ++p) EXPECT_EQ(Draw(logits, c, p), 1);
  c.top_p = 0.0f;  // the proto default: no cut
  seen.clear();
  for (int64_t p = 0; p < 2000; ++p) ++seen[Draw(logits, c, p)];
  EXPECT_EQ(seen.size(), 3u);
}

TEST(Sampler, LogitBiasMovesTheDrawNotTheLogprobs) {
  std::vector<float> logits(64);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = std::sin(static_cast<float>(i));
  SamplingConfig c = Temp(1.0f, 3);
  c.logit_bias = {{17, 100.0f}};
  c.top_logprobs = 0;
  for (int64_t p = 0; p < 200; ++p) {
    auto r = SampleToken(logits.data(), 64, c, p);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->token, 17);  // +100 makes it the only token with any weight
    // The logprob is the raw distribution's: without the bias, 17 is not likely.
    EXPECT_LT(r->logprob, -2.0f);
  }
  SamplingConfig g = Greedy();
  g.logit_bias = {{5, 50.0f}, {2, -100.0f}};
  EXPECT_EQ(Draw(logits, g, 0), 5);
  g.logit_bias = {{64, 1.0f}};  // past the vocabulary
  EXPECT_FALSE(SampleToken(logits.data(), 64, g, 0).ok());
}

TEST(Sampler, MinPDropsIdsBelowItsShareOfTheLikeliest) {
  // Probabilities at temperature 1 relative to id 0: 1, e^-1 = 0.37, e^-2 = 0.14, e^-3 = 0.05.
  const std::vector<float> logits = {3.0f, 2.0f, 1.0f, 0.0f};
  SamplingConfig c = Temp(1.0f);
  c.min_p = 0.3f;
  std::map<int32_t, int> seen;
  for (int64_t p = 0; p < 2000; ++p) ++seen[Draw(logits, c, p)];
  EXPECT_EQ(seen.count(2) + seen.count(3), 0u);  // below 0.3 x the likeliest
  EXPECT_GT(seen[0], 1200);                      // 1 / 1.37 of the draws
  EXPECT_GT(seen[1], 400);
  c.min_p = 0.0f;
  seen.clear();
  for (int64_t p = 0; p < 2000; ++p) ++seen[Draw(logits, c, p)];
  EXPECT_GT(seen[2] + seen[3], 100);  // off: every id is drawn
}

TEST(Sampler, LogprobsAreTheLogSoftmaxOfTheRawLogits) {
  const std::vector<float> logits = {1.0f, 3.0f, 3.0f, -2.0f, 0.5f};
  double z = 0.0;
  for (float l : logits) z += std::exp(static_cast<double>(l));
  SamplingConfig c = Temp(0.7f, 11);
  c.top_logprobs = 3;
  for (int64_t p = 0; p < 20; ++p) {
    auto r = SampleToken(logits.data(), 5, c, p);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_NEAR(r->logprob, logits[r->token] - std::log(z), 1e-6);
    ASSERT_EQ(r->top.size(), 3u);
    EXPECT_EQ(r->top[0].first, 1);  // tie between 1 and 2: the lower id first
    EXPECT_EQ(r->top[1].first, 2);
    EXPECT_EQ(r->top[2].first, 0);
    EXPECT_NEAR(r->top[2].second, 1.0 - std::log(z), 1e-6);
  }
  c.top_logprobs = 0;
  auto r0 = SampleToken(logits.data(), 5, c, 0);
  ASSERT_TRUE(r0.ok());
  EXPECT_TRUE(r0->top.empty());
  EXPECT_LT(r0->logprob, 0.0f);
  c.top_logprobs = -1;
  auto rn = SampleToken(logits.data(), 5, c, 0);
  ASSERT_TRUE(rn.ok());
  EXPECT_TRUE(rn->top.empty());
  EXPECT_EQ(rn->logprob, 0.0f);
}

TEST(Sampler, RefusesBadParametersAndLogits) {
  const std::vector<float> logits = {0.0f, 1.0f};
  SamplingConfig c;
  c.temperature = -1.0f;
  EXPECT_EQ(SampleToken(logits.data(), 2, c, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  c.temperature = NAN;
  EXPECT_FALSE(ValidateSampling(c).ok());
  c = SamplingConfig{};
  c.top_p = 1.5f;
  EXPECT_FALSE(ValidateSampling(c).ok());
  c = SamplingConfig{};
  c.top_logprobs = kMaxTopLogprobs + 1;
  EXPECT_FALSE(ValidateSampling(c).ok());
  c.top_logprobs = -2;
  EXPECT_FALSE(ValidateSampling(c).ok());
  const std::vector<float> nan = {0.0f, NAN};
  const auto st = SampleToken(nan.data(), 2, SamplingConfig{}, 0).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("token 1"), std::string::npos) << st;
  EXPECT_FALSE(SampleToken(logits.data(), 0, SamplingConfig{}, 0).ok());
}

}  // namespace
}  // namespace ss::gpu
