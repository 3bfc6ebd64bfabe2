// Shared by the GPU-worker service tests: a client of the GpuWorker service acting as the
// coordinator (Status, one Steps stream), plan builders, and the reference model's greedy
// continuation the workers must reproduce bit for bit.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "common/cluster_protocol.h"
#include "common/model/model.h"
#include "gtest/gtest.h"
#include "proto/cluster.grpc.pb.h"
#include "tests/cluster_credential_util.h"

namespace ss::gpu::testing_util {

namespace pb = ::splitserve::v1;

inline constexpr char kTinyA[] = "tests/data/tiny-a";

// tiny-a's model, loaded once per test binary.
inline std::shared_ptr<const model::Model> TinyA() {
  static const std::shared_ptr<const model::Model> m = [] {
    auto l = model::Model::Load(kTinyA);
    EXPECT_TRUE(l.ok()) << l.status();
    return l.ok() ? std::shared_ptr<const model::Model>(std::move(*l)) : nullptr;
  }();
  return m;
}

// The coordinator's view of one worker; its calls carry `credential` (the tests' cluster token
// by default).
class WorkerClient {
 public:
  explicit WorkerClient(const std::string& address,
                        const ClusterCredential& credential = ss::testing_util::TestCredential())
      : stub_(pb::GpuWorker::NewStub(credential.CreateChannel(address))) {}
  // A client with no token at all: a plain gRPC channel.
  static std::unique_ptr<WorkerClient> Plain(const std::string& address) {
    auto c = std::make_unique<WorkerClient>(address);
    c->stub_ = pb::GpuWorker::NewStub(
        ::grpc::CreateChannel(address, ::grpc::InsecureChannelCredentials()));
    return c;
  }

  ::grpc::Status Status(pb::WorkerStatus* out, uint32_t version = kClusterProtocolVersion) {
    pb::StatusRequest req;
    req.set_protocol_version(version);
    ::grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    return stub_->Status(&ctx, req, out);
  }

  // Polls Status until ready (or a start-up error, or `timeout`).
  pb::WorkerStatus WaitReady(absl::Duration timeout = absl::Seconds(60)) {
    const absl::Time until = absl::Now() + timeout;
    pb::WorkerStatus st;
    while (absl::Now() < until) {
      st.Clear();
      if (Status(&st).ok() && (st.ready() || !st.error().empty())) return st;
      absl::SleepFor(absl::Milliseconds(20));
    }
    ADD_FAILURE() << "worker not ready within the timeout";
    return st;
  }

  ::grpc::Status Push(const pb::StageStreams& msg) {
    ::grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    pb::PushReply reply;
    return stub_->PushStreams(&ctx, msg, &reply);
  }

  void OpenSteps() {
    steps_ctx_ = std::make_unique<::grpc::ClientContext>();
    steps_ = stub_->Steps(steps_ctx_.get());
  }
  bool Send(const pb::StepPlan& plan) { return steps_->Write(plan); }
  pb::StepResult Receive() {
    pb::StepResult r;
    EXPECT_TRUE(steps_->Read(&r)) << "the Steps stream closed";
    return r;
  }
  pb::StepResult Step(const pb::StepPlan& plan) {
    EXPECT_TRUE(Send(plan));
    return Receive();
  }
  // Ends the stream as a client that went away does.
  void CancelSteps() { steps_ctx_->TryCancel(); }
  // Closes the stream whatever its state and returns its status (a refused stream's reason).
  ::grpc::Status FinishSteps() {
    steps_->WritesDone();
    pb::StepResult extra;
    while (steps_->Read(&extra)) {
    }
    const ::grpc::Status st = steps_->Finish();
    steps_.reset();
    steps_ctx_.reset();
    return st;
  }
  ::grpc::Status CloseSteps() {
    steps_->WritesDone();
    pb::StepResult extra;
    EXPECT_FALSE(steps_->Read(&extra)) << "an unexpected result after the last plan";
    const ::grpc::Status st = steps_->Finish();
    steps_.reset();
    steps_ctx_.reset();
    return st;
  }

