// The host sampler (gpu_worker/sampler.h): greedy ties, temperature, top-k, top-p, min_p,
// logit_bias, penalties, the allowed mask and banned ids, seeded reproducibility by (seed,
// position), logprobs and parameter validation; the penalties' token histories.
#include "gpu_worker/sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <vector>

#include "gpu_worker/sampler_math.h"
#include "gpu_worker/token_histories.h"
#include "gtest/gtest.h"
#include "tests/gpu_worker/sampler_reference.h"

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

int32_t DrawWith(const std::vector<float>& logits, const SamplingConfig& c,
                 const SamplingInputs& in, int64_t position = 0) {
  auto r = SampleToken(logits.data(), static_cast<int64_t>(logits.size()), c, position, in);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? r->token : -1;
}

// Each case puts the penalised id just above or just below its rival, so a formula off by a sign,
// a factor or the wrong set of ids picks the other one.
TEST(Sampler, PenaltiesFollowVllmsFormulas) {
  TokenHistory h;
  h.prompt = {0};
  h.output = {{2, 2}, {3, 5}};
  SamplingInputs in{&h, {}, {}};
  SamplingConfig c = Greedy();
  // Repetition: a positive logit of a prompt id is divided, a negative one multiplied.
  c.repetition_penalty = 2.0f;
  EXPECT_EQ(DrawWith({2.0f, 1.5f}, c, in), 1);    // 2.0 / 2 = 1.0 < 1.5
  EXPECT_EQ(DrawWith({-1.0f, -1.5f}, c, in), 1);  // -1.0 x 2 = -2.0 < -1.5
  c.repetition_penalty = 1.2f;
  EXPECT_EQ(DrawWith({-1.0f, -1.5f}, c, in), 0);      // -1.2 > -1.5
  EXPECT_EQ(DrawWith({1.0f, 1.5f, 1.6f}, c, in), 1);  // output id 2: 1.6 / 1.2 < 1.5
  c.repetition_penalty = 0.5f;                        // < 1 favours repeats
  EXPECT_EQ(DrawWith({1.0f, 1.5f}, c, in), 0);        // 1.0 / 0.5 = 2.0
  // Frequency: minus f x the output count (id 2 was generated twice); prompt ids are exempt.
  c = Greedy();
  c.frequency_penalty = 0.2f;
  EXPECT_EQ(DrawWith({0.0f, 0.0f, 3.0f, 0.0f, 2.5f}, c, in), 2);  // 3.0 - 0.4 > 2.5
  c.frequency_penalty = 0.3f;
  EXPECT_EQ(DrawWith({0.0f, 0.0f, 3.0f, 0.0f, 2.5f}, c, in), 4);  // 3.0 - 0.6 < 2.5
  EXPECT_EQ(DrawWith({3.0f, 2.9f}, c, in), 0);                    // id 0 is a prompt id only
  // Presence: minus p once for any id in the output, whatever its count (id 3: five times).
  c = Greedy();
  c.presence_penalty = 0.4f;
  EXPECT_EQ(DrawWith({0.0f, 0.0f, 0.0f, 3.0f, 2.5f}, c, in), 3);  // 3.0 - 0.4 > 2.5
  c.presence_penalty = 0.6f;
  EXPECT_EQ(DrawWith({0.0f, 0.0f, 0.0f, 3.0f, 2.5f}, c, in), 4);
  c.presence_penalty = -1.0f;  // negative: encourages repeats
  EXPECT_EQ(DrawWith({0.0f, 0.0f, 0.0f, 1.0f, 1.9f}, c, in), 3);
  // Frequency and presence add up on top of repetition.
  c = Greedy();
  c.repetition_penalty = 2.0f;
  c.frequency_penalty = 0.1f;
  c.presence_penalty = 0.1f;
  // id 2: 4.0 / 2 - 0.2 - 0.1 = 1.7 against 1.75 and 1.65.
  EXPECT_EQ(DrawWith({0.0f, 1.75f, 4.0f}, c, in), 1);
  EXPECT_EQ(DrawWith({0.0f, 1.65f, 4.0f}, c, in), 2);
  // Penalties need the history.
  EXPECT_FALSE(SampleToken(std::vector<float>{1.0f}.data(), 1, c, 0).ok());
  c.repetition_penalty = 0.0f;
  EXPECT_FALSE(ValidateSampling(c).ok());
}

