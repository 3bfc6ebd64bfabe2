#include "common/tensor_parallel.h"

#include <string>

#include "gtest/gtest.h"

namespace ss {
namespace {

ModelConfig Shapes(int64_t n_heads, int64_t o_groups, int64_t o_lora_rank) {
  ModelConfig m;
  m.n_heads = n_heads;
  m.o_groups = o_groups;
  m.o_lora_rank = o_lora_rank;
  return m;
}

// Flash (64 heads, 8 groups of o_lora_rank 1024) splits at TP 1, 2, 4, 8; tiny-a (4 heads, 2
// groups of 128) at TP 1 and 2.
TEST(TensorParallelTest, AcceptsTheSplitsTheBackendRuns) {
  for (int tp : {1, 2, 4, 8}) {
    EXPECT_TRUE(CheckTensorParallelSplit(Shapes(64, 8, 1024), tp).ok()) << tp;
  }
  EXPECT_TRUE(CheckTensorParallelSplit(Shapes(4, 2, 128), 1).ok());
  EXPECT_TRUE(CheckTensorParallelSplit(Shapes(4, 2, 128), 2).ok());
}

// Each refusal names the field that does not split.
TEST(TensorParallelTest, RefusesNamingTheField) {
  const struct {
    ModelConfig model;
    int tp;
    std::string field;
  } cases[] = {
      {Shapes(64, 8, 1024), 0, "at least 1"},
      {Shapes(64, 8, 1024), 3, "num_attention_heads = 64"},
      {Shapes(64, 8, 1024), 16, "o_groups = 8"},  // 16 divides the heads, not the groups
      {Shapes(4, 2, 128), 4, "o_groups = 2"},
      {Shapes(8, 4, 64), 4, "o_lora_rank = 64"},  // each rank's 1 x 64 rows: not 128-aligned
      {Shapes(8, 4, 64), 2, ""},                  // 2 x 64 = 128 rows: splits
  };
  for (const auto& c : cases) {
    const absl::Status s = CheckTensorParallelSplit(c.model, c.tp);
    if (c.field.empty()) {
      EXPECT_TRUE(s.ok()) << s;
      continue;
    }
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_NE(std::string(s.message()).find(c.field), std::string::npos) << s;
  }
}

}  // namespace
}  // namespace ss
