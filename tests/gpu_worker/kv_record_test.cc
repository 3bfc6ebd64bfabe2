// CUDA fp8_ds_mla KV records (label gpu; skips without a CUDA device): the GPU cache write equals
// the CPU encoder byte for byte, and SparseAttentionFp8Kv equals SparseAttention over the decoded
// bf16 pool bit for bit.
#include "gpu_worker/kernels/kv_record.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "common/bf16.h"
#include "common/codecs.h"
#include "common/kv_record.h"
#include "gpu_worker/kernels/sparse_attention.h"
#include "gtest/gtest.h"
#include "tests/gpu_worker/gpu_test_util.h"

namespace ss::cuda {
namespace {

using testing_util::DeviceBuffer;

class KvRecordGpuTest : public testing_util::GpuTest {};

// n bf16-valued entries [n, 512]; tiles of different magnitudes; every other entry FP8-simulated;
// entry 0 has all-zero / signed-zero tiles, entry 1 the 224·s edge case.
std::vector<float> MakeEntries(int64_t n, uint64_t seed, bool all_simulated) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int> ex(-12, 3);
  std::vector<float> e(n * kKvDim);
  for (int64_t r = 0; r < n; ++r) {
    float* x = e.data() + r * kKvDim;
    for (int t = 0; t < kKvTiles + 1; ++t) {
      const float mag = std::ldexp(1.0f, ex(rng));
      for (int i = 0; i < kKvTile; ++i) x[t * kKvTile + i] = RoundBf16(nd(rng) * mag);
    }
    if (r == 0) {
      for (int i = 0; i < 2 * kKvTile; ++i) x[i] = i < kKvTile ? 0.0f : (i % 2 ? -0.0f : 0.0f);
    }
    if (r == 1) {
      for (int t = 0; t < kKvTiles; ++t) x[t * kKvTile + 3] = 230.0f * std::ldexp(1.0f, -t);
    }
    if (all_simulated || r % 2 == 0 || r == 1) Fp8SimInplace(x, kKvNopeDim, kKvTile, true);
  }
  return e;
}

TEST_F(KvRecordGpuTest, KernelsRunFromCompute86Ptx) {
  for (const void* k : {EncodeKvRecordsKernel(), SparseAttentionFp8KvKernel()}) {
    cudaFuncAttributes a{};
    CUDA_ASSERT_OK(cudaFuncGetAttributes(&a, k));
    EXPECT_EQ(a.ptxVersion, 86);
  }
}

TEST_F(KvRecordGpuTest, GpuEncodeEqualsCpuEncodeByteForByte) {
  const int64_t n = 301, n_slots = 512;
  const std::vector<float> e = MakeEntries(n, 11, false);
  std::vector<int32_t> perm(n_slots);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937_64(5));
  std::vector<int32_t> slots(perm.begin(), perm.begin() + n);
  slots[7] = -1;  // skipped

  constexpr uint8_t kFill = 0xcd;
  std::vector<uint8_t> want(n_slots * kKvRecordBytes, kFill);
  for (int64_t r = 0; r < n; ++r) {
    if (slots[r] >= 0) EncodeKvRecord(e.data() + r * kKvDim, want.data() + slots[r] * kKvRecordBytes);
  }
  DeviceBuffer<uint16_t> d_e(testing_util::ToBf16(e));
  DeviceBuffer<int32_t> d_slots(slots);
  DeviceBuffer<uint8_t> d_pool(std::vector<uint8_t>(want.size(), kFill));
  CUDA_ASSERT_OK(EncodeKvRecords(d_e.get(), d_slots.get(), n, d_pool.get(), nullptr));
  CUDA_ASSERT_OK(cudaDeviceSynchronize());
  const std::vector<uint8_t> got = d_pool.Get();
  int64_t mismatches = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (got[i] != want[i] && ++mismatches <= 10) {
      ADD_FAILURE() << "slot " << i / kKvRecordBytes << " byte " << i % kKvRecordBytes << ": gpu "
                    << int{got[i]} << " cpu " << int{want[i]};
    }
  }
  EXPECT_EQ(mismatches, 0);
  std::printf("encode n=%ld: %ld mismatching bytes of %zu\n", static_cast<long>(n),
              static_cast<long>(mismatches), want.size());
  CUDA_ASSERT_OK(EncodeKvRecords(d_e.get(), d_slots.get(), 0, d_pool.get(), nullptr));
}

