// The fp8_ds_mla KV record codec (spec §4.2): layout, bit-exact round trip of FP8-simulated
// entries (including the 224·s edge case and all-zero tiles), and the quantisation error bound
// of entries that were not FP8-simulated.
#include "common/kv_record.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "common/bf16.h"
#include "common/codecs.h"

namespace ss {
namespace {

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// A bf16-valued entry whose nope tiles have very different magnitudes (2^-20 .. 2^6).
std::vector<float> RandomEntry(std::mt19937_64& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int> ex(-20, 6);
  std::vector<float> e(kKvDim);
  for (int t = 0; t < kKvTiles + 1; ++t) {
    const float mag = std::ldexp(1.0f, ex(rng));
    for (int i = 0; i < kKvTile; ++i) e[t * kKvTile + i] = RoundBf16(nd(rng) * mag);
  }
  return e;
}

void Fp8Sim(std::vector<float>& e) { Fp8SimInplace(e.data(), kKvNopeDim, kKvTile, true); }

// Encodes, decodes, and expects every float of `e` back bit for bit (signed zeros included).
void ExpectExactRoundTrip(const std::vector<float>& e, const char* what) {
  std::vector<uint8_t> rec(kKvRecordBytes, 0xcd);
  EncodeKvRecord(e.data(), rec.data());
  EXPECT_EQ(rec[kKvPadOffset], 0) << what;
  std::vector<float> d(kKvDim);
  DecodeKvRecord(rec.data(), d.data());
  for (int i = 0; i < kKvDim; ++i) {
    ASSERT_EQ(Bits(d[i]), Bits(e[i])) << what << " dim " << i << ": " << d[i] << " vs " << e[i];
  }
}

TEST(KvRecord, LayoutSizesAndOffsets) {
  EXPECT_EQ(kKvRecordBytes, 584u);
  EXPECT_EQ(kKvNopeOffset, 0u);
  EXPECT_EQ(kKvRopeOffset, 448u);
  EXPECT_EQ(kKvScaleOffset, 576u);
  EXPECT_EQ(kKvPadOffset, 583u);
  EXPECT_EQ(kKvTiles, 7);
  EXPECT_EQ(kKvNopeDim + 2 * kKvRopeDim + kKvTiles + 1, 584);
}

TEST(KvRecord, FieldsLandWhereTheLayoutSays) {
  std::vector<float> e(kKvDim, 0.0f);
  e[0] = 1.0f;                // tile 0: amax 1 -> s = 2^-8 (1/448 rounded up), q = 256
  e[64 * 3 + 5] = -448.0f;    // tile 3: s = 1, code 0xfe
  e[kKvNopeDim] = 1.5f;       // rope dim 0: bf16 0x3fc0
  e[kKvDim - 1] = -2.0f;      // rope dim 63: bf16 0xc000
  std::vector<uint8_t> rec(kKvRecordBytes);
  EncodeKvRecord(e.data(), rec.data());
  EXPECT_EQ(rec[kKvScaleOffset + 0], 127 - 8);
  EXPECT_EQ(rec[0], FloatToE4m3(256.0f));
  EXPECT_EQ(rec[kKvScaleOffset + 3], 127);
  EXPECT_EQ(rec[64 * 3 + 5], 0xfe);
  EXPECT_EQ(rec[kKvRopeOffset], 0xc0);
  EXPECT_EQ(rec[kKvRopeOffset + 1], 0x3f);
  EXPECT_EQ(rec[kKvScaleOffset - 2], 0x00);
  EXPECT_EQ(rec[kKvScaleOffset - 1], 0xc0);
  EXPECT_EQ(rec[kKvScaleOffset + 1], Ue8m0FromPow2(Pow2Scale(0.0f, kFp8AmaxFloor, kE4m3Max)));
  EXPECT_EQ(rec[kKvPadOffset], 0);
}

TEST(KvRecord, Fp8SimulatedEntriesRoundTripBitExact) {
  std::mt19937_64 rng(584);
  for (int n = 0; n < 2000; ++n) {
    std::vector<float> e = RandomEntry(rng);
    Fp8Sim(e);
    ExpectExactRoundTrip(e, "random fp8-simulated entry");
  }
}

TEST(KvRecord, RoundedMaxOn224TimesScaleHalvesTheScaleButStaysExact) {
  std::mt19937_64 rng(224);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  int halved = 0;
  for (const int k : {-12, -3, 0, 2}) {
    const float s = std::ldexp(1.0f, k);
    std::vector<float> e(kKvDim);
    for (int t = 0; t < kKvTiles; ++t) {
      // amax 230·s gives the scale s, and e4m3(230) = 224: after the simulation the max is 224·s.
      for (int i = 0; i < kKvTile; ++i) e[t * kKvTile + i] = RoundBf16(nd(rng) * 8.0f * s);
      e[t * kKvTile + (t * 9) % kKvTile] = (t % 2 ? -230.0f : 230.0f) * s;
      e[t * kKvTile + (t * 9 + 1) % kKvTile] = 0.0021f * s;  // subnormal on the s grid
    }
    for (int i = kKvNopeDim; i < kKvDim; ++i) e[i] = RoundBf16(nd(rng));
    std::vector<float> orig = e;
    EXPECT_EQ(Pow2Scale(230.0f * s, kFp8AmaxFloor, kE4m3Max), s);
    Fp8Sim(e);
    std::vector<uint8_t> rec(kKvRecordBytes);
    EncodeKvRecord(e.data(), rec.data());
    for (int t = 0; t < kKvTiles; ++t) {
      EXPECT_EQ(std::fabs(e[t * kKvTile + (t * 9) % kKvTile]), 224.0f * s);
      if (Ue8m0ToFloat(rec[kKvScaleOffset + t]) == s * 0.5f) ++halved;
    }
    ExpectExactRoundTrip(e, "224*s edge case");
  }
  EXPECT_EQ(halved, 4 * kKvTiles);
}

TEST(KvRecord, ZeroAndTinyTilesRoundTripBitExact) {
  std::mt19937_64 rng(7);
  std::vector<float> e = RandomEntry(rng);
  for (int i = 0; i < kKvTile; ++i) e[i] = 0.0f;                      // all +0
  for (int i = 0; i < kKvTile; ++i) e[kKvTile + i] = i % 2 ? -0.0f : 0.0f;  // signed zeros
  for (int i = 0; i < kKvTile; ++i) e[2 * kKvTile + i] = RoundBf16(1e-7f * (i - 32));  // < floor
  for (int i = kKvNopeDim; i < kKvDim; ++i) e[i] = i % 3 ? 0.0f : -0.0f;
  Fp8Sim(e);
  EXPECT_TRUE(std::signbit(e[kKvTile + 1]));
  ExpectExactRoundTrip(e, "zero / tiny tiles");
  std::vector<float> z(kKvDim, 0.0f);
  ExpectExactRoundTrip(z, "all-zero entry");
}

TEST(KvRecord, NonSimulatedEntriesDecodeWithinHalfAnE4m3Ulp) {
  std::mt19937_64 rng(99);
  for (int n = 0; n < 500; ++n) {
    const std::vector<float> e = RandomEntry(rng);
    std::vector<uint8_t> rec(kKvRecordBytes);
    EncodeKvRecord(e.data(), rec.data());
    std::vector<float> d(kKvDim);
    DecodeKvRecord(rec.data(), d.data());
    for (int t = 0; t < kKvTiles; ++t) {
      float amax = 0.0f;
      for (int i = 0; i < kKvTile; ++i) amax = std::max(amax, std::fabs(e[t * kKvTile + i]));
      const float s = Pow2Scale(amax, kFp8AmaxFloor, kE4m3Max);
      ASSERT_EQ(Ue8m0ToFloat(rec[kKvScaleOffset + t]), s);
      for (int i = 0; i < kKvTile; ++i) {
        const int k = t * kKvTile + i;
        const double v = std::fabs(static_cast<double>(e[k]) / s);
        ASSERT_LE(v, 448.0);
        const double ulp = v < 0x1p-6 ? 0x1p-9 : std::ldexp(1.0, std::ilogb(v) - 3);
        ASSERT_LE(std::fabs(static_cast<double>(d[k]) - e[k]), 0.5 * ulp * s)
            << "dim " << k << " x=" << e[k] << " s=" << s;
        EXPECT_EQ(RoundBf16(d[k]), d[k]) << "decoded value is bf16-representable";
        EXPECT_EQ(d[k], E4m3ToFloat(FloatToE4m3(e[k] / s)) * s);
      }
    }
    for (int i = kKvNopeDim; i < kKvDim; ++i) ASSERT_EQ(Bits(d[i]), Bits(e[i])) << "rope " << i;
  }
}

}  // namespace
}  // namespace ss
