// Shared by the GPU tests: the fixture that skips without a CUDA device, device buffers, bf16
// and FP8 data helpers, the comparison report printed beside every op-vs-reference check, the
// compute_86 PTX check of a kernel list, timings, and the tiny-a weights and golden activations
// the kernel tests feed.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/bf16.h"
#include "common/golden/golden.h"
#include "common/model/hyper_connection.h"
#include "common/model/linear.h"
#include "common/model/weights.h"
#include "common/model_config.h"
#include "common/safetensors.h"
#include "gpu_worker/kernels/hyper_connection.h"
#include "gpu_worker/kernels/prepare.h"
#include "gpu_worker/kernels/rms_norm.h"
#include "gpu_worker/kernels/shared_memory.h"
#include "gtest/gtest.h"

namespace ss::cuda::testing_util {

#define CUDA_ASSERT_OK(expr)                                               \
  do {                                                                     \
    const cudaError_t e_ = (expr);                                         \
    ASSERT_EQ(e_, cudaSuccess) << #expr << ": " << cudaGetErrorString(e_); \
  } while (0)

inline constexpr char kTinyA[] = "tests/data/tiny-a";

// Every test of a fixture derived from this one skips, with a message, on a machine without a
// CUDA device (CI, developer machines); the device machine runs them, after PrepareKernels on the
// current device (kernels launched directly need it).
class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
      GTEST_SKIP() << "no CUDA device (" << (e == cudaSuccess ? "0 devices" : cudaGetErrorString(e))
                   << "): GPU tests run on the device machine";
    }
    const absl::Status s = PrepareKernels();
    ASSERT_TRUE(s.ok()) << s;
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

// A matrix over bf16 bit patterns the caller keeps alive.
inline model::Bf16Matrix MatrixOf(const std::vector<uint16_t>& bits, int64_t rows, int64_t cols) {
  return model::Bf16Matrix{reinterpret_cast<const uint8_t*>(bits.data()), rows, cols};
}

// Random e4m3 codes (NaN codes 0x7f/0xff excluded) and ue8m0 scale bytes in [lo, hi].
inline std::vector<uint8_t> RandomE4m3(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> v(n);
  for (uint8_t& b : v) {
    uint8_t c = static_cast<uint8_t>(rng() & 0xff);
    if ((c & 0x7f) == 0x7f) c ^= 0x01;
    b = c;
  }
  return v;
}
inline std::vector<uint8_t> RandomScales(size_t n, int lo, int hi, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> d(lo, hi);
  std::vector<uint8_t> v(n);
  for (uint8_t& b : v) b = static_cast<uint8_t>(d(rng));
  return v;
}

