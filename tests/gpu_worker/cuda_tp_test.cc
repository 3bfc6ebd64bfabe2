// The cuda backend at TP = 2 (gpu_worker/cuda/cuda_backend.h "Tensor parallelism") on two GPUs: one
// CudaBackend per rank, each driven by its own thread, joined by an in-process NCCL group
// (NcclComm::CreateGroup). Label gpu; the TP tests skip with a message without two CUDA devices
// or without NCCL in the build.
//
// Schedule and reference: tests/gpu_worker/tiny_schedule.h (the one cuda_backend_test.cc uses at
// TP = 1: two sequences, prefill then 8 decode steps, teacher-forced).
//
// Checks:
//  * the collectives on self-describing payloads (rank r sends values that name r and the
//    element), so a misrouted or stale element shows without a numeric reference, for a group
//    made in one call (CreateGroup) and one joined rank by rank from a unique id (Create, the
//    workers' way);
//  * the fp32-output FP8 linear (the ranks' partials): rounded to bf16 it is the bf16 kernel's
//    output bit for bit, and two half-K partials summed and rounded match the whole projection
//    (summation order only: figures printed); the MoE combine kernel against the host;
//  * per block, at the TP = 1 test's tolerances: a one-layer stage per rank fed the reference's
//    input streams at every step; prefill steps rms_rel <= 0.02 and >= 70% bit-identical bf16
//    elements, decode steps rms_rel <= 0.08 and >= 10%; both ranks' outputs bit-identical to each
//    other (the all-reduce gives every rank the same sum); figures against TP = 1 printed;
//  * the whole model on one stage: logits rms_rel <= 0.5 and greedy tokens equal wherever the
//    reference's top-2 margin exceeds 0.5 (as at TP = 1); agreement with TP = 1 (logits figures,
//    greedy tokens) printed, not required; both ranks' logits bit-identical;
//  * the new kernels run from compute_86 PTX (ptxVersion == 86);
//  * option validation (runs anywhere: no device is touched before it);
//  * the nccl stage transport (gpu_worker/stage_link.h): two stages on the two GPUs joined by an
//    NcclStageLink, streams device to device (RunDevice), give logits bit-identical to one stage
//    on one GPU, and a `failed` message keeps the link's ends paired.
// The test runs again on the device with NCCL_P2P_DISABLE=1 (tests/device_suite.sh): the
// PCIe-without-P2P configuration of RTX 3090 boards.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/bf16.h"
#include "common/model/model.h"
#include "gpu_worker/cuda/cuda_backend.h"
#include "gpu_worker/kernels/elementwise.h"
#include "gpu_worker/kernels/fp8_linear.h"
#include "gpu_worker/kernels/prepare.h"
#include "gpu_worker/nccl_comm.h"
#include "gpu_worker/nccl_stage_link.h"
#include "gtest/gtest.h"
#include "tests/gpu_worker/gpu_test_util.h"
#include "tests/gpu_worker/tiny_schedule.h"

namespace ss::gpu {
namespace {

using cuda::testing_util::DeviceBuffer;
using cuda::testing_util::Report;
using namespace testing_util;  // NOLINT: the shared tiny-a schedule

constexpr int kTp = 2;

// Skips without two CUDA devices or without NCCL.
class TpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n < kTp) {
      GTEST_SKIP() << "TP = " << kTp << " needs " << kTp << " CUDA devices ("
                   << (e == cudaSuccess ? std::to_string(n) + " found" : cudaGetErrorString(e))
                   << "): TP tests run on the device machine's two-GPU kind";
    }
    if (!NcclComm::Available()) {
      GTEST_SKIP() << "this build has no NCCL (cmake/nccl.cmake): TP > 1 is not built";
    }
  }
};

// fn(rank) on one thread per rank; returns when all are done.
template <typename Fn>
void OnRanks(Fn fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < kTp; ++r) threads.emplace_back(fn, r);
  for (std::thread& t : threads) t.join();
}

