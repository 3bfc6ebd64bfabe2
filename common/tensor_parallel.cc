#include "common/tensor_parallel.h"

#include "absl/strings/str_cat.h"

namespace ss {

absl::Status CheckTensorParallelSplit(const ModelConfig& model, int tp) {
  if (tp < 1) {
    return absl::InvalidArgumentError(absl::StrCat("TP size ", tp, " must be at least 1"));
  }
  if (model.n_heads % tp != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TP size ", tp, " does not divide the model's num_attention_heads = ", model.n_heads,
        " (each rank holds whole heads)"));
  }
  if (model.o_groups % tp != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("TP size ", tp, " does not divide the model's o_groups = ", model.o_groups,
                     " (each rank holds whole output groups)"));
  }
  if ((model.o_groups / tp) * model.o_lora_rank % 128 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TP size ", tp, " does not split the model's o_lora_rank = ", model.o_lora_rank,
        ": each rank's (o_groups / TP) * o_lora_rank = ", (model.o_groups / tp) * model.o_lora_rank,
        " must be a multiple of 128 (FP8 GEMM blocks)"));
  }
  return absl::OkStatus();
}

}  // namespace ss
