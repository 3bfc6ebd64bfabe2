// The GpuWorker service in-process (cpu backend, tiny-a): malformed plans and requests each get
// an error that names what is wrong, leave the sequences as they were, and the worker keeps
// serving; callers without the cluster token are refused and a second Steps stream cannot take
// a live worker over; the stage-to-stage inbox and its deadline, and the streams' wire form; the
// worker's flag table.
#include "gpu_worker/gpu_worker_service.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/bf16.h"
#include "common/metrics/metrics.h"
#include "common/model/model.h"
#include "common/model/moe.h"
#include "gpu_worker/cpu_backend.h"
#include "gpu_worker/expert_heat.h"
#include "gpu_worker/routed_experts_client.h"
#include "gpu_worker/worker_config.h"
#include "gtest/gtest.h"
#include "tests/gpu_worker/gpu_worker_test_util.h"

namespace ss::gpu {
namespace {

using ::ss::testing_util::TestCredential;
using testing_util::AddChunk;
using testing_util::kTinyA;
using testing_util::Plan;
using testing_util::WorkerClient;
namespace pb = testing_util::pb;

std::shared_ptr<const model::Model> TinyA() {
  static std::shared_ptr<const model::Model> m = [] {
    auto l = model::Model::Load(kTinyA);
    EXPECT_TRUE(l.ok()) << l.status();
    return std::shared_ptr<const model::Model>(std::move(*l));
  }();
  return m;
}

// One worker serving `stage` of `stages` (layers split 0-3 / 4-6 when two) in this process.
struct InProcessWorker {
  std::unique_ptr<GpuWorkerServer> server;
  std::unique_ptr<WorkerClient> client;

