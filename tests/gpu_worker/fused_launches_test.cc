// The decode's fused launches against the launches each replaces (label gpu): the same bits.
// Shapes: Flash's (hidden 4096, q_lora 1024, shared inter 2048, 64 heads of 512 with 64 rope
// dims, hc 4) and ragged ones (a partial last 128-block, a strided gate/up, dims the fused
// kernels leave to the unfused launches). Without a CUDA device every test skips with a message.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "gpu_worker/kernels/elementwise.h"
#include "gpu_worker/kernels/fp8_linear.h"
#include "gpu_worker/kernels/head.h"
#include "gpu_worker/kernels/hyper_connection.h"
#include "gpu_worker/kernels/rms_norm.h"
#include "gpu_worker/kernels/rope.h"
#include "gpu_worker/kernels/swiglu.h"
#include "gtest/gtest.h"
#include "tests/gpu_worker/gpu_test_util.h"

namespace ss::cuda {
namespace {

using namespace testing_util;  // NOLINT: the shared GPU test helpers

class FusedLaunchesTest : public GpuTest {};

constexpr float kEps = 1e-6f;

// a and b element by element, the same bits; prints how many differ.
template <typename V>
void ExpectSameBits(const std::string& label, const V& a, const V& b) {
  ASSERT_EQ(a.size(), b.size()) << label;
  size_t diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff += std::memcmp(&a[i], &b[i], sizeof(a[i])) != 0;
  std::printf("%-52s %zu of %zu differ\n", label.c_str(), diff, a.size());
  EXPECT_EQ(diff, 0u) << label;
}

// Poisons a device buffer, so a launch that writes nothing cannot pass on an earlier one's
// values.
template <typename T>
void Poison(const DeviceBuffer<T>& b, size_t n) {
  CUDA_ASSERT_OK(cudaMemset(b.get(), 0xff, n * sizeof(T)));
}

// A produced bf16 row block [rows, n] and its quantisation (QuantizeActE4m3's layout).
struct Quantised {
  Quantised(int64_t rows, int64_t n) : y(rows * n), q(rows * n), s(rows * ((n + 127) / 128)) {}
  DeviceBuffer<uint16_t> y;
  DeviceBuffer<uint8_t> q;
  DeviceBuffer<float> s;
};

void ExpectSameQuantised(const std::string& label, const std::string& y_name, const Quantised& got,
                         const Quantised& want) {
  ExpectSameBits(label + " " + y_name, got.y.Get(), want.y.Get());
  ExpectSameBits(label + " q", got.q.Get(), want.q.Get());
  ExpectSameBits(label + " s", got.s.Get(), want.s.Get());
}

TEST_F(FusedLaunchesTest, RmsNormQuantIsRmsNormThenQuantize) {
  int64_t seed = 300;
  for (const auto& [rows, n] : {std::pair<int64_t, int64_t>{1, 4096},
                                {8, 4096},
                                {1, 1024},
                                {3, 1024},
                                {2, 2048},
                                {5, 200},
                                {2, 4352}}) {
    const std::string label = "RmsNormQuant " + std::to_string(rows) + "x" + std::to_string(n);
    DeviceBuffer<uint16_t> dx(ToBf16(RandomBf16(rows * n, 1.5f, ++seed)));
    DeviceBuffer<float> dg(RandomF32(n, 0.5f, ++seed));
    Quantised parts(rows, n), fused(rows, n);
    CUDA_ASSERT_OK(
        RmsNorm(AsBf16(dx.get()), dg.get(), rows, n, kEps, AsBf16(parts.y.get()), nullptr));
    CUDA_ASSERT_OK(QuantizeActE4m3(AsBf16(parts.y.get()), rows, n, AsE4m3(parts.q.get()),
                                   parts.s.get(), nullptr));
    CUDA_ASSERT_OK(RmsNormQuant(AsBf16(dx.get()), dg.get(), rows, n, kEps, AsBf16(fused.y.get()),
                                AsE4m3(fused.q.get()), fused.s.get(), nullptr));
    CUDA_ASSERT_OK(cudaDeviceSynchronize());
    ExpectSameQuantised(label, "y", fused, parts);
  }
}

TEST_F(FusedLaunchesTest, SwiGluBf16QuantIsSwiGluThenQuantize) {
  int64_t seed = 314;
  for (const auto& [rows, n, stride, limit] :
       {std::tuple<int64_t, int64_t, int64_t, float>{1, 2048, 2048, 10.0f},
        {8, 2048, 4096, 10.0f},
        {3, 200, 256, 0.0f}}) {
    const std::string label = "SwiGluBf16Quant " + std::to_string(rows) + "x" + std::to_string(n);
    DeviceBuffer<uint16_t> dg(ToBf16(RandomBf16(rows * stride, 4.0f, ++seed)));
    DeviceBuffer<uint16_t> du(ToBf16(RandomBf16(rows * stride, 4.0f, ++seed)));
    Quantised parts(rows, n), fused(rows, n);
    CUDA_ASSERT_OK(SwiGluBf16(AsBf16(dg.get()), AsBf16(du.get()), stride, nullptr, rows, n, limit,
                              AsBf16(parts.y.get()), nullptr));
    CUDA_ASSERT_OK(QuantizeActE4m3(AsBf16(parts.y.get()), rows, n, AsE4m3(parts.q.get()),
                                   parts.s.get(), nullptr));
    CUDA_ASSERT_OK(SwiGluBf16Quant(AsBf16(dg.get()), AsBf16(du.get()), stride, rows, n, limit,
                                   AsBf16(fused.y.get()), AsE4m3(fused.q.get()), fused.s.get(),
                                   nullptr));
    CUDA_ASSERT_OK(cudaDeviceSynchronize());
    ExpectSameQuantised(label, "out", fused, parts);
  }
}

// Two FP8 matrices on the same activations in one launch: the two Fp8Linear calls' bits where
// each matrix alone has the launch's warps per block (out 4096: 256 blocks, 8 warps, also on
// an H200's 132 SMs), and where the fallback runs (in % 128 != 0); at Flash's shared expert
// (2048 each: 16 warps alone on an H200, 8 together) the warps' K split differs, so only the
// fp32 summation order of the 128-block partials does: within a bf16 rounding step.
TEST_F(FusedLaunchesTest, Fp8LinearPairIsTwoFp8Linears) {
  int64_t seed = 320;
  for (const auto& [rows, in, out] : {std::tuple<int64_t, int64_t, int64_t>{1, 4096, 4096},
                                      {8, 4096, 4096},
                                      {3, 200, 96},
                                      {1, 4096, 2048}}) {
    const std::string label = "Fp8LinearPair " + std::to_string(rows) + "x" + std::to_string(in) +
                              " -> 2x" + std::to_string(out);
    const int64_t nb = (in + 127) / 128;
    DeviceBuffer<uint8_t> dq(RandomE4m3(rows * in, ++seed));
    DeviceBuffer<float> ds(std::vector<float>(rows * nb, 0.015625f));
    DeviceBuffer<uint8_t> w0(RandomE4m3(out * in, ++seed)), w1(RandomE4m3(out * in, ++seed));
    const int64_t sn = ((out + 127) / 128) * nb;
    DeviceBuffer<uint8_t> ws0(RandomScales(sn, 118, 122, ++seed)),
        ws1(RandomScales(sn, 118, 122, ++seed));
    DeviceBuffer<uint16_t> a0(rows * out), a1(rows * out), b0(rows * out), b1(rows * out);
    CUDA_ASSERT_OK(Fp8Linear(AsE4m3(dq.get()), ds.get(), rows, AsE4m3(w0.get()), AsUe8m0(ws0.get()),
                             out, in, AsBf16(a0.get()), nullptr));
    CUDA_ASSERT_OK(Fp8Linear(AsE4m3(dq.get()), ds.get(), rows, AsE4m3(w1.get()), AsUe8m0(ws1.get()),
                             out, in, AsBf16(a1.get()), nullptr));
    CUDA_ASSERT_OK(
        Fp8LinearPair({.q = AsE4m3(dq.get()),
                       .s_act = ds.get(),
                       .rows = rows,
                       .in = in,
                       .m0 = {AsE4m3(w0.get()), AsUe8m0(ws0.get()), out, AsBf16(b0.get())},
                       .m1 = {AsE4m3(w1.get()), AsUe8m0(ws1.get()), out, AsBf16(b1.get())}},
                      nullptr));
    CUDA_ASSERT_OK(cudaDeviceSynchronize());
    if (out != 2048) {
      ExpectSameBits(label + " first", b0.Get(), a0.Get());
      ExpectSameBits(label + " second", b1.Get(), a1.Get());
      continue;
    }
    for (const auto& [part, got, want] :
         {std::tuple{"first", b0.Get(), a0.Get()}, std::tuple{"second", b1.Get(), a1.Get()}}) {
      const std::vector<float> g = FromBf16(got), wv = FromBf16(want);
      size_t off = 0;
      for (size_t i = 0; i < g.size(); ++i) {
        off += std::fabs(g[i] - wv[i]) > std::ldexp(std::fabs(wv[i]), -7) + 1e-30f;
      }
      std::printf("%-52s %zu of %zu beyond one bf16 step\n", (label + " " + part).c_str(), off,
                  g.size());
      EXPECT_EQ(off, 0u) << label << " " << part;
    }
  }
}

// A compressor's wkv and wgate (bf16 weights, fp32 out) in one launch: the two calls' bits.
TEST_F(FusedLaunchesTest, LinearBf16F32PairIsTwoLinears) {
  int64_t seed = 340;
  for (const auto& [rows, in, out0, out1] :
       {std::tuple<int64_t, int64_t, int64_t, int64_t>{1, 4096, 1024, 1024},
        {5, 4096, 256, 200},
        {70, 1024, 64, 72}}) {
    const std::string label = "LinearBf16F32Pair " + std::to_string(rows) + "x" +
                              std::to_string(in) + " -> " + std::to_string(out0) + "+" +
                              std::to_string(out1);
    DeviceBuffer<uint16_t> dx(ToBf16(RandomBf16(rows * in, 1.0f, ++seed)));
    DeviceBuffer<uint16_t> w0(ToBf16(RandomBf16(out0 * in, 0.05f, ++seed))),
        w1(ToBf16(RandomBf16(out1 * in, 0.05f, ++seed)));
    DeviceBuffer<float> a0(rows * out0), a1(rows * out1), b0(rows * out0), b1(rows * out1);
    CUDA_ASSERT_OK(
        LinearBf16F32(AsBf16(dx.get()), rows, in, AsBf16(w0.get()), out0, a0.get(), out0, nullptr));
    CUDA_ASSERT_OK(
        LinearBf16F32(AsBf16(dx.get()), rows, in, AsBf16(w1.get()), out1, a1.get(), out1, nullptr));
    CUDA_ASSERT_OK(LinearBf16F32Pair({.x = AsBf16(dx.get()),
                                      .rows = rows,
                                      .in = in,
                                      .m0 = {AsBf16(w0.get()), out0, b0.get(), out0},
                                      .m1 = {AsBf16(w1.get()), out1, b1.get(), out1}},
                                     nullptr));
    CUDA_ASSERT_OK(cudaDeviceSynchronize());
    ExpectSameBits(label + " first", b0.Get(), a0.Get());
    ExpectSameBits(label + " second", b1.Get(), a1.Get());
  }
}

// HcPre's collapse and the sublayer's input norm (one kernel at Flash's dim 4096 for a token or
// two, two launches for more; the other dims take the unfused launches).
TEST_F(FusedLaunchesTest, HcPreDeferCombNormQuantIsHcPreThenRmsNormQuant) {
  int64_t seed = 349;
  for (const auto& [T, dim] : {std::pair<int64_t, int64_t>{1, 4096},
                               {2, 4096},
                               {3, 4096},
                               {8, 4096},
                               {2, 2048},
                               {1, 1024}}) {
    const std::string label =
        "HcPreDeferCombNormQuant T" + std::to_string(T) + " " + std::to_string(dim);
    const int64_t hc = 4, mix = (2 + hc) * hc, iters = 20;
    DeviceBuffer<uint16_t> dx(ToBf16(RandomBf16(T * hc * dim, 1.0f, ++seed)));
    DeviceBuffer<float> dfn(RandomF32(mix * hc * dim, 0.05f, ++seed)),
        dbase(RandomF32(mix, 0.5f, ++seed)), dscale(RandomF32(3, 1.0f, ++seed)),
        dg(RandomF32(dim, 0.5f, ++seed));
    DeviceBuffer<uint16_t> y1(T * dim), y2(T * dim);
    DeviceBuffer<float> pre1(T * hc), pre2(T * hc), post1(T * hc), post2(T * hc);
    DeviceBuffer<float> comb1(T * hc * hc), comb2(T * hc * hc);
    Quantised parts(T, dim), fused(T, dim);
    ASSERT_TRUE(HcPreDefersComb(T, hc, dim, AsBf16(y1.get()))) << label;
    const HcPreParams p1 = {.streams = AsBf16(dx.get()),
                            .fn = dfn.get(),
                            .base = dbase.get(),
                            .scale = dscale.get(),
                            .T = T,
                            .hc = hc,
                            .dim = dim,
                            .sinkhorn_iters = iters,
                            .hc_eps = 1e-6f,
                            .norm_eps = kEps,
                            .y = AsBf16(y1.get()),
                            .pre = pre1.get(),
                            .post = post1.get(),
                            .comb = comb1.get()};
    CUDA_ASSERT_OK(HcPreDeferComb(p1, nullptr));
    CUDA_ASSERT_OK(RmsNormQuant(AsBf16(y1.get()), dg.get(), T, dim, kEps, AsBf16(parts.y.get()),
                                AsE4m3(parts.q.get()), parts.s.get(), nullptr));
    // Without counters (two launches), then twice with them (one launch at dim 4096; the second
    // call proves the counters were left zero).
    DeviceBuffer<uint32_t> sync(std::vector<uint32_t>(T, 0));
    for (uint32_t* counters : {static_cast<uint32_t*>(nullptr), sync.get(), sync.get()}) {
      const std::string how = label + (counters ? " (counters)" : "");
      Poison(y2, T * dim);
      Poison(pre2, T * hc);
      Poison(post2, T * hc);
      Poison(comb2, T * hc * hc);
      Poison(fused.y, T * dim);
      Poison(fused.q, T * dim);
      Poison(fused.s, T * (dim / 128));
      HcPreParams p2 = p1;
      p2.y = AsBf16(y2.get());
      p2.pre = pre2.get();
      p2.post = post2.get();
      p2.comb = comb2.get();
      CUDA_ASSERT_OK(HcPreDeferCombNormQuant(p2,
                                             {.g = dg.get(),
                                              .rms_eps = kEps,
                                              .xn = AsBf16(fused.y.get()),
                                              .q = AsE4m3(fused.q.get()),
                                              .s = fused.s.get(),
                                              .sync = counters},
                                             nullptr));
      CUDA_ASSERT_OK(cudaDeviceSynchronize());
      ExpectSameBits(how + " y", y2.Get(), y1.Get());
      ExpectSameBits(how + " pre", pre2.Get(), pre1.Get());
      ExpectSameBits(how + " post", post2.Get(), post1.Get());
      ExpectSameBits(how + " comb logits", comb2.Get(), comb1.Get());
      ExpectSameQuantised(how, "xn", fused, parts);
      EXPECT_EQ(sync.Get(), std::vector<uint32_t>(T, 0)) << how;
    }
  }
}

TEST_F(FusedLaunchesTest, HeadRmsNormRopeIsHeadNormThenRope) {
  int64_t seed = 369;
  for (const auto& [T, heads, hd, rd] :
       {std::tuple<int64_t, int64_t, int64_t, int64_t>{1, 64, 512, 64},
        {8, 64, 512, 64},
        {3, 8, 512, 128},
        {5, 4, 128, 64}}) {
    const std::string label = "HeadRmsNormRope T" + std::to_string(T) + " " +
                              std::to_string(heads) + "x" + std::to_string(hd);
    const std::vector<float> x = RandomBf16(T * heads * hd, 2.0f, ++seed);
    DeviceBuffer<float> dc(RandomF32(T * rd / 2, 0.7f, ++seed)),
        ds(RandomF32(T * rd / 2, 0.7f, ++seed));
    DeviceBuffer<uint16_t> x1(ToBf16(x)), x2(ToBf16(x));
    CUDA_ASSERT_OK(HeadRmsNormBf16(AsBf16(x1.get()), T * heads, hd, kEps, nullptr));
    CUDA_ASSERT_OK(
        ApplyRope(AsBf16(x1.get()), T, heads, hd, rd, dc.get(), ds.get(), false, nullptr));
    CUDA_ASSERT_OK(
        HeadRmsNormRope(AsBf16(x2.get()), T, heads, hd, kEps, rd, dc.get(), ds.get(), nullptr));
    CUDA_ASSERT_OK(cudaDeviceSynchronize());
    ExpectSameBits(label, x2.Get(), x1.Get());
  }
}

// HcPost's operands for T tokens of hc streams of dim (post and comb as the HcPre gives them:
// positive, O(1)).
struct PostInputs {
  PostInputs(int64_t T, int64_t hc, int64_t dim, int64_t seed)
      : residual(ToBf16(RandomBf16(T * hc * dim, 1.0f, seed))),
        post(RandomPositive(T * hc, seed + 1)),
        comb(RandomPositive(T * hc * hc, seed + 2)),
        out_a(T * hc * dim),
        out_b(T * hc * dim),
        out_f32(T * hc * dim),
        hc(hc),
        dim(dim) {}
  static std::vector<float> RandomPositive(size_t n, int64_t seed) {
    std::vector<float> v = RandomF32(n, 0.5f, static_cast<uint64_t>(seed));
    for (float& x : v) x = std::fabs(x) + 0.25f;
    return v;
  }
  // Into out_b, with its fp32 copy into out_f32.
  HcPostOperands IntoB() {
    return {residual.get(), post.get(), comb.get(), hc, dim, out_b.get(), out_f32.get()};
  }
  // out_b as the launches under test wrote it: the same bits as out_a, and out_f32 its exact
  // fp32 copy.
  void ExpectOutputs(const std::string& label) {
    const std::vector<uint16_t> b = out_b.Get();
    ExpectSameBits(label + " new streams", b, out_a.Get());
    ExpectSameBits(label + " new streams fp32", out_f32.Get(), FromBf16(b));
  }
  DeviceBuffer<uint16_t> residual;
  DeviceBuffer<float> post, comb;
  DeviceBuffer<uint16_t> out_a, out_b;
  DeviceBuffer<float> out_f32;
  int64_t hc, dim;
};

// wo_b's decode launch with HcPost in its epilogue against Fp8Linear then HcPost. Rows past
// the GEMV (9) and ragged dims take the two launches inside the call: the same bits by
// construction, checked too. 5 x 256 -> 96 runs blocks of 2 warps, whose threads each store
// several outputs.
TEST_F(FusedLaunchesTest, Fp8LinearHcPostIsFp8LinearThenHcPost) {
  int64_t seed = 400;
  for (const auto& [rows, in, out] : {std::tuple<int64_t, int64_t, int64_t>{1, 8192, 4096},
                                      {3, 8192, 4096},
                                      {8, 8192, 4096},
                                      {9, 1024, 256},
                                      {5, 256, 96},
                                      {2, 200, 64}}) {
    const std::string label = "Fp8LinearHcPost " + std::to_string(rows) + "x" + std::to_string(in) +
                              " -> " + std::to_string(out);
    const int64_t nb = (in + 127) / 128, hc = 4;
    DeviceBuffer<uint8_t> q(RandomE4m3(rows * in, ++seed));
    DeviceBuffer<float> s(std::vector<float>(rows * nb, 0.015625f));
    DeviceBuffer<uint8_t> w(RandomE4m3(out * in, ++seed));
    DeviceBuffer<uint8_t> ws(RandomScales(((out + 127) / 128) * nb, 118, 122, ++seed));
    DeviceBuffer<uint16_t> ya(rows * out), yb(rows * out);
    PostInputs hp(rows, hc, out, ++seed);
    seed += 2;
    CUDA_ASSERT_OK(Fp8Linear(AsE4m3(q.get()), s.get(), rows, AsE4m3(w.get()), AsUe8m0(ws.get()),
                             out, in, AsBf16(ya.get()), nullptr));
    CUDA_ASSERT_OK(HcPost(AsBf16(ya.get()), AsBf16(hp.residual.get()), hp.post.get(), hp.comb.get(),
                          rows, hc, out, AsBf16(hp.out_a.get()), nullptr));
    CUDA_ASSERT_OK(Fp8LinearHcPost({.q = AsE4m3(q.get()),
                                    .s_act = s.get(),
                                    .rows = rows,
                                    .w = AsE4m3(w.get()),
                                    .w_scale = AsUe8m0(ws.get()),
                                    .out = out,
                                    .in = in,
                                    .y = AsBf16(yb.get()),
                                    .hp = hp.IntoB()},
                                   nullptr));
    CUDA_ASSERT_OK(cudaDeviceSynchronize());
    ExpectSameBits(label + " y", yb.Get(), ya.Get());
    hp.ExpectOutputs(label);
  }
}

// HcPost with its x formed in the same launch: a TP rank's all-reduced fp32 sum
// (RoundF32ToBf16), the MoE combine (MoeCombineBf16 with and without either input;
// MoeCombineF32 on partials), against the combine's launch then HcPost; each also writes the
// new streams' fp32 copy (a stage's output).
TEST_F(FusedLaunchesTest, HcPostOfFormedOutputsIsTheTwoLaunches) {
  int64_t seed = 440;
  for (const auto& [T, dim] : {std::pair<int64_t, int64_t>{1, 4096}, {5, 4096}, {2, 300}}) {
    const std::string shape = " T" + std::to_string(T) + " dim " + std::to_string(dim);
    const int64_t hc = 4, n = T * dim;
    DeviceBuffer<float> f0(RandomF32(n, 1.0f, ++seed)), f1(RandomF32(n, 1.0f, ++seed));
    DeviceBuffer<uint16_t> b0(ToBf16(RandomBf16(n, 1.0f, ++seed))), x(n);
    PostInputs hp(T, hc, dim, ++seed);
    seed += 2;
    const HcPostOperands ops = hp.IntoB();
    auto two = [&](const std::string& what) {
      CUDA_ASSERT_OK(HcPost(AsBf16(x.get()), AsBf16(hp.residual.get()), hp.post.get(),
                            hp.comb.get(), T, hc, dim, AsBf16(hp.out_a.get()), nullptr));
      CUDA_ASSERT_OK(cudaDeviceSynchronize());
      hp.ExpectOutputs(what + shape);
    };
    CUDA_ASSERT_OK(RoundF32ToBf16(f0.get(), n, AsBf16(x.get()), nullptr));
    CUDA_ASSERT_OK(HcPostF32(f0.get(), T, ops, nullptr));
    two("HcPostF32");
    for (const auto& [shared, routed, what] :
         {std::tuple<const uint16_t*, const float*, const char*>{b0.get(), f1.get(), "both"},
          {nullptr, f1.get(), "routed only"},
          {b0.get(), nullptr, "shared only"}}) {
      CUDA_ASSERT_OK(MoeCombineBf16(AsBf16(shared), routed, n, AsBf16(x.get()), nullptr));
      CUDA_ASSERT_OK(MoeCombineHcPost(AsBf16(shared), routed, T, ops, nullptr));
      two(std::string("MoeCombineHcPost ") + what);
    }
    CUDA_ASSERT_OK(MoeCombineF32(f0.get(), f1.get(), n, AsBf16(x.get()), nullptr));
    CUDA_ASSERT_OK(MoeCombineF32HcPost(f0.get(), f1.get(), T, ops, nullptr));
    two("MoeCombineF32HcPost");
  }
}

// The combine and conversion launches the fused ones above are checked against: MoeCombineBf16
// is the reference's combine (with a null input read as 0), Bf16ToF32 exact.
TEST_F(FusedLaunchesTest, MoeCombineAndStreamConversion) {
  const int64_t n = 3000;
  const std::vector<uint16_t> shared = ToBf16(RandomBf16(n, 1.0f, 9));
  const std::vector<float> routed = RandomF32(n, 1.0f, 10);
  DeviceBuffer<uint16_t> ds(shared), dy(n);
  DeviceBuffer<float> dr(routed), df(n);
  CUDA_ASSERT_OK(MoeCombineBf16(AsBf16(ds.get()), dr.get(), n, AsBf16(dy.get()), nullptr));
  const std::vector<uint16_t> y = dy.Get();
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(y[i], FloatToBf16(routed[i] + Bf16ToFloat(shared[i]))) << i;
  }
  CUDA_ASSERT_OK(MoeCombineBf16(AsBf16(ds.get()), nullptr, n, AsBf16(dy.get()), nullptr));
  EXPECT_EQ(dy.Get(), shared);
  CUDA_ASSERT_OK(Bf16ToF32(AsBf16(ds.get()), n, df.get(), nullptr));
  const std::vector<float> f = df.Get();
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(f[i], Bf16ToFloat(shared[i])) << i;
}

// The step's two RoPE tables (plain and compressed layers' frequencies) in one launch.
TEST_F(FusedLaunchesTest, RopeCosSinPairIsTwoRopeCosSin) {
  int64_t seed = 460;
  for (const auto& [n, pairs] : {std::pair<int64_t, int64_t>{1, 32}, {9, 32}, {3, 5}}) {
    const std::string label =
        "RopeCosSinPair n" + std::to_string(n) + " pairs " + std::to_string(pairs);
    std::vector<int64_t> pos(n);
    for (int64_t i = 0; i < n; ++i) pos[i] = 1000003 * i + 7;
    DeviceBuffer<int64_t> dpos(pos);
    DeviceBuffer<float> f0(RandomF32(pairs, 0.3f, ++seed)), f1(RandomF32(pairs, 0.3f, ++seed));
    DeviceBuffer<float> c0(n * pairs), s0(n * pairs), c1(n * pairs), s1(n * pairs);
    DeviceBuffer<float> c0b(n * pairs), s0b(n * pairs), c1b(n * pairs), s1b(n * pairs);
    CUDA_ASSERT_OK(RopeCosSin(f0.get(), pairs, dpos.get(), n, false, c0.get(), s0.get(), nullptr));
    CUDA_ASSERT_OK(RopeCosSin(f1.get(), pairs, dpos.get(), n, false, c1.get(), s1.get(), nullptr));
    CUDA_ASSERT_OK(RopeCosSinPair({.pairs = pairs,
                                   .positions = dpos.get(),
                                   .n = n,
                                   .t0 = {f0.get(), c0b.get(), s0b.get()},
                                   .t1 = {f1.get(), c1b.get(), s1b.get()}},
                                  nullptr));
    CUDA_ASSERT_OK(cudaDeviceSynchronize());
    ExpectSameBits(label + " cos 0", c0b.Get(), c0.Get());
    ExpectSameBits(label + " sin 0", s0b.Get(), s0.Get());
    ExpectSameBits(label + " cos 1", c1b.Get(), c1.Get());
    ExpectSameBits(label + " sin 1", s1b.Get(), s1.Get());
  }
}

TEST_F(FusedLaunchesTest, KernelsRunFromComputeSm86Ptx) {
  ExpectCompute86Ptx({{"Fp8LinearHcPost", Fp8LinearHcPostKernel()},
                      {"HcPreMixFinish", HcPreMixFinishKernel()},
                      {"HeadRmsNormRopeRegs", HeadRmsNormRopeRegsKernel()},
                      {"RopeCosSinPair", RopeCosSinPairKernel()},
                      {"MoeCombineBf16", MoeCombineBf16Kernel()},
                      {"Bf16ToF32", Bf16ToF32Kernel()}});
}

}  // namespace
}  // namespace ss::cuda