TEST(Sampler, TheMaskAndTheBansDecideWhatMayBeDrawn) {
  std::vector<float> logits(70);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = std::cos(static_cast<float>(i));
  std::vector<uint32_t> mask(3, 0u);  // 70 ids -> 3 words
  for (int id : {5, 33, 64}) mask[id / 32] |= 1u << (id % 32);
  SamplingInputs in;
  in.allowed = mask;
  std::map<int32_t, int> seen;
  SamplingConfig c = Temp(1.0f);
  c.top_logprobs = 1;
  for (int64_t p = 0; p < 600; ++p) {
    auto r = SampleToken(logits.data(), 70, c, p, in);
    ASSERT_TRUE(r.ok()) << r.status();
    ++seen[r->token];
    EXPECT_EQ(r->top[0].first, 0);  // logprobs stay the raw distribution's
  }
  EXPECT_EQ(seen.size(), 3u);
  EXPECT_GT(seen[5], 0);
  EXPECT_GT(seen[33], 0);
  EXPECT_GT(seen[64], 0);
  // Greedy takes the best allowed id; a ban removes it.
  const int32_t best =
      logits[5] >= logits[33] && logits[5] >= logits[64] ? 5 : (logits[33] >= logits[64] ? 33 : 64);
  EXPECT_EQ(DrawWith(logits, Greedy(), in), best);
  const std::vector<int32_t> banned = {best};
  in.banned = banned;
  const int32_t second = DrawWith(logits, Greedy(), in);
  EXPECT_NE(second, best);
  EXPECT_TRUE(second == 5 || second == 33 || second == 64);
  // Bans without a mask; a mask shorter than the vocabulary allows nothing past its end.
  SamplingInputs ban_only;
  const std::vector<int32_t> top = {0};
  ban_only.banned = top;
  EXPECT_NE(DrawWith(logits, Greedy(), ban_only), 0);
  // Nothing left: an error, not a draw.
  std::vector<uint32_t> none(3, 0u);
  SamplingInputs empty;
  empty.allowed = none;
  const auto st = SampleToken(logits.data(), 70, c, 0, empty).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
}

