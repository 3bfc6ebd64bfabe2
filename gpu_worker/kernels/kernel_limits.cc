#include "gpu_worker/kernels/kernel_limits.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "gpu_worker/kernels/limits.h"

namespace ss::cuda {
namespace {

// An upper bound on one field of the model config.
struct Limit {
  const char* field;
  int64_t value;
  const char* kernel;  // whose limit, as "the CUDA <kernel>'s limit"
  const char* name;
  int64_t max;
};

}  // namespace

absl::Status CheckKernelLimits(const ModelConfig& c) {
  const Limit limits[] = {
      {"hc_mult", c.hc_mult, "hyper-connection", "kHcMaxMult", kHcMaxMult},
      {"n_routed_experts", c.n_routed_experts, "router", "kRouterMaxExperts", kRouterMaxExperts},
      {"n_activated_experts", c.n_activated_experts, "router", "kRouterMaxTopK", kRouterMaxTopK},
      {"head_dim", c.head_dim, "compressor", "kCompressorMaxDim", kCompressorMaxDim},
      {"index_n_heads", c.index_n_heads, "indexer", "kIndexerMaxHeads", kIndexerMaxHeads},
      {"index_head_dim", c.index_head_dim, "indexer", "kIndexerMaxHeadDim", kIndexerMaxHeadDim},
      {"index_topk", c.index_topk, "indexer top-k", "kIndexerMaxTopK", kIndexerMaxTopK},
  };
  if (c.head_dim % kAttentionHeadDimMultiple != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "head_dim = ", c.head_dim, " is not a multiple of the CUDA sparse attention's ",
        "kAttentionHeadDimMultiple = ", kAttentionHeadDimMultiple));
  }
  for (const Limit& l : limits) {
    if (l.value > l.max) {
      return absl::InvalidArgumentError(absl::StrCat(l.field, " = ", l.value, " exceeds the CUDA ",
                                                     l.kernel, "'s limit ", l.name, " = ", l.max));
    }
  }
  return absl::OkStatus();
}

}  // namespace ss::cuda