  InProcessWorker(int stage, int stages, int64_t kv_tokens, absl::Duration stream_wait,
                  const std::string& next = "") {
    auto s = GpuWorkerServer::Start("127.0.0.1:0", "test", TestCredential());
    EXPECT_TRUE(s.ok()) << s.status();
    server = std::move(*s);
    StageRole role;
    role.worker_id = "test";
    role.stage = stage;
    role.num_stages = stages;
    role.first_layer = stages == 1 || stage == 0 ? 0 : 4;
    role.end_layer = stages == 2 && stage == 0 ? 4 : 7;
    role.next_stage_address = next;
    CpuBackendOptions o;
    o.stage = stage;
    o.num_stages = stages;
    o.first_layer = role.first_layer;
    o.end_layer = role.end_layer;
    o.kv_tokens = kv_tokens;
    LoadedStage ls;
    auto b = CpuBackend::Create(TinyA(), o);
    EXPECT_TRUE(b.ok()) << b.status();
    ls.backend = std::move(*b);
    if (!next.empty()) ls.sender = std::make_unique<StreamSender>(next, TestCredential());
    RunnerOptions ro;
    ro.stream_wait = stream_wait;
    ro.push_deadline = absl::Seconds(2);
    ls.runner = std::make_unique<StageRunner>(ls.backend.get(), role, &server->inbox(),
                                              ls.sender.get(), nullptr, ro);
    server->SetStage(std::move(ls));
    client = std::make_unique<WorkerClient>(absl::StrCat("127.0.0.1:", server->port()));
  }
};

void ExpectError(const pb::StepResult& r, const std::string& part) {
  EXPECT_NE(r.error().find(part), std::string::npos)
      << "error '" << r.error() << "' lacks '" << part << "'";
  EXPECT_EQ(r.samples_size(), 0);
}

TEST(GpuWorkerService, MalformedPlansGetErrorsAndTheWorkerKeepsServing) {
  InProcessWorker w(0, 1, 64, absl::Seconds(1));
  WorkerClient& c = *w.client;
  c.OpenSteps();
  const std::vector<int32_t> prompt = {0, 5, 6, 7, 8};

  pb::StepPlan v = Plan(1);
  v.set_protocol_version(kClusterProtocolVersion + 1);
  AddChunk(&v, 1, 0, prompt);
  pb::StepResult r = c.Step(v);
  EXPECT_EQ(r.micro_batch_id(), 1u);
  ExpectError(r, "protocol version");

  pb::StepPlan unknown = Plan(2);
  AddChunk(&unknown, 42, 3, {1});
  ExpectError(c.Step(unknown), "sequence 42");

  pb::StepPlan range = Plan(3);
  AddChunk(&range, 1, 0, {1, 2, 1024});
  ExpectError(c.Step(range), "token id 1024");
  pb::StepPlan negative = Plan(4);
  AddChunk(&negative, 1, 0, {-1});
  ExpectError(c.Step(negative), "token id -1");

  pb::StepPlan twice = Plan(5);
  AddChunk(&twice, 1, 0, {1});
  AddChunk(&twice, 1, 0, {2});
  ExpectError(c.Step(twice), "twice");

  pb::StepPlan empty = Plan(6);
  AddChunk(&empty, 1, 0, {});
  ExpectError(c.Step(empty), "no tokens");

  pb::StepPlan sampling = Plan(7);
  AddChunk(&sampling, 1, 0, prompt)->mutable_sampling()->set_top_p(2.0f);
  ExpectError(c.Step(sampling), "top_p");

  pb::StepPlan big = Plan(8);
  AddChunk(&big, 1, 0, std::vector<int32_t>(65, 3));
  ExpectError(c.Step(big), "KV capacity");

  // A good prefill, then a start mismatch: refused, and the sequence is untouched, so the right
  // continuation still gives the reference's tokens.
  const auto want = testing_util::ReferenceGreedy(*TinyA(), {prompt}, 3);
  pb::StepPlan prefill = Plan(9);
  AddChunk(&prefill, 1, 0, prompt);
  r = c.Step(prefill);
  ASSERT_EQ(r.error(), "");
  ASSERT_EQ(r.samples_size(), 1);
  EXPECT_EQ(r.samples(0).token(), want[0][0]);
  pb::StepPlan mismatch = Plan(10);
  AddChunk(&mismatch, 1, 4, {r.samples(0).token()});
  ExpectError(c.Step(mismatch), "next position is 5");
  int32_t next = r.samples(0).token();
  for (int s = 1; s < 3; ++s) {
    pb::StepPlan d = Plan(10 + s);
    AddChunk(&d, 1, 4 + s, {next});
    r = c.Step(d);
    ASSERT_EQ(r.error(), "");
    ASSERT_EQ(r.samples_size(), 1);
    next = r.samples(0).token();
    EXPECT_EQ(next, want[0][s]);
  }

  // Logprobs on request; chunks without `samples` give no sample.
  pb::StepPlan lp = Plan(20);
  AddChunk(&lp, 2, 0, {3, 4}, /*samples=*/false);
  AddChunk(&lp, 3, 0, {3, 4})->mutable_sampling()->set_top_logprobs(2);
  r = c.Step(lp);
  ASSERT_EQ(r.error(), "");
  ASSERT_EQ(r.samples_size(), 1);
  EXPECT_EQ(r.samples(0).seq_id(), 3u);
  EXPECT_EQ(r.samples(0).top_size(), 2);
  EXPECT_EQ(r.samples(0).top(0).token(), r.samples(0).token());  // greedy: the most likely
  EXPECT_LT(r.samples(0).logprob(), 0.0f);
  EXPECT_GT(r.compute_us(), 0);

  // A shutdown plan is answered and ends the stream.
  pb::StepPlan down = Plan(30);
  down.set_shutdown(true);
  r = c.Step(down);
  EXPECT_EQ(r.micro_batch_id(), 30u);
  EXPECT_EQ(r.error(), "");
  EXPECT_TRUE(c.CloseSteps().ok());
}

TEST(GpuWorkerService, StatusAndPushStreamsCheckTheProtocolVersion) {
  InProcessWorker w(1, 2, 4096, absl::Seconds(1));
  pb::WorkerStatus st;
  const ::grpc::Status bad = w.client->Status(&st, kClusterProtocolVersion + 7);
  EXPECT_EQ(bad.error_code(), ::grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(bad.error_message().find(std::to_string(kClusterProtocolVersion + 7)),
            std::string::npos);
  ASSERT_TRUE(w.client->Status(&st).ok());
  EXPECT_TRUE(st.ready());
  EXPECT_EQ(st.worker_id(), "test");
  EXPECT_EQ(st.kv_blocks(), 4096 / 128);
  pb::StageStreams msg;
  msg.set_protocol_version(kClusterProtocolVersion + 1);
  msg.set_micro_batch_id(1);
  EXPECT_EQ(w.client->Push(msg).error_code(), ::grpc::StatusCode::FAILED_PRECONDITION);
  msg.set_protocol_version(kClusterProtocolVersion);
  msg.set_rows(2);
  msg.set_width(1024);
  msg.set_streams(std::string(100, '\0'));
  EXPECT_EQ(w.client->Push(msg).error_code(), ::grpc::StatusCode::INVALID_ARGUMENT);
  // bf16 on the wire: 2 bytes a value, so fp32's size is refused, naming the dtype.
  msg.set_bf16(true);
  msg.set_streams(std::string(2 * 1024 * 4, '\0'));
  const ::grpc::Status wrong_size = w.client->Push(msg);
  EXPECT_EQ(wrong_size.error_code(), ::grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(wrong_size.error_message().find("bf16"), std::string::npos)
      << wrong_size.error_message();
}

// Status, Steps and PushStreams refuse a caller without the cluster token (a plain gRPC client)
// or with another one: UNAUTHENTICATED, nothing about the worker in the answer, no plan run, no
// sequence freed, nothing put in the inbox; the coordinator's stream keeps its sequence.
TEST(GpuWorkerService, CallsWithoutTheClusterTokenAreRefused) {
  InProcessWorker w(0, 1, 64, absl::Seconds(1));
  const std::string address = absl::StrCat("127.0.0.1:", w.server->port());
  const std::vector<int32_t> prompt = {0, 5, 6, 7, 8};
  const auto want = testing_util::ReferenceGreedy(*TinyA(), {prompt}, 2);
  WorkerClient& c = *w.client;
  c.OpenSteps();
  pb::StepPlan prefill = Plan(1);
  AddChunk(&prefill, 1, 0, prompt);
  pb::StepResult r = c.Step(prefill);
  ASSERT_EQ(r.error(), "");
  ASSERT_EQ(r.samples_size(), 1);
  EXPECT_EQ(r.samples(0).token(), want[0][0]);

  absl::StatusOr<ClusterCredential> wrong = ClusterCredential::FromToken(std::string(64, '7'));
  ASSERT_TRUE(wrong.ok());
  std::vector<std::unique_ptr<WorkerClient>> strangers;
  strangers.push_back(WorkerClient::Plain(address));
  strangers.push_back(std::make_unique<WorkerClient>(address, *wrong));
  for (auto& s : strangers) {
    pb::WorkerStatus st;
    EXPECT_EQ(s->Status(&st).error_code(), ::grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(st.worker_id(), "");
    EXPECT_FALSE(st.ready());
    pb::StageStreams msg;
    msg.set_protocol_version(kClusterProtocolVersion);
    msg.set_micro_batch_id(77);
    msg.set_error("forged");
    EXPECT_EQ(s->Push(msg).error_code(), ::grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(w.server->inbox().waiting(), 0u);
    s->OpenSteps();
    pb::StepPlan release = Plan(50);
    release.add_release(1);
    s->Send(release);
    EXPECT_EQ(s->FinishSteps().error_code(), ::grpc::StatusCode::UNAUTHENTICATED);
  }
  // The coordinator's sequence is intact: its decode continues the reference.
  pb::StepPlan decode = Plan(2);
  AddChunk(&decode, 1, static_cast<int64_t>(prompt.size()), {r.samples(0).token()});
  r = c.Step(decode);
  ASSERT_EQ(r.error(), "");
  ASSERT_EQ(r.samples_size(), 1);
  EXPECT_EQ(r.samples(0).token(), want[0][1]);
  EXPECT_TRUE(c.CloseSteps().ok());
}

// A second Steps stream (with the token) while one is live is refused with FAILED_PRECONDITION
// after the hand-over wait, and the live stream keeps its sequences; once the live stream is
// closed, or its client goes away (a coordinator that died), the next stream is accepted.
TEST(GpuWorkerService, ASecondStepsStreamCannotTakeALiveWorkerOver) {
  InProcessWorker w(0, 1, 64, absl::Seconds(1));
  const std::string address = absl::StrCat("127.0.0.1:", w.server->port());
  const std::vector<int32_t> prompt = {0, 9, 3};
  const auto want = testing_util::ReferenceGreedy(*TinyA(), {prompt}, 2);
  WorkerClient& first = *w.client;
  first.OpenSteps();
  pb::StepPlan prefill = Plan(1);
  AddChunk(&prefill, 1, 0, prompt);
  pb::StepResult r = first.Step(prefill);
  ASSERT_EQ(r.samples_size(), 1);

  WorkerClient second(address);
  second.OpenSteps();
  pb::StepPlan other = Plan(1);
  AddChunk(&other, 1, 0, {4, 4});
  second.Send(other);
  const absl::Time t0 = absl::Now();
  const ::grpc::Status refused = second.FinishSteps();
  EXPECT_EQ(refused.error_code(), ::grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_GE(absl::Now() - t0, GpuWorkerServer::kStepsHandover - absl::Milliseconds(200));

  pb::StepPlan decode = Plan(2);
  AddChunk(&decode, 1, static_cast<int64_t>(prompt.size()), {r.samples(0).token()});
  r = first.Step(decode);
  ASSERT_EQ(r.error(), "");
  ASSERT_EQ(r.samples_size(), 1);
  EXPECT_EQ(r.samples(0).token(), want[0][1]);
  EXPECT_TRUE(first.CloseSteps().ok());

  // Closed: a new stream is accepted (and starts with no sequences).
  second.OpenSteps();
  pb::StepPlan stale = Plan(3);
  AddChunk(&stale, 1, 4, {1});
  EXPECT_NE(second.Step(stale).error(), "");
  r = second.Step(prefill);
  EXPECT_EQ(r.error(), "");
  // Its client goes away: the next stream is accepted within the hand-over wait.
  second.CancelSteps();
  EXPECT_EQ(second.FinishSteps().error_code(), ::grpc::StatusCode::CANCELLED);
  WorkerClient third(address);
  third.OpenSteps();
  r = third.Step(prefill);
  EXPECT_EQ(r.error(), "");
  EXPECT_EQ(r.samples_size(), 1);
  EXPECT_TRUE(third.CloseSteps().ok());
}

// Streams reach the next stage with the sender's bits: bf16-exact ones (what stages produce,
// signed zeros, infinities, subnormals and NaNs included) travel as bf16, and any other as fp32.
TEST(StageTransfer, StreamsArriveBitExactAsBf16OrFp32) {
  auto s = GpuWorkerServer::Start("127.0.0.1:0", "test", TestCredential());
  ASSERT_TRUE(s.ok()) << s.status();
  StreamSender sender(absl::StrCat("127.0.0.1:", (*s)->port()), TestCredential());
  auto from_bits = [](uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  };
  StageStreamsData exact{2, 4, {}, {}};
  exact.streams = {1.5f,
                   -0.0f,
                   from_bits(0x7f800000u),
                   from_bits(0xff800000u),
                   from_bits(0x00010000u),
                   from_bits(0x7fc10000u),
                   RoundBf16(3.14159f),
                   0.0f};
  StageStreamsData inexact = exact;
  inexact.streams[5] = from_bits(0x3f800001u);  // 1 + 2^-23: not a bf16 value
  std::string packed;
  EXPECT_TRUE(PackBf16(exact.streams, &packed));
  EXPECT_EQ(packed.size(), 16u);
  EXPECT_FALSE(PackBf16(inexact.streams, &packed));
  uint64_t id = 1;
  for (const StageStreamsData* d : {&exact, &inexact}) {
    ASSERT_TRUE(sender.Push(id, *d, absl::Now() + absl::Seconds(10)).ok());
    auto got = (*s)->inbox().Take(id, absl::Now() + absl::Seconds(10));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->rows, 2);
    EXPECT_EQ(got->width, 4);
    ASSERT_EQ(got->streams.size(), d->streams.size());
    EXPECT_EQ(std::memcmp(got->streams.data(), d->streams.data(), 4 * d->streams.size()), 0)
        << "micro-batch " << id;
    ++id;
  }
}

// The grpc transport's two ends as StageLinks (stage_link.h): host memory, unpaired; streams and
// a failure's reason arrive through the inbox, a shape other than the plan's is refused, and a
// skipped micro-batch's streams are dropped when they arrive.
TEST(StageTransfer, GrpcEndsAreStageLinks) {
  auto s = GpuWorkerServer::Start("127.0.0.1:0", "test", TestCredential());
  ASSERT_TRUE(s.ok()) << s.status();
  StreamSender sender(absl::StrCat("127.0.0.1:", (*s)->port()), TestCredential());
  GrpcStageOutput out(&sender);
  GrpcStageInput in(&(*s)->inbox());
  EXPECT_EQ(out.memory(), StageMemory::kHost);
  EXPECT_FALSE(out.paired());
  EXPECT_FALSE(in.paired());
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  const std::vector<float> streams = {1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f};
  ASSERT_TRUE(out.Send(1, 2, 3, streams.data(), {}, deadline).ok());
  absl::StatusOr<StageLink::Received> got = in.Receive(1, 2, 3, deadline);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_FALSE(got->failed);
  ASSERT_NE(got->streams, nullptr);
  EXPECT_EQ(std::memcmp(got->streams, streams.data(), sizeof(float) * streams.size()), 0);

  ASSERT_TRUE(out.Send(2, 2, 3, nullptr, "sequence 7: KV full", deadline).ok());
  got = in.Receive(2, 2, 3, deadline);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->failed);
  EXPECT_EQ(got->failure, "sequence 7: KV full");

  ASSERT_TRUE(out.Send(3, 2, 3, streams.data(), {}, deadline).ok());
  got = in.Receive(3, 3, 2, deadline);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << got.status();

  in.Skip(4);
  ASSERT_TRUE(out.Send(4, 2, 3, streams.data(), {}, deadline).ok());
  EXPECT_EQ((*s)->inbox().waiting(), 0u);
  EXPECT_FALSE(in.Send(5, 2, 3, streams.data(), {}, deadline).ok());
  EXPECT_FALSE(out.Receive(5, 2, 3, deadline).ok());
}

TEST(GpuWorkerService, LaterStageFailsWithoutOrWithBadStreams) {
  InProcessWorker w(1, 2, 4096, absl::Milliseconds(300));
  WorkerClient& c = *w.client;
  c.OpenSteps();
  // No streams ever arrive: the deadline.
  pb::StepPlan p1 = Plan(1);
  AddChunk(&p1, 1, 0, {1, 2});
  ExpectError(c.Step(p1), "did not arrive");
  // The previous stage reports a failure: passed on at once.
  pb::StageStreams failed;
  failed.set_protocol_version(kClusterProtocolVersion);
  failed.set_micro_batch_id(2);
  failed.set_error("layer 1: expert worker gone");
  ASSERT_TRUE(c.Push(failed).ok());
  pb::StepPlan p2 = Plan(2);
  AddChunk(&p2, 1, 0, {1, 2});
  ExpectError(c.Step(p2), "expert worker gone");
  // Streams of the wrong shape for the plan.
  pb::StageStreams wrong;
  wrong.set_protocol_version(kClusterProtocolVersion);
  wrong.set_micro_batch_id(3);
  wrong.set_rows(1);
  wrong.set_width(1024);
  wrong.set_streams(std::string(1024 * 4, '\0'));
  ASSERT_TRUE(c.Push(wrong).ok());
  pb::StepPlan p3 = Plan(3);
  AddChunk(&p3, 1, 0, {1, 2});
  ExpectError(c.Step(p3), "the plan needs [2, 1024]");
  // Streams for an already finished micro-batch are dropped, not kept.
  ASSERT_TRUE(c.Push(wrong).ok());
  EXPECT_EQ(w.server->inbox().waiting(), 0u);
  EXPECT_TRUE(c.CloseSteps().ok());
}

TEST(GpuWorkerService, TwoInProcessStagesMatchTheReference) {
  InProcessWorker s1(1, 2, 4096, absl::Seconds(10));
  InProcessWorker s0(0, 2, 4096, absl::Seconds(10), absl::StrCat("127.0.0.1:", s1.server->port()));
  const std::vector<std::vector<int32_t>> prompts = {{0, 1, 2, 3, 4, 5, 6}, {0, 9}};
  const auto want = testing_util::ReferenceGreedy(*TinyA(), prompts, 4);
  s0.client->OpenSteps();
  s1.client->OpenSteps();
  EXPECT_EQ(testing_util::RunGreedy({s0.client.get(), s1.client.get()}, prompts, 4), want);
  EXPECT_TRUE(s0.client->CloseSteps().ok());
  EXPECT_TRUE(s1.client->CloseSteps().ok());
}

TEST(StageRunner, RecordsLayerLatencyStepsAndKvUsage) {
  metrics::Metrics m;
  CpuBackendOptions o;
  o.end_layer = 7;
  o.kv_tokens = 100;
  auto backend = CpuBackend::Create(TinyA(), o);
  ASSERT_TRUE(backend.ok()) << backend.status();
  StageRole role;
  role.worker_id = "w0";
  role.end_layer = 7;
  WorkerMetrics wm(m, "w0", 0, 7);
  StageRunner runner(backend->get(), role, nullptr, nullptr, &wm, RunnerOptions{});
  pb::StepPlan plan = Plan(1);
  AddChunk(&plan, 1, 0, {0, 1, 2, 3, 4});
  EXPECT_EQ(runner.RunPlan(plan).error(), "");
  pb::StepPlan bad = Plan(2);
  AddChunk(&bad, 1, 0, {5000});
  EXPECT_NE(runner.RunPlan(bad).error(), "");
  const std::string text = m.Serialize();
  for (const char* want :
       {"splitserve:layer_latency_seconds_count{layer=\"6\",part=\"moe_cpu\",worker=\"w0\"} 1",
        "splitserve:layer_latency_seconds_count{layer=\"0\",part=\"attention\",worker=\"w0\"} 1",
        "splitserve:gpu_worker_steps_total{worker=\"w0\"} 2",
        "splitserve:gpu_worker_step_errors_total{worker=\"w0\"} 1",
        "splitserve:gpu_worker_kv_tokens_used{worker=\"w0\"} 5",
        "splitserve:gpu_worker_kv_usage_perc{worker=\"w0\"} 0.05"}) {
    EXPECT_NE(text.find(want), std::string::npos) << want << "\n" << text;
  }
}

TEST(ExpertHeat, CountsEveryChoiceOfItsLayersAndNothingElse) {
  ExpertHeat h(2, 5, 16);
  const int32_t ids[] = {3, 7, 3, model::kSkippedExpert, 16, -2, 0, 15};
  h.Count(2, ids, 8);
  h.Count(4, ids, 2);
  h.Count(1, ids, 8);  // outside the stage's layers
  h.Count(5, ids, 8);
  EXPECT_EQ(h.count(2, 3), 2u);
  EXPECT_EQ(h.count(2, 7), 1u);
  EXPECT_EQ(h.count(2, 0), 1u);
  EXPECT_EQ(h.count(2, 15), 1u);
  EXPECT_EQ(h.count(4, 3), 1u);
  EXPECT_EQ(h.count(4, 7), 1u);
  EXPECT_EQ(h.count(1, 3), 0u);
  EXPECT_EQ(h.count(2, 16), 0u);
  EXPECT_EQ(h.choices(2, ChoicePath::kCpu), 5u);
  EXPECT_EQ(h.choices(4, ChoicePath::kCpu), 2u);
  EXPECT_EQ(h.choices(2, ChoicePath::kGpu), 0u);
  EXPECT_EQ(h.choices(1, ChoicePath::kCpu), 0u);
  h.Count(3, ids, 3, ChoicePath::kGpu);  // 3, 7, 3 served on the GPU
  EXPECT_EQ(h.choices(3, ChoicePath::kGpu), 3u);
  EXPECT_EQ(h.choices(3, ChoicePath::kCpu), 0u);
  EXPECT_EQ(h.count(3, 3), 2u);
  h.Count(3, ids, 3, ChoicePath::kGpu);
  const std::vector<uint64_t> all = h.Snapshot();
  ASSERT_EQ(all.size(), 3u * 16u);
  uint64_t sum = 0;
  for (uint64_t v : all) sum += v;
  EXPECT_EQ(sum, 5u + 2u + 6u);
  EXPECT_EQ(all[2 * 16 + 7], 1u);  // layer 4, expert 7
  h.AddRebalance(2, 100);
  h.AddRebalance(1, 50);
  h.AddCpuRead(7);
  EXPECT_EQ(h.rebalance_swaps(), 3u);
  EXPECT_EQ(h.rebalance_bytes(), 150u);
  EXPECT_EQ(h.cpu_read_bytes(), 7u);
}

// Counts kept elsewhere (the resident path's device counters) arrive through the source at
// Refresh, and a detached source is not called.
TEST(ExpertHeat, ASourceAddsItsCountsAtRefresh) {
  ExpertHeat h(2, 4, 8);
  int calls = 0;
  h.SetSource([&] {
    ++calls;
    h.Add(3, 5, 4, ChoicePath::kGpu);
    h.Add(9, 5, 4, ChoicePath::kGpu);  // outside the layers: ignored
    h.Add(3, 8, 4, ChoicePath::kGpu);  // outside the experts: ignored
  });
  EXPECT_EQ(h.count(3, 5), 0u);
  h.Refresh();
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(h.count(3, 5), 4u);
  EXPECT_EQ(h.choices(3, ChoicePath::kGpu), 4u);
  EXPECT_EQ(h.choices(3, ChoicePath::kCpu), 0u);
  h.SetSource(nullptr);
  h.Refresh();
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(h.count(3, 5), 4u);
}

// The expert client counts each call's choices (here a layer it computes locally), and the
// counters follow the counts at each scrape.
TEST(ExpertHeat, TheClientCountsAndTheMetricsFollow) {
  auto heat = std::make_shared<ExpertHeat>(0, 7, 16);
  ExpertClientOptions o;
  o.heat = heat.get();
  auto client = RoutedExpertsClient::Connect(*TinyA(), {}, o);
  ASSERT_TRUE(client.ok()) << client.status();
  const int64_t T = 2, dim = 256;
  std::vector<float> x(T * dim, 0.5f), out(T * dim);
  const std::vector<int32_t> ids = {1, 5, 9, 5, 5, 2, model::kSkippedExpert, 14};
  const std::vector<float> w(8, 0.25f);
  ASSERT_TRUE((*client)->Compute(3, T, x.data(), ids.data(), w.data(), 4, out.data()).ok());
  EXPECT_EQ(heat->count(3, 5), 3u);
  EXPECT_EQ(heat->count(3, 14), 1u);
  // The CPU read the call's 5 distinct experts (1, 5, 9, 2, 14) whole: the layer is local.
  const int64_t expert_bytes = model::Mxfp4ExpertBytes(TinyA()->config());
  EXPECT_EQ(heat->cpu_read_bytes(), static_cast<uint64_t>(5 * expert_bytes));
  heat->Count(3, ids.data(), 2, ChoicePath::kGpu);  // 1 and 5, as the resident path counts
  metrics::Metrics m;
  ExportExpertHeat(m, "w0", heat);
  EXPECT_NE(
      m.Serialize().find(
          "splitserve:gpu_worker_expert_routed_total{expert=\"5\",layer=\"3\",worker=\"w0\"} 4"),
      std::string::npos);
  ASSERT_TRUE((*client)->Compute(3, T, x.data(), ids.data(), w.data(), 4, out.data()).ok());
  const std::string text = m.Serialize();
  EXPECT_NE(text.find("splitserve:gpu_worker_expert_routed_total{expert=\"5\",layer=\"3\","
                      "worker=\"w0\"} 7"),
            std::string::npos);
  EXPECT_NE(text.find("splitserve:gpu_worker_expert_routed_total{expert=\"0\",layer=\"6\","
                      "worker=\"w0\"} 0"),
            std::string::npos);
  EXPECT_NE(text.find("splitserve:gpu_worker_routed_choices_total{layer=\"3\",path=\"cpu\","
                      "worker=\"w0\"} 14"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("splitserve:gpu_worker_routed_choices_total{layer=\"3\",path=\"gpu\","
                      "worker=\"w0\"} 2"),
            std::string::npos);
  EXPECT_NE(
      text.find(absl::StrCat("splitserve:gpu_worker_expert_cpu_read_bytes_total{worker=\"w0\"} ",
                             10 * expert_bytes)),
      std::string::npos);
  EXPECT_NE(text.find("splitserve:gpu_worker_expert_rebalances_total{worker=\"w0\"} 0"),
            std::string::npos);
}

TEST(GpuWorkerConfig, GpuExpertsAreAutoACountOrAFractionOnTheCudaBackend) {
  WorkerFlags f;
  f.model = kTinyA;
  for (const char* bad : {"-1", "1.5", "x", "nan", "inf", "AUTO", "auto4"}) {
    f.gpu_experts = bad;
    absl::StatusOr<WorkerConfig> r = ParseWorkerConfig(f);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("expected auto, a number"), std::string::npos)
        << r.status();
  }
  for (const char* gpu_only : {"4", "auto"}) {
    f.gpu_experts = gpu_only;
    absl::StatusOr<WorkerConfig> r = ParseWorkerConfig(f);
    ASSERT_FALSE(r.ok()) << gpu_only;  // the cpu backend has no GPU
    EXPECT_NE(r.status().message().find("needs --backend cuda"), std::string::npos) << r.status();
  }
  f.gpu_experts = "0";
  f.gpu_experts_profile = "/p.json";
  EXPECT_FALSE(ParseWorkerConfig(f).ok());  // a profile without experts to place
#ifdef SS_HAVE_CUDA
  f.backend = "cuda";
  f.gpu_experts = "4";
  absl::StatusOr<WorkerConfig> c = ParseWorkerConfig(f);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->gpu_experts, 4);
  EXPECT_EQ(c->gpu_experts_fraction, 0.0);
  EXPECT_EQ(c->gpu_experts_profile, "/p.json");
  f.gpu_experts = "0.25";
  c = ParseWorkerConfig(f);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->gpu_experts, 0);
  EXPECT_EQ(c->gpu_experts_fraction, 0.25);
  EXPECT_EQ(c->gpu_experts_rebalance_s, 10.0);  // on by default
  EXPECT_FALSE(c->gpu_experts_auto);
  f.gpu_experts = "auto";  // with the profile: it places auto's budget
  c = ParseWorkerConfig(f);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->gpu_experts_auto);
  EXPECT_EQ(c->gpu_experts, 0);
  EXPECT_EQ(c->gpu_experts_fraction, 0.0);
  EXPECT_EQ(c->gpu_experts_profile, "/p.json");
  bool described = false;
  for (const std::string& line : c->Describe()) {
    described = described || line ==
                                 "gpu_experts = auto (what the KV pool leaves), placed by "
                                 "/p.json, rebalanced every 10 s";
  }
  EXPECT_TRUE(described);
  f.gpu_experts_rebalance_s = 0;  // never
  ASSERT_TRUE(ParseWorkerConfig(f).ok());
#endif
  f.backend = "cpu";
  f.gpu_experts = "0";
  f.gpu_experts_profile.clear();
  f.gpu_experts_rebalance_s = 30;
  ASSERT_TRUE(ParseWorkerConfig(f).ok());
  for (double bad : {-1.0, 1e9, std::nan("")}) {
    f.gpu_experts_rebalance_s = bad;
    EXPECT_FALSE(ParseWorkerConfig(f).ok()) << bad;
  }
}

// --dummy_router_skew (common/dummy_weights.h): carried into the weight source with --load_format
// dummy; refused with real weights, and when negative or not finite.
TEST(GpuWorkerConfig, DummyRouterSkewNeedsDummyWeights) {
  WorkerFlags f;
  f.model = kTinyA;
  f.dummy_router_skew = 0.2;
  absl::Status st = ParseWorkerConfig(f).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("--dummy_router_skew needs --load_format dummy"), std::string::npos)
      << st;
  f.load_format = "dummy";
  absl::StatusOr<WorkerConfig> c = ParseWorkerConfig(f);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->source.router_skew, 0.2);
  f.dummy_router_skew = -1;
  st = ParseWorkerConfig(f).status();
  EXPECT_NE(st.message().find("--dummy-router-skew -1"), std::string::npos) << st;
  f.dummy_router_skew = std::nan("");
  EXPECT_EQ(ParseWorkerConfig(f).status().code(), absl::StatusCode::kInvalidArgument);
  f.load_format = "auto";
  f.dummy_router_skew = 0;
  c = ParseWorkerConfig(f);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->source.router_skew, 0.0);
}

