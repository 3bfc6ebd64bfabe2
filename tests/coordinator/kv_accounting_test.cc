// KV cost model (exact DeepSeek-V4 numbers of spec §4.3) and the block allocator.
#include "coordinator/kv_accounting.h"

#include <algorithm>
#include <cstdlib>
#include <map>
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
  EXPECT_EQ(m->entry_bytes, 584);       // 448 e4m3 + 64 bf16 rope + 7 ue8m0 + 1 pad
  EXPECT_EQ(m->index_entry_bytes, 68);  // MXFP4 key: 64 nibble bytes + 4 ue8m0 (the default)
  // 21 CSA x 32 entries x (584 + 68) + 20 HCA x 1 x 584 = 128 x 3,514.25 B; a multiple of 8.
  EXPECT_EQ(m->block_bytes, 21 * 32 * 652 + 20 * 584);
  EXPECT_EQ(m->block_bytes, 449'824);
  EXPECT_EQ(m->block_bytes * 4, 128 * 14057);
  // The fixed part in the pool is the window rings only: 44 layers (incl. MTP) x 128 entries,
  // 770 whole entries per block -> 8 window blocks.
  EXPECT_EQ(m->fixed_bytes, 44 * 128 * 584);
  EXPECT_EQ(m->fixed_bytes, 3'289'088);
  EXPECT_EQ(m->windows_per_block, 449'824 / 584);
  EXPECT_EQ(m->windows_per_block, 770);
  EXPECT_EQ(m->fixed_blocks, 8);  // ceil(5,632 / 770)
  // Compressor state, fp32, outside the pool (12.2 MB, spec §4.3): not counted in blocks.
  const int64_t compressors = 21 * (2 * 8 * 1024 * 4 + 2 * 8 * 256 * 4) + 20 * (2 * 128 * 512 * 4);
  EXPECT_EQ(compressors, 12'206'080);
  EXPECT_EQ(m->state_bytes, compressors);

  EXPECT_EQ(m->BlocksForTokens(0), 0);
  EXPECT_EQ(m->BlocksForTokens(1), 9);
  EXPECT_EQ(m->BlocksForTokens(128), 9);
  EXPECT_EQ(m->BlocksForTokens(129), 10);
  EXPECT_EQ(m->BlocksForTokens(1 << 20), 8 + 8192);
  EXPECT_EQ(m->TokensInBlocks(8), 0);
  EXPECT_EQ(m->TokensInBlocks(10), 256);
  // A 24 GB pool holds 53,354 blocks: 6.8 M tokens of one sequence, or 202 sequences of 32 K
  // tokens (208 if the windows were not counted).
  EXPECT_EQ(m->BlocksInPool(24'000'000'000), 53'354);
  EXPECT_EQ(53'354 / m->BlocksForTokens(32 * 1024), 202);
  EXPECT_EQ(53'354 / (32 * 1024 / 128), 208);
  EXPECT_NE(m->DebugString().find("state_bytes=12206080"), std::string::npos) << m->DebugString();
}

TEST(KvCostModelTest, OptionsChangeTheFormulaAsDocumented) {
  const ModelConfig c = FlashConfig();
  // Without MTP: 43 rings, still 8 blocks of 770 entries; the MTP layer has no compressor.
  auto no_mtp = KvCostModel::FromModelConfig(c, {.include_mtp = false});
  ASSERT_TRUE(no_mtp.ok());
  EXPECT_EQ(no_mtp->block_bytes, 449'824);
  EXPECT_EQ(no_mtp->fixed_bytes, 43 * 128 * 584);
  EXPECT_EQ(no_mtp->fixed_blocks, 8);  // ceil(5,504 / 770)
  EXPECT_EQ(no_mtp->state_bytes, 12'206'080);

  // FP8 indexer keys (132 B): bigger blocks hold more ring entries, so 7 window blocks.
  auto fp8 = KvCostModel::FromModelConfig(c, {.indexer_keys = IndexerKeyFormat::kFp8});
  ASSERT_TRUE(fp8.ok());
  EXPECT_EQ(fp8->index_entry_bytes, 132);
  EXPECT_EQ(fp8->block_bytes, 21 * 32 * 716 + 20 * 584);
  EXPECT_EQ(fp8->windows_per_block, 843);  // floor(492,832 / 584)
  EXPECT_EQ(fp8->fixed_blocks, 7);         // ceil(5,632 / 843)

  // bf16 entries (the cuda pool's records without FP8 rounding): 2 x 512 B each.
  auto bf16 = KvCostModel::FromModelConfig(
      c, {.include_mtp = false, .main_entries = MainEntryFormat::kBf16});
  ASSERT_TRUE(bf16.ok());
  EXPECT_EQ(bf16->entry_bytes, 1024);
  EXPECT_EQ(bf16->block_bytes, 21 * 32 * (1024 + 68) + 20 * 1024);
  EXPECT_EQ(bf16->block_bytes, 754'304);
  EXPECT_EQ(bf16->windows_per_block, 736);  // floor(754,304 / 1,024)
  EXPECT_EQ(bf16->fixed_blocks, 8);         // ceil(5,504 / 736)
  EXPECT_EQ(bf16->fixed_bytes, 43 * 128 * 1024);
  EXPECT_EQ(bf16->state_bytes, 12'206'080);  // the state is fp32 whatever the records

  // Twice the tokens per block: twice the bytes, twice the ring entries per block.
  auto b256 = KvCostModel::FromModelConfig(c, {.block_tokens = 256});
  ASSERT_TRUE(b256.ok());
  EXPECT_EQ(b256->block_bytes, 2 * 449'824);
  EXPECT_EQ(b256->windows_per_block, 1540);
  EXPECT_EQ(b256->fixed_blocks, 4);  // ceil(5,632 / 1,540)

  // A two-stage pipeline: layers [0, 22) and [22, 43) + MTP. Blocks, rings and states split
  // exactly between the stages.
  auto s0 = KvCostModel::FromModelConfig(c, {.end_layer = 22, .include_mtp = false});
  auto s1 = KvCostModel::FromModelConfig(c, {.first_layer = 22});
  ASSERT_TRUE(s0.ok() && s1.ok());
  EXPECT_EQ(s0->block_bytes + s1->block_bytes, no_mtp->block_bytes);
  EXPECT_EQ(s0->fixed_bytes + s1->fixed_bytes, KvCostModel::FromModelConfig(c)->fixed_bytes);
  EXPECT_EQ(s0->state_bytes + s1->state_bytes, 12'206'080);
  const KvCostModel stages[] = {*s0, *s1};
  auto pipe = KvCostModel::Pipeline(stages);
  ASSERT_TRUE(pipe.ok());
  EXPECT_EQ(pipe->fixed_blocks, std::max(s0->fixed_blocks, s1->fixed_blocks));
  EXPECT_EQ(pipe->state_bytes, std::max(s0->state_bytes, s1->state_bytes));
}

// The split splitserve-gpu-worker --plan_pp 2 and the launcher use: layers [0, 21) and [21, 43),
// no MTP. Smaller blocks hold fewer ring entries, so a stage needs about as many window blocks
// as the whole model.
TEST(KvCostModelTest, FlashTwoStagePipeline) {
  const ModelConfig c = FlashConfig();
  auto s0 = KvCostModel::FromModelConfig(c, {.end_layer = 21, .include_mtp = false});
  auto s1 = KvCostModel::FromModelConfig(c, {.first_layer = 21, .include_mtp = false});
  ASSERT_TRUE(s0.ok() && s1.ok());
  // Stage 0: 2 SWA + 10 CSA (2, 4, ..., 20) + 9 HCA (3, ..., 19).
  EXPECT_EQ(s0->block_bytes, 10 * 32 * 652 + 9 * 584);
  EXPECT_EQ(s0->block_bytes, 213'896);
  EXPECT_EQ(s0->windows_per_block, 366);
  EXPECT_EQ(s0->fixed_blocks, 8);  // ceil(21 x 128 / 366)
  EXPECT_EQ(s0->state_bytes, 10 * (65'536 + 16'384) + 9 * 524'288);
  EXPECT_EQ(s0->state_bytes, 5'537'792);
  // Stage 1: 11 CSA (22, ..., 42) + 11 HCA (21, ..., 41).
  EXPECT_EQ(s1->block_bytes, 11 * 32 * 652 + 11 * 584);
  EXPECT_EQ(s1->block_bytes, 235'928);
  EXPECT_EQ(s1->windows_per_block, 403);
  EXPECT_EQ(s1->fixed_blocks, 7);  // ceil(22 x 128 / 403)
  EXPECT_EQ(s1->state_bytes, 6'668'288);
  const KvCostModel stages[] = {*s0, *s1};
  auto pipe = KvCostModel::Pipeline(stages);
  ASSERT_TRUE(pipe.ok());
  EXPECT_EQ(pipe->fixed_blocks, 8);
  EXPECT_EQ(pipe->block_bytes, 213'896);  // stage 0's: it needs the most fixed blocks
  EXPECT_EQ(pipe->state_bytes, 6'668'288);
  EXPECT_EQ(pipe->BlocksForTokens(1000), 8 + 8);
}

// Layers with no compressor do not grow, but the cuda pool still holds their rings: one block of
// all of them, as KvLayout::Create lays it out.
TEST(KvCostModelTest, SlidingWindowOnlyStageHoldsItsRingsInOneBlock) {
  const ModelConfig c = FlashConfig();
  auto swa = KvCostModel::FromModelConfig(c, {.end_layer = 2, .include_mtp = false});
  ASSERT_TRUE(swa.ok()) << swa.status();
  EXPECT_EQ(swa->block_bytes, 2 * 128 * 584);
  EXPECT_EQ(swa->windows_per_block, 256);
  EXPECT_EQ(swa->fixed_blocks, 1);
  EXPECT_EQ(swa->fixed_bytes, swa->block_bytes);
  EXPECT_EQ(swa->state_bytes, 0);
  // Rings whose bytes are no multiple of 8: the block is rounded up to 8 bytes (as every block
  // is), and holds them all. 2 layers x 3 entries of 2 x 509 = 1,018 B (bf16) = 6,108 B.
  ModelConfig odd = c;
  odd.head_dim = 509;
  odd.rope_head_dim = 61;
  odd.window_size = 3;
  auto o = KvCostModel::FromModelConfig(
      odd, {.end_layer = 2, .include_mtp = false, .main_entries = MainEntryFormat::kBf16});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->entry_bytes, 1018);
  EXPECT_EQ(o->block_bytes, 6112);
  EXPECT_EQ(o->windows_per_block, 6);
  EXPECT_EQ(o->fixed_blocks, 1);
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
  // head_dim 128: entries of 64 e4m3 + 64 bf16 rope + 1 scale padded to 8 = 200 B; MXFP4 keys of
  // index_head_dim 128: 64 + 4 = 68 B. 3 CSA (2, 4, 6), 2 HCA (3, 5), 8 windows of 16 (incl.
  // MTP): 128 ring entries, and a block holds 130.
  EXPECT_EQ(m->block_bytes, 3 * 32 * (200 + 68) + 2 * 200);
  EXPECT_EQ(m->windows_per_block, 130);
  EXPECT_EQ(m->fixed_bytes, 8 * 16 * 200);
  EXPECT_EQ(m->fixed_blocks, 1);
  EXPECT_EQ(m->state_bytes, 3 * (2 * 8 * 256 * 4 + 2 * 8 * 256 * 4) + 2 * (2 * 128 * 128 * 4));
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

// 4 tokens per block, 1 fixed block, snapshots of 2 blocks.
KvCostModel Snap() {
  KvCostModel m = Small();
  m.snapshot_blocks = 2;
  return m;
}

std::vector<int32_t> Ids(int64_t n, int32_t first) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = first + static_cast<int32_t>(i);
  return v;
}

std::vector<int32_t> Table(const KvAccounting& kv, KvSequenceId s) {
  return {kv.BlockTable(s).begin(), kv.BlockTable(s).end()};
}

// A sequence's full blocks become cached once registered; a snapshot at a block boundary makes
// them a hit; a new sequence shares them by reference and owns the rest of its table.
TEST(KvPrefixCacheTest, HitSharesTheRegisteredBlocksUpToASnapshot) {
  auto kv = KvAccounting::Create(Snap(), 32, /*prefix_caching=*/true);
  ASSERT_TRUE(kv.ok());
  const std::vector<int32_t> prompt = Ids(11, 100);
  SnapshotTicket none;
  ASSERT_EQ(kv->Admit(1, {}, 11, &none), KvGrow::kOk);
  EXPECT_TRUE(none.blocks.empty());
  EXPECT_EQ(Table(*kv, 1), (std::vector<int32_t>{0, 1, 2, 3}));  // fixed + 3 token blocks
  kv->Register(1, prompt);
  EXPECT_EQ(kv->cached_blocks(), 2);  // blocks [0, 4) and [4, 8); [8, 11) is not full
  EXPECT_EQ(kv->Lookup(prompt, 10).tokens, 0) << "no snapshot yet";
  SnapshotTicket t;
  ASSERT_TRUE(kv->BeginSnapshot(1, 8, 0, &t));
  EXPECT_EQ(t.blocks.size(), 2u);
  EXPECT_EQ(kv->used_blocks(), 6);  // the ticket's blocks are reserved
  kv->CommitSnapshot(1, 8, t);
  EXPECT_EQ(kv->cached_blocks(), 4);
  EXPECT_EQ(kv->evictable_blocks(), 2);  // the snapshot (its blocks are referenced by nobody)
  EXPECT_FALSE(kv->BeginSnapshot(1, 8, 0, &t)) << "one snapshot per boundary";

  std::vector<int32_t> other = prompt;
  other[9] = 7;  // differs after the hit
  PrefixHit hit = kv->Lookup(other, static_cast<int64_t>(other.size()) - 1);
  EXPECT_EQ(hit.tokens, 8);
  EXPECT_EQ(hit.blocks, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(kv->Lookup(other, 7).tokens, 0) << "the hit must fit in max_tokens";
  std::vector<int32_t> early = prompt;
  early[5] = 7;  // differs inside the second block
  EXPECT_EQ(kv->Lookup(early, 10).tokens, 0);

  EXPECT_EQ(kv->TokensReachableWith(hit, 0), 8 + (kv->free_blocks() - 2 - 1) * 4);
  SnapshotTicket restore;
  ASSERT_EQ(kv->Admit(2, hit, 11, &restore), KvGrow::kOk);
  EXPECT_EQ(restore.id, t.id);
  EXPECT_EQ(restore.blocks, t.blocks);
  const std::vector<int32_t> table = Table(*kv, 2);
  ASSERT_EQ(table.size(), 4u);
  EXPECT_EQ(std::vector<int32_t>(table.begin() + 1, table.begin() + 3), hit.blocks);
  for (const int32_t b : {table[0], table[3]}) {
    EXPECT_TRUE(b != 0 && b != 1 && b != 2 && b != 3) << "own blocks are fresh: " << b;
  }
  kv->Release(1);
  EXPECT_EQ(kv->evictable_blocks(), 2) << "blocks 1, 2 are still shared by sequence 2";
  kv->Release(2);
  EXPECT_EQ(kv->evictable_blocks(), 4);
  EXPECT_EQ(kv->free_blocks(), 32);
  EXPECT_EQ(kv->Lookup(prompt, 10).tokens, 8) << "cached after every sequence ended";
}

// Eviction: least recently used first, a released sequence's tail before its head; an evicted
// block takes its snapshot and its descendants out of reach, and its id serves new content.
TEST(KvPrefixCacheTest, EvictionIsLruAndNeverServesEvictedContent) {
  auto kv = KvAccounting::Create(Snap(), 12, true);
  ASSERT_TRUE(kv.ok());
  const std::vector<int32_t> a = Ids(9, 100), b = Ids(9, 500);
  SnapshotTicket r, t;
  for (const auto& [seq, prompt] : {std::pair{1, a}, std::pair{2, b}}) {
    ASSERT_EQ(kv->Admit(seq, {}, 8, &r), KvGrow::kOk);
    kv->Register(seq, prompt);
    ASSERT_TRUE(kv->BeginSnapshot(seq, 8, 0, &t));
    kv->CommitSnapshot(seq, 8, t);
    kv->Release(seq);
  }
  EXPECT_EQ(kv->free_blocks(), 12);
  EXPECT_EQ(kv->cached_blocks(), 8);
  EXPECT_EQ(kv->Lookup(a, 8).tokens, 8);
  EXPECT_EQ(kv->Lookup(b, 8).tokens, 8);
  EXPECT_TRUE(kv->TakeEvictedSnapshots().empty());
  // 4 free blocks, then the least recently used unit goes first: a's snapshot (committed
  // before a's release put its blocks in the order).
  ASSERT_EQ(kv->Grow(3, 4 * 4), KvGrow::kOk);  // 1 + 4 blocks
  EXPECT_EQ(kv->Lookup(a, 8).tokens, 0);
  EXPECT_EQ(kv->Lookup(b, 8).tokens, 8);
  EXPECT_EQ(kv->TakeEvictedSnapshots().size(), 1u);
  ASSERT_EQ(kv->Grow(3, 7 * 4), KvGrow::kOk);  // 3 more: the free one, then a's two blocks
  EXPECT_EQ(kv->cached_blocks(), 4);
  EXPECT_EQ(kv->Lookup(b, 8).tokens, 8);
  ASSERT_EQ(kv->Grow(3, 11 * 4), KvGrow::kOk);  // 4 more: b's snapshot and blocks
  EXPECT_EQ(kv->Lookup(b, 8).tokens, 0);
  EXPECT_EQ(kv->cached_blocks(), 0);
  EXPECT_EQ(kv->free_blocks(), 0);
  EXPECT_EQ(kv->Grow(3, 12 * 4), KvGrow::kOutOfBlocks);
  // The freed ids now hold sequence 3's content: a lookup of a or b never reaches them.
  kv->Release(3);
  EXPECT_EQ(kv->free_blocks(), 12);
  EXPECT_EQ(kv->Lookup(b, 8).tokens, 0);
  EXPECT_EQ(kv->Lookup(a, 8).tokens, 0);
}

// A block whose content another sequence cached first stays private; the path continues through
// the cached twin, so the next block and the snapshot still attach.
TEST(KvPrefixCacheTest, ConcurrentTwinsShareOnePath) {
  auto kv = KvAccounting::Create(Snap(), 32, true);
  ASSERT_TRUE(kv.ok());
  const std::vector<int32_t> p = Ids(9, 100);
  SnapshotTicket r, t;
  ASSERT_EQ(kv->Admit(1, {}, 9, &r), KvGrow::kOk);
  ASSERT_EQ(kv->Admit(2, {}, 9, &r), KvGrow::kOk);
  kv->Register(1, std::span<const int32_t>(p).first(4));
  kv->Register(2, p);  // block 0 is a twin of sequence 1's; block 1 is new
  EXPECT_EQ(kv->cached_blocks(), 2);
  ASSERT_TRUE(kv->BeginSnapshot(2, 8, 0, &t));
  kv->CommitSnapshot(2, 8, t);
  const PrefixHit hit = kv->Lookup(p, 8);
  EXPECT_EQ(hit.tokens, 8);
  EXPECT_EQ(hit.blocks[0], Table(*kv, 1)[1]);
  EXPECT_EQ(hit.blocks[1], Table(*kv, 2)[2]);
  kv->Release(1);
  kv->Release(2);
  EXPECT_EQ(kv->free_blocks(), 32);
}

// Random admissions with hits, registrations, snapshots and releases: a block is in two tables
// only when it is a cached block both share, referenced blocks and reserved tickets are exactly
// the used ones, and everything comes back.
TEST(KvPrefixCacheTest, RandomizedAccountingIsExact) {
  std::mt19937_64 rng(11);
  const int64_t kBlocks = 40;
  auto kv = KvAccounting::Create(Snap(), kBlocks, true);
  ASSERT_TRUE(kv.ok());
  // Prompts from a few shared stems, so hits happen.
  auto prompt = [&](uint64_t stem, int64_t len) {
    std::vector<int32_t> v;
    for (int64_t i = 0; i < len; ++i)
      v.push_back(static_cast<int32_t>(stem * 1000 + (i < 12 ? i : rng() % 3)));
    return v;
  };
  std::map<KvSequenceId, std::vector<int32_t>> live;
  std::vector<std::pair<KvSequenceId, SnapshotTicket>> tickets;
  KvSequenceId next = 1;
  for (int it = 0; it < 5000; ++it) {
    const int op = static_cast<int>(rng() % 4);
    if (op == 0 && live.size() < 6) {
      const std::vector<int32_t> p = prompt(rng() % 3, 5 + static_cast<int64_t>(rng() % 14));
      const PrefixHit hit = kv->Lookup(p, static_cast<int64_t>(p.size()) - 1);
      const int64_t len = static_cast<int64_t>(p.size());
      SnapshotTicket r;
      const bool fits = kv->TokensReachableWith(hit, 0) >= len;
      ASSERT_EQ(kv->Admit(next, hit, len, &r) == KvGrow::kOk, fits);
      if (fits) live[next] = p;
      ++next;
    } else if (op == 1 && !live.empty()) {
      auto s = std::next(live.begin(), static_cast<long>(rng() % live.size()));
      kv->Register(s->first, s->second);
      SnapshotTicket t;
      const int64_t at = static_cast<int64_t>(s->second.size()) / 4 * 4;
      if (at > 0 && kv->BeginSnapshot(s->first, at, 0, &t)) tickets.emplace_back(s->first, t);
    } else if (op == 2 && !tickets.empty()) {
      auto [seq, t] = tickets.front();
      tickets.erase(tickets.begin());
      if (live.contains(seq) && rng() % 2 == 0) {
        kv->CommitSnapshot(seq, static_cast<int64_t>(live[seq].size()) / 4 * 4, t);
      } else {
        kv->AbortSnapshot(t);
      }
    } else if (op == 3 && !live.empty()) {
      auto s = std::next(live.begin(), static_cast<long>(rng() % live.size()));
      kv->Release(s->first);
      live.erase(s);
    }
    std::map<int32_t, int> owners;
    for (const auto& [seq, p] : live) {
      for (const int32_t b : kv->BlockTable(seq)) ASSERT_TRUE(b >= 0 && b < kBlocks);
      for (const int32_t b : kv->BlockTable(seq)) ++owners[b];
    }
    for (const auto& [seq, t] : tickets) {
      for (const int32_t b : t.blocks) ASSERT_EQ(owners[b]++, 0) << "ticket block in a table";
    }
    ASSERT_EQ(static_cast<int64_t>(owners.size()), kv->used_blocks()) << "iteration " << it;
    ASSERT_LE(kv->cached_blocks(), kBlocks);
    ASSERT_GE(kv->free_blocks(), kv->evictable_blocks());
  }
  for (const auto& [seq, t] : tickets) kv->AbortSnapshot(t);
  for (const auto& [seq, p] : live) kv->Release(seq);
  EXPECT_EQ(kv->free_blocks(), kBlocks);
}

}  // namespace
}  // namespace ss::sched
