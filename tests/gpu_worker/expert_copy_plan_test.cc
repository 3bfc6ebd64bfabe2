// The streamed path's copy plan (gpu_worker/expert_copy_plan.h): the device block layout is the
// expert store's (checked against a loaded store's views, row-major and tiled, slices 1/1 and
// 1/2), a group of store blocks that lie back to back is one copy, blocks from two stores are
// one copy per expert and part at the right slot offsets, checkpoint pieces land at the block
// layout's offsets (merged where they touch), and the groups cover the experts in order.
#include "gpu_worker/expert_copy_plan.h"

#include <gtest/gtest.h>

#include <vector>

#include "common/thread_pool.h"
#include "cpu_expert_worker/expert_store.h"
#include "tests/cpu_expert_worker/expert_test_util.h"

namespace ss::gpu {
namespace {

TEST(ExpertCopyPlanTest, BlockLayoutIsTheExpertStores) {
  ThreadPoolOptions po;
  po.num_threads = 1;
  std::unique_ptr<ThreadPool> pool = *ThreadPool::Create(po);
  for (int n : {1, 2}) {
    for (int64_t tile_rows : {int64_t{0}, int64_t{16}}) {
      expert::ExpertStoreOptions o;
      o.source.model_dir = expert::testing_util::I256Checkpoint();
      o.layers = {0, 1};
      o.slice_index = n - 1;
      o.slice_count = n;
      o.tile_rows = tile_rows;
      absl::StatusOr<std::unique_ptr<expert::ExpertStore>> s =
          expert::ExpertStore::Load(o, pool.get());
      ASSERT_TRUE(s.ok()) << s.status();
      const expert::ExpertSliceView* v = (*s)->layer_views(0);
      const PartBlockLayout l = *CompactPartBlockLayout((*s)->dim(), (*s)->inter_slice());
      const uint8_t* b = v[0].w1;
      EXPECT_EQ(v[0].w1_scale - b, l.w1_scale);
      EXPECT_EQ(v[0].w3 - b, l.w3);
      EXPECT_EQ(v[0].w3_scale - b, l.w3_scale);
      EXPECT_EQ(v[0].w2 - b, l.w2);
      EXPECT_EQ(v[0].w2_scale - b, l.w2_scale);
      EXPECT_EQ(v[1].w1 - b, l.bytes) << "consecutive experts are one block apart";
      EXPECT_EQ((*s)->layer_views(1)[0].w1 - b, l.bytes * (*s)->num_experts());
    }
  }
}

TEST(ExpertCopyPlanTest, ConsecutiveStoreBlocksAreOneCopy) {
  const PartBlockLayout l = *CompactPartBlockLayout(256, 128);
  std::vector<uint8_t> store(static_cast<size_t>(l.bytes * 8));
  LayerStreamPlan p;
  p.dim = 256;
  p.part_inter = 128;
  p.parts = 1;
  p.part = l;
  p.expert_bytes = l.bytes;
  p.expert_begin = 0;
  p.expert_end = 8;
  for (int e = 0; e < 8; ++e) p.sources.push_back({.block = store.data() + e * l.bytes});
  const std::vector<HostCopy> c = p.GroupCopies(2, 5);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].src, store.data() + 2 * l.bytes);
  EXPECT_EQ(c[0].dst_offset, 0);
  EXPECT_EQ(c[0].bytes, 3 * l.bytes);
  EXPECT_EQ(p.GroupBytes(2, 5), 3 * l.bytes);
}

