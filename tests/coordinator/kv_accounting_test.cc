// KV cost model (exact DeepSeek-V4 numbers of spec §4.3) and the block allocator.
#include "coordinator/kv_accounting.h"

#include <algorithm>
#include <cstdlib>
#include <random>
#include <set>
#include <vector>

#include "common/model_config.h"
#include "gtest/gtest.h"
#include "tests/tools/test_configs.h"

namespace ss::sched {
namespace {

// DeepSeek-V4-Flash's config.json (tests/tools/test_configs.h).
ModelConfig FlashConfig() {
  auto c = ParseModelConfig(testing_util::kFlashConfig, "Flash config.json");
  if (!c.ok()) std::abort();
  return *c;
}

TEST(KvCostModelTest, FlashMatchesSpecPerTokenAndPerSequence) {
  auto m = KvCostModel::FromModelConfig(FlashConfig());
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->block_tokens, 128);
  // 21 CSA x 32 entries x (584 + 132) + 20 HCA x 1 x 584 = 128 x 3,850.25 B (spec §4.3).
  EXPECT_EQ(m->block_bytes, 21 * 32 * 716 + 20 * 584);
  EXPECT_EQ(m->block_bytes * 4, 128 * 15401);
  // Windows of 44 layers (3.29 MB) + compressor state (12.2 MB, spec §4.3).
  const int64_t windows = 44 * 128 * 584;
  const int64_t compressors = 21 * (2 * 8 * 1024 * 4 + 2 * 8 * 256 * 4) + 20 * (2 * 128 * 512 * 4);
  EXPECT_EQ(windows, 3'289'088);
  EXPECT_EQ(compressors, 12'206'080);
  EXPECT_EQ(m->fixed_bytes, windows + compressors);
  EXPECT_EQ(m->fixed_blocks, 32);  // ceil(15,495,168 / 492,832)

