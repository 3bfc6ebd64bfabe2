// The resident routed experts (gpu_worker/cuda/resident_routed_experts.h) on tiny-a's layer 3: the
// GPU's resident part plus the host's part equal the reference routed sum, before and after the
// rebalance's swaps (staged in the background, applied between steps), and swaps that break the
// contract are refused.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "common/bf16.h"
#include "common/model/moe.h"
#include "gpu_worker/cuda/host_routed_experts.h"
#include "gpu_worker/cuda/resident_routed_experts.h"
#include "gtest/gtest.h"
#include "tests/gpu_worker/gpu_test_util.h"
#include "tests/gpu_worker/tiny_schedule.h"

namespace ss::gpu::cuda_backend_internal {
namespace {

using cuda::testing_util::DeviceBuffer;

class ResidentExpertsTest : public cuda::testing_util::GpuTest {};

constexpr int kLayer = 3;
constexpr int64_t kRows = 5;

// Enqueues one step of layer kLayer and checks the sum against model::RoutedSum.
void ExpectReferenceSum(ResidentRoutedExperts& r, const model::Model& m, cudaStream_t stream,
                        const std::vector<float>& x, const std::vector<int32_t>& ids,
                        const std::vector<float>& w) {
  const ModelConfig& c = m.config();
  std::vector<uint16_t> xb(x.size());
  for (size_t i = 0; i < x.size(); ++i) xb[i] = FloatToBf16(x[i]);
  DeviceBuffer<uint16_t> xd(xb);
  DeviceBuffer<int32_t> idd(ids);
  DeviceBuffer<float> wd(w);
  DeviceBuffer<float> sum(x.size());
  ASSERT_TRUE(r.PrepareStep(1, kRows).ok());
  ASSERT_TRUE(r.Enqueue(0, reinterpret_cast<const cuda::bf16_t*>(xd.get()), idd.get(), wd.get(),
                        kRows, sum.get(), stream)
                  .ok());
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  ASSERT_TRUE(r.StepStatus(1).ok());
  model::RouterResult route{ids, w};
  std::vector<float> want(x.size());
  model::RoutedSum(m.weights().blocks[kLayer].moe, c, x.data(), route, kRows, want.data());
  const std::vector<float> got = sum.Get();
  float scale = 0;
  for (float v : want) scale = std::max(scale, std::fabs(v));
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], 1e-5f * scale) << "at " << i;
  }
}

TEST_F(ResidentExpertsTest, ResidentAndSwappedExpertsGiveTheReferenceSum) {
  const std::shared_ptr<const model::Model> model = testing_util::TinyModel();
  ASSERT_NE(model, nullptr);
  const ModelConfig& c = model->config();
  const int E = static_cast<int>(c.n_routed_experts), K = static_cast<int>(c.n_activated_experts);
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(kRows * c.dim);
  for (float& v : x) v = Bf16ToFloat(FloatToBf16(normal(rng)));
  std::vector<int32_t> ids;
  std::vector<float> w;
  for (int64_t t = 0; t < kRows; ++t) {
    std::vector<int32_t> all(E);
    for (int e = 0; e < E; ++e) all[e] = e;
    std::shuffle(all.begin(), all.end(), rng);
    ids.insert(ids.end(), all.begin(), all.begin() + K);
    for (int k = 0; k < K; ++k) w.push_back(0.1f + 0.2f * static_cast<float>(k));
  }
  ids[0] = 1;  // a choice of expert 1, which the swap below evicts, and of 12 it promotes
  ids[1] = 12;
  const std::function<const model::RoutedExperts*(int64_t)> none = [](int64_t) { return nullptr; };
  ResidentExpertsOptions o;
  o.sources = {kLayer, kLayer + 1, 1, 0, nullptr, {}};
  o.resident = {{0, 1, 2, 3}};
  o.heat = std::make_shared<ExpertHeat>(kLayer, kLayer + 1, E);
  o.rebalance.interval = absl::Hours(1);  // the thread never runs a round here: Stage by hand
  o.max_swaps = 2;
  absl::StatusOr<std::unique_ptr<ResidentRoutedExperts>> r = ResidentRoutedExperts::Create(
      *model, o, std::make_unique<HostRoutedExperts>(*model, none, kLayer, 1, 0));
  ASSERT_TRUE(r.ok()) << r.status();
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  ExpectReferenceSum(**r, *model, stream, x, ids, w);

  EXPECT_EQ((*r)->Range(kLayer), (std::pair<int32_t, int32_t>{0, E}));
  EXPECT_FALSE((*r)->Stage({{kLayer, 1, kLayer, 2}}).ok());   // 2 is resident already
  EXPECT_FALSE((*r)->Stage({{kLayer, 9, kLayer, 12}}).ok());  // 9 is not resident
  EXPECT_FALSE(
      (*r)->Stage({{kLayer, 1, kLayer, 12}, {kLayer, 2, kLayer, 13}, {kLayer, 3, kLayer, 14}})
          .ok());  // more than max_swaps
  absl::StatusOr<bool> staged = (*r)->Stage({{kLayer, 1, kLayer, 12}, {kLayer, 2, kLayer, 9}});
  ASSERT_TRUE(staged.ok()) << staged.status();
  EXPECT_TRUE(*staged);
  EXPECT_FALSE(*(*r)->Stage({{kLayer, 3, kLayer, 4}}));  // the first batch is still staged
  for (int i = 0; i < 2000 && (*r)->Current().layers[0] != std::vector<int32_t>{0, 3, 9, 12}; ++i) {
    ASSERT_TRUE((*r)->PrepareStep(1, kRows).ok());  // applies the batch once its copies finished
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ((*r)->Current().layers[0], (std::vector<int32_t>{0, 3, 9, 12}));
  EXPECT_EQ(o.heat->rebalance_swaps(), 2u);
  EXPECT_GT(o.heat->rebalance_bytes(), 0u);
  ExpectReferenceSum(**r, *model, stream, x, ids, w);
  absl::StatusOr<std::vector<ResidentRoutedExperts::LayerHits>> hits = (*r)->Hits();
  ASSERT_TRUE(hits.ok());
  EXPECT_EQ((*hits)[0].choices, static_cast<uint64_t>(2 * kRows * K));
  // The choices served on the GPU, by expert, reach the heat at Refresh: the first step's of
  // experts 0-3, the second's of 0, 3, 9 and 12 (the host path here is the reference's RoutedSum,
  // which counts nothing).
  uint64_t want_first = 0, want_second = 0, ones = 0, twelves = 0;
  for (int32_t e : ids) {
    want_first += e >= 0 && e <= 3 ? 1 : 0;
    want_second += e == 0 || e == 3 || e == 9 || e == 12 ? 1 : 0;
    ones += e == 1 ? 1 : 0;
    twelves += e == 12 ? 1 : 0;
  }
  o.heat->Refresh();
  EXPECT_EQ(o.heat->choices(kLayer, ChoicePath::kGpu), want_first + want_second);
  EXPECT_EQ(o.heat->choices(kLayer, ChoicePath::kGpu), (*hits)[0].resident);
  EXPECT_EQ(o.heat->count(kLayer, 1), ones);      // resident in the first step only
  EXPECT_EQ(o.heat->count(kLayer, 12), twelves);  // resident in the second step only
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace ss::gpu::cuda_backend_internal
