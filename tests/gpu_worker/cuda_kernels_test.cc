// CUDA kernels against the CPU reference (label gpu). Without a CUDA device every test skips
// with a message.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/bf16.h"
#include "common/codecs.h"
#include "common/golden/golden.h"
#include "common/model/linear.h"
#include "common/model/weights.h"
#include "gpu_worker/kernels/fp8_gemm.h"
#include "gpu_worker/kernels/fp8_linear.h"
#include "gpu_worker/kernels/rms_norm.h"
#include "gpu_worker/kernels/shared_memory.h"
#include "gtest/gtest.h"
#include "tests/gpu_worker/gpu_test_util.h"

namespace ss::cuda {
namespace {

using namespace testing_util;  // NOLINT: the shared GPU test helpers

class CudaKernelsTest : public testing_util::GpuTest {};

TEST_F(CudaKernelsTest, KernelsRunFromCompute86Ptx) {
  ExpectCompute86Ptx({{"RmsNorm", RmsNormKernel()},
                      {"QuantizeActE4m3", QuantizeActE4m3Kernel()},
                      {"Fp8Gemv", Fp8LinearKernel()},
                      {"Fp8Gemm", Fp8GemmKernel()},
                      {"Fp8LinearGeneric", Fp8LinearGenericKernel()}});
}

// A shared-memory opt-in past SM 8.6's per-block limit is refused (also on a device that allows
// more), and the prefill GEMM's own opt-in is within it.
TEST_F(CudaKernelsTest, SharedMemoryOptInsStayWithinSm86) {
  const void* k = Fp8GemmKernel();
  EXPECT_EQ(OptInSharedMemory(k, kSm86MaxSharedPerBlock + 16), cudaErrorInvalidValue);
  // A 512-row chunk of a 4096-feature projection takes Fp8Gemm's tallest tile (the kernel k
  // names), which PrepareKernels (the fixture) opted in to its 3-stage pipeline's shared memory.
  const int64_t rows = 512, out = 4096, in = 1024;
  DeviceBuffer<uint8_t> q(RandomE4m3(rows * in, 3)), w(RandomE4m3(out * in, 4));
  DeviceBuffer<float> sa(std::vector<float>(rows * in / 128, 1.0f));
  DeviceBuffer<uint8_t> ws(RandomScales(out / 128 * (in / 128), 120, 130, 5));
  DeviceBuffer<uint16_t> y(rows * out);
  CUDA_ASSERT_OK(Fp8Gemm(AsE4m3(q.get()), sa.get(), rows, AsE4m3(w.get()), AsUe8m0(ws.get()), out,
                         in, AsBf16(y.get()), nullptr));
  CUDA_ASSERT_OK(cudaDeviceSynchronize());
  cudaFuncAttributes a{};
  CUDA_ASSERT_OK(cudaFuncGetAttributes(&a, k));
  std::printf("Fp8Gemm shared memory: static %zu + dynamic %d bytes (SM 8.6 limit %d)\n",
              a.sharedSizeBytes, a.maxDynamicSharedSizeBytes, kSm86MaxSharedPerBlock);
  EXPECT_GT(a.maxDynamicSharedSizeBytes, 48 * 1024);
  EXPECT_LE(a.sharedSizeBytes + static_cast<size_t>(a.maxDynamicSharedSizeBytes),
            static_cast<size_t>(kSm86MaxSharedPerBlock));
}

TEST_F(CudaKernelsTest, RmsNormMatchesReference) {
  for (const int64_t n : {256, 512, 4096}) {
    const int64_t rows = 8;
    const std::vector<float> x = RandomBf16(rows * n, 3.0f, n);
    std::vector<float> g = RandomBf16(n, 0.1f, n + 1);
    for (float& v : g) v += 1.0f;
    DeviceBuffer<uint16_t> dx(x.size()), dy(x.size());
    DeviceBuffer<float> dg(n);
    dx.Put(ToBf16(x));
    dg.Put(g);
    CUDA_ASSERT_OK(RmsNorm(AsBf16(dx.get()), dg.get(), rows, n, 1e-6f, AsBf16(dy.get()), nullptr));
    CUDA_ASSERT_OK(cudaDeviceSynchronize());
    const std::vector<float> got = FromBf16(dy.Get());
    std::vector<float> ref(x.size());
    for (int64_t r = 0; r < rows; ++r)
      model::RmsNorm(x.data() + r * n, g.data(), n, 1e-6f, ref.data() + r * n);
    const golden::Closeness c = golden::Compare(got.data(), ref.data(), ref.size());
    std::printf("RmsNorm n=%ld: rms_rel=%.2e bit_identical=%.4f\n", static_cast<long>(n), c.rms_rel,
                c.bit_identical);
    EXPECT_LE(c.rms_rel, 1e-3);
    EXPECT_GE(c.bit_identical, 0.99);
  }
}

TEST_F(CudaKernelsTest, ActivationQuantisationIsExact) {
  for (const int64_t n : {256, 1000, 4096}) {
    const int64_t rows = 3, nb = (n + 127) / 128;
    std::vector<float> x = RandomBf16(rows * n, 2.0f, 7 * n);
    std::fill(x.begin(), x.begin() + 128, 0.0f);  // an all-zero block: the 1e-4 floor
    x[200 % n] = 448.0f;                          // an exact power-of-two amax/448
    DeviceBuffer<uint16_t> dx(x.size());
    DeviceBuffer<uint8_t> dq(x.size());
    DeviceBuffer<float> ds(rows * nb);
    dx.Put(ToBf16(x));
    CUDA_ASSERT_OK(QuantizeActE4m3(AsBf16(dx.get()), rows, n, AsE4m3(dq.get()), ds.get(), nullptr));
    CUDA_ASSERT_OK(cudaDeviceSynchronize());
    const std::vector<uint8_t> q = dq.Get();
    const std::vector<float> s = ds.Get();
    std::vector<uint8_t> rq(n);
    std::vector<float> rs(nb);
    for (int64_t r = 0; r < rows; ++r) {
      ss::QuantizeActE4m3(x.data() + r * n, n, 128, rq.data(), rs.data());
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(q[r * n + i], rq[i]) << "row " << r << " i " << i;
      for (int64_t b = 0; b < nb; ++b)
        ASSERT_EQ(s[r * nb + b], rs[b]) << "row " << r << " block " << b;
    }
  }
}

// Every finite bf16 value through the quantiser: rows in bit-pattern order (each 128-block one
// sign and exponent, so every scale the values produce), and the values of magnitude ≤ 448 with
// one element per block set to 448 (scale 1: each value's own e4m3 code), twice, the 448 at
// another place. Codes and scales equal the reference's.
TEST_F(CudaKernelsTest, ActivationQuantisationIsExactForEveryBf16Value) {
  std::vector<float> all, small;
  for (uint32_t b = 0; b < 0x10000u; ++b) {
    uint32_t bits = b << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    if (!std::isfinite(f)) continue;
    all.push_back(f);
    if (std::fabs(f) <= 448.0f) small.push_back(f);
  }
  auto pad = [](std::vector<float> v) {
    v.resize((v.size() + 127) / 128 * 128, 0.0f);
    return v;
  };
  all = pad(all);
  small = pad(small);
  std::vector<std::vector<float>> rows = {all};
  for (const size_t at : {0, 77}) {
    std::vector<float> r = small;
    for (size_t i = at; i < r.size(); i += 128) r[i] = i % 256 < 128 ? 448.0f : -448.0f;
    rows.push_back(r);
  }
  for (size_t k = 0; k < rows.size(); ++k) {
    const std::vector<float>& x = rows[k];
    const int64_t n = static_cast<int64_t>(x.size()), nb = n / 128;
    DeviceBuffer<uint16_t> dx(ToBf16(x));
    DeviceBuffer<uint8_t> dq(n);
    DeviceBuffer<float> ds(nb);
    CUDA_ASSERT_OK(QuantizeActE4m3(AsBf16(dx.get()), 1, n, AsE4m3(dq.get()), ds.get(), nullptr));
    CUDA_ASSERT_OK(cudaDeviceSynchronize());
    std::vector<uint8_t> rq(n);
    std::vector<float> rs(nb);
    ss::QuantizeActE4m3(x.data(), n, 128, rq.data(), rs.data());
    const std::vector<uint8_t> q = dq.Get();
    const std::vector<float> s = ds.Get();
    size_t dq_diff = 0, ds_diff = 0;
    for (int64_t i = 0; i < n; ++i) dq_diff += q[i] != rq[i];
    for (int64_t b = 0; b < nb; ++b) ds_diff += std::memcmp(&s[b], &rs[b], 4) != 0;
    std::printf("every bf16 value, row %zu: %zu of %lld codes and %zu of %lld scales differ\n", k,
                dq_diff, static_cast<long long>(n), ds_diff, static_cast<long long>(nb));
    EXPECT_EQ(dq_diff, 0u) << "row " << k;
    EXPECT_EQ(ds_diff, 0u) << "row " << k;
  }
}

using LinearFn = cudaError_t (*)(const e4m3_t*, const float*, int64_t, const e4m3_t*,
                                 const ue8m0_t*, int64_t, int64_t, bf16_t*, cudaStream_t);

// Runs a CUDA Linear8 path on bf16 rows x against the reference and prints one line.
golden::Closeness RunLinear(const std::string& what, LinearFn fn, const model::Fp8Weight& w,
                            const std::vector<float>& x, int64_t rows) {
  const int64_t nb = (w.in + 127) / 128;
  const size_t wbytes = w.out * w.in, sbytes = ((w.out + 127) / 128) * nb;
  DeviceBuffer<uint16_t> dx(rows * w.in), dy(rows * w.out);
  DeviceBuffer<uint8_t> dq(rows * w.in), dw(wbytes), dws(sbytes);
  DeviceBuffer<float> dsa(rows * nb);
  dx.Put(ToBf16(x));
  dw.Put(std::vector<uint8_t>(w.w, w.w + wbytes));
  dws.Put(std::vector<uint8_t>(w.s, w.s + sbytes));
  EXPECT_EQ(QuantizeActE4m3(AsBf16(dx.get()), rows, w.in, AsE4m3(dq.get()), dsa.get(), nullptr),
            cudaSuccess);
  EXPECT_EQ(fn(AsE4m3(dq.get()), dsa.get(), rows, AsE4m3(dw.get()), AsUe8m0(dws.get()), w.out, w.in,
               AsBf16(dy.get()), nullptr),
            cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> got = FromBf16(dy.Get());
  std::vector<float> ref(rows * w.out);
  model::Linear8(w, x.data(), rows, ref.data());
  char label[160];
  std::snprintf(label, sizeof(label), "%s [%ld x %ld] rows=%ld", what.c_str(),
                static_cast<long>(w.out), static_cast<long>(w.in), static_cast<long>(rows));
  return Report(label, got, ref);
}

// Random e4m3 weight bytes (every code but NaN, subnormals included) and ue8m0 scales.
struct RandomFp8 {
  RandomFp8(int64_t out, int64_t in, uint64_t seed)
      : w(out * in), s(((out + 127) / 128) * ((in + 127) / 128)) {
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<int> byte(0, 255);
    for (uint8_t& b : w) {
      b = static_cast<uint8_t>(byte(rng));
      if ((b & 0x7f) == 0x7f) b ^= 1;  // no NaN codes in a real checkpoint
    }
    for (uint8_t& b : s) b = static_cast<uint8_t>(120 + byte(rng) % 6);
    weight = model::Fp8Weight{w.data(), s.data(), out, in};
  }
  std::vector<uint8_t> w, s;
  model::Fp8Weight weight;
};

TEST_F(CudaKernelsTest, Fp8LinearMatchesReferenceOnTinyA) {
  auto weights = model::LoadModelWeights("tests/data/tiny-a");
  ASSERT_TRUE(weights.ok()) << weights.status();
  const auto& a = (*weights)->blocks[3].attn;
  for (const auto& [name, w] : std::vector<std::pair<std::string, model::Fp8Weight>>{
           {"wq_a", a.wq_a}, {"wq_b", a.wq_b}, {"wkv", a.wkv}, {"wo_b", a.wo_b}}) {
    // Fp8Linear: the GEMV up to 8 rows, the GEMM above; then each path forced at other sizes.
    for (const auto& [path, fn, rows] : std::vector<std::tuple<std::string, LinearFn, int64_t>>{
             {"Fp8Linear", &Fp8Linear, 1},
             {"Fp8Linear", &Fp8Linear, 8},
             {"Fp8Linear", &Fp8Linear, 19},
             {"Fp8Gemv", &Fp8Gemv, 19},
             {"Fp8Gemm", &Fp8Gemm, 1},
             {"Fp8Gemm", &Fp8Gemm, 16},
             {"Fp8Gemm", &Fp8Gemm, 128},
             {"Fp8Gemm", &Fp8Gemm, 512},
             {"Fp8LinearGeneric", &Fp8LinearGeneric, 8}}) {
      const golden::Closeness c = RunLinear("tiny-a " + name + " " + path, fn, w,
                                            RandomBf16(rows * w.in, 1.0f, rows), rows);
      EXPECT_LE(c.rms_rel, 1e-3) << name << " " << path << " rows=" << rows;
      EXPECT_GE(c.bit_identical, 0.98) << name << " " << path << " rows=" << rows;
    }
  }
}

// Flash's projections, and the slices a TP rank holds at TP 2, 4 and 8 (wq_b's head rows,
// wo_b's input columns, the shared expert's intermediate rows/columns).
TEST_F(CudaKernelsTest, Fp8GemvMatchesReferenceAtFlashShapes) {
  std::vector<std::tuple<std::string, int64_t, int64_t>> shapes = {
      {"wq_a", 1024, 4096}, {"wkv", 512, 4096}, {"wo_b", 4096, 8192}, {"ragged", 200, 1024}};
  for (const int64_t tp : {1, 2, 4, 8}) {
    // (snprintf: GCC 12's -Wrestrict misfires on "/" + std::to_string here)
    char s[8];
    std::snprintf(s, sizeof s, "/%d", static_cast<int>(tp));
    shapes.insert(shapes.end(), {{std::string("wq_b") + s, 32768 / tp, 1024},
                                 {std::string("shared w1") + s, 2048 / tp, 4096},
                                 {std::string("shared w2") + s, 4096, 2048 / tp}});
    if (tp > 1) shapes.push_back({std::string("wo_b") + s, 4096, 8192 / tp});
  }
  for (const auto& [name, out, in] : shapes) {
    const RandomFp8 w(out, in, 5 + out + in);
    for (const int64_t rows : {1, 3, 8}) {
      const golden::Closeness c = RunLinear("flash " + name + " Fp8Linear", &Fp8Linear, w.weight,
                                            RandomBf16(rows * in, 1.0f, out + rows), rows);
      EXPECT_LE(c.rms_rel, 1e-3) << name;
      EXPECT_GE(c.bit_identical, 0.95) << name;
    }
  }
}

// The prefill GEMM at Flash shapes, with row counts that leave partial 32/64/128-row tiles.
TEST_F(CudaKernelsTest, Fp8GemmMatchesReferenceAtFlashShapes) {
  for (const auto& [name, out, in] :
       std::vector<std::tuple<std::string, int64_t, int64_t>>{{"wq_a", 1024, 4096},
                                                              {"wq_b", 32768, 1024},
                                                              {"wo_b", 4096, 8192},
                                                              {"shared w1", 2048, 4096},
                                                              {"ragged", 200, 1024}}) {
    const RandomFp8 w(out, in, 7 + out + in);
    for (const int64_t rows : {16, 128, 512, 77}) {
      // The CPU reference is the slow part; shared w1 at 512 rows takes 64-row tiles on an H200.
      if (name == "wo_b" && rows != 128) continue;
      if (name == "shared w1" && rows != 512) continue;
      const golden::Closeness c = RunLinear("flash " + name + " Fp8Gemm", &Fp8Gemm, w.weight,
                                            RandomBf16(rows * in, 1.0f, out + rows), rows);
      EXPECT_LE(c.rms_rel, 1e-3) << name << " rows=" << rows;
      EXPECT_GE(c.bit_identical, 0.95) << name << " rows=" << rows;
    }
  }
}

// K not a multiple of 128 (a partial last scale block): Fp8Linear takes the plain kernel, and
// the tensor-core paths refuse the shape.
TEST_F(CudaKernelsTest, Fp8LinearFallsBackForRaggedK) {
  const RandomFp8 w(200, 1000, 11);
  for (const int64_t rows : {1, 8, 19}) {
    const golden::Closeness c = RunLinear("ragged-k Fp8Linear", &Fp8Linear, w.weight,
                                          RandomBf16(rows * 1000, 1.0f, rows), rows);
    EXPECT_LE(c.rms_rel, 1e-3);
    EXPECT_GE(c.bit_identical, 0.95);
  }
  DeviceBuffer<uint8_t> q(16 * 1000), dw(200 * 1000), ws(2 * 8);
  DeviceBuffer<float> sa(16 * 8);
  DeviceBuffer<uint16_t> y(16 * 200);
  EXPECT_EQ(Fp8Gemm(AsE4m3(q.get()), sa.get(), 16, AsE4m3(dw.get()), AsUe8m0(ws.get()), 200, 1000,
                    AsBf16(y.get()), nullptr),
            cudaErrorInvalidValue);
}

}  // namespace
}  // namespace ss::cuda
