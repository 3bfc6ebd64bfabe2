// The device-side step bookkeeping of kernels/decode_step.h (label gpu; skips without a CUDA
// device): candidate lists equal to the host construction the cuda backend used before (window
// then compressed slots, indexer selections or every complete block), the raw-KV staging and ring
// writes, SparseAttentionRows equal bit for bit to one SparseAttention per sequence (with the
// lists padded to the step's longest), the MoE combine and the stream conversion.
#include "gpu_worker/kernels/decode_step.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "common/bf16.h"
#include "gpu_worker/kernels/sparse_attention.h"
#include "gtest/gtest.h"
#include "tests/gpu_worker/gpu_test_util.h"

namespace ss::cuda {
namespace {

using namespace testing_util;  // NOLINT: the shared GPU test helpers

class DecodeStepTest : public testing_util::GpuTest {};

// The host construction the backend used (one chunk; attention.h's layout).
std::vector<int32_t> HostCandidates(int64_t start, int64_t S, int64_t W, int64_t comp_row,
                                    int64_t ratio, bool indexer, int64_t n_sel,
                                    const std::vector<int32_t>& sel, int64_t* n_cand) {
  const int64_t end = start + S;
  const int64_t win_width = start == 0 ? std::min(S, W) : W;
  const int64_t n_comp = indexer ? n_sel : (ratio > 0 ? end / ratio : 0);
  *n_cand = win_width + n_comp;
  std::vector<int32_t> cand(S * *n_cand, -1);
  for (int64_t s = 0; s < S; ++s) {
    const int64_t p = start + s;
    int32_t* cl = cand.data() + s * *n_cand;
    int64_t j = 0;
    for (int64_t t = std::max<int64_t>(0, p - W + 1); t <= p; ++t) {
      cl[j++] = static_cast<int32_t>(t >= start ? W + (t - start) : t % W);
    }
    if (indexer) {
      for (int64_t m = 0; m < n_sel; ++m) {
        const int32_t v = sel[s * n_sel + m];
        cl[win_width + m] = v >= 0 ? static_cast<int32_t>(comp_row + v) : -1;
      }
    } else if (ratio > 0) {
      for (int64_t m = 0; m < n_comp; ++m) {
        cl[win_width + m] = m < (p + 1) / ratio ? static_cast<int32_t>(comp_row + m) : -1;
      }
    }
  }
  return cand;
}

struct Chunk {
  int64_t start, S;
};

// Chunks of different sequences in one step; ratio 0 (window only), 4 with the indexer, 128.
void RunCandidates(const std::vector<Chunk>& chunks, int64_t W, int64_t ratio, bool indexer,
                   int64_t topk) {
  std::mt19937 rng(static_cast<unsigned>(ratio * 7 + chunks.size()));
  std::vector<DecodeToken> toks;
  std::vector<int32_t> sel;
  std::vector<std::vector<int32_t>> want;
  std::vector<int64_t> ncs;
  int64_t n_cand_max = 1;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const int64_t start = chunks[i].start, S = chunks[i].S, end = start + S;
    const int64_t comp_row = W + S + 3 * static_cast<int64_t>(i);
    const int64_t n_sel = indexer ? std::min(topk, end / 4) : 0;
    std::vector<int32_t> csel(S * n_sel);
    for (int64_t s = 0; s < S; ++s) {
      const int64_t complete = (start + s + 1) / 4;
      for (int64_t m = 0; m < n_sel; ++m) {
        csel[s * n_sel + m] = m < complete ? static_cast<int32_t>(rng() % complete) : -1;
      }
    }
    int64_t nc = 0;
    want.push_back(HostCandidates(start, S, W, comp_row, ratio, indexer, n_sel, csel, &nc));
    ncs.push_back(nc);
    n_cand_max = std::max(n_cand_max, nc);
    for (int64_t s = 0; s < S; ++s) {
      DecodeToken d;
      d.pos = static_cast<int32_t>(start + s);
      d.chunk_start = static_cast<int32_t>(start);
      d.chunk_end = static_cast<int32_t>(end);
      d.win_width = static_cast<int32_t>(start == 0 ? std::min(S, W) : W);
      d.n_comp = static_cast<int32_t>(indexer ? n_sel : (ratio > 0 ? end / ratio : 0));
      d.comp_row = static_cast<int32_t>(comp_row);
      d.ratio = static_cast<int32_t>(ratio);
      d.sel_off = indexer && n_sel > 0 ? static_cast<int32_t>(sel.size() + s * n_sel) : -1;
      toks.push_back(d);
    }
    sel.insert(sel.end(), csel.begin(), csel.end());
  }
  const int64_t T = static_cast<int64_t>(toks.size());
  DecodeToken* dt = ToDevice(toks);
  int32_t* ds = ToDevice(sel);
  int32_t* dc = nullptr;
  ASSERT_EQ(cudaMalloc(&dc, T * n_cand_max * 4), cudaSuccess);
  ASSERT_EQ(BuildCandidates(dt, T, W, ds, n_cand_max, dc, nullptr), cudaSuccess);
  const std::vector<int32_t> got = ToHost(dc, T * n_cand_max);
  int64_t row = 0, mismatches = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    for (int64_t s = 0; s < chunks[i].S; ++s, ++row) {
      for (int64_t j = 0; j < n_cand_max; ++j) {
        const int32_t w = j < ncs[i] ? want[i][s * ncs[i] + j] : -1;
        mismatches += got[row * n_cand_max + j] != w;
      }
    }
  }
  EXPECT_EQ(mismatches, 0) << "ratio " << ratio << " indexer " << indexer;
  cudaFree(dt);
  cudaFree(ds);
  cudaFree(dc);
}

