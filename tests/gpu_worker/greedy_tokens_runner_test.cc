// The stage runner with a backend that returns greedy chunks' tokens itself (StageChunk::greedy,
// StageOutput::tokens; the cuda backend's argmax on the device), without a GPU: the cpu backend
// behind a wrapper that answers the greedy chunks with a token and an empty logits row. Only a
// plain greedy chunk (sampler.h IsPlainGreedy, no allowed mask, no banned ids) is flagged; the
// runner samples a flagged chunk as the backend says and every other chunk from its logits; a
// backend that answers neither way fails the step with a clear error.
#include <memory>
#include <vector>

#include "common/status.h"
#include "gpu_worker/cpu_backend.h"
#include "gpu_worker/sampler.h"
#include "gpu_worker/stage_runner.h"
#include "gtest/gtest.h"
#include "tests/gpu_worker/forwarding_cpu_backend.h"
#include "tests/gpu_worker/gpu_worker_test_util.h"

namespace ss::gpu {
namespace {

using testing_util::AddChunk;
using testing_util::Plan;
using testing_util::TinyA;
namespace pb = testing_util::pb;

enum class Answer { kToken, kShiftedToken, kNothing, kRecord };

// One stage of every tiny-a layer.
CpuBackendOptions Options() {
  CpuBackendOptions o;
  o.end_layer = static_cast<int>(TinyA()->config().n_layers);
  o.kv_tokens = 4096;
  return o;
}

// The cpu backend; its greedy chunks answered per `answer`: the argmax (kToken), the argmax + 1
// (kShiftedToken: shows whose token the runner takes), or -1 without logits (kNothing); or no
// chunk answered and the logits kept (kRecord).
class GreedyTokensBackend : public testing_util::ForwardingCpuBackend {
 public:
  explicit GreedyTokensBackend(Answer answer) : ForwardingCpuBackend(Cpu()), answer_(answer) {}
  static std::unique_ptr<CpuBackend> Cpu() {
    auto b = CpuBackend::Create(TinyA(), Options());
    EXPECT_TRUE(b.ok()) << b.status();
    return b.ok() ? std::move(*b) : nullptr;
  }
  absl::Status Run(std::span<const StageChunk> batch, const float* in, StageOutput* out,
                   StageTimings* t) override {
    RETURN_IF_ERROR(inner_->Run(batch, in, out, t));
    flags_.clear();
    if (answer_ == Answer::kRecord) {
      logits_ = out->logits;
      return absl::OkStatus();
    }
    size_t row = 0;
    for (const StageChunk& ch : batch) {
      if (!ch.samples) continue;
      flags_.push_back(ch.greedy);
      out->tokens.push_back(-1);
      if (ch.greedy) {
        const int32_t best = testing_util::Argmax(out->logits[row]);
        out->tokens.back() = answer_ == Answer::kToken          ? best
                             : answer_ == Answer::kShiftedToken ? best + 1
                                                                : -1;
        out->logits[row].clear();
      }
      ++row;
    }
    return absl::OkStatus();
  }
  std::vector<bool> flags_;                 // the last Run's `greedy` per sampling chunk
  std::vector<std::vector<float>> logits_;  // kRecord: the last Run's logits