std::vector<std::unique_ptr<NcclComm>> Group() {
  const std::vector<int> devices = {0, 1};
  auto g = NcclComm::CreateGroup(devices);
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() ? std::move(*g) : std::vector<std::unique_ptr<NcclComm>>{};
}

// One stage at TP = tp (comms: the group's communicators, or empty at TP = 1), rank r on device r.
std::vector<std::unique_ptr<CudaBackend>> MakeStage(std::vector<std::unique_ptr<NcclComm>>& comms,
                                                    int stage, int num_stages, int first, int end) {
  const int tp = comms.empty() ? 1 : static_cast<int>(comms.size());
  std::vector<std::unique_ptr<CudaBackend>> ranks;
  for (int r = 0; r < tp; ++r) {
    CudaBackendOptions o = StageOptions(stage, num_stages, first, end);
    o.device = r;
    o.tp_rank = r;
    o.tp_size = tp;
    o.comm = comms.empty() ? nullptr : comms[r].get();
    auto b = CudaBackend::Create(TinyModel(), o);
    EXPECT_TRUE(b.ok()) << "rank " << r << ": " << b.status();
    ranks.push_back(b.ok() ? std::move(*b) : nullptr);
  }
  return ranks;
}

// Runs one step on every rank at once.
std::vector<StageOutput> RunRanks(std::vector<std::unique_ptr<CudaBackend>>& ranks,
                                  const std::vector<StageChunk>& batch, const float* streams_in,
                                  std::vector<absl::Status>* status) {
  const int n = static_cast<int>(ranks.size());
  std::vector<StageOutput> out(n);
  status->assign(n, absl::OkStatus());
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back(
        [&, r] { (*status)[r] = ranks[r]->Run(batch, streams_in, &out[r], nullptr); });
  }
  for (std::thread& t : threads) t.join();
  return out;
}

int64_t BitIdentical(const std::vector<float>& a, const std::vector<float>& b) {
  int64_t n = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    n += std::memcmp(&a[i], &b[i], 4) == 0;
  }
  return n;
}

TEST(TpOptionsTest, AreValidatedBeforeAnyDeviceIsTouched) {
  ASSERT_NE(TinyModel(), nullptr);
  CudaBackendOptions o = WholeModelOptions(64);
  o.tp_size = 2;
  o.tp_rank = 2;
  EXPECT_EQ(CudaBackend::Create(TinyModel(), o).status().code(),
            absl::StatusCode::kInvalidArgument);
  o.tp_rank = 1;  // no communicator
  const absl::Status s = CudaBackend::Create(TinyModel(), o).status();
  EXPECT_EQ(s.code(), NcclComm::Available() ? absl::StatusCode::kInvalidArgument
                                            : absl::StatusCode::kUnimplemented)
      << s;
  std::printf("TP = 2 without a communicator: %s\n", s.ToString().c_str());
}

// All-reduce and all-gather of values that name their rank and element, on every rank at once.
void CheckCollectives(std::vector<std::unique_ptr<NcclComm>>& comms) {
  ASSERT_EQ(comms.size(), static_cast<size_t>(kTp));
  constexpr int64_t n = 1000;
  std::vector<std::vector<float>> reduced(kTp), gathered(kTp);
  std::vector<absl::Status> status(kTp);
  OnRanks([&](int r) {
    cudaSetDevice(r);
    cudaStream_t st;
    cudaStreamCreate(&st);
    std::vector<float> v(n);
    for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>((r + 1) * 100000 + i);
    float *d = nullptr, *g = nullptr;
    cudaMalloc(&d, n * 4);
    cudaMalloc(&g, kTp * n * 4);
    cudaMemcpy(d, v.data(), n * 4, cudaMemcpyHostToDevice);
    absl::Status s = comms[r]->AllGather(d, n, g, st);
    if (s.ok()) s = comms[r]->AllReduceSum(d, n, st);
    if (s.ok()) s = comms[r]->Synchronize(st, absl::Seconds(120));
    reduced[r].resize(n);
    gathered[r].resize(kTp * n);
    cudaMemcpy(reduced[r].data(), d, n * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(gathered[r].data(), g, kTp * n * 4, cudaMemcpyDeviceToHost);
    cudaFree(d);
    cudaFree(g);
    cudaStreamDestroy(st);
    status[r] = s;
  });
  for (int r = 0; r < kTp; ++r) {
    ASSERT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r];
    for (int64_t i = 0; i < n; ++i) {
      float want = 0.0f;
      for (int q = 0; q < kTp; ++q) want += static_cast<float>((q + 1) * 100000 + i);
      ASSERT_EQ(reduced[r][i], want) << "rank " << r << " element " << i;
      for (int q = 0; q < kTp; ++q) {
        ASSERT_EQ(gathered[r][q * n + i], static_cast<float>((q + 1) * 100000 + i))
            << "rank " << r << " block " << q << " element " << i;
      }
    }
  }
}

