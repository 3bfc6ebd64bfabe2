// The stage runner under the nccl stage transport (stage_runner.h, stage_link.h), without a GPU:
// a host-memory link with the real link's pairing rules (one message per plan with chunks, in
// order, the receiver checking the micro-batch id) and the cpu backend behind a wrapper that
// keeps its streams in "device" (here: host) memory as bf16. Two stages of tiny-a then match the
// reference; a micro-batch either end fails still consumes its message, so the next one runs; and
// ends that are out of step break the link, which the runner reports.
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/bf16.h"
#include "common/model/model.h"
#include "common/status.h"
#include "gpu_worker/cpu_backend.h"
#include "gpu_worker/stage_link.h"
#include "gpu_worker/stage_runner.h"
#include "gtest/gtest.h"
#include "tests/gpu_worker/forwarding_cpu_backend.h"
#include "tests/gpu_worker/gpu_worker_test_util.h"

namespace ss::gpu {
namespace {

using testing_util::AddChunk;
using testing_util::Plan;
namespace pb = testing_util::pb;

using testing_util::TinyA;

// One link's two ends over a queue.
struct HostLinkState {
  struct Message {
    uint64_t id = 0;
    int64_t rows = 0, width = 0;
    std::vector<uint16_t> data;
    bool failed = false;
  };
  absl::Mutex mu;
  std::deque<Message> queue ABSL_GUARDED_BY(mu);
  bool broken ABSL_GUARDED_BY(mu) = false;
  int sent ABSL_GUARDED_BY(mu) = 0;
};

class HostLink : public StageLink {
 public:
  HostLink(std::shared_ptr<HostLinkState> s) : s_(std::move(s)) {}
  StageMemory memory() const override { return StageMemory::kDevice; }
  bool paired() const override { return true; }
  absl::Status Send(uint64_t id, int64_t rows, int64_t width, const void* streams,
                    std::string_view failure, absl::Time) override {
    const bool failed = !failure.empty();
    absl::MutexLock l(&s_->mu);
    if (s_->broken) return absl::FailedPreconditionError("broken");
    // As NcclStageLink: every message has the plan's size, failed or not.
    EXPECT_GT(rows, 0);
    EXPECT_GT(width, 0);
    HostLinkState::Message m{id, rows, width, {}, failed};
    if (!failed) {
      const auto* p = static_cast<const uint16_t*>(streams);
      m.data.assign(p, p + rows * width);
    }
    s_->queue.push_back(std::move(m));
    ++s_->sent;
    return absl::OkStatus();
  }
  absl::StatusOr<Received> Receive(uint64_t id, int64_t rows, int64_t width,
                                   absl::Time deadline) override {
    absl::MutexLock l(&s_->mu);
    if (s_->broken) return absl::FailedPreconditionError("broken");
    auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(s_->mu) { return !s_->queue.empty(); };
    if (!s_->mu.AwaitWithDeadline(absl::Condition(&ready), deadline)) {
      s_->broken = true;
      return absl::DeadlineExceededError("no message");
    }
    held_ = std::move(s_->queue.front());
    s_->queue.pop_front();
    if (held_.id != id || held_.rows != rows || held_.width != width) {
      s_->broken = true;
      return absl::DataLossError(absl::StrCat("expected micro-batch ", id, " [", rows, ", ", width,
                                              "], got ", held_.id, " [", held_.rows, ", ",
                                              held_.width, "]: out of step"));
    }
    Received r;
    r.rows = held_.rows;
    r.width = held_.width;
    r.streams = held_.data.data();
    r.failed = held_.failed;
    return r;
  }
  void Abort() override {
    absl::MutexLock l(&s_->mu);
    s_->broken = true;
  }

