// Whether a model's shapes fit the CUDA kernels' static limits (limits.h), checked once where the
// cuda backend is created rather than at every launch. Plain C++: builds without CUDA.
#pragma once

#include "absl/status/status.h"
#include "common/model_config.h"

namespace ss::cuda {

// OK, or InvalidArgument naming the first field of `c` that a kernel cannot take, its value, and
// the kernel's limit, e.g. "n_routed_experts = 2048 exceeds the CUDA router's limit
// kRouterMaxExperts = 1024".
absl::Status CheckKernelLimits(const ModelConfig& c);

}  // namespace ss::cuda
