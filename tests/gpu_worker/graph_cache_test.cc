// The cuda backend's graph cache rules (gpu_worker/cuda/graph_cache.h) that decide without a
// device: a key seen for the first time runs the layers launched and becomes the pending key; its
// second sight captures (here on the legacy stream, where a capture is refused, so Run returns the
// error without running the layers); set_enabled forgets the pending key. Runs without a GPU.
#include "gpu_worker/cuda/graph_cache.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace ss::gpu::cuda_backend_internal {
namespace {

struct Layers {
  int runs = 0;
  bool saw_capturing = false;
  bool* capturing = nullptr;
  absl::Status operator()() {
    ++runs;
    saw_capturing = saw_capturing || *capturing;
    return absl::OkStatus();
  }
};

TEST(StepGraphCacheTest, ANewKeyRunsLaunchedAndItsSecondSightCaptures) {
  StepGraphCache cache;
  bool capturing = false;
  Layers layers;
  layers.capturing = &capturing;
  const std::vector<int64_t> a = {1, 2, 3}, b = {1, 2, 4};

  absl::StatusOr<bool> ran = cache.Run(a, 0, nullptr, &capturing, [&] { return layers(); });
  ASSERT_TRUE(ran.ok()) << ran.status();
  EXPECT_TRUE(*ran);
  ran = cache.Run(b, 0, nullptr, &capturing, [&] { return layers(); });
  ASSERT_TRUE(ran.ok()) << ran.status();
  EXPECT_TRUE(*ran);
  EXPECT_EQ(layers.runs, 2);
  EXPECT_FALSE(layers.saw_capturing);

  // b again: the capture is attempted (and refused on the legacy stream, or without a device).
  ran = cache.Run(b, 0, nullptr, &capturing, [&] { return layers(); });
  EXPECT_FALSE(ran.ok());
  EXPECT_EQ(layers.runs, 2);
  EXPECT_FALSE(capturing);
  EXPECT_EQ(cache.captures(), 0);
  EXPECT_EQ(cache.replays(), 0);
  (void)cudaGetLastError();
}

TEST(StepGraphCacheTest, SetEnabledForgetsThePendingKey) {
  StepGraphCache cache;
  bool capturing = false;
  Layers layers;
  layers.capturing = &capturing;
  const std::vector<int64_t> a = {7};
  ASSERT_TRUE(cache.Run(a, 0, nullptr, &capturing, [&] { return layers(); }).ok());
  cache.set_enabled(true);
  absl::StatusOr<bool> ran = cache.Run(a, 0, nullptr, &capturing, [&] { return layers(); });
  ASSERT_TRUE(ran.ok()) << ran.status();
  EXPECT_TRUE(*ran);
  EXPECT_EQ(layers.runs, 2);
  EXPECT_TRUE(cache.enabled());
  cache.set_enabled(false);
  EXPECT_FALSE(cache.enabled());
}

TEST(StepGraphCacheTest, EachSlotKeepsItsOwnPendingKey) {
  StepGraphCache cache;
  bool capturing = false;
  Layers layers;
  layers.capturing = &capturing;
  const std::vector<int64_t> a = {1, 2, 3};
  // a in slot 0, then in slot 1: a first sight in each, both launched.
  for (const int slot : {0, 1}) {
    absl::StatusOr<bool> ran = cache.Run(a, slot, nullptr, &capturing, [&] { return layers(); });
    ASSERT_TRUE(ran.ok()) << ran.status();
    EXPECT_TRUE(*ran);
  }
  EXPECT_EQ(layers.runs, 2);
  // a in slot 0 again: its second sight there, so a capture (refused here).
  EXPECT_FALSE(cache.Run(a, 0, nullptr, &capturing, [&] { return layers(); }).ok());
  EXPECT_EQ(layers.runs, 2);
  (void)cudaGetLastError();
  EXPECT_EQ(cache.Run(a, StepGraphCache::kSlots, nullptr, &capturing, [&] { return layers(); })
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cache.Run(a, -1, nullptr, &capturing, [&] { return layers(); }).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(layers.runs, 2);
}

TEST(StepGraphCacheTest, ALaunchedStepsErrorIsReturned) {
  StepGraphCache cache;
  bool capturing = false;
  absl::StatusOr<bool> ran =
      cache.Run({5}, 0, nullptr, &capturing, [] { return absl::InternalError("layer 3 failed"); });
  EXPECT_EQ(ran.status(), absl::InternalError("layer 3 failed"));
}

}  // namespace
}  // namespace ss::gpu::cuda_backend_internal
