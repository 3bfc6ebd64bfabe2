// CUDA KV compressor kernels (gpu_worker/kernels/compressor.h, main and indexer
// compressors on their streaming state) against the CPU reference (label gpu): on tiny-a weights
// with the golden blocks160 activations (CSA layers 2 and 4, HCA layers 3 and 5) and at Flash
// shapes with synthetic data. Without a CUDA device every test that needs one skips with a
// message.
//
// Each comparison prints rms_rel, max_rel and bit_identical. Two kinds of run:
//  * isolated: the kernel gets the reference's own inputs (the host's exact fp32 V/G). The
//    kernels mirror the reference's arithmetic, so these are bit-identical but for rare ulps of
//    exp (and must be ≥ 99.9%);
//  * chain: the device computes V/G too (fp32 GEMV instead of the exact double sums), so an ulp
//    before a bf16/FP8 rounding can flip it: the fraction is reported and the bar is looser
//    (rms_rel ≤ 1e-2).
#include "common/model/compressor.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/bf16.h"
#include "common/golden/golden.h"
#include "common/model/linear.h"
#include "common/model/state.h"
#include "common/model/weights.h"
#include "common/model_config.h"
#include "common/rope.h"
#include "gpu_worker/kernels/compressor.h"
#include "gpu_worker/kernels/head.h"
#include "gtest/gtest.h"
#include "tests/gpu_worker/gpu_test_util.h"

