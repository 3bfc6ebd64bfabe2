// The greedy rows' tokens from the TP ranks' argmax records (gpu_worker/cuda/step_output.h
// CombineGreedyRecords), host code only (no GPU; the records' all-gather needs two GPUs): the
// largest maximum over the ranks, equal maxima to the lower id, and -1 for a row any rank flags,
// a row without an id, an all -inf row or a row that is not greedy.
#include <bit>
#include <cmath>
#include <cstdint>
#include <vector>

#include "gpu_worker/cuda/step_output.h"
#include "gtest/gtest.h"

namespace ss::gpu::cuda_backend_internal {
namespace {

struct Record {
  float max = 0.0f;
  int32_t id = -1, nonfinite = 0;
};

// `ranks`[q][r]: rank q's record of row r, laid out as ReadStepOutput gathers them.
std::vector<float> Layout(const std::vector<std::vector<Record>>& ranks) {
  std::vector<float> out;
  for (const std::vector<Record>& rows : ranks) {
    const size_t n = rows.size();
    std::vector<float> block(3 * n);
    for (size_t r = 0; r < n; ++r) {
      block[r] = rows[r].max;
      block[n + r] = std::bit_cast<float>(rows[r].id);
      block[2 * n + r] = std::bit_cast<float>(rows[r].nonfinite);
    }
    out.insert(out.end(), block.begin(), block.end());
  }
  return out;
}

TEST(GreedyRecordsTest, RanksCombineByTheLargestMaximumThenTheLowerId) {
  const float kNan = std::bit_cast<float>(0x7fc00000u);
  // Rows: 0 rank 1 larger; 1 a tie across ranks (lower id wins, whichever rank has it);
  // 2 rank 0 flags a NaN; 3 all -inf; 4 rank 1 has no rows (-1, NaN maximum); 5 not greedy.
  const std::vector<std::vector<Record>> ranks = {
      {{1.0f, 10, 0},
       {2.0f, 70000, 0},
       {5.0f, 3, 1},
       {-INFINITY, 0, 0},
       {4.0f, 9, 0},
       {9.0f, 1, 0}},
      {{1.5f, 64700, 0},
       {2.0f, 64650, 0},
       {1.0f, 64641, 0},
       {-INFINITY, 64640, 0},
       {kNan, -1, 0},
       {1.0f, 64641, 0}},
  };
  const std::vector<float> records = Layout(ranks);
  const std::vector<bool> greedy = {true, true, true, true, true, false};
  EXPECT_EQ(CombineGreedyRecords(records.data(), 2, greedy),
            (std::vector<int32_t>{64700, 64650, -1, -1, 9, -1}));
  // One rank: its own records.
  const std::vector<float> one = Layout({ranks[0]});
  EXPECT_EQ(CombineGreedyRecords(one.data(), 1, greedy),
            (std::vector<int32_t>{10, 70000, -1, -1, 9, -1}));
  EXPECT_TRUE(CombineGreedyRecords(nullptr, 2, {}).empty());
}

}  // namespace
}  // namespace ss::gpu::cuda_backend_internal