TEST(GpuWorkerConfig, FlagsAreValidated) {
  WorkerFlags f;
  EXPECT_FALSE(ParseWorkerConfig(f).ok());  // --model missing
  f.model = kTinyA;
  auto c = ParseWorkerConfig(f);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->worker_id, "stage0");
  EXPECT_EQ(c->end_layer, -1);
  EXPECT_EQ(c->source.model_dir, kTinyA);
  EXPECT_EQ(c->source.load_format, LoadFormat::kAuto);
  f.load_format = "dummy";
  f.hf_overrides = R"({"rope_scaling": {"factor": 4}})";
  c = ParseWorkerConfig(f);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->source.dummy());
  EXPECT_EQ(c->source.hf_overrides, f.hf_overrides);
  f.load_format = "pt";
  EXPECT_NE(ParseWorkerConfig(f).status().message().find("--load-format 'pt'"), std::string::npos);
  f.load_format = "auto";
  f.hf_overrides = "{";
  EXPECT_NE(ParseWorkerConfig(f).status().message().find("--hf-overrides"), std::string::npos);
  f.hf_overrides = "";
  f.backend = "cuda";
#ifdef SS_HAVE_CUDA
  EXPECT_TRUE(ParseWorkerConfig(f).ok());  // accepted; a missing device fails at start-up
