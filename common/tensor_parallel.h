// Whether tensor parallelism of a given size can split a model: the one rule that `splitserve up`,
// the cluster config, the GPU workers' memory plan and the cuda backend all apply, so a launch is
// refused up front exactly when a worker would refuse it later.
#pragma once

#include "absl/status/status.h"
#include "common/model_config.h"

namespace ss {

// OK when TP `tp` splits `model`: tp >= 1, and tp divides num_attention_heads (each rank holds
// whole heads) and o_groups (each rank holds whole output groups), and each rank's slice of wo_a,
// (o_groups / tp) * o_lora_rank rows, is a multiple of 128 (the FP8 GEMM's 128-row blocks).
// Otherwise InvalidArgument naming the config.json field that does not split and its value.
// Callers prefix their own context ("cluster config: ", "splitserve up: --tp 3: ").
absl::Status CheckTensorParallelSplit(const ModelConfig& model, int tp);

}  // namespace ss