  EXPECT_EQ(m->BlocksForTokens(0), 0);
  EXPECT_EQ(m->BlocksForTokens(1), 33);
  EXPECT_EQ(m->BlocksForTokens(128), 33);
  EXPECT_EQ(m->BlocksForTokens(129), 34);
  EXPECT_EQ(m->BlocksForTokens(1 << 20), 32 + 8192);
  EXPECT_EQ(m->TokensInBlocks(32), 0);
  EXPECT_EQ(m->TokensInBlocks(34), 256);
  // A 24 GB pool holds 48,698 blocks: 6.2 M tokens of one sequence, or 169 sequences of 32 K
  // tokens (190 if the fixed state were not counted).
  EXPECT_EQ(m->BlocksInPool(24'000'000'000), 48'698);
  EXPECT_EQ(48'698 / m->BlocksForTokens(32 * 1024), 169);
  EXPECT_EQ(48'698 / (32 * 1024 / 128), 190);
}

TEST(KvCostModelTest, OptionsChangeTheFormulaAsDocumented) {
  const ModelConfig c = FlashConfig();
  auto no_mtp = KvCostModel::FromModelConfig(c, {.include_mtp = false});
  ASSERT_TRUE(no_mtp.ok());
  EXPECT_EQ(no_mtp->fixed_bytes, 43 * 128 * 584 + 12'206'080);

  auto mxfp4 = KvCostModel::FromModelConfig(c, {.indexer_keys = IndexerKeyFormat::kMxfp4});
  ASSERT_TRUE(mxfp4.ok());
  EXPECT_EQ(mxfp4->block_bytes, 21 * 32 * (584 + 68) + 20 * 584);

  auto b256 = KvCostModel::FromModelConfig(c, {.block_tokens = 256});
  ASSERT_TRUE(b256.ok());
  EXPECT_EQ(b256->block_bytes, 2 * (21 * 32 * 716 + 20 * 584));
  EXPECT_EQ(b256->fixed_blocks, 16);

  // A two-stage pipeline: layers [0, 22) and [22, 43) + MTP.
  auto s0 = KvCostModel::FromModelConfig(c, {.end_layer = 22, .include_mtp = false});
  auto s1 = KvCostModel::FromModelConfig(c, {.first_layer = 22});
  ASSERT_TRUE(s0.ok() && s1.ok());
  EXPECT_EQ(s0->block_bytes + s1->block_bytes, no_mtp->block_bytes);
  EXPECT_EQ(s0->fixed_bytes + s1->fixed_bytes, KvCostModel::FromModelConfig(c)->fixed_bytes);
  const KvCostModel stages[] = {*s0, *s1};
  auto pipe = KvCostModel::Pipeline(stages);
  ASSERT_TRUE(pipe.ok());
  EXPECT_EQ(pipe->fixed_blocks, std::max(s0->fixed_blocks, s1->fixed_blocks));
}

TEST(KvCostModelTest, RejectsLayoutsItCannotCountExactly) {
  const ModelConfig c = FlashConfig();
  // A block of 64 tokens would hold half an HCA entry.
  auto b64 = KvCostModel::FromModelConfig(c, {.block_tokens = 64});
  EXPECT_FALSE(b64.ok());
  EXPECT_NE(b64.status().message().find("compress ratio 128"), std::string::npos) << b64.status();
  EXPECT_FALSE(KvCostModel::FromModelConfig(c, {.block_tokens = 0}).ok());
  EXPECT_FALSE(KvCostModel::FromModelConfig(c, {.first_layer = 5, .end_layer = 5}).ok());
  EXPECT_FALSE(KvCostModel::FromModelConfig(c, {.end_layer = 44}).ok());
  // SWA-only layers do not grow: not countable in blocks.
  auto swa = KvCostModel::FromModelConfig(c, {.end_layer = 2, .include_mtp = false});
  EXPECT_FALSE(swa.ok());
  EXPECT_NE(swa.status().message().find("does not grow"), std::string::npos) << swa.status();
  ModelConfig bad = c;
  bad.compress_ratios.pop_back();
  EXPECT_FALSE(KvCostModel::FromModelConfig(bad).ok());
  const KvCostModel a{.block_tokens = 128, .block_bytes = 1, .fixed_bytes = 1, .fixed_blocks = 1};
  const KvCostModel b{.block_tokens = 256, .block_bytes = 1, .fixed_bytes = 1, .fixed_blocks = 1};
  const KvCostModel mixed[] = {a, b};
  EXPECT_FALSE(KvCostModel::Pipeline(mixed).ok());
  EXPECT_FALSE(KvCostModel::Pipeline({}).ok());
}

TEST(KvCostModelTest, TinyA) {
  auto config = LoadModelConfig(SS_TINY_A_DIR);
  ASSERT_TRUE(config.ok()) << config.status();
  auto m = KvCostModel::FromModelConfig(*config);
  ASSERT_TRUE(m.ok()) << m.status();
  // head_dim 128: entries of 64 e4m3 + 64 bf16 rope + 1 scale padded to 8 = 200 B.
  // 3 CSA (2, 4, 6), 2 HCA (3, 5), 8 windows of 16 (incl. MTP).
  EXPECT_EQ(m->block_bytes, 3 * 32 * (200 + 132) + 2 * 200);
  EXPECT_EQ(m->fixed_bytes,
            8 * 16 * 200 + 3 * (2 * 8 * 256 * 4 + 2 * 8 * 256 * 4) + 2 * (2 * 128 * 128 * 4));
  EXPECT_EQ(m->fixed_blocks, 12);
}

KvCostModel Small() {  // 4 tokens per block, 1 fixed block per sequence
  return {.block_tokens = 4, .block_bytes = 100, .fixed_bytes = 60, .fixed_blocks = 1};
}

TEST(KvAccountingTest, GrowsReleasesAndNeverExceedsThePool) {
  auto kv = KvAccounting::Create(Small(), 8);
  ASSERT_TRUE(kv.ok());
  EXPECT_EQ(kv->free_blocks(), 8);
  EXPECT_EQ(kv->Grow(1, 5), KvGrow::kOk);  // 1 fixed + 2
  EXPECT_EQ(std::vector<int32_t>(kv->BlockTable(1).begin(), kv->BlockTable(1).end()),
            (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(kv->TokensCovered(1), 8);
  EXPECT_EQ(kv->TokensReachable(1), 28);
  EXPECT_EQ(kv->Grow(1, 8), KvGrow::kOk);  // covered already
  EXPECT_EQ(kv->BlocksHeld(1), 3);
  EXPECT_EQ(kv->Grow(1, 2), KvGrow::kOk);  // never shrinks
  EXPECT_EQ(kv->BlocksHeld(1), 3);
  // 1 + 5 blocks for 20 tokens, 5 free: refused, nothing taken.
  EXPECT_EQ(kv->Grow(2, 20), KvGrow::kOutOfBlocks);
  EXPECT_EQ(kv->BlocksHeld(2), 0);
  EXPECT_EQ(kv->free_blocks(), 5);
  EXPECT_EQ(kv->Grow(2, 16), KvGrow::kOk);
  EXPECT_EQ(kv->free_blocks(), 0);
  EXPECT_EQ(kv->TokensReachable(1), kv->TokensCovered(1));
  EXPECT_EQ(kv->Grow(1, 9), KvGrow::kOutOfBlocks);
  kv->Release(1);
  kv->Release(1);  // no-op
  EXPECT_EQ(kv->free_blocks(), 3);
  EXPECT_TRUE(kv->BlockTable(1).empty());
  EXPECT_EQ(kv->Grow(3, 1), KvGrow::kOk);  // reuses the freed blocks first
  EXPECT_EQ(kv->BlockTable(3)[0], 0);
  EXPECT_EQ(kv->BlockTable(3)[1], 1);
  kv->Release(2);
  kv->Release(3);
  EXPECT_EQ(kv->free_blocks(), kv->total_blocks());
  EXPECT_EQ(kv->num_sequences(), 0);
}

TEST(KvAccountingTest, RejectsBadPools) {
  EXPECT_FALSE(KvAccounting::Create(Small(), 0).ok());
  EXPECT_FALSE(KvAccounting::Create(Small(), int64_t{1} << 31).ok());
  EXPECT_FALSE(KvAccounting::Create(KvCostModel{}, 8).ok());
}

// Random grows and releases: block ids are never shared, the pool is never exceeded, and
// everything comes back.
TEST(KvAccountingTest, RandomizedNoLeakNoSharing) {
  std::mt19937_64 rng(7);
  auto kv = KvAccounting::Create(Small(), 64);
  ASSERT_TRUE(kv.ok());
  std::vector<int64_t> tokens(10, 0);
  for (int it = 0; it < 20000; ++it) {
    const KvSequenceId seq = rng() % tokens.size();
    if (rng() % 5 == 0) {
      kv->Release(seq);
      tokens[seq] = 0;
    } else {
      const int64_t want = tokens[seq] + static_cast<int64_t>(rng() % 12);
      const int64_t free_before = kv->free_blocks();
      const int64_t need = Small().BlocksForTokens(want) - kv->BlocksHeld(seq);
      const KvGrow g = kv->Grow(seq, want);
      EXPECT_EQ(g == KvGrow::kOk, need <= free_before);
      if (g == KvGrow::kOk) tokens[seq] = std::max(tokens[seq], want);
      if (g != KvGrow::kOk) {
        EXPECT_EQ(kv->free_blocks(), free_before);
      }
    }
    std::set<int32_t> seen;
    int64_t held = 0;
    for (KvSequenceId s = 0; s < tokens.size(); ++s) {
      EXPECT_EQ(kv->BlocksHeld(s), Small().BlocksForTokens(tokens[s]));
      for (const int32_t b : kv->BlockTable(s)) {
        ASSERT_TRUE(b >= 0 && b < 64);
        ASSERT_TRUE(seen.insert(b).second) << "block " << b << " in two tables";
      }
      held += kv->BlocksHeld(s);
    }
    ASSERT_EQ(held, kv->used_blocks());
  }
  for (KvSequenceId s = 0; s < tokens.size(); ++s) kv->Release(s);
  EXPECT_EQ(kv->free_blocks(), 64);
}

}  // namespace
}  // namespace ss::sched