#else
  EXPECT_EQ(ParseWorkerConfig(f).status().code(), absl::StatusCode::kUnimplemented);
#endif
  // --kv_tokens 0: the cuda backend sizes its pool to the GPU's free memory; the cpu backend
  // has no such size.
  f.kv_tokens = 0;
#ifdef SS_HAVE_CUDA
  EXPECT_TRUE(ParseWorkerConfig(f).ok());
#endif
  f.backend = "cpu";
  EXPECT_EQ(ParseWorkerConfig(f).status().code(), absl::StatusCode::kInvalidArgument);
  f.kv_tokens = -1;
  f.backend = "cuda";
  EXPECT_FALSE(ParseWorkerConfig(f).ok());
  f.kv_tokens = WorkerFlags{}.kv_tokens;
  f.backend = "gpu";
  EXPECT_EQ(ParseWorkerConfig(f).status().code(), absl::StatusCode::kInvalidArgument);
  f.cuda_device = -1;
  f.backend = "cpu";
  EXPECT_FALSE(ParseWorkerConfig(f).ok());
  f.cuda_device = 0;
  EXPECT_EQ(ParseWorkerConfig(f)->fp64_sums, Fp64Sums::kAuto);
  f.fp64_sums = "off";
  EXPECT_EQ(ParseWorkerConfig(f)->fp64_sums, Fp64Sums::kOff);
  f.fp64_sums = "double";
  EXPECT_NE(ParseWorkerConfig(f).status().message().find("--fp64_sums 'double'"),
            std::string::npos);
  f.fp64_sums = "auto";
  f.backend = "cpu";
  f.num_stages = 2;
  f.layers = "0-3";
  EXPECT_NE(ParseWorkerConfig(f).status().message().find("--next_stage"), std::string::npos);
  f.next_stage = "127.0.0.1:5000";
  f.experts = "0-1=shm:a+grpc:10.0.0.2:7000,3=shm:b";
  c = ParseWorkerConfig(f);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->first_layer, 0);
  EXPECT_EQ(c->end_layer, 4);
  ASSERT_EQ(c->experts.size(), 3u);
  EXPECT_EQ(c->experts[1].layer, 1);
  ASSERT_EQ(c->experts[1].endpoints.size(), 2u);
  EXPECT_EQ(c->experts[1].endpoints[1].grpc_address, "10.0.0.2:7000");
  EXPECT_EQ(c->experts[1].endpoints[1].slice_index, 1);
  EXPECT_EQ(c->experts[1].endpoints[1].slice_count, 2);
  EXPECT_EQ(c->experts[2].endpoints[0].shm_name, "b");
  for (const char* bad : {"0-1", "0=tcp:x", "0=grpc:nohost", "0=shm:a,0=shm:b"}) {
    f.experts = bad;
    EXPECT_FALSE(ParseWorkerConfig(f).ok()) << bad;
  }
  f.experts = "";
  f.layers = "0-1,3";
  EXPECT_FALSE(ParseWorkerConfig(f).ok());
  f.layers = "0-3";
  f.coordinator = "127.0.0.1:9";
  EXPECT_FALSE(ParseWorkerConfig(f).ok());  // standalone flags with a coordinator
  WorkerFlags g;
  g.model = kTinyA;
  g.coordinator = "127.0.0.1:9";
  EXPECT_FALSE(ParseWorkerConfig(g).ok());  // --worker_id required
  g.worker_id = "gpu0";
  EXPECT_TRUE(ParseWorkerConfig(g).ok());
  g.kv_tokens = 0;
  EXPECT_FALSE(ParseWorkerConfig(g).ok());
  g.kv_tokens = 16;
  g.tp_size = 2;
  EXPECT_FALSE(ParseWorkerConfig(g).ok());  // the TP rank comes from the coordinator's role
}

