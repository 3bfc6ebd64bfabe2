// Loader exactness on the tiny-a checkpoint: every stored code decodes, and the FP8 / MXFP4
// weights are exactly what the spec's quantisation rule makes of their own dequantised values
// (the checkpoint was made with that rule; tests/data/tiny-a/README.md).
//
// One subtlety: the rule picks the scale from the fp32 amax *before* quantisation. When that
// amax rounds down onto the lower half of the range (e4m3: amax/s in (224, 232] -> 224; e2m1:
// amax/s in (3, 3.5) -> 3), the dequantised block's own amax sits exactly on a power-of-two
// boundary and the rule applied to it picks s/2. Those "boundary" blocks are checked with the
// stored scale instead, and must have amax == 224·s (FP8) or 3·s (FP4) exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "common/codecs.h"
#include "common/model_config.h"
#include "common/safetensors.h"

namespace ss {
namespace {

constexpr char kDir[] = "tests/data/tiny-a";

class TinyAWeights : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto cfg = LoadModelConfig(kDir);
    ASSERT_TRUE(cfg.ok()) << cfg.status();
    cfg_ = new ModelConfig(*cfg);
    auto ckpt = Checkpoint::Open(kDir);
    ASSERT_TRUE(ckpt.ok()) << ckpt.status();
    ckpt_ = ckpt->release();
  }
  static void TearDownTestSuite() {
    delete ckpt_;
    delete cfg_;
  }

  // The `.scale` partner of a `.weight`.
  static const TensorView* ScaleOf(const TensorView& w) {
    const std::string name = w.name.substr(0, w.name.size() - 6) + "scale";
    const TensorView* s = ckpt_->Find(name);
    EXPECT_NE(s, nullptr) << "no scale for " << w.name;
    if (s != nullptr) {
      EXPECT_EQ(s->dtype, DType::kF8E8M0) << name;
    }
    return s;
  }

  static inline const ModelConfig* cfg_ = nullptr;
  static inline const Checkpoint* ckpt_ = nullptr;
};

TEST_F(TinyAWeights, DtypeCounts) {
  std::map<DType, int> counts;
  for (const auto& [name, t] : ckpt_->tensors()) ++counts[t->dtype];
  EXPECT_EQ(ckpt_->tensors().size(), 1057u);
  EXPECT_EQ(counts[DType::kBF16], 73);
  EXPECT_EQ(counts[DType::kF32], 75);
  EXPECT_EQ(counts[DType::kF8E4M3], 69);
  EXPECT_EQ(counts[DType::kF8E8M0], 453);
  EXPECT_EQ(counts[DType::kI64], 3);
  EXPECT_EQ(counts[DType::kI8], 384);
}

TEST_F(TinyAWeights, EveryCodeDecodes) {
  for (const auto& [name, t] : ckpt_->tensors()) {
    if (t->dtype == DType::kF8E4M3) {
      for (size_t i = 0; i < t->nbytes; ++i) {
        ASSERT_TRUE(std::isfinite(E4m3ToFloat(t->data[i]))) << name << " byte " << i;
      }
    } else if (t->dtype == DType::kF8E8M0) {
      for (size_t i = 0; i < t->nbytes; ++i) ASSERT_LT(t->data[i], 255) << name << " byte " << i;
    } else if (t->dtype == DType::kI8) {
      ASSERT_TRUE(absl::StrContains(name, ".ffn.experts.")) << name;
      for (size_t i = 0; i < t->nbytes; ++i) {
        for (uint8_t code : {uint8_t(t->data[i] & 0xf), uint8_t(t->data[i] >> 4)}) {
          ASSERT_TRUE(std::isfinite(E2m1ToFloat(code))) << name << " byte " << i;
          ASSERT_NE(code, 8) << name << " byte " << i << ": zero must be written as code 0";
        }
      }
    }
  }
}

TEST_F(TinyAWeights, Tid2eidRowsHoldDistinctExperts) {
  int tables = 0;
  for (const auto& [name, t] : ckpt_->tensors()) {
    if (!absl::EndsWith(name, ".gate.tid2eid")) continue;
    ++tables;
    ASSERT_EQ(t->dtype, DType::kI64);
    ASSERT_EQ(t->shape, (std::vector<int64_t>{cfg_->vocab_size, cfg_->n_activated_experts}));
    std::vector<int64_t> ids(t->numel());
    std::memcpy(ids.data(), t->data, t->nbytes);
    for (int64_t r = 0; r < cfg_->vocab_size; ++r) {
      std::set<int64_t> row;
      for (int64_t k = 0; k < cfg_->n_activated_experts; ++k) {
        const int64_t e = ids[r * cfg_->n_activated_experts + k];
        ASSERT_GE(e, 0) << name << " row " << r;
        ASSERT_LT(e, cfg_->n_routed_experts) << name << " row " << r;
        row.insert(e);
      }
      ASSERT_EQ(row.size(), static_cast<size_t>(cfg_->n_activated_experts))
          << name << " row " << r << " repeats an expert";
    }
  }
  EXPECT_EQ(tables, cfg_->n_hash_layers);
}