 private:
  std::shared_ptr<HostLinkState> s_;
  HostLinkState::Message held_;
};

// The cpu backend with its streams as bf16 in "device" memory (host memory here).
class DeviceStreamsCpuBackend : public testing_util::ForwardingCpuBackend {
 public:
  static std::unique_ptr<DeviceStreamsCpuBackend> Make(int stage, int64_t kv_tokens) {
    CpuBackendOptions o;
    o.stage = stage;
    o.num_stages = 2;
    o.first_layer = stage == 0 ? 0 : 4;
    o.end_layer = stage == 0 ? 4 : 7;
    o.kv_tokens = kv_tokens;
    auto b = CpuBackend::Create(TinyA(), o);
    EXPECT_TRUE(b.ok()) << b.status();
    return std::unique_ptr<DeviceStreamsCpuBackend>(new DeviceStreamsCpuBackend(std::move(*b)));
  }
  absl::Status RunDevice(std::span<const StageChunk> batch, const void* streams_in,
                         StageOutput* out, StageTimings* t) override {
    std::vector<float> in;
    if (streams_in != nullptr) {
      int64_t T = 0;
      for (const StageChunk& c : batch) T += static_cast<int64_t>(c.tokens.size());
      const auto* p = static_cast<const uint16_t*>(streams_in);
      for (int64_t i = 0; i < T * config().hc_mult * config().dim; ++i) {
        in.push_back(Bf16ToFloat(p[i]));
      }
    }
    RETURN_IF_ERROR(inner_->Run(batch, in.empty() ? nullptr : in.data(), out, t));
    if (!out->streams.empty()) {
      device_.clear();
      for (float v : out->streams) {
        const uint16_t b = FloatToBf16(v);
        EXPECT_EQ(Bf16ToFloat(b), v) << "stage outputs are bf16 values";
        device_.push_back(b);
      }
      out->streams.clear();
      out->device_streams = device_.data();
    }
    return absl::OkStatus();
  }

 private:
  explicit DeviceStreamsCpuBackend(std::unique_ptr<CpuBackend> inner)
      : ForwardingCpuBackend(std::move(inner)) {}
  std::vector<uint16_t> device_;
};

struct LinkedPipeline {
  std::shared_ptr<HostLinkState> state = std::make_shared<HostLinkState>();
  HostLink out{state}, in{state};
  std::unique_ptr<DeviceStreamsCpuBackend> b0, b1;
  std::unique_ptr<StageRunner> r0, r1;
  std::vector<std::string> broken0, broken1;