TEST_F(DecodeStepTest, KernelsRunFromCompute86Ptx) {
  ExpectCompute86Ptx({{"BuildCandidates", BuildCandidatesKernel()},
                      {"KvStage", KvStageKernel()},
                      {"KvRing", KvRingKernel()},
                      {"SparseAttentionRows", SparseAttentionRowsKernel()},
                      {"SparseAttentionRowsFast", SparseAttentionRowsFastKernel()},
                      {"MoeCombineBf16", MoeCombineBf16Kernel()},
                      {"Bf16ToF32", Bf16ToF32Kernel()}});
}

TEST_F(DecodeStepTest, CandidatesMatchHostLists) {
  const std::vector<Chunk> mixed = {{0, 19}, {0, 200}, {300, 1}, {8192, 1}, {77, 64}};
  RunCandidates(mixed, 128, 0, false, 0);
  RunCandidates(mixed, 128, 4, true, 512);
  RunCandidates(mixed, 128, 4, true, 16);
  RunCandidates(mixed, 128, 128, false, 0);
  RunCandidates({{0, 5}, {9, 1}, {3, 4}}, 4, 4, true, 2);  // tiny-a-like window
}

// Two sequences' pools, decode rows and a short prefill chunk; SparseAttentionRows against one
// SparseAttention per sequence on the same lists (padded to the longest), bit for bit; then
// KvStage/KvRing against the host's copies.
TEST_F(DecodeStepTest, RowsAttentionAndKvWritesMatchPerSequence) {
  const int64_t H = 8, D = 512, W = 16, rows = 64;
  std::mt19937_64 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  auto bf = [&](int64_t n) {
    std::vector<uint16_t> v(n);
    for (auto& x : v) x = FloatToBf16(nd(rng));
    return v;
  };
  const std::vector<uint16_t> pool0 = bf(rows * D), pool1 = bf(rows * D), q = bf(3 * H * D),
                              kv = bf(3 * D);
  std::vector<float> sink(H);
  for (float& s : sink) s = nd(rng);
  // Token 0: sequence 0 at position 40 (decode); tokens 1, 2: sequence 1's chunk [5, 7).
  std::vector<DecodeToken> toks(3);
  uint16_t* dp0 = ToDevice(pool0);
  uint16_t* dp1 = ToDevice(pool1);
  toks[0] = {reinterpret_cast<uint64_t>(dp0), 40, 40, 41, static_cast<int32_t>(W), 5, 20, 4, -1};
  for (int s = 0; s < 2; ++s) {
    toks[1 + s] = {
        reinterpret_cast<uint64_t>(dp1), 5 + s, 5, 7, static_cast<int32_t>(W), 1, 20, 4, -1};
  }
  std::vector<int32_t> cand(3 * (W + 5), -1);
  for (int64_t t = 0; t < 3; ++t) {
    for (int64_t j = 0; j < W + 5; ++j) cand[t * (W + 5) + j] = static_cast<int32_t>(rng() % rows);
  }
  for (int t = 1; t < 3; ++t) {  // the chunk's lists are W + 2 long (one masked), then padding
    cand[t * (W + 5) + W + 1] = -1;
    for (int64_t j = W + 2; j < W + 5; ++j) cand[t * (W + 5) + j] = -1;
  }
  DecodeToken* dt = ToDevice(toks);
  int32_t* dc = ToDevice(cand);
  uint16_t* dq = ToDevice(q);
  float* dsink = ToDevice(sink);
  uint16_t *dout = nullptr, *dref = nullptr;
  ASSERT_EQ(cudaMalloc(&dout, q.size() * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dref, q.size() * 2), cudaSuccess);
  const float scale = 0.044f;
  ASSERT_EQ(SparseAttentionRows(dq, dt, dc, dsink, 3, H, D, W + 5, scale, dout, nullptr),
            cudaSuccess);
  // Reference: sequence 0 with its full list, sequence 1 with lists of W + 2 entries.
  ASSERT_EQ(SparseAttention(dq, dp0, dc, dsink, 1, H, D, W + 5, scale, dref, nullptr), cudaSuccess);
  std::vector<int32_t> short_cand;
  for (int t = 1; t < 3; ++t) {
    short_cand.insert(short_cand.end(), cand.begin() + t * (W + 5),
                      cand.begin() + t * (W + 5) + W + 2);
  }
  int32_t* dsc = ToDevice(short_cand);
  ASSERT_EQ(
      SparseAttention(dq + H * D, dp1, dsc, dsink, 2, H, D, W + 2, scale, dref + H * D, nullptr),
      cudaSuccess);
  EXPECT_EQ(ToHost(dout, q.size()), ToHost(dref, q.size()));

  uint16_t* dkv = ToDevice(kv);
  ASSERT_EQ(KvStage(dt, 3, dkv, W, D, nullptr), cudaSuccess);
  ASSERT_EQ(KvRing(dt, 3, dkv, W, D, nullptr), cudaSuccess);
  std::vector<uint16_t> want0 = pool0, want1 = pool1;
  auto put = [&](std::vector<uint16_t>& p, int64_t row, int64_t t) {
    std::copy_n(kv.begin() + t * D, D, p.begin() + row * D);
  };
  put(want0, W + 0, 0);   // staged: row W + (40 − 40)
  put(want0, 40 % W, 0);  // ring
  put(want1, W + 0, 1);   // staged rows W, W + 1
  put(want1, W + 1, 2);
  put(want1, 5 % W, 1);  // ring: both positions are among the chunk's last W
  put(want1, 6 % W, 2);
  EXPECT_EQ(ToHost(dp0, want0.size()), want0);
  EXPECT_EQ(ToHost(dp1, want1.size()), want1);
  for (void* p : std::vector<void*>{dp0, dp1, dt, dc, dq, dsink, dout, dref, dsc, dkv}) cudaFree(p);
}

