// The cuda backend (gpu_worker/cuda/cuda_backend.h) against the reference model on tiny-a (label
// gpu; every test skips with a message without a CUDA device).
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
//  * PP: stages [0, 4) + [4, 7) give logits bit-identical to one stage [0, 7);
//  * the reference's double sums in fp32 (Fp64Sums::kOff) give logits bit-identical to double.
// No new kernel is added by the backend (it launches the kernels of gpu_worker/kernels/, whose
// tests assert ptxVersion == 86); the test checks that a step really launched on the device.
#include "gpu_worker/cuda/cuda_backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/model/model.h"
#include "gpu_worker/step_workspace.h"
#include "gtest/gtest.h"
#include "tests/gpu_worker/gpu_test_util.h"
#include "tests/gpu_worker/tiny_schedule.h"

namespace ss::gpu {
namespace {

using cuda::testing_util::GpuTest;
using cuda::testing_util::Report;
using namespace testing_util;  // NOLINT: the shared tiny-a schedule

std::unique_ptr<CudaBackend> Make(int stage, int num_stages, int first, int end) {
  auto b = CudaBackend::Create(TinyModel(), StageOptions(stage, num_stages, first, end));
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

// Greedy chunks (StageChunk::greedy) get their token from the device's argmax: over the
// schedule, with every sampling chunk greedy the tokens equal the host's greedy rule (lowest id of
// the largest logit) on the logits the same steps return without the flag, and no logits come
// back; with one chunk greedy a step returns that chunk's token and every chunk's logits.
TEST_F(CudaBackendTest, GreedyChunksGetTheDevicesArgmax) {
  ASSERT_NE(TinyModel(), nullptr);
  const RefRun& ref = Reference();
  std::unique_ptr<CudaBackend> plain = Make(0, 1, 0, 7), all = Make(0, 1, 0, 7),
                               first = Make(0, 1, 0, 7);
  ASSERT_TRUE(plain && all && first);
  int tokens = 0;
  for (int step = 0; step < kSteps; ++step) {
    const std::vector<StageChunk> batch = Chunks(ref.steps[step]);
    std::vector<StageChunk> greedy = batch, one = batch;
    for (StageChunk& ch : greedy) ch.greedy = ch.samples;
    bool flagged = false;
    for (StageChunk& ch : one) {
      ch.greedy = ch.samples && !flagged;
      flagged = flagged || ch.samples;
    }
    StageOutput op, og, oo;
    ASSERT_TRUE(plain->Run(batch, nullptr, &op, nullptr).ok());
    ASSERT_TRUE(all->Run(greedy, nullptr, &og, nullptr).ok());
    ASSERT_TRUE(first->Run(one, nullptr, &oo, nullptr).ok());
    EXPECT_TRUE(op.tokens.empty());
    ASSERT_EQ(og.tokens.size(), op.logits.size());
    ASSERT_EQ(og.logits.size(), op.logits.size());
    ASSERT_EQ(oo.tokens.size(), op.logits.size());
    for (size_t i = 0; i < op.logits.size(); ++i) {
      const int32_t want = Argmax(op.logits[i]);
      EXPECT_EQ(og.tokens[i], want) << "step " << step << " chunk " << i;
      EXPECT_TRUE(og.logits[i].empty()) << "step " << step << " chunk " << i;
      EXPECT_EQ(oo.tokens[i], i == 0 ? want : -1) << "step " << step << " chunk " << i;
      // Logits come back when some row needs them (here: a second sampling chunk).
      if (op.logits.size() > 1) {
        EXPECT_EQ(oo.logits[i], op.logits[i]) << "step " << step << " chunk " << i;
      } else {
        EXPECT_TRUE(oo.logits[i].empty()) << "step " << step;
      }
      ++tokens;
    }
  }
  std::printf("greedy tokens from the device equal to the host's: %d checked\n", tokens);
  EXPECT_GT(tokens, 0);
}

// The reference's double sums in fp32 (Fp64Sums::kOff, for GPUs with slow FP64) against double
// (kOn) over the tiny-a schedule (a ratio-128 block completes in its prefill, ratio-4 blocks in
// prefill and decode, the indexer's Hadamard every step): every logit bit-identical. And auto
// resolves by this device's FP64 rate as UseFp64Sums says.
TEST_F(CudaBackendTest, Fp32SumsGiveTheDoubleSumsBits) {
  ASSERT_NE(TinyModel(), nullptr);
  const RefRun& ref = Reference();
  std::unique_ptr<CudaBackend> b[2];
  for (int k = 0; k < 2; ++k) {
    CudaBackendOptions o = WholeModelOptions();
    o.fp64_sums = k == 0 ? Fp64Sums::kOn : Fp64Sums::kOff;
    auto r = CudaBackend::Create(TinyModel(), o);
    ASSERT_TRUE(r.ok()) << r.status();
    b[k] = std::move(*r);
  }
  EXPECT_TRUE(b[0]->fp64_sums());
  EXPECT_FALSE(b[1]->fp64_sums());
  int64_t values = 0, identical = 0;
  for (int step = 0; step < kSteps; ++step) {
    const std::vector<StageChunk> batch = Chunks(ref.steps[step]);
    StageOutput o[2];
    for (int k = 0; k < 2; ++k) ASSERT_TRUE(b[k]->Run(batch, nullptr, &o[k], nullptr).ok());
    ASSERT_EQ(o[0].logits.size(), o[1].logits.size());
    for (size_t i = 0; i < o[0].logits.size(); ++i) {
      ASSERT_EQ(o[0].logits[i].size(), o[1].logits[i].size());
      for (size_t j = 0; j < o[0].logits[i].size(); ++j) {
        ++values;
        identical += std::memcmp(&o[0].logits[i][j], &o[1].logits[i][j], 4) == 0;
      }
    }
  }
  int ratio = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&ratio, cudaDevAttrSingleToDoublePrecisionPerfRatio, 0),
            cudaSuccess);
  auto a = CudaBackend::Create(TinyModel(), WholeModelOptions());
  ASSERT_TRUE(a.ok()) << a.status();
  std::printf(
      "fp32 sums vs double sums: %lld of %lld logits bit-identical; FP64 at 1/%d of FP32 "
      "here: auto runs %s\n",
      static_cast<long long>(identical), static_cast<long long>(values), ratio,
      (*a)->fp64_sums() ? "double" : "fp32");
  EXPECT_EQ(identical, values);
  EXPECT_EQ((*a)->fp64_sums(), UseFp64Sums(Fp64Sums::kAuto, ratio));
}

// Routed experts through a provider (as the expert-worker client): RoutedSum on the host's
// reference weights, failing with Unavailable while `fail_layer` names the layer.
class HostExpertsProvider : public model::RoutedExperts {
 public:
  explicit HostExpertsProvider(const model::Model* m) : m_(m) {}
  absl::Status Compute(int64_t layer, int64_t T, const float* x, const int32_t* ids,
                       const float* weights, int top_k, float* out) const override {
    if (layer == fail_layer.load()) return absl::UnavailableError("expert worker gone (test)");
    model::RouterResult r;
    r.indices.assign(ids, ids + T * top_k);
    r.weights.assign(weights, weights + T * top_k);
    model::RoutedSum(m_->weights().blocks[layer].moe, m_->config(), x, r, T, out);
    calls.fetch_add(1);
    return absl::OkStatus();
  }
  std::atomic<int64_t> fail_layer{-1};
  mutable std::atomic<int64_t> calls{0};