TEST(GpuWorkerConfig, StandaloneTpFlags) {
  WorkerFlags f;
  f.model = kTinyA;
  f.tp_size = 2;
  f.tp_rank = 1;
  // The cpu backend runs TP 1 only.
  EXPECT_NE(ParseWorkerConfig(f).status().message().find("TP 1 only"), std::string::npos);
  f.backend = "cuda";
#ifdef SS_HAVE_CUDA
  EXPECT_NE(ParseWorkerConfig(f).status().message().find("--nccl_id_file"), std::string::npos);
  f.nccl_id_file = "/tmp/id";
  auto c = ParseWorkerConfig(f);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->tp_rank, 1);
  EXPECT_EQ(c->tp_size, 2);
  f.tp_rank = 2;
  EXPECT_FALSE(ParseWorkerConfig(f).ok());
  f.tp_rank = 0;
  f.collective_timeout_ms = 0;
  EXPECT_FALSE(ParseWorkerConfig(f).ok());
#endif
}

// Where each step's routed experts ran (StageTimings' streamed fields) becomes the worker's
// per-path counters and the last streamed step's H2D rate and copy-engine busy fraction.
TEST(StageRunner, RecordsTheRoutedExpertsPathOfEachStep) {
  metrics::Metrics m;
  WorkerMetrics wm(m, "w0", 0, 2);
  StageTimings cpu;
  cpu.gpu_prefill_threshold = 58;
  wm.ObserveStep(cpu, 3, 0, 0, true);
  wm.ObserveStep(cpu, 1, 0, 0, true);
  wm.ObserveStep(cpu, 100, 0, 0, false);  // a failed step counts on no path
  StageTimings streamed;
  streamed.experts_streamed = true;
  streamed.streamed_bytes = 4'000'000'000;
  streamed.streamed_copy_seconds = 0.06;
  streamed.streamed_span_seconds = 0.08;
  streamed.gpu_prefill_threshold = 61;
  wm.ObserveStep(streamed, 8192, 0, 0, true);
  std::string text = m.Serialize();
  for (const char* want : {
           "splitserve:gpu_worker_routed_experts_steps_total{path=\"cpu\",worker=\"w0\"} 2",
           "splitserve:gpu_worker_routed_experts_rows_total{path=\"cpu\",worker=\"w0\"} 4",
           "splitserve:gpu_worker_routed_experts_steps_total{path=\"streamed\",worker=\"w0\"} 1",
           "splitserve:gpu_worker_routed_experts_rows_total{path=\"streamed\",worker=\"w0\"} 8192",
           "splitserve:gpu_worker_streamed_bytes_total{worker=\"w0\"} 4000000000",
           "splitserve:gpu_worker_streamed_h2d_gbps{worker=\"w0\"} 50",
           "splitserve:gpu_worker_streamed_copy_busy_ratio{worker=\"w0\"} 0.75",
           "splitserve:gpu_worker_gpu_prefill_threshold_rows{worker=\"w0\"} 61",
       }) {
    EXPECT_NE(text.find(want), std::string::npos) << want << "\n" << text;
  }
  StageTimings never;
  never.gpu_prefill_threshold = std::numeric_limits<int64_t>::max();
  wm.ObserveStep(never, 1, 0, 0, true);
  text = m.Serialize();
  EXPECT_NE(text.find("splitserve:gpu_worker_gpu_prefill_threshold_rows{worker=\"w0\"} +Inf"),
            std::string::npos)
      << text;
}