TEST(ExpertCopyPlanTest, TwoSlicesAreOneCopyPerExpertAndPart) {
  const PartBlockLayout l = *CompactPartBlockLayout(256, 128);
  std::vector<uint8_t> s0(static_cast<size_t>(l.bytes * 4)), s1(static_cast<size_t>(l.bytes * 4));
  LayerStreamPlan p;
  p.dim = 256;
  p.part_inter = 128;
  p.parts = 2;
  p.part = l;
  p.expert_bytes = 2 * l.bytes;
  p.expert_begin = 0;
  p.expert_end = 4;
  for (int e = 0; e < 4; ++e) {
    p.sources.push_back({.block = s0.data() + e * l.bytes});
    p.sources.push_back({.block = s1.data() + e * l.bytes});
  }
  const std::vector<HostCopy> c = p.GroupCopies(1, 3);
  ASSERT_EQ(c.size(), 4u);
  const std::vector<std::pair<const uint8_t*, int64_t>> want = {
      {s0.data() + l.bytes, 0},
      {s1.data() + l.bytes, l.bytes},
      {s0.data() + 2 * l.bytes, 2 * l.bytes},
      {s1.data() + 2 * l.bytes, 3 * l.bytes}};
  for (size_t i = 0; i < c.size(); ++i) {
    EXPECT_EQ(c[i].src, want[i].first) << i;
    EXPECT_EQ(c[i].dst_offset, want[i].second) << i;
    EXPECT_EQ(c[i].bytes, l.bytes) << i;
  }
}

TEST(ExpertCopyPlanTest, CheckpointPiecesLandAtTheBlockOffsets) {
  const int64_t dim = 256, inter = 128;
  const PartBlockLayout l = *CompactPartBlockLayout(dim, inter);
  const int64_t w13 = inter * dim / 2, w13s = inter * dim / 32, w2 = dim * inter / 2,
                w2s = dim * inter / 32;
  // Two experts' tensors, each in its own buffer (no two pieces touch).
  std::vector<std::vector<uint8_t>> t;
  for (int i = 0; i < 12; ++i) t.emplace_back(4096);
  LayerStreamPlan p;
  p.dim = dim;
  p.part_inter = inter;
  p.parts = 1;
  p.part = l;
  p.expert_bytes = l.bytes;
  p.expert_begin = 3;
  p.expert_end = 5;
  for (int e = 0; e < 2; ++e) {
    p.sources.push_back({.w1 = t[6 * e].data(),
                         .w1_scale = t[6 * e + 1].data(),
                         .w3 = t[6 * e + 2].data(),
                         .w3_scale = t[6 * e + 3].data(),
                         .w2 = t[6 * e + 4].data(),
                         .w2_scale = t[6 * e + 5].data()});
  }
  const std::vector<HostCopy> c = p.GroupCopies(3, 5);
  ASSERT_EQ(c.size(), 12u);
  const int64_t off[6] = {l.w1, l.w1_scale, l.w3, l.w3_scale, l.w2, l.w2_scale};
  const int64_t len[6] = {w13, w13s, w13, w13s, w2, w2s};
  for (int e = 0; e < 2; ++e) {
    for (int k = 0; k < 6; ++k) {
      const HostCopy& x = c[6 * e + k];
      EXPECT_EQ(x.src, t[6 * e + k].data());
      EXPECT_EQ(x.dst_offset, e * l.bytes + off[k]);
      EXPECT_EQ(x.bytes, len[k]);
    }
  }
  // Pieces that touch in memory and in the block merge: one buffer holding the block itself.
  std::vector<uint8_t> block(static_cast<size_t>(l.bytes));
  LayerStreamPlan q = p;
  q.expert_begin = 0;
  q.expert_end = 1;
  q.sources = {{.w1 = block.data() + l.w1,
                .w1_scale = block.data() + l.w1_scale,
                .w3 = block.data() + l.w3,
                .w3_scale = block.data() + l.w3_scale,
                .w2 = block.data() + l.w2,
                .w2_scale = block.data() + l.w2_scale}};
  // 256 x 128 pieces are multiples of 64 bytes: no padding, so all six merge.
  EXPECT_EQ(q.GroupCopies(0, 1).size(), 1u);
}

TEST(ExpertCopyPlanTest, GroupsCoverTheExpertsInOrder) {
  EXPECT_EQ(ExpertGroups(0, 10, 4), (std::vector<std::pair<int, int>>{{0, 4}, {4, 8}, {8, 10}}));
  EXPECT_EQ(ExpertGroups(64, 128, 64), (std::vector<std::pair<int, int>>{{64, 128}}));
  EXPECT_EQ(ExpertGroups(3, 3, 4).size(), 0u);
  EXPECT_EQ(ExpertGroups(0, 2, 0), (std::vector<std::pair<int, int>>{{0, 1}, {1, 2}}));
}

}  // namespace
}  // namespace ss::gpu