// Raw device copies for tests that pass plain pointers (the caller cudaFrees them).
template <typename T>
T* ToDevice(const std::vector<T>& h) {
  T* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(h.size(), 1) * sizeof(T)), cudaSuccess);
  if (!h.empty()) cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice);
  return p;
}
template <typename T>
std::vector<T> ToHost(const T* p, size_t n) {
  std::vector<T> h(n);
  EXPECT_EQ(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
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

// Every kernel of the list (name, the address its *Kernel() accessor gives) runs from compute_86
// PTX, and its static shared memory with the dynamic shared memory it has opted in to (so far)
// stays within SM 8.6's per-block limit; one line of attributes each. static_smem_limit > 0: its
// static shared memory stays below.
inline void ExpectCompute86Ptx(const std::vector<std::pair<std::string, const void*>>& kernels,
                               size_t static_smem_limit = 0) {
  int width = 0;
  for (const auto& k : kernels) width = std::max(width, static_cast<int>(k.first.size()));
  for (const auto& [name, fn] : kernels) {
    cudaFuncAttributes a{};
    const cudaError_t e = cudaFuncGetAttributes(&a, fn);
    ASSERT_EQ(e, cudaSuccess) << name << ": " << cudaGetErrorString(e);
    EXPECT_EQ(a.ptxVersion, 86) << name;
    EXPECT_LE(a.sharedSizeBytes + static_cast<size_t>(a.maxDynamicSharedSizeBytes),
              static_cast<size_t>(kSm86MaxSharedPerBlock))
        << name;
    if (static_smem_limit > 0) {
      EXPECT_LT(a.sharedSizeBytes, static_smem_limit) << name;
    }
    std::printf("%-*s ptxVersion=%d binaryVersion=%d regs=%d smem=%zu local=%zu\n", width,
                name.c_str(), a.ptxVersion, a.binaryVersion, a.numRegs, a.sharedSizeBytes,
                a.localSizeBytes);
  }
}

// Microseconds per call of fn() on the default stream (one warm-up call, then `reps` timed).
template <typename Fn>
double MicrosPerCall(Fn&& fn, int reps) {
  fn();
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  cudaEventRecord(a);
  for (int i = 0; i < reps; ++i) fn();
  cudaEventRecord(b);
  cudaEventSynchronize(b);
  float ms = 0.0f;
  cudaEventElapsedTime(&ms, a, b);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  return 1000.0 * ms / reps;
}

// ---- tiny-a weights and golden activations ---------------------------------------------------

inline const model::ModelWeights& TinyA() {
  static const std::unique_ptr<model::ModelWeights> w = [] {
    auto r = model::LoadModelWeights(kTinyA);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? std::move(*r) : nullptr;
  }();
  return *w;
}

// A golden file of tiny-a (golden.safetensors, golden_blocks.safetensors), opened once.
inline const Checkpoint& TinyAGolden(const std::string& file) {
  static std::map<std::string, std::unique_ptr<Checkpoint>> open;
  std::unique_ptr<Checkpoint>& g = open[file];
  if (g == nullptr) {
    auto r = Checkpoint::OpenFiles({std::string(kTinyA) + "/" + file});
    EXPECT_TRUE(r.ok()) << r.status();
    if (r.ok()) g = std::move(*r);
  }
  return *g;
}

// Tensor `name` (bf16 or f32) of a golden file as fp32.
inline std::vector<float> GoldenFloats(const std::string& file, const std::string& name,
                                       DType dtype, const std::vector<int64_t>& shape) {
  auto t = TinyAGolden(file).Get(name, dtype, shape);
  EXPECT_TRUE(t.ok()) << t.status();
  if (!t.ok()) return {};
  std::vector<float> v((*t)->numel());
  for (size_t i = 0; i < v.size(); ++i) {
    if (dtype == DType::kBF16) {
      uint16_t b;
      std::memcpy(&b, (*t)->data + 2 * i, 2);
      v[i] = Bf16ToFloat(b);
    } else {
      std::memcpy(&v[i], (*t)->data + 4 * i, 4);
    }
  }
  return v;
}

inline std::vector<int64_t> GoldenIds(const std::string& file, const std::string& name) {
  auto t = TinyAGolden(file).GetAnyShape(name, DType::kI64);
  EXPECT_TRUE(t.ok()) << t.status();
  if (!t.ok()) return {};
  std::vector<int64_t> v((*t)->numel());
  std::memcpy(v.data(), (*t)->data, v.size() * 8);
  return v;
}

// A golden prefill case `prefix` of a golden file: its prompt ids and the HC streams after every
// block (the intermediates case "inter" of golden.safetensors, 40 tokens; "blocks160" of
// golden_blocks.safetensors, 160 tokens).
struct GoldenStreams {
  std::vector<int64_t> ids;
  std::vector<float> after_block;  // [n_layers, T, hc, dim]
  int64_t T = 0;
};

inline GoldenStreams LoadGoldenStreams(const std::string& file, const std::string& prefix) {
  const ModelConfig& c = TinyA().config;
  GoldenStreams r;
  r.ids = GoldenIds(file, prefix + ".prompt_ids");
  r.T = static_cast<int64_t>(r.ids.size());
  r.after_block = GoldenFloats(file, prefix + ".hc_after_block", DType::kBF16,
                               {c.n_layers, r.T, c.hc_mult, c.dim});
  return r;
}

// The HC streams entering block `layer` ([T, hc, dim]; block 0: the embedding copied to every
// stream).
inline std::vector<float> StreamsIntoBlock(const GoldenStreams& s, int64_t layer) {
  const ModelConfig& c = TinyA().config;
  const int64_t n = s.T * c.hc_mult * c.dim;
  if (layer > 0) {
    return std::vector<float>(s.after_block.begin() + (layer - 1) * n,
                              s.after_block.begin() + layer * n);
  }
  std::vector<float> h(n), row(c.dim);
  for (int64_t t = 0; t < s.T; ++t) {
    TinyA().embed.Row(s.ids[t], row.data());
    for (int64_t k = 0; k < c.hc_mult; ++k) {
      std::copy(row.begin(), row.end(), h.begin() + (t * c.hc_mult + k) * c.dim);
    }
  }
  return h;
}

// The blocks160 case (loaded once).
inline const GoldenStreams& B160() {
  static const GoldenStreams s = LoadGoldenStreams("golden_blocks.safetensors", "blocks160");
  return s;
}

// The attention input of block `layer` on the blocks160 streams: RMSNorm(HcPre(streams)).
inline std::vector<float> AttnInput(int64_t layer) {
  const ModelConfig& c = TinyA().config;
  const model::BlockWeights& b = TinyA().blocks[layer];
  const std::vector<float> streams = StreamsIntoBlock(B160(), layer);
  const int64_t T = B160().T, dim = c.dim;
  std::vector<float> y(dim), x(T * dim);
  for (int64_t t = 0; t < T; ++t) {
    model::HcPre(streams.data() + t * c.hc_mult * dim, c.hc_mult, dim, b.hc_attn,
                 c.hc_sinkhorn_iters, static_cast<float>(c.hc_eps), static_cast<float>(c.norm_eps),
                 y.data());
    model::RmsNorm(y.data(), b.attn_norm.data(), dim, static_cast<float>(c.norm_eps),
                   x.data() + t * dim);
  }
  return x;
}

}  // namespace ss::cuda::testing_util
