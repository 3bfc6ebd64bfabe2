// The cuda backend (gpu_worker/cuda_backend.h) against the reference model on tiny-a (label gpu;
// every test skips with a message without a CUDA device).
//
// Schedule and reference: tests/gpu_worker/tiny_schedule.h (the reference's routed experts are
// computed locally; the cpu backend itself needs the gRPC build, this test does not).
//
// Checks and tolerances (tests/data/tiny-a/README.md "Suggested tolerances"):
//  * per block: a one-layer cuda stage fed the reference's input streams of that block at every
//    step (its KV state therefore follows the reference's history); prefill steps rms_rel ≤ 0.02
//    and ≥ 70% bit-identical bf16 elements, decode steps rms_rel ≤ 0.08 and ≥ 10%;
//  * the whole model on one stage: logits smoke rms_rel ≤ 0.5, greedy tokens equal wherever the
//    reference's top-2 margin exceeds 0.5 (the model is chaotic end to end; all counts printed);
//  * PP: stages [0, 4) + [4, 7) give logits bit-identical to one stage [0, 7).
// No new kernel is added by the backend (it launches the kernels of gpu_worker/kernels/, whose
// tests assert ptxVersion == 86); the test checks that a step really launched on the device.
#include "gpu_worker/cuda_backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "common/model/model.h"
#include "gtest/gtest.h"
#include "tests/gpu_worker/gpu_test_util.h"
#include "tests/gpu_worker/tiny_schedule.h"