 private:
  Answer answer_;
};

// Four sampling chunks: plain greedy; greedy with logprobs; greedy with a banned id; temperature.
pb::StepPlan MixedPlan(uint64_t mb) {
  pb::StepPlan plan = Plan(mb);
  AddChunk(&plan, 1, 0, {0, 1, 2, 3});
  AddChunk(&plan, 2, 0, {4, 5})->mutable_sampling()->set_top_logprobs(2);
  AddChunk(&plan, 3, 0, {6, 7, 8})->add_banned_tokens(0);
  pb::SeqChunk* c = AddChunk(&plan, 4, 0, {9});
  c->mutable_sampling()->set_temperature(0.7f);
  c->mutable_sampling()->set_seed(11);
  c->mutable_sampling()->set_has_seed(true);
  return plan;
}

std::vector<int32_t> Tokens(const pb::StepResult& r) {
  std::vector<int32_t> t;
  for (const pb::Sample& s : r.samples()) t.push_back(s.token());
  return t;
}

struct Runner {
  explicit Runner(Answer a)
      : backend(a), runner(&backend, StageRole{}, nullptr, nullptr, nullptr, RunnerOptions{}) {}
  GreedyTokensBackend backend;
  StageRunner runner;
};

TEST(GreedyTokensRunner, OnlyPlainGreedyChunksAreFlaggedAndTheirTokenIsTheBackends) {
  Runner plain(Answer::kToken), shifted(Answer::kShiftedToken);
  const pb::StepResult a = plain.runner.RunPlan(MixedPlan(1));
  ASSERT_EQ(a.error(), "");
  EXPECT_EQ(plain.backend.flags_, (std::vector<bool>{true, false, false, false}));
  const pb::StepResult b = shifted.runner.RunPlan(MixedPlan(1));
  ASSERT_EQ(b.error(), "");
  const std::vector<int32_t> ta = Tokens(a), tb = Tokens(b);
  ASSERT_EQ(ta.size(), 4u);
  ASSERT_EQ(tb.size(), 4u);
  EXPECT_EQ(tb[0], ta[0] + 1);  // the backend's token, not the host's argmax
  for (size_t i = 1; i < 4; ++i) EXPECT_EQ(tb[i], ta[i]) << "chunk " << i;
  // The logprobs chunk still gets its logprobs from the host sampler.
  EXPECT_EQ(a.samples(1).top_size(), 2);
  EXPECT_EQ(a.samples(0).top_size(), 0);
}

TEST(GreedyTokensRunner, TheBackendsTokenEqualsTheHostSamplersGreedyToken) {
  // The same prompts through the plain cpu backend (no tokens: the host samples every chunk).
  Runner tokens(Answer::kToken);
  auto cpu = CpuBackend::Create(TinyA(), Options());
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  StageRunner host(cpu->get(), StageRole{}, nullptr, nullptr, nullptr, RunnerOptions{});
  EXPECT_EQ(Tokens(tokens.runner.RunPlan(MixedPlan(1))), Tokens(host.RunPlan(MixedPlan(1))));
}

TEST(GreedyTokensRunner, ABackendWithNeitherTokenNorLogitsFailsTheStep) {
  Runner r(Answer::kNothing);
  const pb::StepResult res = r.runner.RunPlan(MixedPlan(1));
  EXPECT_NE(res.error().find("returned no logits"), std::string::npos) << res.error();
  EXPECT_EQ(res.samples_size(), 0);
}

// Many sampled chunks in one step (drawn in parallel over the chunks): each token and logprob
// is SampleToken's on that chunk's logits, in the plan's order.
TEST(GreedyTokensRunner, ManySampledChunksDrawWhatEachDrawsAlone) {
  Runner r(Answer::kRecord);
  pb::StepPlan plan = Plan(1);
  constexpr int kChunks = 12;
  for (int i = 0; i < kChunks; ++i) {
    pb::SeqChunk* c = AddChunk(&plan, 10 + i, 0, {i % 7, (3 * i) % 11, 5});
    c->mutable_sampling()->set_temperature(0.5f + 0.1f * static_cast<float>(i));
    c->mutable_sampling()->set_seed(1000 + i);
    c->mutable_sampling()->set_has_seed(true);
    if (i % 3 == 0) c->mutable_sampling()->set_top_p(0.9f);
    if (i % 4 == 1) c->mutable_sampling()->set_top_logprobs(3);
  }
  const pb::StepResult res = r.runner.RunPlan(plan);
  ASSERT_EQ(res.error(), "");
  ASSERT_EQ(res.samples_size(), kChunks);
  ASSERT_EQ(r.backend.logits_.size(), static_cast<size_t>(kChunks));
  for (int i = 0; i < kChunks; ++i) {
    const pb::SamplingParams& p = plan.chunks(i).sampling();
    SamplingConfig cfg;
    cfg.temperature = p.temperature();
    cfg.top_p = p.top_p();
    cfg.seed = p.seed();
    cfg.top_logprobs = p.top_logprobs();
    const auto want = SampleToken(r.backend.logits_[i].data(),
                                  static_cast<int64_t>(r.backend.logits_[i].size()), cfg, 2, {});
    ASSERT_TRUE(want.ok()) << want.status();
    EXPECT_EQ(res.samples(i).seq_id(), static_cast<uint64_t>(10 + i));
    EXPECT_EQ(res.samples(i).token(), want->token) << "chunk " << i;
    ASSERT_EQ(res.samples(i).top_size(), static_cast<int>(want->top.size())) << "chunk " << i;
    if (cfg.top_logprobs >= 0) {
      EXPECT_EQ(res.samples(i).logprob(), want->logprob);
    }
  }
}

}  // namespace
}  // namespace ss::gpu
