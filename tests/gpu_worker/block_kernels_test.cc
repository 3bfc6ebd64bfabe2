// CUDA block kernels (gpu_worker/kernels/hyper_connection.h, rope.h, router.h, swiglu.h) against
// the CPU reference (label gpu): hyper-connections, the q/kv path pieces, the router and SwiGLU, on
// tiny-a weights and golden streams and at Flash shapes with synthetic data. Without a CUDA device
// every test that needs one skips with a message.
//
// Each comparison prints rms_rel, max_rel and bit_identical. Where the kernel and the reference
// perform the same fp32 operations on the same inputs (HcPost, RoPE given the same table,
// FP8sim), the result must be bit-identical; where the reference sums exactly in double and the
// kernel in fp32 (HC mixes, router logits, the q norm's sum of squares), rms_rel ≤ 1e-3.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/bf16.h"
#include "common/codecs.h"
#include "common/golden/golden.h"
#include "common/model/attention.h"
#include "common/model/hyper_connection.h"
#include "common/model/linear.h"
#include "common/model/moe.h"
#include "common/model/weights.h"
#include "common/model_config.h"
#include "common/rope.h"
#include "common/safetensors.h"
#include "gpu_worker/kernels/fp8_linear.h"
#include "gpu_worker/kernels/hyper_connection.h"
#include "gpu_worker/kernels/limits.h"
#include "gpu_worker/kernels/rms_norm.h"
#include "gpu_worker/kernels/rope.h"
#include "gpu_worker/kernels/router.h"
#include "gpu_worker/kernels/swiglu.h"
#include "gtest/gtest.h"
#include "tests/gpu_worker/gpu_test_util.h"

