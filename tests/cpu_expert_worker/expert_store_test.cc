// The expert store: its slice bytes equal the checkpoint's bytes for the same rows/columns
// (tiny-a with n = 1; a generated I = 256 checkpoint with n = 1 and n = 2, sharded, MTP block
// included), with the weights in tiles of 16 and 8 rows and row-major, compact strides, validation
// of layers and slices with clear messages, resident memory close to the slice's bytes, pages
// on the requested node.
#include "cpu_expert_worker/expert_store.h"

#include <gtest/gtest.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/safetensors.h"
#include "common/thread_pool.h"
#include "cpu_expert_worker/numa.h"
#include "tests/cpu_expert_worker/expert_test_util.h"

namespace ss::expert {
namespace {

using testing_util::AllLayers;
using testing_util::I256Checkpoint;
using testing_util::kTinyA;

std::unique_ptr<ThreadPool> Pool(int n) {
  ThreadPoolOptions o;
  o.num_threads = n;
  return *ThreadPool::Create(o);
}

absl::StatusOr<std::unique_ptr<ExpertStore>> Load(const std::string& dir, std::vector<int> layers,
                                                  int i, int n, ThreadPool* pool,
                                                  int64_t tile_rows = 16) {
  ExpertStoreOptions o;
  o.source.model_dir = dir;
  o.layers = std::move(layers);
  o.slice_index = i;
  o.slice_count = n;
  o.tile_rows = tile_rows;
  return ExpertStore::Load(o, pool);
}

// Row r (len bytes) of a weight matrix in the view's layout (ExpertSliceView::tile_rows).
std::vector<uint8_t> WeightRow(const uint8_t* w, int64_t tile_rows, int64_t r, int64_t len) {
  std::vector<uint8_t> row(len);
  for (int64_t j = 0; j < len; ++j) {
    row[j] = tile_rows == 0 ? w[r * len + j]
                            : w[r / tile_rows * tile_rows * len + j / 64 * tile_rows * 64 +
                                r % tile_rows * 64 + j % 64];
  }
  return row;
}

std::string Prefix(const ModelConfig& c, int layer, int e) {
  return layer < c.n_layers ? absl::StrCat("layers.", layer, ".ffn.experts.", e, ".")
                            : absl::StrCat("mtp.", layer - c.n_layers, ".ffn.experts.", e, ".");
}

// Every held expert's bytes against the checkpoint's, row by row; returns the bytes compared.
int64_t ExpectSliceEqualsCheckpoint(const ExpertStore& s, const std::string& dir) {
  auto ckpt = Checkpoint::Open(dir);
  EXPECT_TRUE(ckpt.ok()) << ckpt.status();
  const ModelConfig& c = s.config();
  const int64_t dim = c.dim, I = c.moe_inter_dim, is = s.inter_slice();
  const int64_t r0 = is * s.slice_index();
  int64_t compared = 0;
  auto rows_equal = [&](const uint8_t* got, int64_t got_stride, const uint8_t* want,
                        int64_t want_stride, int64_t rows, int64_t len, const std::string& what,
                        int64_t tile_rows = 0) {
    for (int64_t r = 0; r < rows; ++r) {
      const std::vector<uint8_t> row =
          tile_rows == 0 ? std::vector<uint8_t>(got + r * got_stride, got + r * got_stride + len)
                         : WeightRow(got, tile_rows, r, len);
      if (std::memcmp(row.data(), want + r * want_stride, len) != 0) {
        ADD_FAILURE() << what << " row " << r << " differs";
        return;
      }
    }
    compared += rows * len;
  };
  for (int layer : s.layers()) {
    const ExpertSliceView* v = s.layer_views(layer);
    EXPECT_NE(v, nullptr) << layer;
    if (v == nullptr) continue;
    for (int e = 0; e < c.n_routed_experts; ++e) {
      const std::string p = Prefix(c, layer, e);
      auto t = [&](const std::string& name) { return (*ckpt)->Find(p + name)->data; };
      EXPECT_EQ(v[e].w2_stride, is / 2);
      EXPECT_EQ(v[e].w2_scale_stride, is / 32);
      for (const uint8_t* ptr :
           {v[e].w1, v[e].w1_scale, v[e].w3, v[e].w3_scale, v[e].w2, v[e].w2_scale}) {
        EXPECT_EQ(reinterpret_cast<uintptr_t>(ptr) % 64, 0u);
      }
      const int64_t tr = v[e].tile_rows;
      EXPECT_EQ(tr, s.tile_rows());
      rows_equal(v[e].w1, dim / 2, t("w1.weight") + r0 * dim / 2, dim / 2, is, dim / 2, p + "w1",
                 tr);
      rows_equal(v[e].w1_scale, dim / 32, t("w1.scale") + r0 * dim / 32, dim / 32, is, dim / 32,
                 p + "w1.scale");
      rows_equal(v[e].w3, dim / 2, t("w3.weight") + r0 * dim / 2, dim / 2, is, dim / 2, p + "w3",
                 tr);
      rows_equal(v[e].w3_scale, dim / 32, t("w3.scale") + r0 * dim / 32, dim / 32, is, dim / 32,
                 p + "w3.scale");
      rows_equal(v[e].w2, is / 2, t("w2.weight") + r0 / 2, I / 2, dim, is / 2, p + "w2", tr);
      rows_equal(v[e].w2_scale, is / 32, t("w2.scale") + r0 / 32, I / 32, dim, is / 32,
                 p + "w2.scale");
    }
  }
  EXPECT_EQ(compared, s.slice_bytes());
  return compared;
}

TEST(ExpertStore, TinyAWholeExpertsEqualTheCheckpoint) {
  auto pool = Pool(2);
  auto cfg = LoadModelConfig(kTinyA);
  ASSERT_TRUE(cfg.ok());
  auto s = Load(kTinyA, AllLayers(*cfg), 0, 1, pool.get());
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->inter_slice(), 128);
  EXPECT_EQ((*s)->layers().size(), 8u);  // 7 blocks + the MTP block (layer 7)
  EXPECT_EQ((*s)->layer_views(8), nullptr);
  EXPECT_EQ((*s)->layer_views(-1), nullptr);
  EXPECT_EQ((*s)->expert_slice_bytes(), 3 * 128 * 256 / 2 + 3 * 128 * 256 / 32);
  ExpectSliceEqualsCheckpoint(**s, kTinyA);
}

TEST(ExpertStore, TinyACannotBeCutInTwo) {
  auto s = Load(kTinyA, {0, 1}, 0, 2, nullptr);
  ASSERT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string m(s.status().message());
  EXPECT_NE(m.find("slice 0/2"), std::string::npos) << m;
  EXPECT_NE(m.find("moe_intermediate_size 128 / 2 = 64"), std::string::npos) << m;
  EXPECT_NE(m.find("multiple of 128"), std::string::npos) << m;
}

TEST(ExpertStore, I256SlicesEqualTheCheckpoint) {
  const std::string& dir = I256Checkpoint();
  auto cfg = LoadModelConfig(dir);
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  auto pool = Pool(3);
  for (const int64_t tile_rows : {16, 8, 0})
    for (int n : {1, 2}) {
      for (int i = 0; i < n; ++i) {
        // Layers out of order, the MTP block (5) included.
        auto s = Load(dir, {5, 0, 3, 1}, i, n, pool.get(), tile_rows);
        ASSERT_TRUE(s.ok()) << s.status();
        EXPECT_EQ((*s)->inter_slice(), 256 / n);
        EXPECT_EQ((*s)->layer_views(2), nullptr);
        const int64_t bytes = ExpectSliceEqualsCheckpoint(**s, dir);
        EXPECT_EQ(bytes, 4 * 8 * (3 * (256 / n) * 384 / 2 + 3 * (256 / n) * 384 / 32));
        EXPECT_LE((*s)->allocated_bytes(), (*s)->slice_bytes() + (2 << 20));
      }
    }
  // i >= n; I not divisible by n; I/n = 64 not a multiple of 128.
  EXPECT_EQ(Load(dir, {0}, 2, 2, nullptr).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Load(dir, {0}, 0, 3, nullptr).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Load(dir, {0}, 0, 4, nullptr).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ExpertStore, LayerListIsValidated) {
  const std::string& dir = I256Checkpoint();
  auto out_of_range = Load(dir, {0, 6}, 0, 1, nullptr);
  ASSERT_EQ(out_of_range.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string m(out_of_range.status().message());
  EXPECT_NE(m.find("layer 6"), std::string::npos) << m;
  EXPECT_NE(m.find("5 layers"), std::string::npos) << m;
  EXPECT_NE(m.find("MTP"), std::string::npos) << m;
  EXPECT_EQ(Load(dir, {-1}, 0, 1, nullptr).status().code(), absl::StatusCode::kInvalidArgument);
  auto twice = Load(dir, {1, 2, 1}, 0, 1, nullptr);
  EXPECT_NE(twice.status().message().find("layer 1 is listed twice"), std::string::npos)
      << twice.status();
  EXPECT_EQ(Load(dir, {}, 0, 1, nullptr).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(Load("/nonexistent/model", {0}, 0, 1, nullptr).ok());
}

// Resident memory after the load ~ the slice's bytes (the checkpoint's pages are gone).
TEST(ExpertStore, ResidentMemoryIsAboutTheSlice) {
  const std::string& dir = I256Checkpoint();
  auto cfg = LoadModelConfig(dir);
  ASSERT_TRUE(cfg.ok());
  auto pool = Pool(2);
  const int64_t before = ResidentBytes();
  auto s = Load(dir, AllLayers(*cfg), 0, 1, pool.get());
  ASSERT_TRUE(s.ok()) << s.status();
  const int64_t grown = ResidentBytes() - before;
  const int64_t slice = (*s)->slice_bytes();
  std::printf("slice %.2f MB, allocated %.2f MB, resident grew by %.2f MB\n", slice / 1e6,
              (*s)->allocated_bytes() / 1e6, grown / 1e6);
  EXPECT_LE(grown, static_cast<int64_t>(1.1 * slice) + (1 << 20));
}

// The copy's pages are on the node the store was bound to (move_pages in query mode).
TEST(ExpertStore, PagesLandOnTheRequestedNode) {
  auto topo = NumaTopology::Discover();
  ASSERT_TRUE(topo.ok());
  const int node = *(*topo)->ResolveNode(-1);
  auto pool = Pool(2);
  ExpertStoreOptions o;
  o.source.model_dir = I256Checkpoint();
  o.layers = {0, 1, 2};
  o.topology = topo->get();
  o.numa_node = node;
  auto s = ExpertStore::Load(o, pool.get());
  ASSERT_TRUE(s.ok()) << s.status();
  const ExpertSliceView* v = (*s)->layer_views(1);
  std::vector<void*> pages;
  for (int e = 0; e < 8; ++e) pages.push_back(const_cast<uint8_t*>(v[e].w2));
  std::vector<int> status(pages.size(), -100);
  if (::syscall(SYS_move_pages, 0, pages.size(), pages.data(), nullptr, status.data(), 0) != 0) {
    GTEST_SKIP() << "move_pages is refused here: " << std::strerror(errno);
  }
  for (int st : status) EXPECT_EQ(st, node);
  std::printf("store memory %s to node %d; pages on node %d\n",
              (*s)->memory_bound() ? "bound" : "NOT bound", node, status[0]);
}

}  // namespace
}  // namespace ss::expert