  explicit LinkedPipeline(int64_t kv0 = 4096, int64_t kv1 = 4096) {
    b0 = DeviceStreamsCpuBackend::Make(0, kv0);
    b1 = DeviceStreamsCpuBackend::Make(1, kv1);
    StageRole role;
    role.num_stages = 2;
    role.end_layer = 4;
    role.stage_transport = "nccl";
    RunnerOptions o;
    o.stream_wait = absl::Milliseconds(200);
    o.on_link_broken = [this](const std::string& why) { broken0.push_back(why); };
    r0 = std::make_unique<StageRunner>(b0.get(), role, nullptr, nullptr, nullptr, o,
                                       StageLinks{nullptr, &out});
    role.stage = 1;
    role.first_layer = 4;
    role.end_layer = 7;
    o.on_link_broken = [this](const std::string& why) { broken1.push_back(why); };
    r1 = std::make_unique<StageRunner>(b1.get(), role, nullptr, nullptr, nullptr, o,
                                       StageLinks{&in, nullptr});
  }
  // Both stages run the plan, stage 0 first (the link buffers); returns stage 1's result.
  std::pair<pb::StepResult, pb::StepResult> Run(const pb::StepPlan& p) {
    pb::StepResult a = r0->RunPlan(p);
    pb::StepResult b = r1->RunPlan(p);
    return {a, b};
  }
  int Sent() {
    absl::MutexLock l(&state->mu);
    return state->sent;
  }
};

TEST(StageLinkRunner, TwoLinkedStagesMatchTheReference) {
  LinkedPipeline p;
  const std::vector<std::vector<int32_t>> prompts = {{0, 1, 2, 3, 4, 5, 6}, {0, 9}};
  const auto want = testing_util::ReferenceGreedy(*TinyA(), prompts, 4);
  std::vector<std::vector<int32_t>> got(prompts.size());
  std::vector<int64_t> pos(prompts.size(), 0);
  for (int s = 0; s < 4; ++s) {
    pb::StepPlan plan = Plan(s + 1);
    for (size_t i = 0; i < prompts.size(); ++i) {
      AddChunk(&plan, i + 1, pos[i], s == 0 ? prompts[i] : std::vector<int32_t>{got[i].back()});
      pos[i] += plan.chunks(i).tokens_size();
    }
    auto [a, b] = p.Run(plan);
    ASSERT_EQ(a.error(), "");
    ASSERT_EQ(b.error(), "");
    ASSERT_EQ(b.samples_size(), 2);
    for (size_t i = 0; i < prompts.size(); ++i) got[i].push_back(b.samples(i).token());
  }
  EXPECT_EQ(got, want);
  EXPECT_EQ(p.Sent(), 4);
  // A plan without chunks sends nothing.
  pb::StepPlan empty = Plan(5);
  empty.add_release(1);
  auto [a, b] = p.Run(empty);
  EXPECT_EQ(a.error() + b.error(), "");
  EXPECT_EQ(p.Sent(), 4);
  EXPECT_TRUE(p.broken0.empty() && p.broken1.empty());
}

TEST(StageLinkRunner, AFailedMicroBatchStillPairsItsMessage) {
  // Each end fails a micro-batch the other runs (its KV capacity of 8 tokens); the next
  // micro-batch then runs on both: the ends are still paired.
  for (const bool sender_fails : {true, false}) {
    SCOPED_TRACE(sender_fails ? "stage 0 fails" : "stage 1 fails");
    LinkedPipeline p(sender_fails ? 8 : 4096, sender_fails ? 4096 : 8);
    pb::StepPlan big = Plan(1);
    AddChunk(&big, 1, 0, std::vector<int32_t>(12, 3));
    auto [a1, b1] = p.Run(big);
    if (sender_fails) {
      EXPECT_NE(a1.error(), "");
      // Stage 1 learns it from the link's `failed` message.
      EXPECT_NE(b1.error().find("previous stage failed micro-batch 1"), std::string::npos)
          << b1.error();
    } else {
      EXPECT_EQ(a1.error(), "");
      EXPECT_NE(b1.error().find("KV"), std::string::npos) << b1.error();
    }
    pb::StepPlan ok = Plan(2);
    AddChunk(&ok, 2, 0, {0, 1, 2});
    auto [a2, b2] = p.Run(ok);
    EXPECT_EQ(a2.error(), "");
    EXPECT_EQ(b2.error(), "");
    EXPECT_EQ(b2.samples_size(), 1);
    EXPECT_EQ(p.Sent(), 2);
    EXPECT_TRUE(p.broken0.empty() && p.broken1.empty());
  }
}

TEST(StageLinkRunner, EndsOutOfStepBreakTheLink) {
  LinkedPipeline p;
  pb::StepPlan p1 = Plan(1), p2 = Plan(2);
  AddChunk(&p1, 1, 0, {0, 1});
  AddChunk(&p2, 2, 0, {0, 1});
  // Stage 0 runs micro-batch 1, stage 1 receives for micro-batch 2.
  EXPECT_EQ(p.r0->RunPlan(p1).error(), "");
  const pb::StepResult r = p.r1->RunPlan(p2);
  EXPECT_NE(r.error().find("out of step"), std::string::npos) << r.error();
  ASSERT_EQ(p.broken1.size(), 1u);
  // Nothing arrives at all: the deadline breaks it too (a new link, as after a restart).
  LinkedPipeline q;
  const pb::StepResult late = q.r1->RunPlan(p1);
  EXPECT_NE(late.error().find("no message"), std::string::npos) << late.error();
  EXPECT_EQ(q.broken1.size(), 1u);
  // The cpu backend itself keeps no streams on a device.
  CpuBackendOptions o;
  o.end_layer = 7;
  o.kv_tokens = 64;
  auto cpu = CpuBackend::Create(TinyA(), o);
  ASSERT_TRUE(cpu.ok());
  StageOutput out;
  std::vector<StageChunk> none;
  EXPECT_EQ((*cpu)->RunDevice(none, nullptr, &out, nullptr).code(),
            absl::StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace ss::gpu
