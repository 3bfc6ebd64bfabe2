// The cuda backend's step plan (gpu_worker/cuda/cuda_backend_internal.h PlanStep) at Flash's
// sizes, host code only (no GPU): a decode step's sizes that grow with the sequence (the
// indexer's k, the candidate lists, the tables' room in the upload) are rounded up to
// kDecodeSizeStep, so one sequence's decode keeps its launches -- and its CUDA graph -- over many
// positions, while every token still reads its own counts (n_comp = its selections); a prefill
// step keeps its exact sizes.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <set>
#include <span>
#include <tuple>
#include <vector>

#include "common/model_config.h"
#include "gpu_worker/cuda/cuda_backend_internal.h"
#include "gtest/gtest.h"
#include "tests/tools/test_configs.h"

namespace ss::gpu::cuda_backend_internal {
namespace {

constexpr int64_t kBlockTokens = 128;

struct Stage {
  ModelConfig c;
  KvLayout kvl;
  std::vector<DevBlock> blocks;
};

Stage FlashStage() {
  Stage s;
  absl::StatusOr<ModelConfig> c = ParseModelConfig(testing_util::kFlashConfig);
  EXPECT_TRUE(c.ok()) << c.status();
  s.c = *c;
  const int n = static_cast<int>(s.c.n_layers);
  absl::StatusOr<KvLayout> k = KvLayout::Create(s.c, 0, n, kBlockTokens);
  EXPECT_TRUE(k.ok()) << k.status();
  s.kvl = *k;
  for (const KvLayout::Layer& y : s.kvl.layers) {
    DevBlock b;
    b.ratio = y.ratio;
    b.has_compressor = y.ratio > 0;
    b.has_indexer = y.has_indexer;
    s.blocks.push_back(b);
  }
  return s;
}

// One sequence's step of `rows` tokens from `start`, the indexer's scores capped at `scores_bytes`.
StepPlan PlanOne(const Stage& s, int64_t start, int64_t rows, KvSeq* seq,
                 int64_t scores_bytes = kIndexerScoresBytes) {
  seq->table.assign(s.kvl.BlocksFor(start + rows), 7);
  seq->layers.assign(s.blocks.size(), KvSeq::Layer{});
  static const std::vector<int32_t> kTokens(8192, 1);
  StageChunk ch;
  ch.seq_id = 1;
  ch.start = start;
  ch.tokens = std::span<const int32_t>(kTokens.data(), rows);
  ch.samples = true;
  const KvSeq* const seqs[] = {seq};
  return PlanStep(std::span<const StageChunk>(&ch, 1), s.c, s.blocks, s.kvl, seqs, nullptr,
                  scores_bytes);
}

// A prefill chunk scores its rows in slices of IndexerScoreRows rows where rows x columns of fp32
// scores pass the cap, and the scores buffer holds one slice: at 1M positions (262,144 columns,
// 1 MiB a row) a 2048-token chunk is one slice under the default 2 GiB, an 8192-token one four;
// a cap of a few rows' bytes slices any chunk.
TEST(StepPlanTest, APrefillChunkScoresItsRowsInSlicesUnderTheCap) {
  const Stage s = FlashStage();
  KvSeq seq;
  const int64_t end = int64_t{1} << 20;
  StepPlan p = PlanOne(s, end - 2048, 2048, &seq);
  EXPECT_EQ(p.n_cols[0], end / 4);
  EXPECT_EQ(p.score_rows[0], 2048);
  EXPECT_EQ(p.scores_cap, 2048 * (end / 4));
  p = PlanOne(s, end - 8192, 8192, &seq);
  EXPECT_EQ(p.score_rows[0], 2048);
  EXPECT_EQ(p.scores_cap * 4, kIndexerScoresBytes);
  // A short context is never sliced; a tiny cap slices it into rows of what fits (at least 1).
  p = PlanOne(s, 0, 4096, &seq);
  EXPECT_EQ(p.score_rows[0], 4096);
  p = PlanOne(s, 0, 4096, &seq, 3 * 1024 * 4);  // 1024 columns a row: 3 rows
  EXPECT_EQ(p.n_cols[0], 1024);
  EXPECT_EQ(p.score_rows[0], 3);
  EXPECT_EQ(p.scores_cap, 3 * 1024);
  p = PlanOne(s, 0, 4096, &seq, 1);
  EXPECT_EQ(p.score_rows[0], 1);
  // The selections' layout does not change: n_sel per row, rows after rows.
  EXPECT_EQ(p.sel_base[1], 4096 * p.n_sel[0]);
  EXPECT_EQ(IndexerScoreRows(10, 0, 1), 10);
  EXPECT_EQ(IndexerScoreRows(10, 256, 0), 10);
}

TEST(StepPlanTest, DecodeSizesAreRoundedAndStayTheSameOverManyPositions) {
  const Stage s = FlashStage();
  ASSERT_FALSE(s.blocks.empty());
  KvSeq seq;
  std::set<std::vector<int64_t>> shapes;
  for (int64_t pos = 16; pos < 2600; ++pos) {
    SCOPED_TRACE(pos);
    const StepPlan p = PlanOne(s, pos, 1, &seq);
    ASSERT_TRUE(p.index_one_launch);
    const int64_t n_sel = p.n_sel[0];
    EXPECT_EQ(n_sel, std::min<int64_t>(s.c.index_topk, (pos + 1) / 4));
    if (n_sel > 0) {
      EXPECT_EQ(p.index_k % kDecodeSizeStep, 0);
      EXPECT_GE(p.index_k, n_sel);
      EXPECT_LE(p.index_k, p.index_cols);
    }
    for (const int64_t n : p.n_cand) EXPECT_EQ(n % kDecodeSizeStep, 0);
    EXPECT_EQ(p.table_cap % kDecodeSizeStep, 0);
    EXPECT_GE(p.table_cap, p.table_off[1]);
    // Each token reads its own selections: n_comp is the exact count, sel_off its row of k.
    for (size_t l = 0; l < s.blocks.size(); ++l) {
      const cuda::KvToken& d = p.tokens[l];
      if (s.blocks[l].has_indexer) {
        EXPECT_EQ(d.n_comp, n_sel);
        EXPECT_EQ(d.sel_off, n_sel > 0 ? 0 : -1);
      }
      EXPECT_LE(d.win_width + d.n_comp, p.n_cand[l]);
    }
    std::vector<int64_t> shape = {p.index_cols,
                                  p.index_k,
                                  p.table_cap,
                                  static_cast<int64_t>(p.dst_at),
                                  static_cast<int64_t>(p.streams_at),
                                  p.sel_base[1]};
    shape.insert(shape.end(), p.n_cand.begin(), p.n_cand.end());
    shapes.insert(shape);
  }
  // 2,584 positions: a new shape where the indexer's k or its candidate lists pass a multiple of
  // 64 selections (every 256 positions below 2,048) or the score columns a multiple of 256.
  std::printf("decode positions 16..2599: %zu step shapes\n", shapes.size());
  EXPECT_LE(shapes.size(), 12u);
}

TEST(StepPlanTest, APrefillStepKeepsItsExactSizes) {
  const Stage s = FlashStage();
  KvSeq seq;
  const StepPlan p = PlanOne(s, 1000, 100, &seq);
  ASSERT_FALSE(p.index_one_launch);
  EXPECT_EQ(p.n_sel[0], std::min<int64_t>(s.c.index_topk, 1100 / 4));
  EXPECT_EQ(p.table_cap, p.table_off[1]);
  bool unrounded = false;
  for (size_t l = 0; l < s.blocks.size(); ++l) {
    int64_t longest = 0;
    for (int64_t t = 0; t < p.T; ++t) {
      const cuda::KvToken& d = p.tokens[l * p.T + t];
      longest = std::max<int64_t>(longest, d.win_width + d.n_comp);
    }
    EXPECT_EQ(p.n_cand[l], std::max<int64_t>(longest, 1)) << "layer " << l;
    unrounded = unrounded || p.n_cand[l] % kDecodeSizeStep != 0;
  }
  EXPECT_TRUE(unrounded);  // 128 + 275 selections: no multiple of 64
}

}  // namespace
}  // namespace ss::gpu::cuda_backend_internal
