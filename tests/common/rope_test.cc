// RoPE / YaRN frequencies and rotations (spec §3.5), checked against the definition and the
// demo's own cos/sin tables in tests/data/tiny-a/golden.safetensors.
#include "common/rope.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "common/bf16.h"
#include "common/model_config.h"
#include "common/safetensors.h"

namespace ss {
namespace {

constexpr int kRopeDim = 64;
constexpr int kPairs = kRopeDim / 2;

double BaseFreq(double base, int i) { return std::pow(base, -2.0 * i / kRopeDim); }

TEST(RopeFrequencies, Base10000WithoutYarn) {
  const std::vector<float> f = RopeFrequencies(kRopeDim, 10000, nullptr);
  ASSERT_EQ(f.size(), static_cast<size_t>(kPairs));
  EXPECT_EQ(f[0], 1.0f);
  for (int i = 0; i < kPairs; ++i) {
    EXPECT_NEAR(f[i], BaseFreq(10000, i), 1e-6 * BaseFreq(10000, i)) << "pair " << i;
  }
}

TEST(RopeFrequencies, YarnBase160000) {
  const YarnConfig yarn;  // factor 16, L0 65536, beta_fast 32, beta_slow 1
  const std::vector<float> plain = RopeFrequencies(kRopeDim, 160000, nullptr);
  const std::vector<float> f = RopeFrequencies(kRopeDim, 160000, &yarn);
  ASSERT_EQ(f.size(), static_cast<size_t>(kPairs));
  // corr(32) = 15.45 -> low 15; corr(1) = 24.71 -> high 25.
  for (int i = 0; i < kPairs; ++i) {
    const double base = BaseFreq(160000, i);
    EXPECT_NEAR(plain[i], base, 1e-6 * base) << "pair " << i;
    if (i <= 15) {
      EXPECT_EQ(f[i], plain[i]) << "pair " << i << " must keep its frequency";
    } else if (i >= 25) {
      EXPECT_EQ(f[i], plain[i] / 16.0f) << "pair " << i << " must be divided by 16";
    } else {
      const double ramp = (i - 15) / 10.0;
      const double want = base * (1 - ramp) + base / 16 * ramp;
      EXPECT_NEAR(f[i], want, 1e-6 * want) << "pair " << i;
      EXPECT_LT(f[i], plain[i]);
      EXPECT_GT(f[i], plain[i] / 16.0f);
    }
  }
}

TEST(RopeFrequencies, LayerTablesFollowTheCompressRatio) {
  auto cfg = LoadModelConfig("tests/data/tiny-a");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  const YarnConfig yarn;
  EXPECT_EQ(LayerRopeFrequencies(*cfg, 0), RopeFrequencies(kRopeDim, 10000, nullptr));
  EXPECT_EQ(LayerRopeFrequencies(*cfg, 4), RopeFrequencies(kRopeDim, 160000, &yarn));
  EXPECT_EQ(LayerRopeFrequencies(*cfg, 128), RopeFrequencies(kRopeDim, 160000, &yarn));
}

// Max |ours - golden| over all positions, pairs and both of cos/sin.
double MaxErrorVsGolden(const Checkpoint& golden, const std::string& name,
                        const std::vector<float>& freqs) {
  auto t = golden.Get(name, DType::kF32, {512, kPairs, 2});
  EXPECT_TRUE(t.ok()) << t.status();
  if (!t.ok()) return INFINITY;
  std::vector<float> table(512 * kPairs * 2);
  std::memcpy(table.data(), (*t)->data, table.size() * sizeof(float));
  double max_err = 0;
  float c[kPairs], s[kPairs];
  for (int p = 0; p < 512; ++p) {
    RopeCosSin(freqs, p, c, s);
    for (int i = 0; i < kPairs; ++i) {
      const float* g = &table[(p * kPairs + i) * 2];
      max_err = std::max({max_err, std::fabs(static_cast<double>(c[i]) - g[0]),
                          std::fabs(static_cast<double>(s[i]) - g[1])});
    }
  }
  return max_err;
}

TEST(RopeCosSin, MatchesGoldenTables) {
  auto golden = Checkpoint::OpenFiles({"tests/data/tiny-a/golden.safetensors"});
  ASSERT_TRUE(golden.ok()) << golden.status();
  auto cfg = LoadModelConfig("tests/data/tiny-a");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  const double err_m0 =
      MaxErrorVsGolden(**golden, "rope.freqs_cis.m0", LayerRopeFrequencies(*cfg, 0));
  const double err_c =
      MaxErrorVsGolden(**golden, "rope.freqs_cis.compressed", LayerRopeFrequencies(*cfg, 4));
  std::printf("max |cos/sin - golden|: m0 %.3g, compressed %.3g\n", err_m0, err_c);
  RecordProperty("max_err_m0", std::to_string(err_m0));
  RecordProperty("max_err_compressed", std::to_string(err_c));
  EXPECT_LE(err_m0, 2e-6);
  EXPECT_LE(err_c, 2e-6);
}

TEST(RopeCosSin, PositionZeroIsIdentity) {
  const std::vector<float> f = RopeFrequencies(kRopeDim, 10000, nullptr);
  float c[kPairs], s[kPairs];
  RopeCosSin(f, 0, c, s);
  for (int i = 0; i < kPairs; ++i) {
    EXPECT_EQ(c[i], 1.0f);
    EXPECT_EQ(s[i], 0.0f);
  }
}

TEST(ApplyRope, InterleavedPairsAndInverse) {
  const YarnConfig yarn;
  const std::vector<float> f = RopeFrequencies(kRopeDim, 160000, &yarn);
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  float c[kPairs], s[kPairs];
  for (int64_t pos : {0, 1, 7, 300, 4095, 65537}) {
    RopeCosSin(f, pos, c, s);
    std::vector<float> v(kRopeDim);
    for (float& x : v) x = RoundBf16(nd(rng));
    std::vector<float> w = v;
    ApplyRope(w.data(), kPairs, c, s, /*inverse=*/false);
    for (int i = 0; i < kPairs; ++i) {
      const float a = v[2 * i], b = v[2 * i + 1];
      EXPECT_EQ(w[2 * i], RoundBf16(a * c[i] - b * s[i]));
      EXPECT_EQ(w[2 * i + 1], RoundBf16(a * s[i] + b * c[i]));
    }
    ApplyRope(w.data(), kPairs, c, s, /*inverse=*/true);
    for (int i = 0; i < kPairs; ++i) {
      const float norm = std::hypot(v[2 * i], v[2 * i + 1]);
      // Two bf16 roundings of values bounded by the pair's norm.
      EXPECT_NEAR(w[2 * i], v[2 * i], norm * 0x1p-7) << "pos " << pos << " pair " << i;
      EXPECT_NEAR(w[2 * i + 1], v[2 * i + 1], norm * 0x1p-7) << "pos " << pos << " pair " << i;
    }
  }
}

}  // namespace
}  // namespace ss
