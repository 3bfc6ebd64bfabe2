// What the cluster tests share: tiny-a's config and a two-stage cluster config over it.
#pragma once

#include "common/model_config.h"
#include "gtest/gtest.h"

namespace ss::coord::testing_util {

inline ModelConfig TinyModel() {
  absl::StatusOr<ModelConfig> m = LoadModelConfig(SS_TINY_A_DIR);
  EXPECT_TRUE(m.ok()) << m.status();
  return *m;
}

inline constexpr char kTwoStages[] = R"({
  "model_name": "tiny", "kv_block_tokens": 128, "max_batch_tokens": 256, "max_running": 32,
  "heartbeat_interval_ms": 50, "heartbeat_timeout_ms": 3000,
  "stages": [{"layers": "0-3", "workers": ["gpu0"]}, {"layers": "4-6", "workers": ["gpu1"]}],
  "expert_workers": [
    {"id": "e0", "layers": "0-3", "slice": "0/1", "shm": "seg0"},
    {"id": "e1", "layers": "4-6", "slice": "0/1", "grpc": "127.0.0.1:1"}
  ]})";

}  // namespace ss::coord::testing_util