namespace ss::gpu {
namespace {

using cuda::testing_util::GpuTest;
using cuda::testing_util::Report;
using testing_util::Argmax;
using testing_util::Chunks;
using testing_util::kSteps;
using testing_util::Reference;
using testing_util::RefRun;
using testing_util::TinyModel;
using testing_util::Top2Margin;

std::unique_ptr<CudaBackend> Make(int stage, int num_stages, int first, int end) {
  CudaBackendOptions o;
  o.stage = stage;
  o.num_stages = num_stages;
  o.first_layer = first;
  o.end_layer = end;
  o.kv_tokens = 4096;
  auto b = CudaBackend::Create(TinyModel(), o);
  EXPECT_TRUE(b.ok()) << b.status();
  return b.ok() ? std::move(*b) : nullptr;
}

class CudaBackendTest : public GpuTest {};

TEST_F(CudaBackendTest, EveryBlockMatchesTheReferenceOnItsInputs) {
  ASSERT_NE(TinyModel(), nullptr);
  const RefRun& ref = Reference();
  const ModelConfig& c = TinyModel()->config();
  const int L = static_cast<int>(c.n_layers);
  for (int l = 0; l < L; ++l) {
    // Stage l of L + 1: every one-layer stage is a non-last stage and returns its streams.
    std::unique_ptr<CudaBackend> b = Make(l, L + 1, l, l + 1);
    ASSERT_NE(b, nullptr);
    std::vector<float> got_p, ref_p, got_d, ref_d;
    for (int step = 0; step < kSteps; ++step) {
      const std::vector<StageChunk> batch = Chunks(ref.steps[step]);
      StageOutput out;
      const absl::Status s =
          b->Run(batch, l == 0 ? nullptr : ref.streams[step][l].data(), &out, nullptr);
      ASSERT_TRUE(s.ok()) << "layer " << l << " step " << step << ": " << s;
      const std::vector<float>& want = ref.streams[step][l + 1];
      ASSERT_EQ(out.streams.size(), want.size());
      auto& g = step < 2 ? got_p : got_d;
      auto& r = step < 2 ? ref_p : ref_d;
      g.insert(g.end(), out.streams.begin(), out.streams.end());
      r.insert(r.end(), want.begin(), want.end());
    }
    const auto cp = Report("block " + std::to_string(l) + " prefill steps (0-1)", got_p, ref_p);
    const auto cd = Report("block " + std::to_string(l) + " decode steps (2-9)", got_d, ref_d);
    EXPECT_LE(cp.rms_rel, 0.02) << "block " << l;
    EXPECT_GE(cp.bit_identical, 0.70) << "block " << l;
    EXPECT_LE(cd.rms_rel, 0.08) << "block " << l;
    EXPECT_GE(cd.bit_identical, 0.10) << "block " << l;
    const KvUsage u = b->kv_usage();
    EXPECT_EQ(u.sequences, 2);
    EXPECT_EQ(u.used_tokens, 150 + 8 + 23 + 9);
  }
}

TEST_F(CudaBackendTest, WholeModelGreedyAndPipelineSplitIsBitIdentical) {
  ASSERT_NE(TinyModel(), nullptr);
  const RefRun& ref = Reference();
  std::unique_ptr<CudaBackend> one = Make(0, 1, 0, 7);
  std::unique_ptr<CudaBackend> s0 = Make(0, 2, 0, 4);
  std::unique_ptr<CudaBackend> s1 = Make(1, 2, 4, 7);
  ASSERT_TRUE(one && s0 && s1);
  std::printf("device %s, stage [0,7) weights %.2f MB\n", one->info().device.c_str(),
              one->info().weight_bytes / 1e6);
  int tokens = 0, equal = 0, confident = 0, confident_equal = 0;
  int64_t pp_values = 0, pp_identical = 0;
  for (int step = 0; step < kSteps; ++step) {
    const std::vector<StageChunk> batch = Chunks(ref.steps[step]);
    StageOutput o1, o0, o2;
    ASSERT_TRUE(one->Run(batch, nullptr, &o1, nullptr).ok());
    ASSERT_TRUE(s0->Run(batch, nullptr, &o0, nullptr).ok());
    ASSERT_TRUE(o0.logits.empty());
    ASSERT_TRUE(s1->Run(batch, o0.streams.data(), &o2, nullptr).ok());
    ASSERT_EQ(o1.logits.size(), ref.logits[step].size());
    ASSERT_EQ(o2.logits.size(), o1.logits.size());
    for (size_t i = 0; i < o1.logits.size(); ++i) {
      const auto& want = ref.logits[step][i];
      const auto cl = Report("step " + std::to_string(step) + " logits " + std::to_string(i),
                             o1.logits[i], want);
      EXPECT_LE(cl.rms_rel, 0.5);
      const bool same = Argmax(o1.logits[i]) == Argmax(want);
      ++tokens;
      equal += same;
      if (Top2Margin(want) > 0.5f) {
        ++confident;
        confident_equal += same;
        EXPECT_TRUE(same) << "step " << step << " chunk " << i;
      }
      for (size_t j = 0; j < o1.logits[i].size(); ++j) {
        ++pp_values;
        pp_identical += std::memcmp(&o1.logits[i][j], &o2.logits[i][j], 4) == 0;
      }
    }
  }
  std::printf("greedy tokens equal to the reference: %d of %d (%d of %d with top-2 margin > 0.5)\n",
              equal, tokens, confident_equal, confident);
  std::printf("PP [0,4)+[4,7) vs [0,7): %lld of %lld logits bit-identical\n",
              static_cast<long long>(pp_identical), static_cast<long long>(pp_values));
  EXPECT_EQ(pp_identical, pp_values);
}

// Decode under CUDA graphs (exclude_routed_experts: a step's work is all on the GPU) against the
// same steps launched kernel by kernel: logits bit-identical at every step, and the graph backend
// really replayed (a capture on a step shape's second step, replays after).
TEST_F(CudaBackendTest, DecodeGraphsAreBitIdenticalToLaunches) {
  ASSERT_NE(TinyModel(), nullptr);
  std::unique_ptr<CudaBackend> b[2];
  for (int k = 0; k < 2; ++k) {
    CudaBackendOptions o;
    o.first_layer = 0;
    o.end_layer = 7;
    o.kv_tokens = 4096;
    o.exclude_routed_experts = true;
    auto r = CudaBackend::Create(TinyModel(), o);
    ASSERT_TRUE(r.ok()) << r.status();
    b[k] = std::move(*r);
  }
  b[0]->set_decode_graphs(false);
  std::vector<int32_t> prompt(37);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(3 + (i * 7) % 90);
  int64_t values = 0, identical = 0;
  std::vector<int32_t> next = {5, 9};
  for (int step = 0; step < 14; ++step) {
    std::vector<StageChunk> batch;
    for (int s = 0; s < 2; ++s) {
      if (step == 0) {
        batch.push_back({static_cast<uint64_t>(s + 1), 0,
                         std::span<const int32_t>(prompt.data(), prompt.size() - s), true, {}});
      } else {
        batch.push_back({static_cast<uint64_t>(s + 1),
                         static_cast<int64_t>(prompt.size()) - s + step - 1,
                         std::span<const int32_t>(&next[s], 1), true, {}});
      }
    }
    StageOutput o[2];
    for (int k = 0; k < 2; ++k) {
      const absl::Status st = b[k]->Run(batch, nullptr, &o[k], nullptr);
      ASSERT_TRUE(st.ok()) << st;
    }
    ASSERT_EQ(o[0].logits.size(), 2u);
    ASSERT_EQ(o[1].logits.size(), 2u);
    for (int s = 0; s < 2; ++s) {
      ASSERT_EQ(o[0].logits[s].size(), o[1].logits[s].size());
      for (size_t j = 0; j < o[0].logits[s].size(); ++j) {
        ++values;
        identical += std::memcmp(&o[0].logits[s][j], &o[1].logits[s][j], 4) == 0;
      }
      next[s] = static_cast<int32_t>(Argmax(o[0].logits[s]));
    }
  }
  std::printf("decode under CUDA graphs vs launched: %lld of %lld logits bit-identical; graphs "
              "captured %lld, replayed %lld (launched backend: %lld)\n",
              static_cast<long long>(identical), static_cast<long long>(values),
              static_cast<long long>(b[1]->graph_captures()),
              static_cast<long long>(b[1]->graph_replays()),
              static_cast<long long>(b[0]->graph_replays()));
  EXPECT_EQ(identical, values);
  EXPECT_GE(b[1]->graph_captures(), 1);
  EXPECT_GE(b[1]->graph_replays(), 6);
  EXPECT_EQ(b[0]->graph_replays(), 0);
}

TEST_F(CudaBackendTest, ChecksReleaseAndCapacity) {
  ASSERT_NE(TinyModel(), nullptr);
  CudaBackendOptions o;
  o.first_layer = 0;
  o.end_layer = 7;
  o.kv_tokens = 40;
  auto b = CudaBackend::Create(TinyModel(), o);
  ASSERT_TRUE(b.ok()) << b.status();
  const std::vector<int32_t> t30(30, 5), t1(1, 7), t20(20, 9);
  StageOutput out;
  ASSERT_TRUE(
      (*b)->Run(std::vector<StageChunk>{{1, 0, t30, true, {}}}, nullptr, &out, nullptr).ok());
  EXPECT_EQ(out.logits.size(), 1u);
  EXPECT_EQ((*b)->Check(std::vector<StageChunk>{{1, 29, t1, true, {}}}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*b)->Check(std::vector<StageChunk>{{2, 0, t20, true, {}}}).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE((*b)->Check(std::vector<StageChunk>{{1, 30, t1, true, {}}}).ok());
  (*b)->Release(1);
  EXPECT_EQ((*b)->kv_usage().sequences, 0);
  EXPECT_TRUE((*b)->Check(std::vector<StageChunk>{{2, 0, t20, true, {}}}).ok());
  EXPECT_GT((*b)->info().weight_bytes, 0);
}

}  // namespace
}  // namespace ss::gpu
