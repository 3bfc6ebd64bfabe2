// The CUDA kernels' static-limit check (gpu_worker/kernels/kernel_limits.h, label unit; no GPU):
// a model within every limit passes, and one past a limit fails naming the field, its value and
// the kernel's limit.
#include "gpu_worker/kernels/kernel_limits.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "gpu_worker/kernels/limits.h"
#include "gtest/gtest.h"

namespace ss::cuda {
namespace {

// Flash's shapes.
ModelConfig Flash() {
  ModelConfig c;
  c.hc_mult = 4;
  c.n_routed_experts = 256;
  c.n_activated_experts = 6;
  c.head_dim = 512;
  c.index_n_heads = 64;
  c.index_head_dim = 128;
  c.index_topk = 512;
  return c;
}

TEST(KernelLimitsTest, AModelWithinEveryLimitPasses) {
  EXPECT_TRUE(CheckKernelLimits(Flash()).ok());
  ModelConfig c = Flash();
  c.hc_mult = kHcMaxMult;
  c.n_routed_experts = kRouterMaxExperts;
  c.n_activated_experts = kRouterMaxTopK;
  c.head_dim = kCompressorMaxDim;
  c.index_n_heads = kIndexerMaxHeads;
  c.index_head_dim = kIndexerMaxHeadDim;
  c.index_topk = kIndexerMaxTopK;
  EXPECT_TRUE(CheckKernelLimits(c).ok()) << CheckKernelLimits(c);
}

TEST(KernelLimitsTest, TheErrorNamesTheFieldItsValueAndTheLimit) {
  struct Case {
    std::function<void(ModelConfig&)> set;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](ModelConfig& c) { c.hc_mult = 9; },
       "hc_mult = 9 exceeds the CUDA hyper-connection's limit kHcMaxMult = 8"},
      {[](ModelConfig& c) { c.n_routed_experts = 2048; },
       "n_routed_experts = 2048 exceeds the CUDA router's limit kRouterMaxExperts = 1024"},
      {[](ModelConfig& c) { c.n_activated_experts = 33; },
       "n_activated_experts = 33 exceeds the CUDA router's limit kRouterMaxTopK = 32"},
      {[](ModelConfig& c) { c.head_dim = 1024; },
       "head_dim = 1024 exceeds the CUDA compressor's limit kCompressorMaxDim = 512"},
      {[](ModelConfig& c) { c.head_dim = 200; },
       "head_dim = 200 is not a multiple of the CUDA sparse attention's "
       "kAttentionHeadDimMultiple = 128"},
      {[](ModelConfig& c) { c.index_n_heads = 65; },
       "index_n_heads = 65 exceeds the CUDA indexer's limit kIndexerMaxHeads = 64"},
      {[](ModelConfig& c) { c.index_head_dim = 256; },
       "index_head_dim = 256 exceeds the CUDA indexer's limit kIndexerMaxHeadDim = 128"},
      {[](ModelConfig& c) { c.index_topk = 2048; },
       "index_topk = 2048 exceeds the CUDA indexer top-k's limit kIndexerMaxTopK = 1024"},
  };
  for (const Case& k : cases) {
    ModelConfig c = Flash();
    k.set(c);
    const absl::Status s = CheckKernelLimits(c);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << k.message;
    EXPECT_EQ(s.message(), k.message);
  }
}

}  // namespace
}  // namespace ss::cuda