struct Case {
  const char* name;
  int64_t T, H, window, compressed, pool;
};

void RunAttention(const Case& c, bool all_simulated) {
  const int64_t D = kKvDim, C = c.window + c.compressed;
  std::mt19937_64 rng(c.H * 1000 + C);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(c.pool - 1));
  const std::vector<float> entries = MakeEntries(c.pool, c.H + C, all_simulated);
  std::vector<uint8_t> records(c.pool * kKvRecordBytes);
  std::vector<float> decoded(c.pool * D);
  for (int64_t r = 0; r < c.pool; ++r) {
    EncodeKvRecord(entries.data() + r * D, records.data() + r * kKvRecordBytes);
    DecodeKvRecord(records.data() + r * kKvRecordBytes, decoded.data() + r * D);
  }
  if (all_simulated) {
    for (size_t i = 0; i < decoded.size(); ++i) {
      ASSERT_EQ(FloatToBf16(decoded[i]), FloatToBf16(entries[i])) << "lossless at " << i;
    }
  }
  std::vector<float> q(c.T * c.H * D), sink(c.H);
  for (float& v : q) v = RoundBf16(nd(rng));
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
  const float scale = static_cast<float>(std::pow(static_cast<double>(D), -0.5));
  DeviceBuffer<uint16_t> d_q(testing_util::ToBf16(q)), d_bf16_pool(testing_util::ToBf16(decoded));
  DeviceBuffer<uint8_t> d_records(records);
  DeviceBuffer<int32_t> d_cand(cand);
  DeviceBuffer<float> d_sink(sink);
  DeviceBuffer<uint16_t> d_ref(q.size()), d_got(q.size());
  CUDA_ASSERT_OK(SparseAttention(d_q.get(), d_bf16_pool.get(), d_cand.get(), d_sink.get(), c.T,
                                 c.H, D, C, scale, d_ref.get(), nullptr));
  CUDA_ASSERT_OK(SparseAttentionFp8Kv(d_q.get(), d_records.get(), d_cand.get(), d_sink.get(), c.T,
                                      c.H, C, scale, d_got.get(), nullptr));
  CUDA_ASSERT_OK(cudaDeviceSynchronize());
  const std::vector<uint16_t> ref = d_ref.Get(), got = d_got.Get();
  testing_util::Report(std::string(c.name) + (all_simulated ? " (fp8-simulated)" : " (mixed)"),
                       testing_util::FromBf16(got), testing_util::FromBf16(ref));
  int64_t mismatches = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (got[i] != ref[i] && ++mismatches <= 10) {
      ADD_FAILURE() << c.name << " out[" << i << "]: fp8kv " << got[i] << " bf16 pool " << ref[i];
    }
  }
  EXPECT_EQ(mismatches, 0) << c.name;
}

TEST_F(KvRecordGpuTest, Fp8KvAttentionEqualsBf16PoolTinyShape) {
  RunAttention({"tiny", 3, 2, 16, 8, 64}, true);
  RunAttention({"tiny", 3, 2, 16, 8, 64}, false);
}

TEST_F(KvRecordGpuTest, Fp8KvAttentionEqualsBf16PoolFlashShape) {
  RunAttention({"flash 64 heads x 512, 640 candidates", 4, 64, 128, 512, 2048}, true);
  RunAttention({"flash 64 heads x 512, 640 candidates", 2, 64, 128, 512, 2048}, false);
}

TEST_F(KvRecordGpuTest, RejectsEmptyCandidateLists) {
  EXPECT_EQ(SparseAttentionFp8Kv(nullptr, nullptr, nullptr, nullptr, 1, 1, 0, 1.0f, nullptr,
                                 nullptr),
            cudaErrorInvalidValue);
}

}  // namespace
}  // namespace ss::cuda
