// The expert store's dummy path (--load-format dummy): from a directory holding only config.json
// it holds exactly the bytes a real load of the same dummy checkpoint written to safetensors
// holds (so from the bound views on it is the real load's path), for slices and tile layouts;
// the seed changes the bytes.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/dummy_weights.h"
#include "common/safetensors.h"
#include "common/thread_pool.h"
#include "cpu_expert_worker/expert_store.h"
#include "tests/tools/test_configs.h"

namespace ss::expert {
namespace {

namespace fs = std::filesystem;

class ExpertStoreDummy : public testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::path(testing::TempDir()) / ("ss_store_dummy_" + std::to_string(::getpid()));
    fs::create_directories(root_ / "config_only");
    fs::create_directories(root_ / "written");
    for (const char* d : {"config_only", "written"}) {
      std::ofstream(root_ / d / "config.json") << testing_util::kWideI256Config;
    }
    auto cfg = ParseModelConfig(testing_util::kWideI256Config);
    ASSERT_TRUE(cfg.ok()) << cfg.status();
    config_ = *cfg;
    // The dummy checkpoint of seed 9, written as safetensors.
    auto ck = MakeDummyCheckpoint(config_, 9, nullptr, nullptr);
    ASSERT_TRUE(ck.ok()) << ck.status();
    std::vector<TensorToWrite> out;
    for (const auto& [name, v] : (*ck)->tensors()) {
      out.push_back({name, v->dtype, v->shape, std::vector<uint8_t>(v->data, v->data + v->nbytes)});
    }
    ASSERT_TRUE(WriteSafetensors((root_ / "written" / "model.safetensors").string(), out).ok());
    ThreadPoolOptions po;
    po.num_threads = 2;
    pool_ = *ThreadPool::Create(po);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }

  absl::StatusOr<std::unique_ptr<ExpertStore>> Load(const char* dir, LoadFormat format,
                                                    uint64_t seed, int i, int n,
                                                    int64_t tile_rows) {
    ExpertStoreOptions o;
    o.source.model_dir = (root_ / dir).string();
    o.source.load_format = format;
    o.source.seed = seed;
    o.layers = {5, 0, 3, 1, 2, 4};
    o.slice_index = i;
    o.slice_count = n;
    o.tile_rows = tile_rows;
    return ExpertStore::Load(o, pool_.get());
  }

  fs::path root_;
  ModelConfig config_;
  std::unique_ptr<ThreadPool> pool_;
};

// Bytes held by both stores, piece by piece; returns how many differ.
int64_t Differences(const ExpertStore& a, const ExpertStore& b, int64_t* compared) {
  int64_t diff = 0;
  const int64_t dim = a.dim(), is = a.inter_slice();
  for (int layer : a.layers()) {
    const ExpertSliceView* va = a.layer_views(layer);
    const ExpertSliceView* vb = b.layer_views(layer);
    for (int64_t e = 0; e < a.num_experts(); ++e) {
      const std::pair<const uint8_t*, const uint8_t*> pieces[] = {
          {va[e].w1, vb[e].w1}, {va[e].w1_scale, vb[e].w1_scale},
          {va[e].w3, vb[e].w3}, {va[e].w3_scale, vb[e].w3_scale},
          {va[e].w2, vb[e].w2}, {va[e].w2_scale, vb[e].w2_scale}};
      const int64_t sizes[] = {is * dim / 2,  is * dim / 32, is * dim / 2,
                               is * dim / 32, dim * is / 2,  dim * is / 32};
      for (int k = 0; k < 6; ++k) {
        diff += std::memcmp(pieces[k].first, pieces[k].second, sizes[k]) != 0;
        *compared += sizes[k];
      }
    }
  }
  return diff;
}

TEST_F(ExpertStoreDummy, DummyLoadEqualsARealLoadOfTheSameDummyCheckpoint) {
  for (const auto& [n, tile_rows] : {std::pair{1, 0}, std::pair{2, 16}, std::pair{2, 8}}) {
    for (int i = 0; i < n; ++i) {
      auto dummy = Load("config_only", LoadFormat::kDummy, 9, i, n, tile_rows);
      ASSERT_TRUE(dummy.ok()) << dummy.status();
      auto real = Load("written", LoadFormat::kSafetensors, 0, i, n, tile_rows);
      ASSERT_TRUE(real.ok()) << real.status();
      int64_t compared = 0;
      EXPECT_EQ(Differences(**dummy, **real, &compared), 0) << "slice " << i << "/" << n;
      EXPECT_EQ(compared, (*real)->slice_bytes());
      EXPECT_EQ((*dummy)->slice_bytes(), (*real)->slice_bytes());
    }
  }
  auto other = Load("config_only", LoadFormat::kDummy, 10, 0, 1, 0);
  auto real = Load("written", LoadFormat::kAuto, 0, 0, 1, 0);
  ASSERT_TRUE(other.ok() && real.ok());
  int64_t compared = 0;
  EXPECT_GT(Differences(**other, **real, &compared), 100) << "seed 10 should differ from 9";
}

TEST_F(ExpertStoreDummy, ConfigOnlyDirectoryNeedsDummy) {
  EXPECT_FALSE(Load("config_only", LoadFormat::kAuto, 9, 0, 1, 0).ok());
}

}  // namespace
}  // namespace ss::expert