TEST_F(TpTest, CollectivesCarrySelfDescribingPayloads) {
  // The in-process group (one thread initialises every rank).
  std::vector<std::unique_ptr<NcclComm>> group = Group();
  CheckCollectives(group);
  // The workers' way: one unique id, each rank joining from its own thread.
  absl::StatusOr<std::string> id = NcclComm::NewUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  std::vector<std::unique_ptr<NcclComm>> joined(kTp);
  std::vector<absl::Status> status(kTp);
  OnRanks([&](int r) {
    auto c = NcclComm::Create(*id, r, kTp, r);
    status[r] = c.status();
    if (c.ok()) joined[r] = std::move(*c);
  });
  for (int r = 0; r < kTp; ++r) ASSERT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r];
  CheckCollectives(joined);
  EXPECT_EQ(NcclComm::Create("short", 0, 2, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

// The ranks' fp32 partials of a row-parallel FP8 projection (fp8_linear.h Fp8Linear, fp32 output).
TEST_F(TpTest, Fp32LinearPartialsSumToTheBf16Projection) {
  cudaSetDevice(0);
  const absl::Status prepared = cuda::PrepareKernels();  // Fp8Linear's GEMM for 40 and 200 rows
  ASSERT_TRUE(prepared.ok()) << prepared;
  constexpr int64_t out = 256, in = 1024;
  std::vector<uint8_t> w(out * in), ws((out / 128) * (in / 128));
  uint32_t x = 12345;
  auto next = [&x] { return x = x * 1664525u + 1013904223u; };
  for (uint8_t& b : w) {
    b = static_cast<uint8_t>(next() >> 24);
    if ((b & 0x7f) == 0x7f) b ^= 1;  // no NaN codes
  }
  for (uint8_t& s : ws) s = static_cast<uint8_t>(120 + next() % 8);
  // Column halves of w (whole 128-blocks), each with its scale columns.
  std::vector<uint8_t> wh[2], sh[2];
  for (int h = 0; h < 2; ++h) {
    for (int64_t o = 0; o < out; ++o) {
      wh[h].insert(wh[h].end(), w.begin() + o * in + h * in / 2,
                   w.begin() + o * in + (h + 1) * in / 2);
    }
    for (int64_t b = 0; b < out / 128; ++b) {
      sh[h].insert(sh[h].end(), ws.begin() + b * (in / 128) + h * in / 256,
                   ws.begin() + b * (in / 128) + (h + 1) * in / 256);
    }
  }
  DeviceBuffer<uint8_t> dw(w), dws(ws), dw0(wh[0]), dw1(wh[1]), ds0(sh[0]), ds1(sh[1]);
  for (int64_t rows : {1, 5, 40, 200}) {
    const std::vector<float> xv = cuda::testing_util::RandomBf16(rows * in, 1.0f, rows);
    DeviceBuffer<uint16_t> dx(cuda::testing_util::ToBf16(xv));
    DeviceBuffer<uint8_t> q(rows * in);
    DeviceBuffer<float> s(rows * (in / 128));
    CUDA_ASSERT_OK(cuda::QuantizeActE4m3(cuda::AsBf16(dx.get()), rows, in, cuda::AsE4m3(q.get()),
                                         s.get(), nullptr));
    // The quantised halves as their own [rows, in/2] activations, with their scale columns.
    std::vector<uint8_t> qh = q.Get();
    std::vector<float> shv = s.Get();
    std::vector<uint8_t> qp[2];
    std::vector<float> sp[2];
    for (int h = 0; h < 2; ++h) {
      for (int64_t r = 0; r < rows; ++r) {
        qp[h].insert(qp[h].end(), qh.begin() + r * in + h * in / 2,
                     qh.begin() + r * in + (h + 1) * in / 2);
        sp[h].insert(sp[h].end(), shv.begin() + r * (in / 128) + h * in / 256,
                     shv.begin() + r * (in / 128) + (h + 1) * in / 256);
      }
    }
    DeviceBuffer<uint8_t> q0(qp[0]), q1(qp[1]);
    DeviceBuffer<float> s0(sp[0]), s1(sp[1]);
    DeviceBuffer<uint16_t> y16(rows * out);
    DeviceBuffer<float> y32(rows * out), p0(rows * out), p1(rows * out);
    CUDA_ASSERT_OK(cuda::Fp8Linear(cuda::AsE4m3(q.get()), s.get(), rows, cuda::AsE4m3(dw.get()),
                                   cuda::AsUe8m0(dws.get()), out, in, cuda::AsBf16(y16.get()),
                                   nullptr));
    CUDA_ASSERT_OK(cuda::Fp8Linear(cuda::AsE4m3(q.get()), s.get(), rows, cuda::AsE4m3(dw.get()),
                                   cuda::AsUe8m0(dws.get()), out, in, y32.get(), nullptr));
    CUDA_ASSERT_OK(cuda::Fp8Linear(cuda::AsE4m3(q0.get()), s0.get(), rows, cuda::AsE4m3(dw0.get()),
                                   cuda::AsUe8m0(ds0.get()), out, in / 2, p0.get(), nullptr));
    CUDA_ASSERT_OK(cuda::Fp8Linear(cuda::AsE4m3(q1.get()), s1.get(), rows, cuda::AsE4m3(dw1.get()),
                                   cuda::AsUe8m0(ds1.get()), out, in / 2, p1.get(), nullptr));
    DeviceBuffer<uint16_t> r32(rows * out), comb(rows * out);
    CUDA_ASSERT_OK(cuda::RoundF32ToBf16(y32.get(), rows * out, cuda::AsBf16(r32.get()), nullptr));
    // The MoE combine on these two as (shared, routed): bf16(p1 + bf16(p0)).
    CUDA_ASSERT_OK(
        cuda::MoeCombineF32(p0.get(), p1.get(), rows * out, cuda::AsBf16(comb.get()), nullptr));
    CUDA_ASSERT_OK(cudaDeviceSynchronize());
    EXPECT_EQ(r32.Get(), y16.Get()) << rows << " rows: fp32 output rounded != bf16 output";
    const std::vector<float> h0 = p0.Get(), h1 = p1.Get();
    std::vector<float> sum(h0.size()), want_comb(h0.size());
    for (size_t i = 0; i < h0.size(); ++i) {
      sum[i] = RoundBf16(h0[i] + h1[i]);
      want_comb[i] = RoundBf16(h1[i] + RoundBf16(h0[i]));
    }
    EXPECT_EQ(cuda::testing_util::FromBf16(comb.Get()), want_comb) << rows << " rows";
    const auto c = Report("fp8 linear, 2 K-halves summed vs whole, rows " + std::to_string(rows),
                          sum, cuda::testing_util::FromBf16(y16.Get()));
    EXPECT_LE(c.rms_rel, 1e-3);
    EXPECT_GE(c.bit_identical, 0.95);
  }
}

TEST_F(TpTest, NewKernelsRunFromComputeSm86Ptx) {
  for (const auto& [name, fn] : std::vector<std::pair<const char*, const void*>>{
           {"MoeCombineF32", cuda::MoeCombineF32Kernel()},
           {"RoundF32ToBf16", cuda::RoundF32ToBf16Kernel()}}) {
    cudaFuncAttributes a{};
    CUDA_ASSERT_OK(cudaFuncGetAttributes(&a, fn));
    std::printf("%s ptxVersion=%d binaryVersion=%d\n", name, a.ptxVersion, a.binaryVersion);
    EXPECT_EQ(a.ptxVersion, 86) << name;
  }
}

TEST_F(TpTest, EveryBlockMatchesTheReferenceAtTheSingleGpuTolerances) {
  ASSERT_NE(TinyModel(), nullptr);
  const RefRun& ref = Reference();
  const int L = static_cast<int>(TinyModel()->config().n_layers);
  std::vector<std::unique_ptr<NcclComm>> comms = Group(), none;
  ASSERT_EQ(comms.size(), static_cast<size_t>(kTp));
  for (int l = 0; l < L; ++l) {
    // Stage l of L + 1: every one-layer stage is a non-last stage and returns its streams.
    std::vector<std::unique_ptr<CudaBackend>> tp2 = MakeStage(comms, l, L + 1, l, l + 1);
    std::vector<std::unique_ptr<CudaBackend>> tp1 = MakeStage(none, l, L + 1, l, l + 1);
    ASSERT_TRUE(tp2[0] && tp2[1] && tp1[0]);
    std::vector<float> got_p, ref_p, one_p, got_d, ref_d, one_d;
    int64_t rank_values = 0, rank_identical = 0;
    for (int step = 0; step < kSteps; ++step) {
      const std::vector<StageChunk> batch = Chunks(ref.steps[step]);
      const float* in = l == 0 ? nullptr : ref.streams[step][l].data();
      std::vector<absl::Status> st;
      std::vector<StageOutput> o2 = RunRanks(tp2, batch, in, &st);
      for (int r = 0; r < kTp; ++r) {
        ASSERT_TRUE(st[r].ok()) << "layer " << l << " step " << step << " rank " << r << ": "
                                << st[r];
      }
      StageOutput o1;
      ASSERT_TRUE(tp1[0]->Run(batch, in, &o1, nullptr).ok());
      const std::vector<float>& want = ref.streams[step][l + 1];
      ASSERT_EQ(o2[0].streams.size(), want.size());
      ASSERT_EQ(o2[1].streams.size(), want.size());
      rank_values += static_cast<int64_t>(want.size());
      rank_identical += BitIdentical(o2[0].streams, o2[1].streams);
      const bool prefill = step < 2;
      auto append = [](std::vector<float>& v, const std::vector<float>& x) {
        v.insert(v.end(), x.begin(), x.end());
      };
      append(prefill ? got_p : got_d, o2[0].streams);
      append(prefill ? ref_p : ref_d, want);
      append(prefill ? one_p : one_d, o1.streams);
    }
    const std::string b = "TP=2 block " + std::to_string(l);
    const auto cp = Report(b + " prefill (0-1) vs reference", got_p, ref_p);
    const auto cd = Report(b + " decode (2-9) vs reference", got_d, ref_d);
    Report(b + " prefill (0-1) vs TP=1", got_p, one_p);
    Report(b + " decode (2-9) vs TP=1", got_d, one_d);
    Report("TP=1 block " + std::to_string(l) + " prefill (0-1) vs reference", one_p, ref_p);
    Report("TP=1 block " + std::to_string(l) + " decode (2-9) vs reference", one_d, ref_d);
    EXPECT_LE(cp.rms_rel, 0.02) << "block " << l;
    EXPECT_GE(cp.bit_identical, 0.70) << "block " << l;
    EXPECT_LE(cd.rms_rel, 0.08) << "block " << l;
    EXPECT_GE(cd.bit_identical, 0.10) << "block " << l;
    EXPECT_EQ(rank_identical, rank_values) << "block " << l << ": the ranks' streams differ";
    for (int r = 0; r < kTp; ++r) {
      const KvUsage u = tp2[r]->kv_usage();
      EXPECT_EQ(u.sequences, 2);
      EXPECT_EQ(u.used_tokens, 150 + 8 + 23 + 9);
    }
  }
}

TEST_F(TpTest, WholeModelLogitsAgainstTheReferenceAndTp1) {
  ASSERT_NE(TinyModel(), nullptr);
  const RefRun& ref = Reference();
  std::vector<std::unique_ptr<NcclComm>> comms = Group(), none;
  ASSERT_EQ(comms.size(), static_cast<size_t>(kTp));
  std::vector<std::unique_ptr<CudaBackend>> tp2 = MakeStage(comms, 0, 1, 0, 7);
  std::vector<std::unique_ptr<CudaBackend>> tp1 = MakeStage(none, 0, 1, 0, 7);
  ASSERT_TRUE(tp2[0] && tp2[1] && tp1[0]);
  for (int r = 0; r < kTp; ++r) {
    std::printf("rank %d: device %s, weights %.2f MB (TP = 1: %.2f MB)\n", r,
                tp2[r]->info().device.c_str(), tp2[r]->info().weight_bytes / 1e6,
                tp1[0]->info().weight_bytes / 1e6);
  }
  int tokens = 0, equal_ref = 0, equal_tp1 = 0, confident = 0, confident_equal = 0;
  int64_t rank_values = 0, rank_identical = 0;
  std::vector<float> all2, all1, allr;
  for (int step = 0; step < kSteps; ++step) {
    const std::vector<StageChunk> batch = Chunks(ref.steps[step]);
    std::vector<absl::Status> st;
    std::vector<StageOutput> o2 = RunRanks(tp2, batch, nullptr, &st);
    for (int r = 0; r < kTp; ++r) ASSERT_TRUE(st[r].ok()) << "step " << step << ": " << st[r];
    StageOutput o1;
    ASSERT_TRUE(tp1[0]->Run(batch, nullptr, &o1, nullptr).ok());
    ASSERT_EQ(o2[0].logits.size(), ref.logits[step].size());
    ASSERT_EQ(o2[1].logits.size(), ref.logits[step].size());
    ASSERT_EQ(o1.logits.size(), ref.logits[step].size());
    for (size_t i = 0; i < o2[0].logits.size(); ++i) {
      const std::vector<float>& got = o2[0].logits[i];
      const std::vector<float>& want = ref.logits[step][i];
      const std::string what = "step " + std::to_string(step) + " logits " + std::to_string(i);
      const auto cl = Report("TP=2 " + what + " vs reference", got, want);
      Report("TP=2 " + what + " vs TP=1", got, o1.logits[i]);
      EXPECT_LE(cl.rms_rel, 0.5);
      const bool same = Argmax(got) == Argmax(want);
      ++tokens;
      equal_ref += same;
      equal_tp1 += Argmax(got) == Argmax(o1.logits[i]);
      if (Top2Margin(want) > 0.5f) {
        ++confident;
        confident_equal += same;
        EXPECT_TRUE(same) << "step " << step << " chunk " << i;
      }
      rank_values += static_cast<int64_t>(got.size());
      rank_identical += BitIdentical(got, o2[1].logits[i]);
      all2.insert(all2.end(), got.begin(), got.end());
      all1.insert(all1.end(), o1.logits[i].begin(), o1.logits[i].end());
      allr.insert(allr.end(), want.begin(), want.end());
    }
  }
  Report("TP=2 all logits vs reference", all2, allr);
  Report("TP=2 all logits vs TP=1", all2, all1);
  Report("TP=1 all logits vs reference", all1, allr);
  std::printf(
      "TP=2 greedy tokens: %d of %d equal to the reference (%d of %d with top-2 margin > 0.5), "
      "%d of %d equal to TP=1\n",
      equal_ref, tokens, confident_equal, confident, equal_tp1, tokens);
  std::printf("TP=2 rank 0 vs rank 1: %lld of %lld logits bit-identical\n",
              static_cast<long long>(rank_identical), static_cast<long long>(rank_values));
  EXPECT_EQ(rank_identical, rank_values);
}

TEST_F(TpTest, TwoStagesOverAnNcclLinkAreBitIdenticalToOne) {
  ASSERT_NE(TinyModel(), nullptr);
  const RefRun& ref = Reference();
  std::vector<std::unique_ptr<NcclComm>> none;
  std::vector<std::unique_ptr<CudaBackend>> whole = MakeStage(none, 0, 1, 0, 7);
  std::vector<std::unique_ptr<CudaBackend>> s0 = MakeStage(none, 0, 2, 0, 4);
  // Stage 1 on the second GPU (NCCL refuses a link whose two ranks share one).
  CudaBackendOptions o1 = StageOptions(1, 2, 4, 7);
  o1.device = 1;
  auto s1 = CudaBackend::Create(TinyModel(), o1);
  ASSERT_TRUE(whole[0] && s0[0] && s1.ok()) << s1.status();
  absl::StatusOr<std::string> id = NcclComm::NewUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  std::unique_ptr<NcclStageLink> out, in;
  std::thread join([&] {
    auto l = NcclStageLink::Create(*id, /*sender=*/false, 1, "the link from stage 0");
    ASSERT_TRUE(l.ok()) << l.status();
    in = std::move(*l);
  });
  auto l = NcclStageLink::Create(*id, /*sender=*/true, 0, "the link to stage 1");
  join.join();
  ASSERT_TRUE(l.ok()) << l.status();
  out = std::move(*l);
  ASSERT_NE(in, nullptr);
  // A micro-batch the sender failed: a `failed` message, no data.
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  ASSERT_TRUE(out->Send(100, 3, 16, nullptr, "failed", deadline).ok());
  absl::StatusOr<StageLink::Received> f = in->Receive(100, 3, 16, deadline);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_TRUE(f->failed);
  int64_t values = 0, identical = 0;
  for (int step = 0; step < kSteps; ++step) {
    const std::vector<StageChunk> batch = Chunks(ref.steps[step]);
    StageOutput a, b, w;
    absl::Status sa, sb;
    std::thread receiver([&] {
      int64_t rows = 0;
      for (const StageChunk& c : batch) rows += static_cast<int64_t>(c.tokens.size());
      const ModelConfig& mc = TinyModel()->config();
      absl::StatusOr<StageLink::Received> r =
          in->Receive(step, rows, mc.hc_mult * mc.dim, deadline);
      sb = r.ok() ? (*s1)->RunDevice(batch, r->streams, &b, nullptr) : r.status();
    });
    sa = s0[0]->RunDevice(batch, nullptr, &a, nullptr);
    if (sa.ok()) {
      EXPECT_TRUE(a.streams.empty());
      sa = out->Send(step, a.rows, a.width, a.device_streams, {}, deadline);
    }
    receiver.join();
    ASSERT_TRUE(sa.ok()) << "step " << step << ": " << sa;
    ASSERT_TRUE(sb.ok()) << "step " << step << ": " << sb;
    ASSERT_TRUE(whole[0]->Run(batch, nullptr, &w, nullptr).ok());
    ASSERT_EQ(b.logits.size(), w.logits.size());
    for (size_t i = 0; i < w.logits.size(); ++i) {
      values += static_cast<int64_t>(w.logits[i].size());
      identical += BitIdentical(b.logits[i], w.logits[i]);
    }
  }
  std::printf("PP = 2 over an NCCL link vs one stage: %lld of %lld logits bit-identical\n",
              static_cast<long long>(identical), static_cast<long long>(values));
  EXPECT_GT(values, 0);
  EXPECT_EQ(identical, values);
  // Out of step (the receiver expects another micro-batch): the link breaks.
  ASSERT_TRUE(out->Send(7, 1, 16, nullptr, "failed", deadline).ok());
  absl::StatusOr<StageLink::Received> bad = in->Receive(8, 1, 16, deadline);
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("out of step"), std::string::npos) << bad.status();
}

}  // namespace
}  // namespace ss::gpu