TEST_F(DecodeStepTest, MoeCombineAndStreamConversion) {
  const int64_t n = 3000;
  std::mt19937_64 rng(9);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<uint16_t> shared(n);
  std::vector<float> routed(n);
  for (auto& v : shared) v = FloatToBf16(nd(rng));
  for (auto& v : routed) v = nd(rng);
  uint16_t* ds = ToDevice(shared);
  float* dr = ToDevice(routed);
  uint16_t* dy = nullptr;
  float* df = nullptr;
  ASSERT_EQ(cudaMalloc(&dy, n * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&df, n * 4), cudaSuccess);
  ASSERT_EQ(MoeCombineBf16(ds, dr, n, dy, nullptr), cudaSuccess);
  const std::vector<uint16_t> y = ToHost(dy, n);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(y[i], FloatToBf16(routed[i] + Bf16ToFloat(shared[i]))) << i;
  }
  ASSERT_EQ(MoeCombineBf16(ds, nullptr, n, dy, nullptr), cudaSuccess);
  EXPECT_EQ(ToHost(dy, n), shared);
  ASSERT_EQ(Bf16ToF32(ds, n, df, nullptr), cudaSuccess);
  const std::vector<float> f = ToHost(df, n);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(f[i], Bf16ToFloat(shared[i])) << i;
  cudaFree(ds);
  cudaFree(dr);
  cudaFree(dy);
  cudaFree(df);
}

}  // namespace
}  // namespace ss::cuda
