// CUDA sparse attention against the reference SparseAttendHead (label gpu); skips without a
// CUDA device.
#include "gpu_worker/kernels/sparse_attention.h"

#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "common/bf16.h"
#include "common/golden/golden.h"
#include "common/model/attention.h"
#include "gtest/gtest.h"
#include "tests/gpu_worker/gpu_test_util.h"

namespace ss::cuda {
namespace {

class SparseAttentionTest : public testing_util::GpuTest {};

struct Case {
  const char* name;
  int64_t T, H, D, window, compressed, pool;
};

// Candidate lists shaped like the reference's: `window` raw entries (positions before the query
// padded with -1 early on), then `compressed` entries with some masked.
void RunCase(const Case& c) {
  std::mt19937_64 rng(c.H * 1000 + c.D);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(c.pool - 1));
  const int64_t C = c.window + c.compressed;
  std::vector<float> q(c.T * c.H * c.D), pool(c.pool * c.D), sink(c.H);
  for (float& v : q) v = RoundBf16(nd(rng));
  for (float& v : pool) v = RoundBf16(nd(rng));
  for (float& v : sink) v = nd(rng);
  std::vector<int32_t> cand(c.T * C);
  for (int64_t t = 0; t < c.T; ++t) {
    const int64_t valid_window = std::min<int64_t>(c.window, 1 + t * (c.window / 2));
    for (int64_t i = 0; i < C; ++i) {
      int32_t v = pick(rng);
      if (i < c.window && i >= valid_window) v = -1;
      if (i >= c.window && (i + t) % 7 == 0) v = -1;
      cand[t * C + i] = v;
    }
  }
  std::vector<uint16_t> qb(q.size()), pb(pool.size());
  for (size_t i = 0; i < q.size(); ++i) qb[i] = FloatToBf16(q[i]);
  for (size_t i = 0; i < pool.size(); ++i) pb[i] = FloatToBf16(pool[i]);
  uint16_t *dq, *dp, *dout;
  int32_t* dc;
  float* ds;
  ASSERT_EQ(cudaMalloc(&dq, qb.size() * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dp, pb.size() * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dout, qb.size() * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dc, cand.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&ds, sink.size() * 4), cudaSuccess);
  cudaMemcpy(dq, qb.data(), qb.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(dp, pb.data(), pb.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(dc, cand.data(), cand.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(ds, sink.data(), sink.size() * 4, cudaMemcpyHostToDevice);
  const float scale = static_cast<float>(std::pow(static_cast<double>(c.D), -0.5));
  ASSERT_EQ(SparseAttention(dq, dp, dc, ds, c.T, c.H, c.D, C, scale, dout, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint16_t> ob(qb.size());
  cudaMemcpy(ob.data(), dout, ob.size() * 2, cudaMemcpyDeviceToHost);
  cudaFree(dq);
  cudaFree(dp);
  cudaFree(dout);
  cudaFree(dc);
  cudaFree(ds);

  std::vector<float> got(ob.size()), ref(ob.size());
  for (size_t i = 0; i < ob.size(); ++i) got[i] = Bf16ToFloat(ob[i]);
  for (int64_t t = 0; t < c.T; ++t) {
    std::vector<const float*> list;
    for (int64_t i = 0; i < C; ++i) {
      const int32_t v = cand[t * C + i];
      list.push_back(v >= 0 ? pool.data() + v * c.D : nullptr);
    }
    for (int64_t h = 0; h < c.H; ++h) {
      model::SparseAttendHead(q.data() + (t * c.H + h) * c.D, list, c.D, scale, sink[h],
                              ref.data() + (t * c.H + h) * c.D);
    }
  }
  const golden::Closeness cl = golden::Compare(got.data(), ref.data(), ref.size());
  std::printf("%s T=%ld H=%ld D=%ld candidates=%ld: rms_rel=%.2e max_rel=%.2e bit_identical=%.4f\n",
              c.name, static_cast<long>(c.T), static_cast<long>(c.H), static_cast<long>(c.D),
              static_cast<long>(C), cl.rms_rel, cl.max_rel, cl.bit_identical);
  EXPECT_LE(cl.rms_rel, 2e-3) << c.name;
  EXPECT_GE(cl.bit_identical, 0.9) << c.name;
}

TEST_F(SparseAttentionTest, RunsFromCompute86Ptx) {
  cudaFuncAttributes a{};
  ASSERT_EQ(cudaFuncGetAttributes(&a, SparseAttentionKernel()), cudaSuccess);
  EXPECT_EQ(a.ptxVersion, 86);
}

TEST_F(SparseAttentionTest, TinyAShape) { RunCase({"tiny-a", 5, 4, 128, 16, 8, 64}); }

TEST_F(SparseAttentionTest, FlashShapeCsaDecode) {
  RunCase({"flash-csa", 4, 64, 512, 128, 512, 2048});
}

TEST_F(SparseAttentionTest, FlashShapeTpHeads) {
  for (const int64_t H : {32, 16, 8}) RunCase({"flash-tp", 2, H, 512, 128, 64, 1024});
}

TEST_F(SparseAttentionTest, RejectsUnsupportedHeadDim) {
  EXPECT_EQ(
      SparseAttention(nullptr, nullptr, nullptr, nullptr, 1, 1, 100, 1, 1.0f, nullptr, nullptr),
      cudaErrorInvalidValue);
}

}  // namespace
}  // namespace ss::cuda