TEST(GpuWorkerConfig, StreamedPrefillFlags) {
  WorkerFlags f;
  f.model = kTinyA;
  absl::StatusOr<WorkerConfig> c = ParseWorkerConfig(f);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->gpu_prefill_threshold.mode, GpuPrefillThreshold::Mode::kAuto);
  EXPECT_EQ(c->gpu_prefill_ring_bytes, kDefaultGpuPrefillRingMiB << 20);
  auto has_line = [](const WorkerConfig& wc, const std::string& line) {
    for (const std::string& l : wc.Describe()) {
      if (l == line) return true;
    }
    return false;
  };
  EXPECT_TRUE(has_line(*c, "gpu_prefill_threshold = auto (cuda backend only)"));
  EXPECT_TRUE(has_line(*c, absl::StrCat("gpu_prefill_ring = ", kDefaultGpuPrefillRingMiB,
                                        " MiB (cuda backend only)")));
  f.gpu_prefill_threshold = "512";
  f.gpu_prefill_ring_mib = 256;
  c = ParseWorkerConfig(f);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->gpu_prefill_threshold.mode, GpuPrefillThreshold::Mode::kRows);
  EXPECT_EQ(c->gpu_prefill_threshold.rows, 512);
  EXPECT_EQ(c->gpu_prefill_ring_bytes, int64_t{256} << 20);
  f.gpu_prefill_ring_mib = 0;  // no streamed path
  EXPECT_EQ(ParseWorkerConfig(f)->gpu_prefill_ring_bytes, 0);
  EXPECT_TRUE(has_line(*ParseWorkerConfig(f),
                       "gpu_prefill_ring = (none: no streamed path) (cuda backend only)"));
  f.gpu_prefill_ring_mib = 1024;
  f.gpu_prefill_threshold = "off";  // never streams: no ring either
  c = ParseWorkerConfig(f);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->gpu_prefill_threshold.mode, GpuPrefillThreshold::Mode::kOff);
  EXPECT_EQ(c->gpu_prefill_ring_bytes, 0);
  f.gpu_prefill_threshold = "0";
  EXPECT_NE(ParseWorkerConfig(f).status().message().find("--gpu-prefill-threshold '0'"),
            std::string::npos)
      << ParseWorkerConfig(f).status();
  f.gpu_prefill_threshold = "auto";
  f.gpu_prefill_ring_mib = -1;
  EXPECT_EQ(ParseWorkerConfig(f).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(ParseWorkerConfig(f).status().message().find("--gpu_prefill_ring_mib -1"),
            std::string::npos);
}

