// The checkpoint generator on a config whose shapes differ from tiny-a everywhere (dim 384,
// 6 heads in 3 output groups, hc_mult 2, 8 experts top-3, an indexer with a partial 128-row
// block, one hash layer, five layers + MTP): the output must load, match the schema exactly,
// be the same bytes whether sharded or not, and depend on the seed.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/checkpoint_schema.h"
#include "common/codecs.h"
#include "common/model_config.h"
#include "common/safetensors.h"
#include "tests/tools/checkpoint_generator.h"
#include "tests/tools/test_configs.h"

namespace ss {
namespace {

constexpr const char* kConfig = testing_util::kWideI256Config;

class GeneratorTest : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = new std::filesystem::path(std::filesystem::path(testing::TempDir()) /
                                      ("ss_generator_test_" + std::to_string(getpid())));
    std::filesystem::remove_all(*root_);
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*root_);
    delete root_;
  }
  void SetUp() override {
    auto cfg = ParseModelConfig(kConfig, "generator_test config");
    ASSERT_TRUE(cfg.ok()) << cfg.status();
    cfg_ = *cfg;
  }

  // Generates into root/<sub> and opens it, checking it against the schema.
  std::unique_ptr<Checkpoint> Make(const std::string& sub, uint64_t seed, int shards) {
    const std::string dir = (*root_ / sub).string();
    const absl::Status st = GenerateCheckpoint(cfg_, kConfig, dir, seed, shards);
    EXPECT_TRUE(st.ok()) << st;
    auto ckpt = Checkpoint::Open(dir);
    EXPECT_TRUE(ckpt.ok()) << ckpt.status();
    if (!ckpt.ok()) return nullptr;
    std::vector<std::string> unexpected;
    const absl::Status valid = ValidateCheckpoint(**ckpt, cfg_, &unexpected);
    EXPECT_TRUE(valid.ok()) << valid;
    EXPECT_TRUE(unexpected.empty())
        << unexpected.size() << " unexpected, first " << unexpected.front();
    EXPECT_EQ((*ckpt)->tensors().size(), ExpectedTensors(cfg_).size());
    auto reread = LoadModelConfig(dir);
    EXPECT_TRUE(reread.ok()) << reread.status();
    return std::move(*ckpt);
  }

  static bool SameBytes(const TensorView& a, const TensorView& b) {
    return a.nbytes == b.nbytes && std::memcmp(a.data, b.data, a.nbytes) == 0;
  }

  static inline std::filesystem::path* root_ = nullptr;
  ModelConfig cfg_;
};

TEST_F(GeneratorTest, SingleAndShardedHoldIdenticalTensors) {
  auto single = Make("single", 7, 1);
  auto sharded = Make("sharded", 7, 3);
  ASSERT_NE(single, nullptr);
  ASSERT_NE(sharded, nullptr);
  EXPECT_EQ(single->num_files(), 1u);
  EXPECT_EQ(sharded->num_files(), 3u);
  EXPECT_TRUE(std::filesystem::exists(*root_ / "sharded" / "model.safetensors.index.json"));
  EXPECT_TRUE(std::filesystem::exists(*root_ / "sharded" / "model-00003-of-00003.safetensors"));
  EXPECT_FALSE(std::filesystem::exists(*root_ / "single" / "model.safetensors.index.json"));
  for (const auto& [name, t] : single->tensors()) {
    const TensorView* u = sharded->Find(name);
    ASSERT_NE(u, nullptr) << name;
    EXPECT_TRUE(SameBytes(*t, *u)) << name;
  }
  // Re-generating a directory with another shard count replaces the old files.
  auto resharded = Make("sharded", 7, 1);
  ASSERT_NE(resharded, nullptr);
  EXPECT_EQ(resharded->num_files(), 1u);
}

TEST_F(GeneratorTest, SeedChangesEveryRandomTensor) {
  auto a = Make("seed1", 1, 1);
  auto b = Make("seed2", 2, 1);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  int differing = 0;
  for (const auto& [name, t] : a->tensors()) {
    if (t->dtype == DType::kF8E8M0) continue;  // scales of small blocks may coincide
    const bool same = SameBytes(*t, *b->Find(name));
    EXPECT_FALSE(same) << name;
    differing += !same;
  }
  EXPECT_GT(differing, 0);
}

// Spot checks of the init and the codecs on the generated values.
TEST_F(GeneratorTest, ValuesFollowTheInitAndTheQuantisationRule) {
  auto ckpt = Make("values", 3, 1);
  ASSERT_NE(ckpt, nullptr);

  // Routed w1: std 8/sqrt(384) = 0.408; every group scale is the rule's for its own amax or
  // one step above it (when the fp32 amax rounded down onto 3·s).
  const TensorView* w1 = ckpt->Find("layers.1.ffn.experts.5.w1.weight");
  const TensorView* s1 = ckpt->Find("layers.1.ffn.experts.5.w1.scale");
  ASSERT_NE(w1, nullptr);
  ASSERT_NE(s1, nullptr);
  double sum2 = 0;
  for (int64_t r = 0; r < 256; ++r) {
    for (int64_t g = 0; g < 384 / 32; ++g) {
      const float s = Ue8m0ToFloat(s1->data[r * 12 + g]);
      float amax = 0;
      for (int j = 0; j < 16; ++j) {
        const uint8_t b = w1->data[r * 192 + g * 16 + j];
        for (uint8_t code : {uint8_t(b & 0xf), uint8_t(b >> 4)}) {
          ASSERT_NE(code, 8) << "zero must be code 0";
          const float v = E2m1ToFloat(code) * s;
          amax = std::max(amax, std::fabs(v));
          sum2 += static_cast<double>(v) * v;
        }
      }
      EXPECT_TRUE(amax == 3 * s || Pow2Scale(amax, 0, kE2m1Max) == s) << r << " " << g;
    }
  }
  EXPECT_NEAR(std::sqrt(sum2 / (256 * 384)), 8 / std::sqrt(384.0), 0.05 * 8 / std::sqrt(384.0));

  // Indexer wq_b [192, 256]: the second row block is partial (64 rows).
  const TensorView* iq = ckpt->Find("layers.1.attn.indexer.wq_b.scale");
  ASSERT_NE(iq, nullptr);
  EXPECT_EQ(iq->shape, (std::vector<int64_t>{2, 2}));

  // tid2eid: three distinct experts per token.
  const TensorView* tid = ckpt->Find("layers.0.ffn.gate.tid2eid");
  ASSERT_NE(tid, nullptr);
  std::vector<int64_t> ids(tid->numel());
  std::memcpy(ids.data(), tid->data, tid->nbytes);
  for (int64_t r = 0; r < 640; ++r) {
    const std::set<int64_t> row(ids.begin() + 3 * r, ids.begin() + 3 * r + 3);
    EXPECT_EQ(row.size(), 3u) << r;
    EXPECT_GE(*row.begin(), 0);
    EXPECT_LT(*row.rbegin(), 8);
  }
}

}  // namespace
}  // namespace ss
