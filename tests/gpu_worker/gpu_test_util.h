// Shared by the GPU tests: the fixture that skips without a CUDA device, device buffers, bf16
// helpers, and the comparison report printed beside every op-vs-reference check.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/bf16.h"
#include "common/golden/golden.h"
#include "common/model/linear.h"
#include "gtest/gtest.h"

namespace ss::cuda::testing_util {

#define CUDA_ASSERT_OK(expr)                                               \
  do {                                                                     \
    const cudaError_t e_ = (expr);                                         \
    ASSERT_EQ(e_, cudaSuccess) << #expr << ": " << cudaGetErrorString(e_); \
  } while (0)

inline constexpr char kTinyA[] = "tests/data/tiny-a";

// Every test of a fixture derived from this one skips, with a message, on a machine without a
// CUDA device (CI, developer machines); the device machine runs them.
class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
      GTEST_SKIP() << "no CUDA device (" << (e == cudaSuccess ? "0 devices" : cudaGetErrorString(e))
                   << "): GPU tests run on the device machine";
    }
  }
};

template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : n_(n) {
    const cudaError_t e = cudaMalloc(&p_, std::max<size_t>(n, 1) * sizeof(T));
    if (e != cudaSuccess) {
      ADD_FAILURE() << "cudaMalloc(" << n * sizeof(T) << "): " << cudaGetErrorString(e);
      p_ = nullptr;
    }
  }
  explicit DeviceBuffer(const std::vector<T>& v) : DeviceBuffer(v.size()) { Put(v); }
  ~DeviceBuffer() { cudaFree(p_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() const { return p_; }
  void Put(const std::vector<T>& v) {
    ASSERT_LE(v.size(), n_);
    EXPECT_EQ(cudaMemcpy(p_, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  std::vector<T> Get() const {
    std::vector<T> v(n_);
    EXPECT_EQ(cudaMemcpy(v.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

inline std::vector<float> RandomBf16(size_t n, float stddev, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = RoundBf16(d(rng));
  return v;
}

inline std::vector<float> RandomF32(size_t n, float stddev, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

inline std::vector<uint16_t> ToBf16(const std::vector<float>& v) {
  std::vector<uint16_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = FloatToBf16(v[i]);
  return b;
}

inline std::vector<float> FromBf16(const std::vector<uint16_t>& b) {
  std::vector<float> v(b.size());
  for (size_t i = 0; i < b.size(); ++i) v[i] = Bf16ToFloat(b[i]);
  return v;
}

// The raw bf16 bit patterns of a checkpoint matrix, for upload.
inline std::vector<uint16_t> MatrixBits(const model::Bf16Matrix& m) {
  std::vector<uint16_t> b(m.rows * m.cols);
  std::memcpy(b.data(), m.data, b.size() * 2);
  return b;
}

// Compares and prints one line: what, rms_rel, max_rel, bit-identical fraction.
inline golden::Closeness Report(const std::string& what, const std::vector<float>& got,
                                const std::vector<float>& ref) {
  EXPECT_EQ(got.size(), ref.size()) << what;
  const golden::Closeness c =
      golden::Compare(got.data(), ref.data(), std::min(got.size(), ref.size()));
  std::printf("%-60s rms_rel=%.2e max_rel=%.2e bit_identical=%.6f (n=%zu)\n", what.c_str(),
              c.rms_rel, c.max_rel, c.bit_identical, c.n);
  return c;
}

}  // namespace ss::cuda::testing_util