namespace ss::cuda {
namespace {

using namespace testing_util;  // NOLINT: the shared GPU test helpers

class BlockKernelsTest : public testing_util::GpuTest {};

// ---- tiny-a data ---------------------------------------------------------------------------

constexpr char kGolden[] = "golden.safetensors";

// The 40-token intermediates case.
const GoldenStreams& Inter() {
  static const GoldenStreams s = LoadGoldenStreams(kGolden, "inter");
  return s;
}

// ---- hyper-connections
// ---------------------------------------------------------------------------

struct HcShape {
  int64_t hc, dim, iters;
  float hc_eps, norm_eps;
};

struct HcOut {
  std::vector<float> y, pre, post, comb;
};

HcOut HostHcPre(const model::HcWeights& w, const std::vector<float>& streams, int64_t T,
                const HcShape& s) {
  HcOut o;
  o.y.resize(T * s.dim);
  for (int64_t t = 0; t < T; ++t) {
    const model::HcSplit sp = model::HcPre(streams.data() + t * s.hc * s.dim, s.hc, s.dim, w,
                                           s.iters, s.hc_eps, s.norm_eps, o.y.data() + t * s.dim);
    o.pre.insert(o.pre.end(), sp.pre.begin(), sp.pre.end());
    o.post.insert(o.post.end(), sp.post.begin(), sp.post.end());
    o.comb.insert(o.comb.end(), sp.comb.begin(), sp.comb.end());
  }
  return o;
}

// HcPre's parameters over the device buffers of one shape (DeviceHcPre, DeviceHcPreDeferred).
HcPreParams HcPreOn(DeviceBuffer<uint16_t>& dx, DeviceBuffer<float>& dfn,
                    DeviceBuffer<float>& dbase, DeviceBuffer<float>& dscale, int64_t T,
                    const HcShape& s, DeviceBuffer<uint16_t>& dy, DeviceBuffer<float>& dpre,
                    DeviceBuffer<float>& dpost, DeviceBuffer<float>& dcomb) {
  return {.streams = AsBf16(dx.get()),
          .fn = dfn.get(),
          .base = dbase.get(),
          .scale = dscale.get(),
          .T = T,
          .hc = s.hc,
          .dim = s.dim,
          .sinkhorn_iters = s.iters,
          .hc_eps = s.hc_eps,
          .norm_eps = s.norm_eps,
          .y = AsBf16(dy.get()),
          .pre = dpre.get(),
          .post = dpost.get(),
          .comb = dcomb.get()};
}

HcOut DeviceHcPre(const model::HcWeights& w, const std::vector<float>& streams, int64_t T,
                  const HcShape& s) {
  DeviceBuffer<uint16_t> dx(ToBf16(streams)), dy(T * s.dim);
  DeviceBuffer<float> dfn(w.fn), dbase(w.base), dscale(w.scale);
  DeviceBuffer<float> dpre(T * s.hc), dpost(T * s.hc), dcomb(T * s.hc * s.hc);
  EXPECT_EQ(HcPre(HcPreOn(dx, dfn, dbase, dscale, T, s, dy, dpre, dpost, dcomb), nullptr),
            cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return HcOut{FromBf16(dy.Get()), dpre.Get(), dpost.Get(), dcomb.Get()};
}

// HcPreDeferComb, then HcCombSinkhorn on another stream (as the backend's decode runs them);
// `ran` is false where the deferral does not apply to this shape.
HcOut DeviceHcPreDeferred(const model::HcWeights& w, const std::vector<float>& streams, int64_t T,
                          const HcShape& s, bool* ran) {
  DeviceBuffer<uint16_t> dx(ToBf16(streams)), dy(T * s.dim);
  *ran = HcPreDefersComb(T, s.hc, s.dim, AsBf16(dy.get()));
  if (!*ran) return {};
  DeviceBuffer<float> dfn(w.fn), dbase(w.base), dscale(w.scale);
  DeviceBuffer<float> dpre(T * s.hc), dpost(T * s.hc), dcomb(T * s.hc * s.hc);
  cudaStream_t side = nullptr;
  EXPECT_EQ(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking), cudaSuccess);
  EXPECT_EQ(HcPreDeferComb(HcPreOn(dx, dfn, dbase, dscale, T, s, dy, dpre, dpost, dcomb), nullptr),
            cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(HcCombSinkhorn(dcomb.get(), T, s.hc, s.iters, s.hc_eps, side), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaStreamDestroy(side);
  return HcOut{FromBf16(dy.Get()), dpre.Get(), dpost.Get(), dcomb.Get()};
}

// HcPre on both sides (and, where it applies, the deferred Sinkhorn: bit-identical to HcPre),
// then HcPost of `x` on both sides from the HOST split (so HcPost is compared on identical
// inputs), also in place (out aliasing residual).
void CheckHc(const std::string& label, const model::HcWeights& w, const std::vector<float>& streams,
             const std::vector<float>& x, int64_t T, const HcShape& s) {
  const HcOut ref = HostHcPre(w, streams, T, s);
  const HcOut got = DeviceHcPre(w, streams, T, s);
  const golden::Closeness cy = Report(label + " HcPre y", got.y, ref.y);
  EXPECT_LE(cy.rms_rel, 1e-3) << label;
  EXPECT_GE(cy.bit_identical, 0.99) << label;
  for (const auto& [part, a, b] :
       {std::tuple{"pre", &got.pre, &ref.pre}, std::tuple{"post", &got.post, &ref.post},
        std::tuple{"comb", &got.comb, &ref.comb}}) {
    const golden::Closeness c = Report(label + " HcPre " + part, *a, *b);
    EXPECT_LE(c.rms_rel, 1e-3) << label << " " << part;
    EXPECT_LE(c.max_rel, 1e-4) << label << " " << part;
  }
  bool deferred = false;
  const HcOut dg = DeviceHcPreDeferred(w, streams, T, s, &deferred);
  if (deferred) {
    for (const auto& [part, a, b] :
         {std::tuple{"y", &dg.y, &got.y}, std::tuple{"pre", &dg.pre, &got.pre},
          std::tuple{"post", &dg.post, &got.post}, std::tuple{"comb", &dg.comb, &got.comb}}) {
      const golden::Closeness c =
          Report(label + " HcPre deferred Sinkhorn vs HcPre " + part, *a, *b);
      EXPECT_EQ(c.bit_identical, 1.0) << label << " " << part;
    }
  }

  std::vector<float> post_ref(T * s.hc * s.dim);
  for (int64_t t = 0; t < T; ++t) {
    model::HcSplit sp;
    sp.pre.assign(ref.pre.begin() + t * s.hc, ref.pre.begin() + (t + 1) * s.hc);
    sp.post.assign(ref.post.begin() + t * s.hc, ref.post.begin() + (t + 1) * s.hc);
    sp.comb.assign(ref.comb.begin() + t * s.hc * s.hc, ref.comb.begin() + (t + 1) * s.hc * s.hc);
    model::HcPost(x.data() + t * s.dim, streams.data() + t * s.hc * s.dim, sp, s.hc, s.dim,
                  post_ref.data() + t * s.hc * s.dim);
  }
  DeviceBuffer<uint16_t> dx(ToBf16(x)), dres(ToBf16(streams)), dout(streams.size());
  DeviceBuffer<float> dpost(ref.post), dcomb(ref.comb);
  ASSERT_EQ(HcPost(AsBf16(dx.get()), AsBf16(dres.get()), dpost.get(), dcomb.get(), T, s.hc, s.dim,
                   AsBf16(dout.get()), nullptr),
            cudaSuccess);
  ASSERT_EQ(HcPost(AsBf16(dx.get()), AsBf16(dres.get()), dpost.get(), dcomb.get(), T, s.hc, s.dim,
                   AsBf16(dres.get()), nullptr),
            cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const golden::Closeness cp = Report(label + " HcPost", FromBf16(dout.Get()), post_ref);
  EXPECT_LE(cp.rms_rel, 1e-3) << label;
  EXPECT_EQ(cp.bit_identical, 1.0) << label;
  const golden::Closeness ci = Report(label + " HcPost in place", FromBf16(dres.Get()), post_ref);
  EXPECT_EQ(ci.bit_identical, 1.0) << label;
}

void CheckHcHead(const std::string& label, const model::HcWeights& w,
                 const std::vector<float>& streams, int64_t T, const HcShape& s) {
  std::vector<float> ref(T * s.dim);
  for (int64_t t = 0; t < T; ++t) {
    model::HcHead(streams.data() + t * s.hc * s.dim, s.hc, s.dim, w, s.hc_eps, s.norm_eps,
                  ref.data() + t * s.dim);
  }
  DeviceBuffer<uint16_t> dx(ToBf16(streams)), dz(T * s.dim);
  DeviceBuffer<float> dfn(w.fn), dbase(w.base), dscale(w.scale);
  ASSERT_EQ(HcHead({.streams = AsBf16(dx.get()),
                    .fn = dfn.get(),
                    .base = dbase.get(),
                    .scale = dscale.get(),
                    .T = T,
                    .hc = s.hc,
                    .dim = s.dim,
                    .hc_eps = s.hc_eps,
                    .norm_eps = s.norm_eps,
                    .z = AsBf16(dz.get())},
                   nullptr),
            cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const golden::Closeness c = Report(label + " HcHead", FromBf16(dz.Get()), ref);
  EXPECT_LE(c.rms_rel, 1e-3) << label;
  EXPECT_GE(c.bit_identical, 0.99) << label;
}

HcShape TinyAHcShape() {
  const ModelConfig& c = TinyA().config;
  return HcShape{c.hc_mult, c.dim, c.hc_sinkhorn_iters, static_cast<float>(c.hc_eps),
                 static_cast<float>(c.norm_eps)};
}

// ---- RoPE
// ------------------------------------------------------------------------------------------

struct RopeTables {
  std::vector<float> cos, sin;
};

RopeTables HostRopeTables(const std::vector<float>& freqs, const std::vector<int64_t>& pos) {
  const size_t pairs = freqs.size();
  RopeTables t{std::vector<float>(pos.size() * pairs), std::vector<float>(pos.size() * pairs)};
  for (size_t r = 0; r < pos.size(); ++r) {
    ss::RopeCosSin(freqs, pos[r], t.cos.data() + r * pairs, t.sin.data() + r * pairs);
  }
  return t;
}

RopeTables DeviceRopeTables(const std::vector<float>& freqs, const std::vector<int64_t>& pos,
                            bool fp32_trig) {
  const int64_t pairs = static_cast<int64_t>(freqs.size()), n = static_cast<int64_t>(pos.size());
  DeviceBuffer<float> df(freqs), dc(n * pairs), ds(n * pairs);
  DeviceBuffer<int64_t> dp(pos);
  EXPECT_EQ(RopeCosSin(df.get(), pairs, dp.get(), n, fp32_trig, dc.get(), ds.get(), nullptr),
            cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return RopeTables{dc.Get(), ds.Get()};
}

// Host RoPE (ss::ApplyRope) on the last rd dims of each head of x [T, heads, hd].
void HostRope(std::vector<float>& x, int64_t T, int64_t heads, int64_t hd, int64_t rd,
              const RopeTables& tab, bool inverse) {
  const int pairs = static_cast<int>(rd / 2);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      ss::ApplyRope(x.data() + (t * heads + h) * hd + hd - rd, pairs, tab.cos.data() + t * pairs,
                    tab.sin.data() + t * pairs, inverse);
    }
  }
}

std::vector<float> DeviceRope(const std::vector<float>& x, int64_t T, int64_t heads, int64_t hd,
                              int64_t rd, const RopeTables& tab, bool inverse) {
  DeviceBuffer<uint16_t> dx(ToBf16(x));
  DeviceBuffer<float> dc(tab.cos), ds(tab.sin);
  EXPECT_EQ(ApplyRope(AsBf16(dx.get()), T, heads, hd, rd, dc.get(), ds.get(), inverse, nullptr),
            cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return FromBf16(dx.Get());
}

// Positions covering the start, YaRN's original length (65536) and beyond 2^20, where the fp32
// angle float(p)·f_i has few fraction bits.
std::vector<int64_t> TestPositions(int64_t T) {
  std::vector<int64_t> p(T);
  for (int64_t t = 0; t < T; ++t) {
    p[t] = t % 3 == 0 ? t : t % 3 == 1 ? 65530 + 13 * t : 1048573 + 7919 * t;
  }
  return p;
}

// The q path after wq_b: per-head normalisation, then RoPE, then the inverse RoPE, each kernel
// on the reference's own input (isolated) and chained on the device.
void CheckQPath(const std::string& label, const std::vector<float>& q, int64_t T, int64_t H,
                int64_t hd, int64_t rd, const std::vector<float>& freqs, float eps) {
  std::vector<float> normed = q;
  for (int64_t r = 0; r < T * H; ++r) model::HeadNormBf16(normed.data() + r * hd, hd, eps);
  DeviceBuffer<uint16_t> dq(ToBf16(q));
  ASSERT_EQ(HeadRmsNormBf16(AsBf16(dq.get()), T * H, hd, eps, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> normed_dev = FromBf16(dq.Get());
  const golden::Closeness cn = Report(label + " HeadRmsNormBf16", normed_dev, normed);
  EXPECT_LE(cn.rms_rel, 1e-3) << label;
  EXPECT_GE(cn.bit_identical, 0.99) << label;

  const std::vector<int64_t> pos = TestPositions(T);
  const RopeTables host_tab = HostRopeTables(freqs, pos);
  const RopeTables dev_tab = DeviceRopeTables(freqs, pos, /*fp32_trig=*/false);
  const golden::Closeness cc =
      Report(label + " RopeCosSin cos (double trig)", dev_tab.cos, host_tab.cos);
  const golden::Closeness cs =
      Report(label + " RopeCosSin sin (double trig)", dev_tab.sin, host_tab.sin);
  EXPECT_GE(cc.bit_identical, 0.999) << label;
  EXPECT_GE(cs.bit_identical, 0.999) << label;

  std::vector<float> roped = normed;
  HostRope(roped, T, H, hd, rd, host_tab, false);
  const golden::Closeness cr = Report(label + " ApplyRope (same table)",
                                      DeviceRope(normed, T, H, hd, rd, host_tab, false), roped);
  EXPECT_EQ(cr.bit_identical, 1.0) << label;
  const golden::Closeness crd = Report(label + " ApplyRope (device table)",
                                       DeviceRope(normed, T, H, hd, rd, dev_tab, false), roped);
  EXPECT_LE(crd.rms_rel, 1e-3) << label;
  std::vector<float> back = roped;
  HostRope(back, T, H, hd, rd, host_tab, true);
  const golden::Closeness cb =
      Report(label + " ApplyRope inverse", DeviceRope(roped, T, H, hd, rd, host_tab, true), back);
  EXPECT_EQ(cb.bit_identical, 1.0) << label;

  // Measurement of the alternative: cosf/sinf of the fp32 angle on the device.
  const RopeTables f32_tab = DeviceRopeTables(freqs, pos, /*fp32_trig=*/true);
  double max_abs = 0;
  for (size_t i = 0; i < host_tab.cos.size(); ++i) {
    max_abs = std::max({max_abs, std::fabs(static_cast<double>(f32_tab.cos[i]) - host_tab.cos[i]),
                        std::fabs(static_cast<double>(f32_tab.sin[i]) - host_tab.sin[i])});
  }
  std::printf("%-52s max |cosf/sinf - host| = %.3g\n", (label + " fp32 trig").c_str(), max_abs);
  Report(label + " RopeCosSin cos (fp32 trig)", f32_tab.cos, host_tab.cos);
  const golden::Closeness cf = Report(label + " ApplyRope (fp32-trig table)",
                                      DeviceRope(normed, T, H, hd, rd, f32_tab, false), roped);
  EXPECT_LE(cf.rms_rel, 1e-3) << label;

  // The chain on the device: norm in place, then rope with the device table.
  DeviceBuffer<float> dc(dev_tab.cos), ds(dev_tab.sin);
  ASSERT_EQ(ApplyRope(AsBf16(dq.get()), T, H, hd, rd, dc.get(), ds.get(), false, nullptr),
            cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const golden::Closeness ch = Report(label + " q chain (norm + rope)", FromBf16(dq.Get()), roped);
  EXPECT_LE(ch.rms_rel, 1e-3) << label;
}

// Host kv tail: RoPE on the last rd dims, FP8sim on the first hd - rd, of kv [T, hd].
std::vector<float> HostKvTail(std::vector<float> kv, int64_t T, int64_t hd, int64_t rd,
                              const RopeTables& tab, bool round_e4m3) {
  HostRope(kv, T, 1, hd, rd, tab, false);
  for (int64_t t = 0; t < T; ++t) ss::Fp8SimInplace(kv.data() + t * hd, hd - rd, 64, round_e4m3);
  return kv;
}

std::vector<float> DeviceKvTail(const std::vector<float>& kv, int64_t T, int64_t hd, int64_t rd,
                                const RopeTables& tab, bool round_e4m3) {
  DeviceBuffer<uint16_t> dkv(ToBf16(kv));
  DeviceBuffer<float> dc(tab.cos), ds(tab.sin);
  EXPECT_EQ(ApplyRope(AsBf16(dkv.get()), T, 1, hd, rd, dc.get(), ds.get(), false, nullptr),
            cudaSuccess);
  EXPECT_EQ(Fp8SimInplace(AsBf16(dkv.get()), T, hd, hd - rd, 64, round_e4m3, nullptr), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return FromBf16(dkv.Get());
}

// ---- router ------------------------------------------------------------------------------------

struct RouterCase {
  const model::MoeWeights* w;
  ModelConfig config;  // n_routed_experts, n_activated_experts, route_scale
  std::vector<float> x;
  std::vector<int64_t> ids;
  int64_t T, dim;
};

void CheckRouter(const std::string& label, const RouterCase& rc) {
  const model::MoeWeights& w = *rc.w;
  const int64_t T = rc.T, E = rc.config.n_routed_experts, k = rc.config.n_activated_experts;
  const model::RouterResult ref = model::Route(w, rc.config, rc.x.data(), rc.ids.data(), T);
  std::vector<float> ref_logits(T * E);
  model::LinearF32(w.gate, rc.x.data(), T, ref_logits.data());

  DeviceBuffer<uint16_t> dx(ToBf16(rc.x)), dgate(MatrixBits(w.gate));
  DeviceBuffer<float> dbias(w.hash ? std::vector<float>{0.0f} : w.bias), dlogits(T * E),
      dweights(T * k);
  DeviceBuffer<int32_t> dtable(w.hash ? w.tid2eid : std::vector<int32_t>{0}), dindices(T * k);
  DeviceBuffer<int64_t> dids(rc.ids);
  ASSERT_EQ(Route({.x = AsBf16(dx.get()),
                   .gate = AsBf16(dgate.get()),
                   .bias = w.hash ? nullptr : dbias.get(),
                   .tid2eid = w.hash ? dtable.get() : nullptr,
                   .token_ids = dids.get(),
                   .T = T,
                   .E = E,
                   .dim = rc.dim,
                   .k = k,
                   .route_scale = static_cast<float>(rc.config.route_scale),
                   .logits = dlogits.get(),
                   .indices = dindices.get(),
                   .weights = dweights.get()},
                  nullptr),
            cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<int32_t> idx = dindices.Get();
  const std::vector<float> wts = dweights.Get();
  const golden::Closeness cl = Report(label + " router logits", dlogits.Get(), ref_logits);
  EXPECT_LE(cl.rms_rel, 1e-3) << label;

  // Index sets per token; a differing set is excused only at a near-tie of the k-th and
  // (k+1)-th biased scores (computed from the reference's logits).
  int64_t same_order = 0, same_set = 0, unexcused = 0;
  double min_gap = INFINITY;
  std::vector<float> got_w, ref_w;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> a(idx.begin() + t * k, idx.begin() + (t + 1) * k);
    std::vector<int32_t> b(ref.indices.begin() + t * k, ref.indices.begin() + (t + 1) * k);
    if (a == b) {
      ++same_order;
      got_w.insert(got_w.end(), wts.begin() + t * k, wts.begin() + (t + 1) * k);
      ref_w.insert(ref_w.end(), ref.weights.begin() + t * k, ref.weights.begin() + (t + 1) * k);
    }
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    double gap = INFINITY;
    if (!w.hash && k < E) {
      std::vector<float> biased(E);
      for (int64_t e = 0; e < E; ++e) {
        const float l = ref_logits[t * E + e];
        biased[e] = std::sqrt(l > 20.0f ? l : std::log1p(std::exp(l))) + w.bias[e];
      }
      std::nth_element(biased.begin(), biased.begin() + k, biased.end(), std::greater<float>());
      const float kth = *std::min_element(biased.begin(), biased.begin() + k);
      gap = static_cast<double>(kth) - biased[k];
      min_gap = std::min(min_gap, gap);
    }
    if (a == b) {
      ++same_set;
    } else if (gap > 1e-5) {
      ++unexcused;
    }
  }
  const golden::Closeness cw = Report(label + " router weights (equal sequences)", got_w, ref_w);
  std::printf("%-52s tokens=%ld same_set=%ld same_order=%ld unexcused=%ld min_kth_gap=%.3g\n",
              (label + " router indices").c_str(), static_cast<long>(T),
              static_cast<long>(same_set), static_cast<long>(same_order),
              static_cast<long>(unexcused), min_gap);
  EXPECT_GE(same_set, (99 * T + 99) / 100) << label;
  EXPECT_EQ(unexcused, 0) << label;
  if (w.hash) {
    EXPECT_EQ(same_order, T) << label;
  }
  EXPECT_LE(cw.rms_rel, 1e-3) << label;
}

// ---- SwiGLU ------------------------------------------------------------------------------------

void CheckSwiGlu(const std::string& label, bool bf16_in, bool fused, float limit, bool weighted,
                 int64_t rows, int64_t n, uint64_t seed) {
  // Values around the clamp (limit 10) on both sides, bf16-valued for the bf16 variant.
  std::vector<float> g =
      bf16_in ? RandomBf16(rows * n, 8.0f, seed) : RandomF32(rows * n, 8.0f, seed);
  std::vector<float> u =
      bf16_in ? RandomBf16(rows * n, 8.0f, seed + 1) : RandomF32(rows * n, 8.0f, seed + 1);
  // Edges: the gate exactly at the limit, up at −limit, a large negative gate, zeros.
  g[0] = 10.0f;
  u[0] = -10.0f;
  g[1] = -30.0f;
  u[1] = 0.0f;
  g[2] = 0.0f;
  std::vector<float> rw(rows);
  for (int64_t r = 0; r < rows; ++r) rw[r] = 0.05f + 0.1f * static_cast<float>(r);
  std::vector<float> ref(rows * n);
  for (int64_t r = 0; r < rows; ++r) {
    model::SwiGlu(g.data() + r * n, u.data() + r * n, n, limit, rw[r], weighted,
                  ref.data() + r * n);
  }
  // Device layout: separate [rows, n] arrays, or one fused [rows, 2n] (gate | up).
  const int64_t stride = fused ? 2 * n : n;
  std::vector<float> in_g(rows * stride), in_u(rows * stride);
  for (int64_t r = 0; r < rows; ++r) {
    std::copy_n(g.begin() + r * n, n, in_g.begin() + r * stride);
    std::copy_n(u.begin() + r * n, n, (fused ? in_g : in_u).begin() + r * stride + (fused ? n : 0));
  }
  DeviceBuffer<float> dw(rw);
  DeviceBuffer<uint16_t> dout(rows * n);
  const float* wp = weighted ? dw.get() : nullptr;
  if (bf16_in) {
    DeviceBuffer<uint16_t> dg(ToBf16(in_g)), du(ToBf16(in_u));
    const uint16_t* up = fused ? dg.get() + n : du.get();
    ASSERT_EQ(SwiGluBf16(AsBf16(dg.get()), AsBf16(up), stride, wp, rows, n, limit,
                         AsBf16(dout.get()), nullptr),
              cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  } else {
    DeviceBuffer<float> dg(in_g), du(in_u);
    const float* up = fused ? dg.get() + n : du.get();
    ASSERT_EQ(SwiGluF32(dg.get(), up, stride, wp, rows, n, limit, AsBf16(dout.get()), nullptr),
              cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  const golden::Closeness c = Report(label, FromBf16(dout.Get()), ref);
  EXPECT_LE(c.rms_rel, 1e-3) << label;
  EXPECT_GE(c.bit_identical, 0.999) << label;
}

// ---- tests
// ---------------------------------------------------------------------------------------

TEST_F(BlockKernelsTest, KernelsRunFromCompute86Ptx) {
  ExpectCompute86Ptx({{"HcPre", HcPreKernel()},
                      {"HcPreTiled", HcPreTiledKernel()},
                      {"HcPreMix", HcPreMixKernel()},
                      {"HcPreFinish", HcPreFinishKernel()},
                      {"HcPreMixLanes", HcPreMixLanesKernel()},
                      {"HcPreFinishLanes", HcPreFinishLanesKernel()},
                      {"HcPreFinishDefer", HcPreFinishDeferKernel()},
                      {"HcPreFinishNorm", HcPreFinishNormKernel()},
                      {"HcCombSinkhorn", HcCombSinkhornKernel()},
                      {"HcPost", HcPostKernel()},
                      {"HcHead", HcHeadKernel()},
                      {"HcEmbedStreams", HcEmbedStreamsKernel()},
                      {"HeadRmsNormBf16", HeadRmsNormBf16Kernel()},
                      {"RopeCosSin", RopeCosSinKernel()},
                      {"ApplyRope", ApplyRopeKernel()},
                      {"Fp8SimInplace", Fp8SimInplaceKernel()},
                      {"RouterLogits", RouterLogitsKernel()},
                      {"RouterLogitsRow", RouterLogitsRowKernel()},
                      {"RouterSelect", RouterSelectKernel()},
                      {"SwiGluF32", SwiGluF32Kernel()},
                      {"SwiGluBf16", SwiGluBf16Kernel()},
                      {"SwiGluBf16Quant", SwiGluBf16QuantKernel()},
                      {"HeadRmsNormRope", HeadRmsNormRopeKernel()},
                      {"RmsNormQuant", RmsNormQuantKernel()},
                      {"RmsNormQuantRegs", RmsNormQuantRegsKernel()}},
                     size_t{48} << 10);
}

// Size checks happen before any CUDA call, so this runs without a device.
TEST(BlockKernelsLimits, OutOfRangeSizesAreRejectedWithoutLaunching) {
  EXPECT_EQ(HcPre({.T = 1, .hc = kHcMaxMult + 1, .dim = 16, .sinkhorn_iters = 20}, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(HcPre({.T = 1, .hc = 4, .dim = 16, .sinkhorn_iters = 0}, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(HcPost(nullptr, nullptr, nullptr, nullptr, 1, 0, 16, nullptr, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(HcHead({.T = 1, .hc = 9, .dim = 16}, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(ApplyRope(nullptr, 1, 1, 64, 65, nullptr, nullptr, false, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(ApplyRope(nullptr, 1, 1, 64, 128, nullptr, nullptr, false, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(Fp8SimInplace(nullptr, 1, 64, 128, 64, true, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(
      Route({.T = 1, .E = kRouterMaxExperts + 1, .dim = 64, .k = 6, .route_scale = 1.5f}, nullptr),
      cudaErrorInvalidValue);
  EXPECT_EQ(
      Route({.T = 1, .E = 256, .dim = 64, .k = kRouterMaxTopK + 1, .route_scale = 1.5f}, nullptr),
      cudaErrorInvalidValue);
  EXPECT_EQ(SwiGluF32(nullptr, nullptr, 8, nullptr, 1, 16, 10.0f, nullptr, nullptr),
            cudaErrorInvalidValue);
  // Zero rows: nothing to do.
  EXPECT_EQ(HcPre({.T = 0, .hc = 4, .dim = 16, .sinkhorn_iters = 20}, nullptr), cudaSuccess);
}

// Block 0's input from the embedding rows: every stream a copy of its token's row, bit for bit,
// at Flash's dim (16-byte copies) and at an odd one (element copies).
TEST_F(BlockKernelsTest, EmbedStreamsCopyEachRowToEveryStream) {
  for (const auto& [T, dim] : {std::pair<int64_t, int64_t>{3, 4096}, {5, 100}}) {
    const int64_t hc = 4;
    const std::vector<uint16_t> rows = ToBf16(RandomBf16(T * dim, 1.0f, 31 + T));
    DeviceBuffer<uint16_t> drows(rows), streams(T * hc * dim);
    CUDA_ASSERT_OK(HcEmbedStreams(AsBf16(drows.get()), T, hc, dim, AsBf16(streams.get()), nullptr));
    CUDA_ASSERT_OK(cudaDeviceSynchronize());
    const std::vector<uint16_t> got = streams.Get();
    int64_t differ = 0;
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t k = 0; k < hc; ++k) {
        differ += std::memcmp(got.data() + (t * hc + k) * dim, rows.data() + t * dim, dim * 2) != 0;
      }
    }
    EXPECT_EQ(differ, 0) << "T " << T << " dim " << dim;
  }
}

TEST_F(BlockKernelsTest, HyperConnectionsMatchReferenceOnTinyA) {
  const model::ModelWeights& w = TinyA();
  const ModelConfig& c = w.config;
  const GoldenStreams& s = Inter();
  ASSERT_GT(s.T, 0);
  const HcShape shape = TinyAHcShape();
  const std::vector<float> attn_out =
      GoldenFloats(kGolden, "inter.attn_out", DType::kBF16, {c.n_layers, s.T, c.dim});
  for (int64_t L = 0; L < c.n_layers; ++L) {
    const std::vector<float> streams = StreamsIntoBlock(Inter(), L);
    // A realistic sublayer output for HcPost: the golden attention output of block L.
    const std::vector<float> x(attn_out.begin() + L * s.T * c.dim,
                               attn_out.begin() + (L + 1) * s.T * c.dim);
    CheckHc("tiny-a L" + std::to_string(L) + " hc_attn", w.blocks[L].hc_attn, streams, x, s.T,
            shape);
    CheckHc("tiny-a L" + std::to_string(L) + " hc_ffn", w.blocks[L].hc_ffn, streams, x, s.T, shape);
  }
  const std::vector<float> final_streams =
      GoldenFloats(kGolden, "inter.hc_final", DType::kBF16, {s.T, c.hc_mult, c.dim});
  CheckHcHead("tiny-a hc_head", w.hc_head, final_streams, s.T, shape);
  if (!w.mtp.empty())
    CheckHcHead("tiny-a mtp.0 hc_head", w.mtp[0].hc_head, final_streams, s.T, shape);
}

// The official demo's layer-0 split (tiny-a README: ≤ 1e-5 relative).
TEST_F(BlockKernelsTest, HcSplitMatchesOfficialGoldenLayer0) {
  const model::ModelWeights& w = TinyA();
  const ModelConfig& c = w.config;
  const int64_t T = Inter().T, hc = c.hc_mult;
  const HcOut got =
      DeviceHcPre(w.blocks[0].hc_attn, StreamsIntoBlock(Inter(), 0), T, TinyAHcShape());
  for (const auto& [part, v, shape] :
       {std::tuple{"pre", &got.pre, std::vector<int64_t>{T, hc}},
        std::tuple{"post", &got.post, std::vector<int64_t>{T, hc}},
        std::tuple{"comb", &got.comb, std::vector<int64_t>{T, hc, hc}}}) {
    const golden::Closeness cg =
        Report(std::string("official L0 hc_attn ") + part, *v,
               GoldenFloats(kGolden, std::string("inter.L0.hc_attn.") + part, DType::kF32, shape));
    EXPECT_LE(cg.rms_rel, 1e-5) << part;
  }
}

TEST_F(BlockKernelsTest, HyperConnectionsMatchReferenceAtFlashShapes) {
  const HcShape s{4, 4096, 20, 1e-6f, 1e-6f};
  const int64_t T = 6, n = s.hc * s.dim, mix = (2 + s.hc) * s.hc;
  // Streams of different magnitudes; fn scaled so that the mixes are O(1).
  std::vector<float> streams = RandomBf16(T * n, 1.0f, 11);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t k = 0; k < s.hc; ++k) {
      for (int64_t i = 0; i < s.dim; ++i) {
        float& v = streams[(t * s.hc + k) * s.dim + i];
        v = RoundBf16(v * (0.25f + 0.5f * static_cast<float>(k + t % 2)));
      }
    }
  }
  model::HcWeights w{
      RandomF32(mix * n, 1.0f / 128.0f, 12), RandomF32(mix, 0.5f, 13), {0.7f, 0.4f, 2.0f}};
  const std::vector<float> x = RandomBf16(T * s.dim, 2.0f, 14);
  CheckHc("flash hc 4x4096", w, streams, x, T, s);
  // The decode split (T ≤ 64: lane sums over blocks) against the 16-token tiles (65 tokens, the
  // first T the same): the same bits.
  {
    std::vector<float> more = streams;
    const std::vector<float> extra = RandomBf16((65 - T) * n, 1.0f, 17);
    more.insert(more.end(), extra.begin(), extra.end());
    const HcOut split = DeviceHcPre(w, streams, T, s);
    // `other`'s tokens from `first` on hold the split's T tokens' bits.
    const auto expect_split_bits = [&](const HcOut& other, int64_t first, const std::string& what) {
      for (const auto& [part, a, b, per] :
           {std::tuple{"y", &split.y, &other.y, s.dim},
            std::tuple{"pre", &split.pre, &other.pre, s.hc},
            std::tuple{"post", &split.post, &other.post, s.hc},
            std::tuple{"comb", &split.comb, &other.comb, s.hc * s.hc}}) {
        EXPECT_EQ(std::memcmp(a->data(), b->data() + first * per, T * per * sizeof(float)), 0)
            << "HcPre split vs " << what << ": " << part;
      }
    };
    expect_split_bits(DeviceHcPre(w, more, 65, s), 0, "16-token tiles");
    // Tokens 150 .. 155 of a 200-token call (a tile's middle, a partial last tile) against the
    // split over those six alone.
    std::vector<float> longer = RandomBf16(200 * n, 1.0f, 18);
    std::copy(streams.begin(), streams.end(), longer.begin() + 150 * n);
    expect_split_bits(DeviceHcPre(w, longer, 200, s), 150, "tokens 150.. of 200");
  }
  model::HcWeights head{RandomF32(s.hc * n, 1.0f / 128.0f, 15), RandomF32(s.hc, 0.5f, 16), {0.8f}};
  CheckHcHead("flash hc 4x4096", head, streams, T, s);
}

TEST_F(BlockKernelsTest, QueryPathMatchesReferenceOnTinyA) {
  const model::ModelWeights& w = TinyA();
  const ModelConfig& c = w.config;
  const int64_t T = Inter().T, dim = c.dim, H = c.n_heads, hd = c.head_dim, qlr = c.q_lora_rank;
  const float eps = static_cast<float>(c.norm_eps);
  for (const int64_t L : {int64_t{0}, int64_t{3}}) {  // no YaRN (ratio 0), YaRN (ratio 128)
    const model::BlockWeights& b = w.blocks[L];
    const HcOut hc = HostHcPre(b.hc_attn, StreamsIntoBlock(Inter(), L), T, TinyAHcShape());
    std::vector<float> x(T * dim), qa(T * qlr), qr(T * qlr), q(T * H * hd);
    for (int64_t t = 0; t < T; ++t) {
      model::RmsNorm(hc.y.data() + t * dim, b.attn_norm.data(), dim, eps, x.data() + t * dim);
    }
    model::Linear8(b.attn.wq_a, x.data(), T, qa.data());
    for (int64_t t = 0; t < T; ++t) {
      model::RmsNorm(qa.data() + t * qlr, b.attn.q_norm.data(), qlr, eps, qr.data() + t * qlr);
    }
    model::Linear8(b.attn.wq_b, qr.data(), T, q.data());
    CheckQPath("tiny-a L" + std::to_string(L) + " q", q, T, H, hd, c.rope_head_dim,
               LayerRopeFrequencies(c, c.compress_ratio(L)), eps);
  }
}

// Flash's 64 heads and a TP rank's share of them at TP 2, 4 and 8.
TEST_F(BlockKernelsTest, QueryPathMatchesReferenceAtFlashShapes) {
  const int64_t T = 6, hd = 512, rd = 64;
  const YarnConfig yarn;
  for (const int64_t H : {64, 32, 16, 8}) {
    std::vector<float> q = RandomBf16(T * H * hd, 3.0f, 21 + H);
    for (int64_t r = 0; r < T * H; ++r) {  // heads of different magnitudes
      for (int64_t i = 0; i < hd; ++i)
        q[r * hd + i] = RoundBf16(q[r * hd + i] * std::ldexp(1.0f, static_cast<int>(r % 9) - 4));
    }
    const std::string shape = "flash q " + std::to_string(H) + "x512";
    CheckQPath(shape + " theta 1e4", q, T, H, hd, rd, RopeFrequencies(rd, 10000, nullptr), 1e-6f);
    CheckQPath(shape + " theta 1.6e5 yarn", q, T, H, hd, rd, RopeFrequencies(rd, 160000, &yarn),
               1e-6f);
  }
}

TEST_F(BlockKernelsTest, KvPathMatchesReferenceOnTinyA) {
  const model::ModelWeights& w = TinyA();
  const ModelConfig& c = w.config;
  const int64_t T = Inter().T, dim = c.dim, hd = c.head_dim, rd = c.rope_head_dim;
  const float eps = static_cast<float>(c.norm_eps);
  for (const int64_t L : {int64_t{0}, int64_t{3}}) {
    const model::BlockWeights& b = w.blocks[L];
    const HcOut hc = HostHcPre(b.hc_attn, StreamsIntoBlock(Inter(), L), T, TinyAHcShape());
    std::vector<float> x(T * dim), kva(T * hd), kv(T * hd);
    for (int64_t t = 0; t < T; ++t) {
      model::RmsNorm(hc.y.data() + t * dim, b.attn_norm.data(), dim, eps, x.data() + t * dim);
    }
    model::Linear8(b.attn.wkv, x.data(), T, kva.data());
    for (int64_t t = 0; t < T; ++t) {
      model::RmsNorm(kva.data() + t * hd, b.attn.kv_norm.data(), hd, eps, kv.data() + t * hd);
    }
    const std::vector<int64_t> pos = TestPositions(T);
    const std::vector<float> freqs = LayerRopeFrequencies(c, c.compress_ratio(L));
    const RopeTables tab = HostRopeTables(freqs, pos);
    const std::string label = "tiny-a L" + std::to_string(L) + " kv";
    for (const bool round : {true, false}) {
      const golden::Closeness ci =
          Report(label + (round ? " rope+fp8sim" : " rope+fp8sim (no e4m3)"),
                 DeviceKvTail(kv, T, hd, rd, tab, round), HostKvTail(kv, T, hd, rd, tab, round));
      EXPECT_LE(ci.rms_rel, 1e-3) << label;
      EXPECT_EQ(ci.bit_identical, 1.0) << label;
    }
    // The device chain from the wkv output: RmsNorm (rms_norm.h), RopeCosSin, ApplyRope,
    // Fp8SimInplace. An fp32-vs-double ulp in the norm can flip one e4m3 rounding (1/16 of an
    // element), so this is looser than the isolated check above.
    DeviceBuffer<uint16_t> dkva(ToBf16(kva)), dkv(T * hd);
    DeviceBuffer<float> dg(b.attn.kv_norm), df(freqs), dc(T * rd / 2), ds(T * rd / 2);
    DeviceBuffer<int64_t> dp(pos);
    ASSERT_EQ(RmsNorm(AsBf16(dkva.get()), dg.get(), T, hd, eps, AsBf16(dkv.get()), nullptr),
              cudaSuccess);
    ASSERT_EQ(RopeCosSin(df.get(), rd / 2, dp.get(), T, false, dc.get(), ds.get(), nullptr),
              cudaSuccess);
    ASSERT_EQ(ApplyRope(AsBf16(dkv.get()), T, 1, hd, rd, dc.get(), ds.get(), false, nullptr),
              cudaSuccess);
    ASSERT_EQ(Fp8SimInplace(AsBf16(dkv.get()), T, hd, hd - rd, 64, true, nullptr), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const golden::Closeness cc = Report(label + " chain (norm+rope+fp8sim)", FromBf16(dkv.Get()),
                                        HostKvTail(kv, T, hd, rd, tab, true));
    EXPECT_LE(cc.rms_rel, 1e-2) << label;
  }
}

TEST_F(BlockKernelsTest, KvPathMatchesReferenceAtFlashShapes) {
  const int64_t T = 8, hd = 512, rd = 64;
  const YarnConfig yarn;
  std::vector<float> kv = RandomBf16(T * hd, 1.0f, 31);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < hd - rd; ++i) {  // blocks spanning many scales
      const int e = static_cast<int>((i / 64 + t) % 7) * 3 - 9;
      kv[t * hd + i] = RoundBf16(kv[t * hd + i] * std::ldexp(1.0f, e));
    }
  }
  std::fill_n(kv.begin() + 64, 64, 0.0f);  // the 1e-4 amax floor
  kv[hd + 70] = 448.0f;                    // amax/448 an exact power of two
  kv[2 * hd + 5] = 1e-30f;                 // below e4m3's subnormals after scaling
  const std::vector<int64_t> pos = TestPositions(T);
  const RopeTables tab = HostRopeTables(RopeFrequencies(rd, 160000, &yarn), pos);
  for (const bool round : {true, false}) {
    const golden::Closeness c =
        Report(std::string("flash kv 512 rope+fp8sim") + (round ? "" : " (no e4m3)"),
               DeviceKvTail(kv, T, hd, rd, tab, round), HostKvTail(kv, T, hd, rd, tab, round));
    EXPECT_LE(c.rms_rel, 1e-3);
    EXPECT_EQ(c.bit_identical, 1.0);
  }
}

TEST_F(BlockKernelsTest, RouterMatchesReferenceOnTinyA) {
  const model::ModelWeights& w = TinyA();
  const ModelConfig& c = w.config;
  const int64_t T = Inter().T, dim = c.dim;
  const float eps = static_cast<float>(c.norm_eps);
  for (int64_t L = 0; L < c.n_layers; ++L) {  // layers < n_hash_layers hash, the rest learned
    const model::BlockWeights& b = w.blocks[L];
    // A realistic router input: the ffn-normed HC collapse of the streams entering block L.
    const HcOut hc = HostHcPre(b.hc_ffn, StreamsIntoBlock(Inter(), L), T, TinyAHcShape());
    std::vector<float> x(T * dim);
    for (int64_t t = 0; t < T; ++t) {
      model::RmsNorm(hc.y.data() + t * dim, b.ffn_norm.data(), dim, eps, x.data() + t * dim);
    }
    CheckRouter("tiny-a L" + std::to_string(L) + (b.moe.hash ? " hash" : " learned"),
                RouterCase{&b.moe, c, x, Inter().ids, T, dim});
  }
}

TEST_F(BlockKernelsTest, RouterMatchesReferenceAtFlashShapes) {
  const int64_t T = 64, E = 256, k = 6, dim = 4096, vocab = 1000;
  std::vector<float> gate = RandomBf16(E * dim, 1.0f / 64.0f, 41);
  // Expert 17 duplicates expert 5 (same row, same bias): exact ties, which the reference's
  // stable sort orders by the lower index.
  std::copy_n(gate.begin() + 5 * dim, dim, gate.begin() + 17 * dim);
  const std::vector<uint16_t> gate_bits = ToBf16(gate);
  model::MoeWeights learned;
  learned.gate = model::Bf16Matrix{reinterpret_cast<const uint8_t*>(gate_bits.data()), E, dim};
  learned.bias = RandomF32(E, 0.05f, 42);
  learned.bias[17] = learned.bias[5] = 0.3f;  // make the tied pair a frequent pick
  model::MoeWeights hashed;
  hashed.gate = learned.gate;
  hashed.hash = true;
  std::mt19937_64 rng(43);
  std::vector<int32_t> experts(E);
  std::iota(experts.begin(), experts.end(), 0);
  for (int64_t v = 0; v < vocab; ++v) {
    std::shuffle(experts.begin(), experts.end(), rng);
    hashed.tid2eid.insert(hashed.tid2eid.end(), experts.begin(), experts.begin() + k);
  }
  ModelConfig c;
  c.n_routed_experts = E;
  c.n_activated_experts = k;
  c.route_scale = 1.5;
  std::vector<int64_t> ids(T);
  for (int64_t t = 0; t < T; ++t) ids[t] = (t * 37 + 11) % vocab;
  const std::vector<float> x = RandomBf16(T * dim, 1.0f, 44);
  CheckRouter("flash 256 experts top-6 learned", RouterCase{&learned, c, x, ids, T, dim});
  CheckRouter("flash 256 experts top-6 hash", RouterCase{&hashed, c, x, ids, T, dim});
  // Few tokens (one block per (expert, token)) against the 64-token launch: the same logits, bit
  // for bit.
  DeviceBuffer<uint16_t> dx(ToBf16(x)), dgate(gate_bits);
  DeviceBuffer<float> dbias(learned.bias), dlog64(T * E), dlog3(3 * E), dwts(T * k);
  DeviceBuffer<int32_t> didx(T * k);
  DeviceBuffer<int64_t> dids(ids);
  RouteParams p = {.x = AsBf16(dx.get()),
                   .gate = AsBf16(dgate.get()),
                   .bias = dbias.get(),
                   .token_ids = dids.get(),
                   .T = T,
                   .E = E,
                   .dim = dim,
                   .k = k,
                   .route_scale = 1.5f,
                   .logits = dlog64.get(),
                   .indices = didx.get(),
                   .weights = dwts.get()};
  ASSERT_EQ(Route(p, nullptr), cudaSuccess);
  p.T = 3;
  p.logits = dlog3.get();
  ASSERT_EQ(Route(p, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> l64 = dlog64.Get(), l3 = dlog3.Get();
  EXPECT_EQ(std::memcmp(l3.data(), l64.data(), 3 * E * sizeof(float)), 0)
      << "router logits, 3 tokens vs 64";
}

TEST_F(BlockKernelsTest, SwiGluMatchesReference) {
  // Flash moe_intermediate_size 2048; tiny-a 128.
  CheckSwiGlu("swiglu bf16 limit 10 weighted 2048", true, false, 10.0f, true, 8, 2048, 51);
  CheckSwiGlu("swiglu bf16 limit 10 unweighted fused 2048", true, true, 10.0f, false, 8, 2048, 52);
  CheckSwiGlu("swiglu f32 limit 10 weighted fused 2048", false, true, 10.0f, true, 8, 2048, 53);
  CheckSwiGlu("swiglu f32 no clamp unweighted 2048", false, false, 0.0f, false, 8, 2048, 54);
  CheckSwiGlu("swiglu bf16 limit 10 weighted 128", true, false, 10.0f, true, 40, 128, 55);
}

// The tiny-a shared expert end to end on the device (existing Linear8 kernels + SwiGluBf16) vs
// model::SharedExpert; GEMM-order ulps propagate through two re-quantisations, so the bar is the
// chained one.
TEST_F(BlockKernelsTest, SharedExpertChainMatchesReferenceOnTinyA) {
  const model::ModelWeights& w = TinyA();
  const ModelConfig& c = w.config;
  const model::MoeWeights& m = w.blocks[3].moe;
  const int64_t T = 19, dim = c.dim, inter = m.shared_w1.out;
  const float limit = static_cast<float>(c.swiglu_limit);
  const std::vector<float> x = RandomBf16(T * dim, 1.0f, 61);
  std::vector<float> ref(T * dim);
  model::SharedExpert(m, x.data(), T, limit, ref.data());

  auto upload = [](const model::Fp8Weight& fw, DeviceBuffer<uint8_t>& dw,
                   DeviceBuffer<uint8_t>& ds) {
    const size_t sb = ((fw.out + 127) / 128) * ((fw.in + 127) / 128);
    dw.Put(std::vector<uint8_t>(fw.w, fw.w + fw.out * fw.in));
    ds.Put(std::vector<uint8_t>(fw.s, fw.s + sb));
  };
  auto scale_bytes = [](const model::Fp8Weight& fw) {
    return static_cast<size_t>(((fw.out + 127) / 128) * ((fw.in + 127) / 128));
  };
  DeviceBuffer<uint8_t> w1(inter * dim), s1(scale_bytes(m.shared_w1)), w3(inter * dim),
      s3(scale_bytes(m.shared_w3)), w2(dim * inter), s2(scale_bytes(m.shared_w2));
  upload(m.shared_w1, w1, s1);
  upload(m.shared_w3, w3, s3);
  upload(m.shared_w2, w2, s2);
  DeviceBuffer<uint16_t> dx(ToBf16(x)), dg(T * inter), du(T * inter), da(T * inter), dy(T * dim);
  DeviceBuffer<uint8_t> q(T * std::max(dim, inter));
  DeviceBuffer<float> sa(T * ((std::max(dim, inter) + 127) / 128));
  CUDA_ASSERT_OK(QuantizeActE4m3(AsBf16(dx.get()), T, dim, AsE4m3(q.get()), sa.get(), nullptr));
  CUDA_ASSERT_OK(Fp8Linear(AsE4m3(q.get()), sa.get(), T, AsE4m3(w1.get()), AsUe8m0(s1.get()), inter,
                           dim, AsBf16(dg.get()), nullptr));
  CUDA_ASSERT_OK(Fp8Linear(AsE4m3(q.get()), sa.get(), T, AsE4m3(w3.get()), AsUe8m0(s3.get()), inter,
                           dim, AsBf16(du.get()), nullptr));
  CUDA_ASSERT_OK(SwiGluBf16(AsBf16(dg.get()), AsBf16(du.get()), inter, nullptr, T, inter, limit,
                            AsBf16(da.get()), nullptr));
  CUDA_ASSERT_OK(QuantizeActE4m3(AsBf16(da.get()), T, inter, AsE4m3(q.get()), sa.get(), nullptr));
  CUDA_ASSERT_OK(Fp8Linear(AsE4m3(q.get()), sa.get(), T, AsE4m3(w2.get()), AsUe8m0(s2.get()), dim,
                           inter, AsBf16(dy.get()), nullptr));
  CUDA_ASSERT_OK(cudaDeviceSynchronize());
  const golden::Closeness cc = Report("tiny-a L3 shared expert chain", FromBf16(dy.Get()), ref);
  EXPECT_LE(cc.rms_rel, 1e-2);
}

}  // namespace
}  // namespace ss::cuda
