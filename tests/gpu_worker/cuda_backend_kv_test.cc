// The cuda backend's paged-KV layout (gpu_worker/cuda/cuda_backend_kv.h) against the KV cost model
// (common/kv_cost_model.h): the pool's blocks, window packing and compressor states are the
// figures the coordinator and the memory plan count. Host code only: runs without a GPU, except
// KvPoolTest (the state allocations' reuse), which skips without one.
#include "gpu_worker/cuda/cuda_backend_kv.h"

#include <cmath>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "common/kv_cost_model.h"
#include "common/model_config.h"
#include "gtest/gtest.h"
#include "tests/tools/test_configs.h"

namespace ss::gpu {
namespace {

ModelConfig Parse(const char* json) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(json);
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

void ExpectSnapshotAgrees(const ModelConfig& c, const KvLayout& k, const sched::KvCostModel& m);

// Checks the layout of layers [first, end) against the cost model the coordinator builds for
// the same stage.
void ExpectAgree(const ModelConfig& c, int first, int end, int64_t block_tokens, bool fp8_records) {
  SCOPED_TRACE(testing::Message() << "layers [" << first << ", " << end << "), B " << block_tokens
                                  << (fp8_records ? ", fp8" : ", bf16"));
  absl::StatusOr<KvLayout> k = KvLayout::Create(c, first, end, block_tokens, fp8_records);
  ASSERT_TRUE(k.ok()) << k.status();
  absl::StatusOr<sched::KvCostModel> m = sched::KvCostModel::FromModelConfig(
      c, {.block_tokens = block_tokens,
          .first_layer = first,
          .end_layer = end,
          .include_mtp = false,
          .indexer_keys = sched::IndexerKeyFormat::kMxfp4,
          .main_entries =
              fp8_records ? sched::MainEntryFormat::kFp8DsMla : sched::MainEntryFormat::kBf16});
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(k->block_bytes, m->block_bytes);
  EXPECT_EQ(k->record_bytes, m->entry_bytes);
  EXPECT_EQ(k->key_bytes, m->index_entry_bytes);
  EXPECT_EQ(k->win_per_block, m->windows_per_block);
  EXPECT_EQ(k->window_blocks, m->fixed_blocks);
  for (int64_t n : {int64_t{1}, block_tokens, block_tokens + 1, int64_t{100'000}}) {
    EXPECT_EQ(k->BlocksFor(n), m->BlocksForTokens(n)) << n;
  }
  // Every layer's entries fit in a token block; the rings fit in the window blocks.
  for (const KvLayout::Layer& y : k->layers) {
    if (y.ratio > 0) {
      EXPECT_LE(y.main_off + block_tokens / y.ratio * k->record_bytes, k->block_bytes);
    }
    if (y.has_indexer) {
      EXPECT_LE(y.key_off + block_tokens / 4 * k->key_bytes, k->block_bytes);
    }
  }
  EXPECT_GE(k->window_blocks * k->win_per_block, (end - first) * c.window_size);
  // The state allocation: the cost model's bytes plus alignment, every piece 256-byte aligned
  // and disjoint, in layer order.
  int64_t bytes = 0, next = 0;
  for (const KvLayout::Layer& y : k->layers) {
    for (auto [off, n] : {std::pair{y.comp_state_off, y.comp_n}, {y.index_state_off, y.index_n}}) {
      if (off < 0) {
        EXPECT_EQ(n, 0);
        continue;
      }
      EXPECT_EQ(off * 4 % 256, 0);
      EXPECT_GE(off, next);
      next = off + 2 * n;
      bytes += 2 * n * 4;
    }
    EXPECT_EQ(y.comp_state_off >= 0, y.ratio > 0);
    EXPECT_EQ(y.index_state_off >= 0, y.has_indexer);
  }
  EXPECT_LE(next, k->state_floats);
  EXPECT_EQ(bytes, m->state_bytes);
  ExpectSnapshotAgrees(c, *k, *m);
}

// A resume snapshot's carried slots (cuda_backend_kv.h "Resume snapshots") against the cost
// model: the same bytes and blocks; per ratio-4 layer in order the first half (slots 0..3 of 8)
// of the main compressor's kv, its score, the indexer's kv, its score, each 4 x 2 x d floats.
void ExpectSnapshotAgrees(const ModelConfig& c, const KvLayout& k, const sched::KvCostModel& m) {
  EXPECT_EQ(k.carry_bytes, m.carry_bytes);
  EXPECT_EQ(k.snapshot_blocks, m.snapshot_blocks);
  EXPECT_EQ(k.snapshot_blocks,
            k.window_blocks + (k.carry_bytes + k.block_bytes - 1) / k.block_bytes);
  std::vector<KvLayout::CarryPiece> want;
  for (const KvLayout::Layer& y : k.layers) {
    if (y.ratio != 4) continue;
    const int64_t main_half = 4 * 2 * c.head_dim, index_half = 4 * 2 * c.index_head_dim;
    EXPECT_EQ(y.comp_n, 2 * main_half);
    EXPECT_EQ(y.index_n, 2 * index_half);
    want.push_back({y.comp_state_off, main_half * 4});
    want.push_back({y.comp_state_off + y.comp_n, main_half * 4});
    want.push_back({y.index_state_off, index_half * 4});
    want.push_back({y.index_state_off + y.index_n, index_half * 4});
  }
  ASSERT_EQ(k.carry.size(), want.size());
  int64_t sum = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(k.carry[i].state_off, want[i].state_off) << i;
    EXPECT_EQ(k.carry[i].bytes, want[i].bytes) << i;
    EXPECT_LE(k.carry[i].state_off * 4 + k.carry[i].bytes, k.state_floats * 4) << i;
    sum += k.carry[i].bytes;
  }
  EXPECT_EQ(sum, k.carry_bytes);
}

TEST(KvLayoutTest, FlashMatchesTheCostModel) {
  const ModelConfig c = Parse(testing_util::kFlashConfig);
  const int n = static_cast<int>(c.n_layers);
  for (bool fp8 : {true, false}) {
    for (int pp : {1, 2, 5, 22}) {  // 22 stages: stage 0 is layer 0 alone, SWA only
      for (int s = 0; s < pp; ++s) ExpectAgree(c, n * s / pp, n * (s + 1) / pp, 128, fp8);
    }
    ExpectAgree(c, 0, n, 256, fp8);
    ExpectAgree(c, 0, 2, 128, fp8);
  }
  absl::StatusOr<KvLayout> k = KvLayout::Create(c, 0, n, 128);
  ASSERT_TRUE(k.ok()) << k.status();
  EXPECT_EQ(k->block_bytes, 449'824);
  EXPECT_EQ(k->win_per_block, 770);
  EXPECT_EQ(k->window_blocks, 8);
  EXPECT_EQ(k->state_floats * 4, 12'206'080);  // no padding at Flash sizes
}

TEST(KvLayoutTest, OtherShapesMatchTheCostModel) {
  const ModelConfig wide = Parse(testing_util::kWideI256Config);
  for (bool fp8 : {true, false}) {
    ExpectAgree(wide, 0, 5, 128, fp8);
    ExpectAgree(wide, 0, 2, 128, fp8);
    ExpectAgree(wide, 2, 5, 256, fp8);
    ExpectAgree(wide, 4, 5, 128, fp8);  // one SWA layer
  }
}

// The snapshot figures of Flash (cost model: 860,160 carried bytes, 10 blocks) and of tiny-a,
// whole and split in two stages; ExpectAgree checks them against the cost model too.
TEST(KvLayoutTest, SnapshotsMatchTheCostModel) {
  const ModelConfig flash = Parse(testing_util::kFlashConfig);
  absl::StatusOr<KvLayout> k = KvLayout::Create(flash, 0, 43, 128);
  ASSERT_TRUE(k.ok()) << k.status();
  EXPECT_EQ(k->carry_bytes, 860'160);
  EXPECT_EQ(k->snapshot_blocks, 10);
  EXPECT_EQ(k->carry.size(), 21u * 4);
  for (auto [first, end] : {std::pair{0, 43}, {0, 21}, {21, 43}, {0, 2}, {2, 3}}) {
    ExpectAgree(flash, first, end, 128, true);
  }
  absl::StatusOr<ModelConfig> tiny = LoadModelConfig("tests/data/tiny-a");
  ASSERT_TRUE(tiny.ok()) << tiny.status();
  for (auto [first, end] : {std::pair{0, 7}, {0, 4}, {4, 7}, {0, 3}, {3, 7}, {0, 2}}) {
    ExpectAgree(*tiny, first, end, 128, true);
    ExpectAgree(*tiny, first, end, 256, false);
  }
  k = KvLayout::Create(*tiny, 0, 7, 128);
  ASSERT_TRUE(k.ok()) << k.status();
  // 3 ratio-4 layers x 64 x (128 + 128) B over 26,128-byte blocks, after 1 window block.
  EXPECT_EQ(k->carry_bytes, 3 * 64 * 256);
  EXPECT_EQ(k->snapshot_blocks, 1 + 2);
}

TEST(KvLayoutTest, RejectsWhatTheCostModelRejects) {
  const ModelConfig c = Parse(testing_util::kFlashConfig);
  EXPECT_FALSE(KvLayout::Create(c, 0, 43, 64).ok());  // half an HCA entry per block
  EXPECT_FALSE(KvLayout::Create(c, 0, 44, 128).ok());
}

// The pool against a device's free memory (Flash, one stage of every layer: 449,824-byte blocks
// of 128 tokens, 11.6 MiB of compressor state per sequence).
TEST(KvFitTest, SizesThePoolToTheFreeMemoryAndRefusesWhatDoesNotFit) {
  const ModelConfig c = Parse(testing_util::kFlashConfig);
  absl::StatusOr<KvLayout> k = KvLayout::Create(c, 0, static_cast<int>(c.n_layers), 128);
  ASSERT_TRUE(k.ok()) << k.status();
  const int64_t gib = int64_t{1} << 30, reserve = 3 * gib / 2, state = k->state_floats * 4;
  // Fit to 20 GiB free: every whole block of what is left, 8 extra sequences' window blocks
  // (9 blocks each) not counted as tokens.
  absl::StatusOr<KvFit> f = FitKvPool(*k, 0, 8, 20 * gib, reserve, 64);
  ASSERT_TRUE(f.ok()) << f.status();
  const int64_t room = 20 * gib - reserve - 64 * state;
  EXPECT_EQ(f->pool_blocks, room / k->block_bytes);
  EXPECT_EQ(f->kv_tokens, (f->pool_blocks - 8 * 9) * 128);
  EXPECT_EQ(k->PoolBlocks(f->kv_tokens, 8), f->pool_blocks);
  EXPECT_LE(f->pool_bytes, room);
  EXPECT_GT(f->pool_bytes + k->block_bytes, room);
  std::printf("%s\n", f->Describe().c_str());
  EXPECT_NE(f->Describe().find("64 sequences"), std::string::npos);
  // A given capacity: the pool of exactly that, if it fits.
  f = FitKvPool(*k, 65536, 8, 20 * gib, reserve, 64);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->kv_tokens, 65536);
  EXPECT_EQ(f->pool_blocks, 512 + 72);
  EXPECT_EQ(f->pool_bytes, (512 + 72) * k->block_bytes);
  // One token more than the fitted capacity's blocks hold: refused, with the figures.
  const int64_t most = FitKvPool(*k, 0, 8, 20 * gib, reserve, 64)->kv_tokens;
  EXPECT_TRUE(FitKvPool(*k, most, 8, 20 * gib, reserve, 64).ok());
  f = FitKvPool(*k, most + 128, 8, 20 * gib, reserve, 64);
  ASSERT_EQ(f.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(f.status().message().find("does not fit"), std::string::npos) << f.status();
  EXPECT_NE(f.status().message().find("--kv_tokens"), std::string::npos) << f.status();
  // More sequences' states leave less for the pool.
  EXPECT_LT(FitKvPool(*k, 0, 8, 20 * gib, reserve, 256)->kv_tokens, most);
  // Nothing left after the reserve and the states: refused even when fitting.
  EXPECT_EQ(FitKvPool(*k, 0, 8, 2 * gib, reserve, 64).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(FitKvPool(*k, 0, 8, reserve, reserve, 1).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // Nonsense figures.
  EXPECT_EQ(FitKvPool(*k, -1, 8, 20 * gib, reserve, 64).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FitKvPool(*k, 0, 8, 20 * gib, reserve, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// A released sequence's compressor states are reused, reset, by the next new sequence: no
// cudaMalloc / cudaFree per sequence.
TEST(KvPoolTest, ReusesReleasedStateAllocations) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    GTEST_SKIP() << "no CUDA device";
  }
  const ModelConfig c = Parse(testing_util::kWideI256Config);  // ratios 0, 4, 128, 4, 0
  absl::StatusOr<KvLayout> k = KvLayout::Create(c, 0, 5, 128);
  ASSERT_TRUE(k.ok()) << k.status();
  KvPool pool;
  ASSERT_TRUE(pool.Init(*k, 1024, 4).ok());
  ASSERT_TRUE(pool.Prepare(1, 0, 10, {}, {}, nullptr).ok());
  ASSERT_TRUE(pool.Prepare(2, 0, 10, {}, {}, nullptr).ok());
  EXPECT_EQ(pool.state_allocations(), 2);
  const KvSeq* s1 = pool.Find(1);
  ASSERT_NE(s1, nullptr);
  float* const states = s1->states;
  ASSERT_NE(states, nullptr);
  EXPECT_NE(pool.Find(2)->states, states);
  for (size_t l = 0; l < k->layers.size(); ++l) {
    const KvLayout::Layer& y = k->layers[l];
    const KvSeq::Layer& q = s1->layers[l];
    EXPECT_EQ(q.comp_state, y.comp_state_off < 0 ? nullptr : states + y.comp_state_off) << l;
    EXPECT_EQ(q.index_state, y.index_state_off < 0 ? nullptr : states + y.index_state_off) << l;
    EXPECT_EQ(q.comp_n, y.comp_n);
    EXPECT_EQ(q.index_n, y.index_n);
  }
  // Sequence 1 leaves garbage behind; sequence 3 gets its allocation, reset.
  ASSERT_EQ(cudaMemset(states, 0x7f, k->state_floats * 4), cudaSuccess);
  pool.Release(1);
  ASSERT_TRUE(pool.Prepare(3, 0, 10, {}, {}, nullptr).ok());
  EXPECT_EQ(pool.state_allocations(), 2);
  const KvSeq* s3 = pool.Find(3);
  ASSERT_EQ(s3->states, states);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (const KvSeq::Layer& q : s3->layers) {
    for (auto [p, n] : {std::pair{q.comp_state, q.comp_n}, {q.index_state, q.index_n}}) {
      if (p == nullptr) continue;
      std::vector<float> host(2 * n);
      ASSERT_EQ(cudaMemcpy(host.data(), p, host.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(host[i], 0.0f) << i;                            // kv
        ASSERT_TRUE(std::isinf(host[n + i]) && host[n + i] < 0);  // score
      }
    }
  }
  pool.ReleaseAll();
  EXPECT_EQ(pool.state_allocations(), 0);
  EXPECT_EQ(pool.Find(2), nullptr);
}

}  // namespace
}  // namespace ss::gpu