namespace ss::cuda {
namespace {

using namespace testing_util;  // NOLINT: the shared GPU test helpers

class CompressorTest : public testing_util::GpuTest {};

// Elements whose bits differ (the compressor state holds −inf, which Compare does not take).
int64_t BitMismatches(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return static_cast<int64_t>(std::max(a.size(), b.size()));
  int64_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += std::memcmp(&a[i], &b[i], 4) != 0;
  return n;
}

// ---- compressor harness ------------------------------------------------------------------------

// One sequence fed to a compressor: rows x [n, dim] at positions start.., in steps of `chunks`.
struct CompressorSeq {
  std::vector<float> x;
  int64_t start = 0;
  std::vector<int64_t> chunks;
};

struct CompressorOut {
  std::vector<float> entries, kv, score;
};

model::CompressorParams HostParams(const CompressorShape& s, const std::vector<float>& freqs) {
  return model::CompressorParams{s.kind == CompressorKind::kMain ? model::CompressorKind::kMain
                                                                 : model::CompressorKind::kIndexer,
                                 s.rope_dim, s.norm_eps, s.fp8_round, &freqs};
}

CompressorOut HostCompressor(const model::CompressorWeights& w, const CompressorShape& shape,
                             const std::vector<float>& freqs, const CompressorSeq& q, int64_t dim) {
  const model::CompressorParams p = HostParams(shape, freqs);
  model::CompressorState st;
  st.Reset(w.ratio, w.head_dim);
  CompressorOut o;
  int64_t off = 0;
  for (const int64_t n : q.chunks) {
    model::CompressorFeed(w, p, st, q.x.data() + off * dim, n, dim, q.start + off, o.entries);
    off += n;
  }
  o.kv = st.kv;
  o.score = st.score;
  return o;
}

// Runs every sequence together, step i feeding chunk i of each (none once its chunks ran out),
// with V/G from the host's exact LinearF32 (isolated) or from LinearBf16F32 on the device
// (chain; `vg_dev` / `vg_host` then collect both for a report).
std::vector<CompressorOut> DeviceCompressor(const model::CompressorWeights& w,
                                            const CompressorShape& shape,
                                            const std::vector<float>& freqs,
                                            const std::vector<CompressorSeq>& seqs, int64_t dim,
                                            bool device_vg, std::vector<float>* vg_dev,
                                            std::vector<float>* vg_host) {
  const int64_t S = static_cast<int64_t>(seqs.size()), m = w.ratio, d = w.head_dim;
  const int64_t width = (m == 4 ? 2 : 1) * d, slots = (m == 4 ? 2 : 1) * m;
  std::vector<std::unique_ptr<DeviceBuffer<float>>> kv, sc;
  std::vector<float*> kv_ptr, sc_ptr;
  std::vector<int64_t> base(S + 1, 0);
  size_t steps = 0;
  for (int64_t s = 0; s < S; ++s) {
    kv.push_back(std::make_unique<DeviceBuffer<float>>(slots * width));
    sc.push_back(std::make_unique<DeviceBuffer<float>>(slots * width));
    kv_ptr.push_back(kv.back()->get());
    sc_ptr.push_back(sc.back()->get());
    EXPECT_EQ(CompressorResetState(kv_ptr[s], sc_ptr[s], slots * width, nullptr), cudaSuccess);
    const int64_t n = static_cast<int64_t>(seqs[s].x.size()) / dim;
    base[s + 1] = base[s] + (seqs[s].start + n) / m - seqs[s].start / m;
    steps = std::max(steps, seqs[s].chunks.size());
  }
  DeviceBuffer<float*> dkv(kv_ptr), dsc(sc_ptr);
  DeviceBuffer<float> dape(w.ape), dnorm(w.norm), dfreqs(freqs);
  DeviceBuffer<uint16_t> dwkv(MatrixBits(w.wkv)), dwgate(MatrixBits(w.wgate));
  DeviceBuffer<uint16_t> dentries(base[S] * d);
  std::vector<int64_t> off(S, 0), emitted(S, 0);
  for (size_t step = 0; step < steps; ++step) {
    std::vector<int64_t> start(S), row_begin(S + 1, 0), entry_begin(S);
    std::vector<float> x;
    int64_t max_new = 0;
    for (int64_t s = 0; s < S; ++s) {
      const int64_t n = step < seqs[s].chunks.size() ? seqs[s].chunks[step] : 0;
      start[s] = seqs[s].start + off[s];
      row_begin[s + 1] = row_begin[s] + n;
      entry_begin[s] = base[s] + emitted[s];
      x.insert(x.end(), seqs[s].x.begin() + off[s] * dim, seqs[s].x.begin() + (off[s] + n) * dim);
      const int64_t nn = (start[s] + n) / m - start[s] / m;
      max_new = std::max(max_new, nn);
      off[s] += n;
      emitted[s] += nn;
    }
    const int64_t rows = row_begin[S];
    std::vector<float> hv(rows * width), hg(rows * width);
    model::LinearF32(w.wkv, x.data(), rows, hv.data());
    model::LinearF32(w.wgate, x.data(), rows, hg.data());
    DeviceBuffer<float> dv(rows * width), dg(rows * width);
    if (device_vg) {
      DeviceBuffer<uint16_t> dx(ToBf16(x));
      EXPECT_EQ(LinearBf16F32(AsBf16(dx.get()), rows, dim, AsBf16(dwkv.get()), width, dv.get(),
                              width, nullptr),
                cudaSuccess);
      EXPECT_EQ(LinearBf16F32(AsBf16(dx.get()), rows, dim, AsBf16(dwgate.get()), width, dg.get(),
                              width, nullptr),
                cudaSuccess);
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      if (vg_dev != nullptr && rows > 0) {
        for (const DeviceBuffer<float>* b : {&dv, &dg}) {
          const std::vector<float> got = b->Get();
          vg_dev->insert(vg_dev->end(), got.begin(), got.begin() + rows * width);
        }
        vg_host->insert(vg_host->end(), hv.begin(), hv.end());
        vg_host->insert(vg_host->end(), hg.begin(), hg.end());
      }
    } else {
      dv.Put(hv);
      dg.Put(hg);
    }
    DeviceBuffer<int64_t> dstart(start), drow(row_begin), dentry(entry_begin);
    CompressorBatch batch{S, max_new, dstart.get(), drow.get(), dentry.get(), dkv.get(), dsc.get()};
    EXPECT_EQ(CompressorStep({.v = dv.get(),
                              .g = dg.get(),
                              .ld = width,
                              .ape = dape.get(),
                              .norm = dnorm.get(),
                              .rope_freqs = dfreqs.get(),
                              .shape = shape,
                              .batch = batch,
                              .entries = AsBf16(dentries.get())},
                             nullptr),
              cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  const std::vector<float> all = FromBf16(dentries.Get());
  std::vector<CompressorOut> out(S);
  for (int64_t s = 0; s < S; ++s) {
    out[s].entries.assign(all.begin() + base[s] * d, all.begin() + base[s + 1] * d);
    out[s].kv = kv[s]->Get();
    out[s].score = sc[s]->Get();
  }
  return out;
}

void CheckCompressor(const std::string& label, const model::CompressorWeights& w,
                     const CompressorShape& shape, const std::vector<float>& freqs,
                     const std::vector<CompressorSeq>& seqs, int64_t dim) {
  std::vector<CompressorOut> ref;
  std::vector<float> ref_entries, ref_state;
  for (const CompressorSeq& q : seqs) {
    ref.push_back(HostCompressor(w, shape, freqs, q, dim));
    ref_entries.insert(ref_entries.end(), ref.back().entries.begin(), ref.back().entries.end());
  }
  ASSERT_FALSE(ref_entries.empty()) << label;
  auto gather = [&](const std::vector<CompressorOut>& o) {
    std::vector<float> e;
    int64_t state_bits = 0;
    for (size_t s = 0; s < o.size(); ++s) {
      e.insert(e.end(), o[s].entries.begin(), o[s].entries.end());
      state_bits += BitMismatches(o[s].kv, ref[s].kv) + BitMismatches(o[s].score, ref[s].score);
    }
    return std::make_pair(e, state_bits);
  };

  // Isolated: the reference's exact V/G.
  const auto [iso, iso_state] =
      gather(DeviceCompressor(w, shape, freqs, seqs, dim, false, nullptr, nullptr));
  const golden::Closeness ci = Report(label + " entries (host V/G)", iso, ref_entries);
  std::printf("%-60s state elements differing: %ld\n", (label + " state (host V/G)").c_str(),
              static_cast<long>(iso_state));
  EXPECT_LE(ci.rms_rel, 1e-3) << label;
  EXPECT_GE(ci.bit_identical, 0.999) << label;
  EXPECT_EQ(iso_state, 0) << label;

  // Chain: V/G from the device GEMV.
  std::vector<float> vg_dev, vg_host;
  const auto [chain, chain_state] =
      gather(DeviceCompressor(w, shape, freqs, seqs, dim, true, &vg_dev, &vg_host));
  const golden::Closeness cv = Report(label + " V/G (LinearBf16F32)", vg_dev, vg_host);
  EXPECT_LE(cv.rms_rel, 1e-5) << label;
  const golden::Closeness cc = Report(label + " entries (device V/G)", chain, ref_entries);
  EXPECT_LE(cc.rms_rel, 1e-2) << label;
  EXPECT_GE(cc.bit_identical, 0.9) << label;

  // fp32 arithmetic (fp64 = false): expf, compensated fp32 sums, the fp32 Hadamard butterfly.
  CompressorShape f32 = shape;
  f32.fp64 = false;
  const auto [e32, e32_state] =
      gather(DeviceCompressor(w, f32, freqs, seqs, dim, false, nullptr, nullptr));
  const golden::Closeness c32 = Report(label + " entries (host V/G, fp32 math)", e32, ref_entries);
  EXPECT_LE(c32.rms_rel, 1e-2) << label;
  EXPECT_GE(c32.bit_identical, 0.99) << label;
  EXPECT_EQ(e32_state, 0) << label;
}

// ---- tests --------------------------------------------------------------------------------------

TEST_F(CompressorTest, KernelsRunFromCompute86Ptx) {
  ExpectCompute86Ptx({{"CompressorReset", CompressorResetKernel()},
                      {"CompressorPool", CompressorPoolKernel()},
                      {"CompressorPoolFp32", CompressorPoolFp32Kernel()},
                      {"CompressorFinish", CompressorFinishKernel()},
                      {"CompressorFinishFp32", CompressorFinishFp32Kernel()},
                      {"CompressorUpdate", CompressorUpdateKernel()}},
                     size_t{48} << 10);
}

// Size checks happen before any CUDA call, so this runs without a device.
TEST(CompressorLimits, OutOfRangeSizesAreRejectedWithoutLaunching) {
  constexpr cudaError_t kBad = cudaErrorInvalidValue;
  CompressorBatch one{1, 1, nullptr, nullptr, nullptr, nullptr, nullptr};
  CompressorShape s{CompressorKind::kMain, 4, 1024, 64, 1e-6f, true, true};
  EXPECT_EQ(CompressorStep({.ld = 2048, .shape = s, .batch = one}, nullptr), kBad);
  s = CompressorShape{CompressorKind::kIndexer, 4, 96, 64, 1e-6f, true, true};
  EXPECT_EQ(CompressorStep({.ld = 192, .shape = s, .batch = one}, nullptr), kBad);
  s = CompressorShape{CompressorKind::kMain, 128, 512, 63, 1e-6f, true, true};
  EXPECT_EQ(CompressorStep({.ld = 512, .shape = s, .batch = one}, nullptr), kBad);
  s = CompressorShape{CompressorKind::kMain, 4, 512, 64, 1e-6f, true, true};
  EXPECT_EQ(CompressorStep({.ld = 512, .shape = s, .batch = one}, nullptr),
            kBad);  // ld < 2·d for ratio 4
  // Nothing to do.
  CompressorBatch none{};
  s = CompressorShape{CompressorKind::kMain, 128, 512, 64, 1e-6f, true, true};
  EXPECT_EQ(CompressorStep({.ld = 512, .shape = s, .batch = none}, nullptr), cudaSuccess);
}

TEST_F(CompressorTest, CompressorMatchesReferenceOnTinyA) {
  const model::ModelWeights& w = TinyA();
  const ModelConfig& c = w.config;
  const int64_t T = B160().T;
  ASSERT_EQ(T, 160);
  for (const int64_t L : {int64_t{2}, int64_t{3}, int64_t{4}, int64_t{5}}) {
    const model::AttentionWeights& a = w.blocks[L].attn;
    const int64_t ratio = c.compress_ratio(L);
    const std::vector<float> x = AttnInput(L);
    const std::vector<float> freqs = LayerRopeFrequencies(c, ratio);
    // Sequence A from position 0 in uneven steps (prefill, decode, chunks across block edges);
    // sequence B, in the same batched calls, from position 1000 with a fresh state.
    const std::vector<CompressorSeq> seqs{
        {x, 0, {37, 1, 1, 1, 2, 5, 1, 64, 1, 47}},
        {x, 1000, {3, 1, 4, 100, 52}},
    };
    const std::string label = "tiny-a L" + std::to_string(L);
    ASSERT_TRUE(a.has_compressor);
    const CompressorShape main{CompressorKind::kMain,          ratio, c.head_dim, c.rope_head_dim,
                               static_cast<float>(c.norm_eps), true,  true};
    CheckCompressor(label + " main r" + std::to_string(ratio), a.compressor, main, freqs, seqs,
                    c.dim);
    if (a.has_indexer) {
      const CompressorShape idx{CompressorKind::kIndexer,
                                4,
                                c.index_head_dim,
                                c.rope_head_dim,
                                static_cast<float>(c.norm_eps),
                                true,
                                true};
      CheckCompressor(label + " indexer", a.indexer.compressor, idx, freqs, seqs, c.dim);
    }
  }
}

// Synthetic compressor weights with Flash shapes (dim 4096).
struct SyntheticCompressor {
  std::vector<uint16_t> wkv_bits, wgate_bits;
  model::CompressorWeights w;
  SyntheticCompressor(int64_t ratio, int64_t d, int64_t dim, uint64_t seed) {
    const int64_t width = (ratio == 4 ? 2 : 1) * d;
    wkv_bits = ToBf16(RandomBf16(width * dim, 1.0f / 64.0f, seed));
    wgate_bits = ToBf16(RandomBf16(width * dim, 1.0f / 64.0f, seed + 1));
    w.ratio = ratio;
    w.head_dim = d;
    w.ape = RandomF32(ratio * width, 0.5f, seed + 2);
    w.wkv = MatrixOf(wkv_bits, width, dim);
    w.wgate = MatrixOf(wgate_bits, width, dim);
    w.norm = RandomBf16(d, 0.1f, seed + 3);
    for (float& g : w.norm) g = RoundBf16(1.0f + g);
  }
};

TEST_F(CompressorTest, CompressorMatchesReferenceAtFlashShapes) {
  const int64_t dim = 4096, rd = 64;
  const YarnConfig yarn;
  const std::vector<float> freqs = RopeFrequencies(rd, 160000, &yarn);
  const std::vector<float> x = RandomBf16(300 * dim, 1.0f, 71);
  auto rows = [&](int64_t n) { return std::vector<float>(x.begin(), x.begin() + n * dim); };
  {
    SyntheticCompressor sc(4, 512, dim, 72);
    const CompressorShape s{CompressorKind::kMain, 4, 512, rd, 1e-6f, true, true};
    const std::vector<CompressorSeq> seqs{{rows(72), 0, {13, 1, 1, 1, 1, 40, 15}},
                                          {rows(40), 65533, {2, 1, 1, 36}}};
    CheckCompressor("flash main r4 d512", sc.w, s, freqs, seqs, dim);
    CompressorShape nr = s;
    nr.fp8_round = false;
    CheckCompressor("flash main r4 d512 (FP8sim without e4m3)", sc.w, nr, freqs, seqs, dim);
  }
  {
    SyntheticCompressor sc(128, 512, dim, 73);
    const CompressorShape s{CompressorKind::kMain, 128, 512, rd, 1e-6f, true, true};
    const std::vector<CompressorSeq> seqs{{rows(300), 0, {100, 1, 27, 1, 171}},
                                          {rows(140), 1048570, {6, 134}}};
    CheckCompressor("flash main r128 d512", sc.w, s, freqs, seqs, dim);
  }
  {
    SyntheticCompressor sc(4, 128, dim, 74);
    const CompressorShape s{CompressorKind::kIndexer, 4, 128, rd, 1e-6f, true, true};
    const std::vector<CompressorSeq> seqs{{rows(72), 0, {13, 1, 1, 1, 1, 40, 15}},
                                          {rows(40), 65533, {2, 1, 1, 36}}};
    CheckCompressor("flash indexer r4 d128", sc.w, s, freqs, seqs, dim);
  }
}

// Timings at Flash shapes, for information (not run by ctest; run with
// --gtest_also_run_disabled_tests). Numbers from an H200 running the compute_86 PTX do not
// transfer to an RTX 3090 (about 3x less bandwidth, 1/64-rate FP64), only the proportions.
TEST_F(CompressorTest, DISABLED_TimingsAtFlashShapes) {
  const int64_t rd = 64, dim = 4096;
  auto line = [](const char* what, double us) { std::printf("%-60s %10.1f us\n", what, us); };
  DeviceBuffer<float> freqs(RopeFrequencies(rd, 160000, nullptr));
  // Compressor: the fused wkv|wgate GEMV for a decode batch, a decode step of 64 sequences and a
  // 4096-token prefill chunk.
  for (const int64_t ratio : {int64_t{4}, int64_t{128}}) {
    const int64_t d = 512, width = (ratio == 4 ? 2 : 1) * d, slots = (ratio == 4 ? 2 : 1) * ratio;
    const int64_t S = 64, P = 4096;
    DeviceBuffer<uint16_t> wkv(ToBf16(RandomBf16(2 * width * dim, 1.0f / 64.0f, 148)));
    DeviceBuffer<uint16_t> x(ToBf16(RandomBf16(S * dim, 1.0f, 149)));
    DeviceBuffer<float> vg(P * 2 * width), ape(RandomF32(ratio * width, 0.5f, 150)),
        norm(std::vector<float>(d, 1.0f)), kv(S * slots * width), sc(S * slots * width);
    CUDA_ASSERT_OK(CompressorResetState(kv.get(), sc.get(), S * slots * width, nullptr));
    CUDA_ASSERT_OK(cudaMemset(vg.get(), 0, P * 2 * width * sizeof(float)));
    std::vector<float*> kvp(S), scp(S);
    std::vector<int64_t> start(S), rows(S + 1), ebeg(S);
    for (int64_t s = 0; s < S; ++s) {
      kvp[s] = kv.get() + s * slots * width;
      scp[s] = sc.get() + s * slots * width;
      start[s] = ratio * (8 * s + 1) - 1;  // every sequence completes a block
      rows[s + 1] = s + 1;
      ebeg[s] = s;
    }
    DeviceBuffer<float*> dkvp(kvp), dscp(scp);
    DeviceBuffer<int64_t> dstart(start), drows(rows), debeg(ebeg);
    DeviceBuffer<uint16_t> entries(P * d);
    const CompressorShape shape{CompressorKind::kMain, ratio, d, rd, 1e-6f, true, true};
    const std::string r = " ratio " + std::to_string(ratio);
    line(("LinearBf16F32 wkv|wgate T=64" + r).c_str(),
         MicrosPerCall(
             [&] {
               LinearBf16F32(AsBf16(x.get()), S, dim, AsBf16(wkv.get()), 2 * width, vg.get(),
                             2 * width, nullptr);
             },
             10));
    const CompressorBatch dec{S, 1, dstart.get(), drows.get(), debeg.get(), dkvp.get(), dscp.get()};
    std::vector<int64_t> pstart{0}, prow{0, P}, pbeg{0};
    DeviceBuffer<int64_t> dps(pstart), dpr(prow), dpb(pbeg);
    const CompressorBatch pre{1,         P / ratio,  dps.get(), dpr.get(),
                              dpb.get(), dkvp.get(), dscp.get()};
    for (const bool fp64 : {true, false}) {
      CompressorShape sh = shape;
      sh.fp64 = fp64;
      auto step = [&](const CompressorBatch& batch) {
        CompressorStep({.v = vg.get(),
                        .g = vg.get() + width,
                        .ld = 2 * width,
                        .ape = ape.get(),
                        .norm = norm.get(),
                        .rope_freqs = freqs.get(),
                        .shape = sh,
                        .batch = batch,
                        .entries = AsBf16(entries.get())},
                       nullptr);
      };
      const std::string m = r + (fp64 ? " (fp64)" : " (fp32)");
      line(("CompressorStep decode 64 sequences" + m).c_str(),
           MicrosPerCall([&] { step(dec); }, 20));
      line(("CompressorStep prefill 4096 tokens" + m).c_str(),
           MicrosPerCall([&] { step(pre); }, 5));
    }
  }
}

}  // namespace
}  // namespace ss::cuda
