// The expert path's statistics (gpu_worker/expert_heat.h): counts by layer, expert and path, the
// CPU's expert bytes and the moves; a source's counts added at Refresh; the expert client's
// counting and the Prometheus series that follow the counts (stage_runner.h ExportExpertHeat).
#include "gpu_worker/expert_heat.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/metrics/metrics.h"
#include "common/model/model.h"
#include "common/model/moe.h"
#include "gpu_worker/routed_experts_client.h"
#include "gpu_worker/stage_runner.h"
#include "gtest/gtest.h"
#include "tests/gpu_worker/gpu_worker_test_util.h"

namespace ss::gpu {
namespace {

using testing_util::TinyA;

TEST(ExpertHeat, CountsEveryChoiceOfItsLayersAndNothingElse) {
  ExpertHeat h(2, 5, 16);
  const int32_t ids[] = {3, 7, 3, model::kSkippedExpert, 16, -2, 0, 15};
  h.Count(2, ids, 8);
  h.Count(4, ids, 2);
  h.Count(1, ids, 8);  // outside the stage's layers
  h.Count(5, ids, 8);
  EXPECT_EQ(h.count(2, 3), 2u);
  EXPECT_EQ(h.count(2, 7), 1u);
  EXPECT_EQ(h.count(2, 0), 1u);
  EXPECT_EQ(h.count(2, 15), 1u);
  EXPECT_EQ(h.count(4, 3), 1u);
  EXPECT_EQ(h.count(4, 7), 1u);
  EXPECT_EQ(h.count(1, 3), 0u);
  EXPECT_EQ(h.count(2, 16), 0u);
  EXPECT_EQ(h.choices(2, ChoicePath::kCpu), 5u);
  EXPECT_EQ(h.choices(4, ChoicePath::kCpu), 2u);
  EXPECT_EQ(h.choices(2, ChoicePath::kGpu), 0u);
  EXPECT_EQ(h.choices(1, ChoicePath::kCpu), 0u);
  h.Count(3, ids, 3, ChoicePath::kGpu);  // 3, 7, 3 served on the GPU
  EXPECT_EQ(h.choices(3, ChoicePath::kGpu), 3u);
  EXPECT_EQ(h.choices(3, ChoicePath::kCpu), 0u);
  EXPECT_EQ(h.count(3, 3), 2u);
  h.Count(3, ids, 3, ChoicePath::kGpu);
  const std::vector<uint64_t> all = h.Snapshot();
  ASSERT_EQ(all.size(), 3u * 16u);
  uint64_t sum = 0;
  for (uint64_t v : all) sum += v;
  EXPECT_EQ(sum, 5u + 2u + 6u);
  EXPECT_EQ(all[2 * 16 + 7], 1u);  // layer 4, expert 7
  h.AddRebalance(2, 100);
  h.AddRebalance(1, 50);
  h.AddCpuRead(7);
  EXPECT_EQ(h.rebalance_swaps(), 3u);
  EXPECT_EQ(h.rebalance_bytes(), 150u);
  EXPECT_EQ(h.cpu_read_bytes(), 7u);
}

// Counts kept elsewhere (the resident path's device counters) arrive through the source at
// Refresh, and a detached source is not called.
TEST(ExpertHeat, ASourceAddsItsCountsAtRefresh) {
  ExpertHeat h(2, 4, 8);
  int calls = 0;
  h.SetSource([&] {
    ++calls;
    h.Add(3, 5, 4, ChoicePath::kGpu);
    h.Add(9, 5, 4, ChoicePath::kGpu);  // outside the layers: ignored
    h.Add(3, 8, 4, ChoicePath::kGpu);  // outside the experts: ignored
  });
  EXPECT_EQ(h.count(3, 5), 0u);
  h.Refresh();
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(h.count(3, 5), 4u);
  EXPECT_EQ(h.choices(3, ChoicePath::kGpu), 4u);
  EXPECT_EQ(h.choices(3, ChoicePath::kCpu), 0u);
  h.SetSource(nullptr);
  h.Refresh();
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(h.count(3, 5), 4u);
}

// The expert client counts each call's choices (here a layer it computes locally), and the
// counters follow the counts at each scrape.
TEST(ExpertHeat, TheClientCountsAndTheMetricsFollow) {
  auto heat = std::make_shared<ExpertHeat>(0, 7, 16);
  ExpertClientOptions o;
  o.heat = heat.get();
  auto client = RoutedExpertsClient::Connect(*TinyA(), {}, o);
  ASSERT_TRUE(client.ok()) << client.status();
  const int64_t T = 2, dim = 256;
  std::vector<float> x(T * dim, 0.5f), out(T * dim);
  const std::vector<int32_t> ids = {1, 5, 9, 5, 5, 2, model::kSkippedExpert, 14};
  const std::vector<float> w(8, 0.25f);
  ASSERT_TRUE((*client)->Compute(3, T, x.data(), ids.data(), w.data(), 4, out.data()).ok());
  EXPECT_EQ(heat->count(3, 5), 3u);
  EXPECT_EQ(heat->count(3, 14), 1u);
  // The CPU read the call's 5 distinct experts (1, 5, 9, 2, 14) whole: the layer is local.
  const int64_t expert_bytes = model::Mxfp4ExpertBytes(TinyA()->config());
  EXPECT_EQ(heat->cpu_read_bytes(), static_cast<uint64_t>(5 * expert_bytes));
  heat->Count(3, ids.data(), 2, ChoicePath::kGpu);  // 1 and 5, as the resident path counts
  metrics::Metrics m;
  ExportExpertHeat(m, "w0", heat);
  EXPECT_NE(
      m.Serialize().find(
          "splitserve:gpu_worker_expert_routed_total{expert=\"5\",layer=\"3\",worker=\"w0\"} 4"),
      std::string::npos);
  ASSERT_TRUE((*client)->Compute(3, T, x.data(), ids.data(), w.data(), 4, out.data()).ok());
  const std::string text = m.Serialize();
  EXPECT_NE(text.find("splitserve:gpu_worker_expert_routed_total{expert=\"5\",layer=\"3\","
                      "worker=\"w0\"} 7"),
            std::string::npos);
  EXPECT_NE(text.find("splitserve:gpu_worker_expert_routed_total{expert=\"0\",layer=\"6\","
                      "worker=\"w0\"} 0"),
            std::string::npos);
  EXPECT_NE(text.find("splitserve:gpu_worker_routed_choices_total{layer=\"3\",path=\"cpu\","
                      "worker=\"w0\"} 14"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("splitserve:gpu_worker_routed_choices_total{layer=\"3\",path=\"gpu\","
                      "worker=\"w0\"} 2"),
            std::string::npos);
  EXPECT_NE(
      text.find(absl::StrCat("splitserve:gpu_worker_expert_cpu_read_bytes_total{worker=\"w0\"} ",
                             10 * expert_bytes)),
      std::string::npos);
  EXPECT_NE(text.find("splitserve:gpu_worker_expert_rebalances_total{worker=\"w0\"} 0"),
            std::string::npos);
}

}  // namespace
}  // namespace ss::gpu