TEST(TokenHistories, CountOutputAfterThePromptAndRequireContinuity) {
  TokenHistories t;
  const std::vector<int32_t> a = {7, 8, 7}, b = {9, 7}, c = {7};
  ASSERT_TRUE(t.Observe(1, 0, a, 4).ok());
  ASSERT_TRUE(t.Observe(1, 3, b, 4).ok());  // position 3 is the prompt's last, 4 the first output
  const TokenHistory* h = t.Find(1);
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(h->prompt, (absl::flat_hash_set<int32_t>{7, 8, 9}));
  EXPECT_EQ(h->output, (absl::flat_hash_map<int32_t, int32_t>{{7, 1}}));
  ASSERT_TRUE(t.Observe(1, 5, c, 4).ok());
  EXPECT_EQ(t.Find(1)->output.at(7), 2);
  // A gap or a repeat is refused and changes nothing; position 0 starts over.
  EXPECT_EQ(t.Observe(1, 7, c, 4).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(t.Observe(2, 3, c, 4).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(t.Find(2), nullptr);
  EXPECT_EQ(t.Find(1)->output.at(7), 2);
  ASSERT_TRUE(t.Observe(1, 0, c, 0).ok());  // recomputed after a preemption, prompt of 0
  EXPECT_TRUE(t.Find(1)->prompt.empty());
  EXPECT_EQ(t.Find(1)->output.at(7), 1);
  t.Release(1);
  EXPECT_EQ(t.Find(1), nullptr);
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

// The sampler's fast paths (one-pass argmax, top_p without sorting the vocabulary) draw what the
// plain rule draws, over random vocabularies with ties, -inf logits and every cut.
TEST(Sampler, DrawsWhatThePlainRuleDraws) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 4.0f);
  int64_t cases = 0;
  for (int64_t vocab : {1, 2, 7, 300, 5000}) {
    for (int trial = 0; trial < 12; ++trial) {
      std::vector<float> logits(vocab);
      for (float& v : logits) v = std::round(nd(rng) * 4.0f) / 4.0f;  // many equal values
      if (vocab > 2) logits[vocab / 2] = -INFINITY;
      if (trial % 3 == 0) logits[vocab - 1] = -0.0f;
      for (float t : {0.0f, 0.3f, 1.0f, 2.5f}) {
        for (float top_p : {1.0f, 0.9f, 0.5f, 0.05f}) {
          for (int top_k : {0, 3, 40}) {
            SamplingConfig c = Temp(t, 1000 + trial);
            c.top_p = top_p;
            c.top_k = top_k;
            c.min_p = trial % 4 == 1 ? 0.05f : 0.0f;
            for (int64_t pos : {0, 9}) {
              ASSERT_EQ(Draw(logits, c, pos), testing_util::ReferenceDraw(logits, c, pos))
                  << "vocab " << vocab << " trial " << trial << " t " << t << " top_p " << top_p
                  << " top_k " << top_k << " position " << pos;
              ++cases;
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(cases, 5 * 12 * 4 * 4 * 3 * 2);
}

// The units in the last place between two positive doubles.
int64_t Ulps(double a, double b) {
  const int64_t d = std::bit_cast<int64_t>(a) - std::bit_cast<int64_t>(b);
  return d < 0 ? -d : d;
}

// WeightExp over xs as the sampler's FillWeights runs it: vectorised (this file is built with
// -fno-trapping-math, as sampler.cc), an AVX2 clone where the CPU has it.
__attribute__((target_clones("avx2", "default"))) void WeightExps(const double* xs, size_t n,
                                                                  double* out) {
  for (size_t i = 0; i < n; ++i) out[i] = WeightExp(xs[i]);
}

// WeightExp against exp over [-708, 0] (a sweep and random points, the ends and the cut), in a
// loop the compiler vectorises and call by call: within 2 ulp, the same bits both ways, 0 below
// -708 and for -inf.
TEST(SamplerMath, WeightExpIsExpWithin2Ulp) {
  std::vector<double> xs = {
      0.0,   -0.0,   -1e-300,   -1e-17, -0.5 * std::log(2.0), -std::log(2.0), -1.0,
      -10.0, -700.0, -707.9999, -708.0};
  for (int i = 0; i <= 200000; ++i) xs.push_back(-708.0 * i / 200000.0);
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> u(-708.0, 0.0);
  for (int i = 0; i < 100000; ++i) xs.push_back(u(rng));
  xs.push_back(-INFINITY);
  xs.push_back(-1e6);
  std::vector<double> looped(xs.size());
  WeightExps(xs.data(), xs.size(), looped.data());
  int64_t worst = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    volatile double x = xs[i];
    const double one = WeightExp(x);
    ASSERT_EQ(std::bit_cast<uint64_t>(one), std::bit_cast<uint64_t>(looped[i])) << xs[i];
    if (xs[i] < -708.0) {
      EXPECT_EQ(one, 0.0) << xs[i];
      continue;
    }
    const int64_t ulps = Ulps(one, std::exp(xs[i]));
    ASSERT_LE(ulps, 2) << "x " << xs[i] << ": " << one << " against " << std::exp(xs[i]);
    worst = std::max(worst, ulps);
  }
  std::printf("WeightExp: %zu points, at most %lld ulp from exp\n", xs.size(),
              static_cast<long long>(worst));
  EXPECT_EQ(WeightExp(0.0), 1.0);
  EXPECT_EQ(WeightExp(-708.0000001), 0.0);
  EXPECT_EQ(WeightExp(-1e6), 0.0);
  EXPECT_EQ(WeightExp(-INFINITY), 0.0);
}

// SumWeights: 8 running sums over the ids = k (mod 8), then pairwise, whatever the length.
TEST(SamplerMath, SumWeightsAddsInItsDocumentedOrder) {
  std::mt19937_64 rng(4);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (size_t n :
       {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{1000}, size_t{129280}}) {
    std::vector<double> w(n);
    for (double& x : w) x = u(rng) * u(rng) * u(rng);
    double s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (size_t i = 0; i < n; ++i) s[i % 8] += w[i];
    const double want = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    EXPECT_EQ(std::bit_cast<uint64_t>(SumWeights(w)), std::bit_cast<uint64_t>(want)) << n;
  }
}

// top_p where the prefix ends past the 16 heaviest bands (the sampler sums those first, over the
// ids a scan finds, and every band only when they fall short) and where it ends inside them:
// the same draws as the plain rule, and the far cut reaches the light ids.
TEST(Sampler, TopPCutsInAndPastTheHeaviestBands) {
  // 49,959 light ids of e^-12 (band 18 beside the likeliest's 1), ~6 % of the weight.
  std::vector<float> logits(50000, -12.0f);
  logits[1234] = 0.0f;
  for (int i = 0; i < 40; ++i) logits[1000 * i + 7] = -1.0f - 0.1f * static_cast<float>(i);
  int light = 0;
  for (const float top_p : {0.99f, 0.9f, 0.6f}) {
    SamplingConfig c = Temp(1.0f, 77);
    c.top_p = top_p;
    for (int64_t pos = 0; pos < 60; ++pos) {
      const int32_t t = Draw(logits, c, pos);
      ASSERT_EQ(t, testing_util::ReferenceDraw(logits, c, pos)) << top_p << " " << pos;
      light += logits[t] == -12.0f ? 1 : 0;
    }
  }
  EXPECT_GT(light, 0);  // top_p 0.99's prefix holds them
}

// The logprob list is the most likely ids in ByLogit order (ties to the lower id), over
// vocabularies large enough for the one-pass selection and small enough for the sort.
TEST(Sampler, TopLogprobsAreTheMostLikelyInOrder) {
  std::mt19937 rng(8);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  for (int64_t vocab : {3, 40, 1000, 20000}) {
    std::vector<float> logits(vocab);
    for (float& v : logits) v = std::round(nd(rng) * 2.0f) / 2.0f;
    std::vector<int32_t> ids(vocab);
    for (int64_t i = 0; i < vocab; ++i) ids[i] = static_cast<int32_t>(i);
    std::stable_sort(ids.begin(), ids.end(),
                     [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
    for (int n : {1, 5, kMaxTopLogprobs}) {
      SamplingConfig c;
      c.top_logprobs = n;
      auto r = SampleToken(logits.data(), vocab, c, 0);
      ASSERT_TRUE(r.ok()) << r.status();
      ASSERT_EQ(static_cast<int64_t>(r->top.size()), std::min<int64_t>(n, vocab));
      for (size_t i = 0; i < r->top.size(); ++i) {
        EXPECT_EQ(r->top[i].first, ids[i]) << "vocab " << vocab << " n " << n << " rank " << i;
      }
    }
  }
}

TEST(Sampler, GreedyTreatsMinusZeroAsZero) {
  EXPECT_EQ(Draw({-1.0f, -0.0f, 0.0f}, Greedy(), 0), 1);
  EXPECT_EQ(Draw({-1.0f, 0.0f, -0.0f}, Greedy(), 0), 1);
  EXPECT_EQ(Draw({-INFINITY, -3.0f}, Greedy(), 0), 1);
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
  std::vector<float> wide(1000, 0.5f);
  wide[777] = INFINITY;
  wide[901] = NAN;
  const auto inf = SampleToken(wide.data(), 1000, SamplingConfig{}, 0).status();
  EXPECT_EQ(inf.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(inf.message().find("token 777 is inf"), std::string::npos) << inf;
  EXPECT_FALSE(SampleToken(logits.data(), 0, SamplingConfig{}, 0).ok());
}

}  // namespace
}  // namespace ss::gpu