 private:
  std::unique_ptr<pb::GpuWorker::Stub> stub_;
  std::unique_ptr<::grpc::ClientContext> steps_ctx_;
  std::unique_ptr<::grpc::ClientReaderWriter<pb::StepPlan, pb::StepResult>> steps_;
};

inline pb::SeqChunk* AddChunk(pb::StepPlan* plan, uint64_t seq, int64_t start,
                              const std::vector<int32_t>& tokens, bool samples = true) {
  pb::SeqChunk* c = plan->add_chunks();
  c->set_seq_id(seq);
  c->set_start(start);
  for (int32_t t : tokens) c->add_tokens(t);
  c->set_samples(samples);
  c->mutable_sampling()->set_temperature(0.0f);
  c->mutable_sampling()->set_top_logprobs(-1);
  return c;
}

inline pb::StepPlan Plan(uint64_t micro_batch_id) {
  pb::StepPlan p;
  p.set_protocol_version(kClusterProtocolVersion);
  p.set_micro_batch_id(micro_batch_id);
  return p;
}

// Argmax with the lowest id on ties (the sampler's greedy rule).
inline int32_t Argmax(const std::vector<float>& logits) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[best]) best = static_cast<int32_t>(i);
  }
  return best;
}

// The reference model's greedy continuation of each prompt: `steps` tokens per prompt (the
// first from the prefill), all prompts batched in one Forward per step.
inline std::vector<std::vector<int32_t>> ReferenceGreedy(
    const model::Model& m, const std::vector<std::vector<int32_t>>& prompts, int steps) {
  std::vector<model::SequenceState> states;
  for (size_t i = 0; i < prompts.size(); ++i) states.push_back(m.NewSequence());
  std::vector<std::vector<int64_t>> inputs;
  for (const auto& p : prompts) inputs.emplace_back(p.begin(), p.end());
  std::vector<std::vector<int32_t>> out(prompts.size());
  for (int s = 0; s < steps; ++s) {
    std::vector<model::ChunkRef> chunks;
    for (size_t i = 0; i < prompts.size(); ++i) {
      chunks.push_back({&states[i], inputs[i].data(), static_cast<int64_t>(inputs[i].size()), 0});
    }
    auto logits = m.Forward(chunks);
    EXPECT_TRUE(logits.ok()) << logits.status();
    if (!logits.ok()) return out;
    for (size_t i = 0; i < prompts.size(); ++i) {
      const int32_t t = Argmax((*logits)[i]);
      out[i].push_back(t);
      inputs[i] = {t};
    }
  }
  return out;
}

}  // namespace ss::gpu::testing_util

namespace ss::gpu::testing_util {

// Acts as the coordinator for a pipeline of workers (stage order): every plan goes to every
// worker; the last one's samples are the tokens. A prefill of every prompt (seq ids 1, 2, ...),
// then steps - 1 one-token decode steps. Every result must be error-free and carry its plan's id.
inline std::vector<std::vector<int32_t>> RunGreedy(std::vector<WorkerClient*> stages,
                                                   const std::vector<std::vector<int32_t>>& prompts,
                                                   int steps, uint64_t first_micro_batch = 1) {
  std::vector<std::vector<int32_t>> out(prompts.size());
  std::vector<int64_t> pos(prompts.size(), 0);
  for (int s = 0; s < steps; ++s) {
    pb::StepPlan plan = Plan(first_micro_batch + s);
    for (size_t i = 0; i < prompts.size(); ++i) {
      AddChunk(&plan, i + 1, pos[i], s == 0 ? prompts[i] : std::vector<int32_t>{out[i].back()});
    }
    for (WorkerClient* w : stages) EXPECT_TRUE(w->Send(plan));
    pb::StepResult last;
    for (size_t k = 0; k < stages.size(); ++k) {
      pb::StepResult r = stages[k]->Receive();
      EXPECT_EQ(r.micro_batch_id(), plan.micro_batch_id());
      EXPECT_EQ(r.error(), "") << "stage " << k << ", step " << s;
      if (k + 1 < stages.size()) {
        EXPECT_EQ(r.samples_size(), 0);
      }
      last = r;
    }
    EXPECT_EQ(last.samples_size(), static_cast<int>(prompts.size())) << "step " << s;
    if (last.samples_size() != static_cast<int>(prompts.size())) return out;
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(last.samples(i).seq_id(), i + 1);
      out[i].push_back(last.samples(i).token());
      pos[i] += plan.chunks(i).tokens_size();
    }
  }
  return out;
}

}  // namespace ss::gpu::testing_util