// CudaBackendOptions::expert_stores from a rank's experts: per remote layer its slices'
// shared-memory names in slice order ("" for gRPC), the layer's slice count; local layers none.
TEST(GpuWorkerConfig, ExpertStoresOfTheRanksSlices) {
  absl::StatusOr<std::vector<LayerExpertsConfig>> all =
      ParseExpertsSpec("0-1=shm:a+grpc:127.0.0.1:5000+shm:c+shm:d,3=shm:e");
  ASSERT_TRUE(all.ok()) << all.status();
  // TP rank 1 of 2 holds slices 1 and 3 of layers 0-1 and none of layer 3's one slice.
  std::map<int64_t, ExpertLayerStores> s = ExpertStoresOf(ExpertSlicesForRank(*all, 1, 2));
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0].shm_names, (std::vector<std::string>{"", "d"}));
  EXPECT_EQ(s[0].slice_count, 4);
  EXPECT_EQ(s[1].shm_names, (std::vector<std::string>{"", "d"}));
  EXPECT_TRUE(s[3].shm_names.empty());
  EXPECT_EQ(s[3].slice_count, 1);
  // TP 1: every slice in order; a layer computed locally has no entry.
  std::vector<LayerExpertsConfig> one = *all;
  one.push_back({7, {}, 0});
  s = ExpertStoresOf(one);
  EXPECT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0].shm_names, (std::vector<std::string>{"a", "", "c", "d"}));
  EXPECT_EQ(s[0].slice_count, 4);
  EXPECT_EQ(s[3].shm_names, (std::vector<std::string>{"e"}));
  EXPECT_EQ(s.count(7), 0u);
}

}  // namespace
}  // namespace ss::gpu