 private:
  const model::Model* m_;
};

// Two sequences: a prompt (37 and 36 tokens), then greedy decode steps of one token each.
std::vector<StageChunk> DecodeBatch(int step, const std::vector<int32_t>& prompt,
                                    const std::vector<int32_t>& next, uint64_t first_id = 1) {
  std::vector<StageChunk> batch;
  for (int s = 0; s < 2; ++s) {
    const uint64_t id = first_id + static_cast<uint64_t>(s);
    if (step == 0) {
      batch.push_back(
          {id, 0, std::span<const int32_t>(prompt.data(), prompt.size() - s), true, {}, {}, 0});
    } else {
      batch.push_back({id,
                       static_cast<int64_t>(prompt.size()) - s + step - 1,
                       std::span<const int32_t>(&next[s], 1),
                       true,
                       {},
                       {}});
    }
  }
  return batch;
}

std::vector<int32_t> Prompt() {
  std::vector<int32_t> prompt(37);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(3 + (i * 7) % 90);
  return prompt;
}

// Decode under CUDA graphs against the same steps launched kernel by kernel: logits bit-identical
// at every step, and the graph backend really replayed (a capture on a step shape's second step,
// replays after). Both ways a step can run: all on the GPU (exclude_routed_experts), and as
// production runs it, with the routed experts on the host through a provider (host nodes on a side
// stream) and StageTimings (event nodes), whose figures must then be filled in.
TEST_F(CudaBackendTest, DecodeGraphsAreBitIdenticalToLaunches) {
  ASSERT_NE(TinyModel(), nullptr);
  for (const bool production : {false, true}) {
    SCOPED_TRACE(production ? "host experts + timings" : "GPU only");
    HostExpertsProvider provider(TinyModel().get());
    std::unique_ptr<CudaBackend> b[2];
    for (int k = 0; k < 2; ++k) {
      CudaBackendOptions o = WholeModelOptions();
      o.exclude_routed_experts = !production;
      if (production) o.experts = [&](int64_t) { return &provider; };
      auto r = CudaBackend::Create(TinyModel(), o);
      ASSERT_TRUE(r.ok()) << r.status();
      b[k] = std::move(*r);
    }
    b[0]->set_decode_graphs(false);
    const std::vector<int32_t> prompt = Prompt();
    int64_t values = 0, identical = 0, timed_layers = 0;
    std::vector<int32_t> next = {5, 9};
    for (int step = 0; step < 14; ++step) {
      const std::vector<StageChunk> batch = DecodeBatch(step, prompt, next);
      StageOutput o[2];
      StageTimings t;
      for (int k = 0; k < 2; ++k) {
        const absl::Status st =
            b[k]->Run(batch, nullptr, &o[k], production && k == 1 ? &t : nullptr);
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
      if (production) {
        ASSERT_EQ(t.attention.size(), 7u);
        for (int l = 0; l < 7; ++l) {
          EXPECT_GT(t.attention[l], 0.0) << "step " << step << " layer " << l;
          EXPECT_GT(t.moe_cpu[l], 0.0) << "step " << step << " layer " << l;
          EXPECT_GE(t.moe_gpu[l], 0.0);
          EXPECT_EQ(t.allreduce[l], 0.0);
          ++timed_layers;
        }
      }
    }
    std::printf(
        "%s: decode under CUDA graphs vs launched: %lld of %lld logits bit-identical; "
        "graphs captured %lld, replayed %lld (launched backend: %lld); %lld timed "
        "layers, %lld provider calls\n",
        production ? "host experts + timings" : "GPU only", static_cast<long long>(identical),
        static_cast<long long>(values), static_cast<long long>(b[1]->graph_captures()),
        static_cast<long long>(b[1]->graph_replays()),
        static_cast<long long>(b[0]->graph_replays()), static_cast<long long>(timed_layers),
        static_cast<long long>(provider.calls.load()));
    EXPECT_EQ(identical, values);
    EXPECT_GE(b[1]->graph_captures(), 1);
    EXPECT_GE(b[1]->graph_replays(), 6);
    EXPECT_EQ(b[0]->graph_replays(), 0);
    if (production) {
      EXPECT_EQ(provider.calls.load(), 2 * 14 * 7);
    }
  }
}

// A provider that fails inside a replayed graph: the step returns the provider's error (no hang,
// the later layers' calls skipped), its sequences are released, and the backend serves a new
// batch afterwards, again under graphs.
TEST_F(CudaBackendTest, FailingRoutedExpertsFailTheStepUnderGraphs) {
  ASSERT_NE(TinyModel(), nullptr);
  HostExpertsProvider provider(TinyModel().get());
  CudaBackendOptions o = WholeModelOptions();
  o.experts = [&](int64_t) { return &provider; };
  auto r = CudaBackend::Create(TinyModel(), o);
  ASSERT_TRUE(r.ok()) << r.status();
  CudaBackend& b = **r;
  const std::vector<int32_t> prompt = Prompt();
  std::vector<int32_t> next = {5, 9};
  for (int step = 0; step < 6; ++step) {
    StageOutput out;
    ASSERT_TRUE(b.Run(DecodeBatch(step, prompt, next), nullptr, &out, nullptr).ok());
  }
  ASSERT_GE(b.graph_replays(), 2) << "graphs must be replaying by the failing step";
  provider.fail_layer = 3;
  const int64_t calls = provider.calls.load();
  StageOutput out;
  const absl::Status st = b.Run(DecodeBatch(6, prompt, next), nullptr, &out, nullptr);
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
  EXPECT_NE(st.message().find("expert worker gone"), std::string::npos) << st;
  EXPECT_EQ(provider.calls.load(), calls + 3) << "layers 0-2 called, 4-6 skipped";
  EXPECT_EQ(b.kv_usage().sequences, 0) << "the failed step's sequences are released";
  provider.fail_layer = -1;
  const int64_t replays = b.graph_replays();
  for (int step = 0; step < 4; ++step) {
    const absl::Status again = b.Run(DecodeBatch(step, prompt, next, 11), nullptr, &out, nullptr);
    ASSERT_TRUE(again.ok()) << again;
    ASSERT_EQ(out.logits.size(), 2u);
  }
  EXPECT_GT(b.graph_replays(), replays);
}

TEST_F(CudaBackendTest, ChecksReleaseAndCapacity) {
  ASSERT_NE(TinyModel(), nullptr);
  auto b = CudaBackend::Create(TinyModel(), WholeModelOptions(40));
  ASSERT_TRUE(b.ok()) << b.status();
  const std::vector<int32_t> t30(30, 5), t1(1, 7), t20(20, 9);
  StageOutput out;
  ASSERT_TRUE(
      (*b)->Run(std::vector<StageChunk>{{1, 0, t30, true, {}, {}, 0}}, nullptr, &out, nullptr)
          .ok());
  EXPECT_EQ(out.logits.size(), 1u);
  EXPECT_EQ((*b)->Check(std::vector<StageChunk>{{1, 29, t1, true, {}, {}, 0}}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*b)->Check(std::vector<StageChunk>{{2, 0, t20, true, {}, {}, 0}}).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE((*b)->Check(std::vector<StageChunk>{{1, 30, t1, true, {}, {}, 0}}).ok());
  (*b)->Release(1);
  EXPECT_EQ((*b)->kv_usage().sequences, 0);
  EXPECT_TRUE((*b)->Check(std::vector<StageChunk>{{2, 0, t20, true, {}, {}, 0}}).ok());
  EXPECT_GT((*b)->info().weight_bytes, 0);
}

// kv_tokens 0 sizes the pool to the device's free memory; a capacity that cannot fit is refused
// at Create with the figures, before any pool allocation.
TEST_F(CudaBackendTest, SizesTheKvPoolToTheDevice) {
  ASSERT_NE(TinyModel(), nullptr);
  size_t free_bytes = 0, total_bytes = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total_bytes), cudaSuccess);
  CudaBackendOptions o = WholeModelOptions(40);
  const ModelConfig& c = TinyModel()->config();
  o.kv_tokens = 0;
  o.max_step_tokens = 64;
  const int64_t workspace = StepWorkspaceBytes(c, 1, 0, static_cast<int>(c.n_layers),
                                               o.max_step_tokens, c.max_position_embeddings);
  o.kv_reserve_bytes =
      static_cast<int64_t>(free_bytes) - workspace - (int64_t{256} << 20);  // 256 MiB left
  o.kv_sequences = 2;
  {
    auto b = CudaBackend::Create(TinyModel(), o);
    ASSERT_TRUE(b.ok()) << b.status();
    std::printf("%s; info().kv_tokens %lld\n", (*b)->kv_fit().c_str(),
                static_cast<long long>((*b)->info().kv_tokens));
    EXPECT_GT((*b)->info().kv_tokens, 0);
    EXPECT_EQ((*b)->kv_usage().capacity_tokens, (*b)->info().kv_tokens);
    EXPECT_LE((*b)->info().kv_bytes, int64_t{256} << 20);
    const std::vector<int32_t> t30(30, 5);
    StageOutput out;
    EXPECT_TRUE(
        (*b)->Run(std::vector<StageChunk>{{1, 0, t30, true, {}, {}, 0}}, nullptr, &out, nullptr)
            .ok());
  }
  o.kv_tokens = int64_t{1} << 40;
  o.kv_reserve_bytes = int64_t{3} << 29;
  auto r = CudaBackend::Create(TinyModel(), o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  EXPECT_NE(r.status().message().find("does not fit"), std::string::npos) << r.status();
  std::printf("%s\n", std::string(r.status().message()).c_str());
}

}  // namespace
}  // namespace ss::gpu
