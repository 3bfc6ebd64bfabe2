// The indexer's top-k (gpu_worker/kernels/indexer_topk.cu: IndexerTopK and each of its paths,
// counting, radix, filtered and split) against a stable sort on the host (label gpu): rows with
// heavy ties, ±0, −inf tails of every length, fully masked rows, fewer finite scores than k,
// k = 1 and k = n_cols, 1 to 262144 columns; every selection byte equal. Without a CUDA device
// every test skips with a message.
#include "gpu_worker/kernels/indexer_topk.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "common/bf16.h"
#include "gtest/gtest.h"
#include "tests/gpu_worker/gpu_test_util.h"
#include "tests/gpu_worker/indexer_test_util.h"

namespace ss::cuda {
namespace {

using namespace testing_util;  // NOLINT: the shared GPU test helpers

class IndexerTopKTest : public testing_util::GpuTest {};

// Order-preserving key of a float, as the top-k kernels use it (so −0 ranks below +0).
uint32_t OrderKeyHost(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// The reference selection of one row: the k largest by a stable sort on the kernels' key order
// (ties to the lower index), -1 past the `eligible` first columns.
void StableTopK(const float* row, int64_t n_cols, int64_t k, int64_t eligible, int32_t* out) {
  std::vector<int32_t> order(n_cols);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return OrderKeyHost(row[a]) > OrderKeyHost(row[b]);
  });
  for (int64_t i = 0; i < k; ++i) out[i] = order[i] < eligible ? order[i] : -1;
}

// The selections [T, k] of T rows of scores (device) by one path, or by IndexerTopK's own choice
// (no kind).
std::vector<int32_t> TopKBy(const float* scores, int64_t T, int64_t n_cols, int64_t k,
                            std::optional<IndexerTopKKind> kind) {
  DeviceBuffer<int32_t> sel(T * k);
  const cudaError_t e =
      kind ? IndexerTopKPath(scores, T, n_cols, k, *kind, sel.get(), TopKScratch(), nullptr)
           : IndexerTopK(scores, T, n_cols, k, sel.get(), TopKScratch(), nullptr);
  EXPECT_EQ(e, cudaSuccess) << cudaGetErrorString(e);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return sel.Get();
}

// Rows of `ref` [T, k] identical to the selections'.
int64_t SameRows(const std::vector<int32_t>& sel, const std::vector<int32_t>& ref, int64_t T,
                 int64_t k) {
  int64_t same = 0;
  for (int64_t t = 0; t < T; ++t) {
    same += std::equal(sel.begin() + t * k, sel.begin() + (t + 1) * k, ref.begin() + t * k);
  }
  return same;
}

// One row per IndexerTopK call (decode), each row of a batch: the rows of ref [T, k].
void ExpectEachRowAlone(const float* scores, int64_t T, int64_t n_cols, int64_t k,
                        const std::vector<int32_t>& ref, const std::string& label) {
  for (int64_t t = 0; t < T; ++t) {
    EXPECT_EQ(TopKBy(scores + t * n_cols, 1, n_cols, k, std::nullopt),
              std::vector<int32_t>(ref.begin() + t * k, ref.begin() + (t + 1) * k))
        << label << " row " << t;
  }
}

// IndexerTopK's choice against the reference's stable sort on rows with heavy ties, masks, k =
// n_cols, fully masked rows and distinct values.
TEST_F(IndexerTopKTest, TopKMatchesStableSort) {
  struct Case {
    const char* name;
    int64_t n_cols, k, levels;  // levels: distinct values (0: continuous)
  };
  for (const Case& c : {Case{"65536 cols k512 50 levels", 65536, 512, 50},
                        Case{"65536 cols k1024 continuous", 65536, 1024, 0},
                        Case{"5000 cols k512 3 levels", 5000, 512, 3},
                        Case{"1024 cols k1024 continuous", 1024, 1024, 0},
                        Case{"16384 cols k1 7 levels", 16384, 1, 7},
                        Case{"4096 cols k300 1 level", 4096, 300, 1}}) {
    const int64_t T = 12;
    std::mt19937_64 rng(c.n_cols + c.k);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> s(T * c.n_cols);
    std::vector<int32_t> ref(T * c.k);
    for (int64_t t = 0; t < T; ++t) {
      // Row t: eligible prefix of decreasing length, the rest −inf (row 1 fully masked).
      const int64_t eligible = t == 1 ? 0 : c.n_cols - (t * c.n_cols) / (T + 2);
      float* row = s.data() + t * c.n_cols;
      for (int64_t j = 0; j < c.n_cols; ++j) {
        float v = c.levels > 0 ? static_cast<float>(rng() % c.levels) - 7.0f : RoundBf16(nd(rng));
        row[j] = j < eligible ? v : -INFINITY;
      }
      StableTopK(row, c.n_cols, c.k, eligible, ref.data() + t * c.k);
    }
    DeviceBuffer<float> ds(s);
    const int64_t same = SameRows(TopKBy(ds.get(), T, c.n_cols, c.k, std::nullopt), ref, T, c.k);
    std::printf("%-60s rows=%ld identical=%ld\n", (std::string("IndexerTopK ") + c.name).c_str(),
                static_cast<long>(T), static_cast<long>(same));
    EXPECT_EQ(same, T) << c.name;
  }
}

// Both top-k kernels (counting, radix) and the automatic choice on the same rows: ties (few
// levels, ±0), −inf tails of every length, a fully masked row, k = 1 and k = n_cols; every
// selection byte equal, and equal to the first k of a sort by (key, −index).
TEST_F(IndexerTopKTest, TopKCountingEqualsRadix) {
  struct Case {
    int64_t n_cols, k, levels;  // levels: distinct values (0: bf16 normal; −1: ±0 and ±1)
  };
  for (const Case& c : {Case{1, 1, 0}, Case{5, 5, 2}, Case{31, 7, 3}, Case{32, 32, 0},
                        Case{33, 1, 1}, Case{100, 64, -1}, Case{1000, 512, 5}, Case{2304, 512, 0},
                        Case{2304, 512, 40}, Case{2304, 1024, 3}, Case{1024, 1000, 0},
                        Case{4097, 512, 7}, Case{8192, 512, 0}, Case{1024, 1024, 2}}) {
    const int64_t T = 9;
    std::mt19937_64 rng(301 + c.n_cols * 7 + c.k);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> s(T * c.n_cols);
    std::vector<int32_t> ref(T * c.k);
    for (int64_t t = 0; t < T; ++t) {
      const int64_t eligible = t == 1 ? 0 : c.n_cols - (t * c.n_cols) / T;
      float* row = s.data() + t * c.n_cols;
      for (int64_t j = 0; j < c.n_cols; ++j) {
        float v = c.levels > 0    ? static_cast<float>(rng() % c.levels) - 1.0f
                  : c.levels == 0 ? RoundBf16(nd(rng))
                                  : static_cast<float>(rng() % 2) * ((rng() % 2) ? -1.0f : 1.0f);
        if (c.levels < 0 && v == 0.0f && (rng() % 2)) v = -0.0f;
        row[j] = j < eligible ? v : -INFINITY;
      }
      StableTopK(row, c.n_cols, c.k, eligible, ref.data() + t * c.k);
    }
    DeviceBuffer<float> ds(s);
    const std::string label = "IndexerTopK counting vs radix, " + std::to_string(c.n_cols) +
                              " cols k" + std::to_string(c.k) + " levels " +
                              std::to_string(c.levels);
    const std::vector<int32_t> radix = TopKBy(ds.get(), T, c.n_cols, c.k, IndexerTopKKind::kRadix);
    EXPECT_EQ(TopKBy(ds.get(), T, c.n_cols, c.k, IndexerTopKKind::kCounting), radix) << label;
    EXPECT_EQ(TopKBy(ds.get(), T, c.n_cols, c.k, IndexerTopKKind::kFiltered), radix)
        << label << " (filtered)";
    EXPECT_EQ(TopKBy(ds.get(), 8, c.n_cols, c.k, IndexerTopKKind::kSplit),
              std::vector<int32_t>(radix.begin(), radix.begin() + 8 * c.k))
        << label << " (split, rows 0-7)";
    EXPECT_EQ(TopKBy(ds.get(), T, c.n_cols, c.k, std::nullopt), radix) << label;
    EXPECT_EQ(radix, ref) << label;
    ExpectEachRowAlone(ds.get(), T, c.n_cols, c.k, ref, label);
  }
}

// The filtered kernel (long rows: a wide-digit prefix, then candidates in shared memory) and the
// split one (its first histogram and candidates over many blocks, then ranks by counting)
// against the radix kernel and a stable sort, at 16K to 256K columns: continuous bf16 scores (a
// few candidates after one histogram), bf16 scores far from zero (thousands in the k-th
// largest's first bin: the second histogram, and the split kernel's pass over the row in its
// last block), few levels (heavy ties at the k-th largest), narrow ranges of bf16 values (more
// equal to the k-th largest than the candidate buffer holds: the scan in index order; the split
// kernel's fallback) and of fp32 values (a third histogram), ±0,
// −inf tails of every length, fewer finite scores than k and fully masked rows, odd widths (rows
// not 16-byte aligned); every row of a batch and each row alone (decode: the split kernel),
// every selection byte equal.
TEST_F(IndexerTopKTest, TopKFilteredEqualsRadix) {
  enum Kind { kNormal, kLevels, kNarrowBf16, kNarrowF32, kZeros, kShiftedBf16 };
  struct Case {
    int64_t n_cols, k;
    Kind kind;
    int levels;
  };
  for (const Case& c :
       {Case{16384, 512, kNormal, 0}, Case{16384, 512, kLevels, 50},
        Case{16385, 1024, kNarrowBf16, 0}, Case{16384, 1, kLevels, 7}, Case{20000, 512, kZeros, 0},
        Case{65536, 512, kNarrowF32, 0}, Case{65537, 1024, kLevels, 3},
        Case{65536, 512, kNormal, 0}, Case{262144, 512, kNormal, 0}, Case{262144, 64, kLevels, 1},
        Case{16384, 512, kShiftedBf16, 0}, Case{65536, 1024, kShiftedBf16, 0},
        Case{16387, 64, kShiftedBf16, 0}}) {
    const int64_t T = c.n_cols > 65537 ? 3 : 6;
    std::mt19937_64 rng(601 + c.n_cols + c.k + c.kind);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::uniform_real_distribution<float> ud(1.0f, 1.001f);
    std::vector<float> s(T * c.n_cols);
    std::vector<int32_t> ref(T * c.k);
    for (int64_t t = 0; t < T; ++t) {
      // Row 1 fully masked, row 2 fewer finite scores than k, the rest −inf tails of every length.
      const int64_t eligible = t == 1 ? 0 : t == 2 ? c.k / 2 : c.n_cols - (t * c.n_cols) / (2 * T);
      float* row = s.data() + t * c.n_cols;
      for (int64_t j = 0; j < c.n_cols; ++j) {
        float v = 0.0f;
        switch (c.kind) {
          case kNormal:
            v = RoundBf16(nd(rng));
            break;
          case kLevels:
            v = static_cast<float>(rng() % c.levels) - 1.0f;
            break;
          case kNarrowBf16:
            v = RoundBf16(1.0f + 0.01f * nd(rng));
            break;
          case kNarrowF32:
            v = ud(rng);
            break;
          case kZeros:
            v = (rng() % 2) ? 0.0f : -0.0f;
            break;
          case kShiftedBf16:
            v = RoundBf16(20.0f + nd(rng));
            break;
        }
        row[j] = j < eligible ? v : -INFINITY;
      }
      StableTopK(row, c.n_cols, c.k, eligible, ref.data() + t * c.k);
    }
    DeviceBuffer<float> ds(s);
    const std::string label = "IndexerTopK filtered vs radix, " + std::to_string(c.n_cols) +
                              " cols k" + std::to_string(c.k) + " kind " + std::to_string(c.kind);
    const std::vector<int32_t> filt =
        TopKBy(ds.get(), T, c.n_cols, c.k, IndexerTopKKind::kFiltered);
    std::printf("%-60s rows=%ld identical=%ld\n", label.c_str(), static_cast<long>(T),
                static_cast<long>(SameRows(filt, ref, T, c.k)));
    EXPECT_EQ(filt, TopKBy(ds.get(), T, c.n_cols, c.k, IndexerTopKKind::kRadix)) << label;
    EXPECT_EQ(filt, ref) << label;
    EXPECT_EQ(TopKBy(ds.get(), T, c.n_cols, c.k, IndexerTopKKind::kSplit), ref)
        << label << " (split)";
    EXPECT_EQ(TopKBy(ds.get(), T, c.n_cols, c.k, std::nullopt), ref) << label;
    ExpectEachRowAlone(ds.get(), T, c.n_cols, c.k, ref, label);
  }
}

}  // namespace
}  // namespace ss::cuda