// Counts of re-quantised blocks: reproduced by the rule, or on the boundary described above.
struct RequantStats {
  int exact = 0, boundary = 0, zero = 0;
};

TEST_F(TinyAWeights, Fp8BlocksRequantiseExactly) {
  RequantStats st;
  for (const auto& [name, w] : ckpt_->tensors()) {
    if (w->dtype != DType::kF8E4M3) continue;
    const TensorView* sc = ScaleOf(*w);
    ASSERT_NE(sc, nullptr);
    ASSERT_EQ(w->shape.size(), 2u);
    const int64_t rows = w->shape[0], cols = w->shape[1];
    const int64_t sb_cols = (cols + 127) / 128;
    ASSERT_EQ(sc->shape, (std::vector<int64_t>{(rows + 127) / 128, sb_cols})) << name;
    for (int64_t br = 0; br < rows; br += 128) {
      for (int64_t bc = 0; bc < cols; bc += 128) {
        const uint8_t sbyte = sc->data[(br / 128) * sb_cols + bc / 128];
        const float s = Ue8m0ToFloat(sbyte);
        const int64_t r1 = std::min(rows, br + 128), c1 = std::min(cols, bc + 128);
        float amax = 0;
        for (int64_t r = br; r < r1; ++r) {
          for (int64_t c = bc; c < c1; ++c) {
            amax = std::max(amax, std::fabs(E4m3ToFloat(w->data[r * cols + c]) * s));
          }
        }
        if (amax == 0) {
          ++st.zero;
          continue;
        }
        float s_rule = Pow2Scale(amax, 0.0f, kE4m3Max);
        if (s_rule != s) {
          ASSERT_EQ(s_rule * 2, s) << name << " block (" << br << ", " << bc << ")";
          ASSERT_EQ(amax, 224.0f * s) << name << " block (" << br << ", " << bc << ")";
          ++st.boundary;
          s_rule = s;
        } else {
          ++st.exact;
        }
        ASSERT_EQ(Ue8m0FromPow2(s_rule), sbyte);
        for (int64_t r = br; r < r1; ++r) {
          for (int64_t c = bc; c < c1; ++c) {
            const uint8_t stored = w->data[r * cols + c];
            const uint8_t again = FloatToE4m3(E4m3ToFloat(stored) * s / s_rule);
            ASSERT_EQ(again, stored) << name << " [" << r << ", " << c << "]";
          }
        }
      }
    }
  }
  std::printf("FP8 blocks: %d reproduced by the rule, %d on the 224·s boundary, %d all-zero\n",
              st.exact, st.boundary, st.zero);
  EXPECT_GT(st.exact, 0);
  EXPECT_LT(st.boundary, st.exact / 10 + 1);
}

TEST_F(TinyAWeights, Fp4GroupsRequantiseExactly) {
  RequantStats st;
  for (const auto& [name, w] : ckpt_->tensors()) {
    if (w->dtype != DType::kI8) continue;
    const TensorView* sc = ScaleOf(*w);
    ASSERT_NE(sc, nullptr);
    const int64_t rows = w->shape[0], in = w->shape[1] * 2;
    ASSERT_EQ(in % 32, 0) << name;
    ASSERT_EQ(sc->shape, (std::vector<int64_t>{rows, in / 32})) << name;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t g = 0; g < in / 32; ++g) {
        const uint8_t sbyte = sc->data[r * (in / 32) + g];
        const float s = Ue8m0ToFloat(sbyte);
        const uint8_t* bytes = w->data + r * (in / 2) + g * 16;
        float v[32];
        float amax = 0;
        for (int j = 0; j < 16; ++j) {
          v[2 * j] = E2m1ToFloat(bytes[j] & 0xf) * s;  // element 2j: low nibble
          v[2 * j + 1] = E2m1ToFloat(bytes[j] >> 4) * s;
          amax = std::max({amax, std::fabs(v[2 * j]), std::fabs(v[2 * j + 1])});
        }
        if (amax == 0) {
          ++st.zero;
          continue;
        }
        float s_rule = Pow2Scale(amax, 0.0f, kE2m1Max);
        if (s_rule != s) {
          ASSERT_EQ(s_rule * 2, s) << name << " row " << r << " group " << g;
          ASSERT_EQ(amax, 3.0f * s) << name << " row " << r << " group " << g;
          ++st.boundary;
          s_rule = s;
        } else {
          ++st.exact;
        }
        ASSERT_EQ(Ue8m0FromPow2(s_rule), sbyte);
        for (int j = 0; j < 16; ++j) {
          const uint8_t again = static_cast<uint8_t>(FloatToE2m1(v[2 * j] / s_rule) |
                                                     (FloatToE2m1(v[2 * j + 1] / s_rule) << 4));
          ASSERT_EQ(again, bytes[j]) << name << " row " << r << " byte " << g * 16 + j;
        }
      }
    }
  }
  std::printf("FP4 groups: %d reproduced by the rule, %d on the 3·s boundary, %d all-zero\n",
              st.exact, st.boundary, st.zero);
  EXPECT_GT(st.exact, st.boundary);
}

}  // namespace
}  // namespace ss
