// The GpuWorker service in-process (cpu backend, tiny-a): malformed plans and requests each get
// an error that names what is wrong, leave the sequences as they were, and the worker keeps
// serving; callers without the cluster token are refused and a second Steps stream cannot take
// a live worker over; the stage-to-stage inbox and its deadline, and the streams' wire form; the
// stage runner's metrics. (The worker's flag table: worker_config_test.cc; the expert path's
// statistics: expert_heat_test.cc.)
#include "gpu_worker/gpu_worker_service.h"

#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/bf16.h"
#include "common/metrics/metrics.h"
#include "common/model/model.h"
#include "gpu_worker/cpu_backend.h"
#include "gtest/gtest.h"
#include "tests/gpu_worker/gpu_worker_test_util.h"

namespace ss::gpu {
namespace {

using ::ss::testing_util::TestCredential;
using testing_util::AddChunk;
using testing_util::kTinyA;
using testing_util::Plan;
using testing_util::TinyA;
using testing_util::WorkerClient;
namespace pb = testing_util::pb;

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

// A stage runner of all tiny-a's layers ("w0", KV for 100 tokens) on the cpu backend, with its
// metrics.
struct MeteredRunner {
  explicit MeteredRunner(const RunnerOptions& ro)
      : backend(Backend()),
        wm(m, "w0", 0, 7),
        runner(backend.get(), Role(), nullptr, nullptr, &wm, ro) {}
  static std::unique_ptr<CpuBackend> Backend() {
    CpuBackendOptions o;
    o.end_layer = 7;
    o.kv_tokens = 100;
    auto b = CpuBackend::Create(TinyA(), o);
    EXPECT_TRUE(b.ok()) << b.status();
    return b.ok() ? std::move(*b) : nullptr;
  }
  static StageRole Role() {
    StageRole role;
    role.worker_id = "w0";
    role.end_layer = 7;
    return role;
  }
  metrics::Metrics m;
  std::unique_ptr<CpuBackend> backend;
  WorkerMetrics wm;
  StageRunner runner;
};

TEST(StageRunner, RecordsLayerLatencyStepsAndKvUsage) {
  MeteredRunner r{RunnerOptions{}};
  ASSERT_NE(r.backend, nullptr);
  metrics::Metrics& m = r.m;
  StageRunner& runner = r.runner;
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
        "splitserve:gpu_worker_kv_usage_perc{worker=\"w0\"} 0.05",
        // Both plans' wall time; the backend run and the sampling of the one that ran.
        "splitserve:gpu_worker_step_seconds_count{part=\"total\",worker=\"w0\"} 2",
        "splitserve:gpu_worker_step_seconds_count{part=\"backend\",worker=\"w0\"} 1",
        "splitserve:gpu_worker_step_seconds_count{part=\"sample\",worker=\"w0\"} 1",
        // The cpu backend runs no CUDA graphs.
        "splitserve:gpu_worker_graph_steps_total{how=\"none\",worker=\"w0\"} 1",
        "splitserve:gpu_worker_graph_steps_total{how=\"replayed\",worker=\"w0\"} 0"}) {
    EXPECT_NE(text.find(want), std::string::npos) << want << "\n" << text;
  }
}

// layer_timing_every N: the layers of plans 0, N, 2N, ... (those with chunks) and of every plan
// with a chunk of kAlwaysTimedChunkTokens tokens or more are timed; every step counts in the step
// metrics; 0 times none.
TEST(StageRunner, TimesTheLayersOfEveryNthStep) {
  for (const int every : {0, 1, 3}) {
    SCOPED_TRACE(every);
    RunnerOptions ro;
    ro.layer_timing_every = every;
    MeteredRunner r(ro);
    ASSERT_NE(r.backend, nullptr);
    metrics::Metrics& m = r.m;
    StageRunner& runner = r.runner;
    int32_t next = 0;
    for (int s = 0; s < 7; ++s) {
      pb::StepPlan plan = Plan(s + 1);
      AddChunk(&plan, 1, s == 0 ? 0 : 2 + s,
               s == 0 ? std::vector<int32_t>{0, 1, 2} : std::vector<int32_t>{next});
      const pb::StepResult r = runner.RunPlan(plan);
      ASSERT_EQ(r.error(), "");
      next = r.samples(0).token();
      if (s == 2) runner.RunPlan(Plan(100));  // no chunks: not a step that counts
    }
    // A prefill chunk of kAlwaysTimedChunkTokens tokens (plan 7: not a multiple of 3) is timed too.
    pb::StepPlan prefill = Plan(8);
    AddChunk(&prefill, 2, 0, std::vector<int32_t>(kAlwaysTimedChunkTokens, 1));
    ASSERT_EQ(runner.RunPlan(prefill).error(), "");
    // A decode batch of kAlwaysTimedChunkTokens one-token chunks (plan 8) is timed only when
    // sampled.
    pb::StepPlan batch = Plan(9);
    batch.add_release(1);
    batch.add_release(2);
    for (int q = 0; q < kAlwaysTimedChunkTokens; ++q) AddChunk(&batch, 10 + q, 0, {1});
    ASSERT_EQ(runner.RunPlan(batch).error(), "");
    const int timed = every == 0 ? 0 : (7 + every - 1) / every + 1 + (8 % every == 0 ? 1 : 0);
    const std::string text = m.Serialize();
    for (const std::string& want :
         {absl::StrCat("splitserve:layer_latency_seconds_count{layer=\"0\",part=\"attention\","
                       "worker=\"w0\"} ",
                       timed),
          std::string(
              "splitserve:gpu_worker_step_seconds_count{part=\"backend\",worker=\"w0\"} 9")}) {
      EXPECT_NE(text.find(want), std::string::npos) << want << "\n" << text;
    }
  }
}

// Where each step's routed experts ran (StageTimings' streamed fields) becomes the worker's
// per-path counters and the last streamed step's H2D rate and copy-engine busy fraction.
TEST(StageRunner, RecordsTheRoutedExpertsPathOfEachStep) {
  metrics::Metrics m;
  WorkerMetrics wm(m, "w0", 0, 2);
  StageTimings cpu;
  cpu.gpu_prefill_threshold = 58;
  wm.ObserveStep(cpu, 3, {}, true);
  wm.ObserveStep(cpu, 1, {}, true);
  wm.ObserveStep(cpu, 100, {}, false);  // a failed step counts on no path
  StageTimings streamed;
  streamed.experts_streamed = true;
  streamed.streamed_bytes = 4'000'000'000;
  streamed.streamed_copy_seconds = 0.06;
  streamed.streamed_span_seconds = 0.08;
  streamed.gpu_prefill_threshold = 61;
  wm.ObserveStep(streamed, 8192, {}, true);
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
  wm.ObserveStep(never, 1, {}, true);
  text = m.Serialize();
  EXPECT_NE(text.find("splitserve:gpu_worker_gpu_prefill_threshold_rows{worker=\"w0\"} +Inf"),
            std::string::npos)
      << text;
}

}  // namespace
}  // namespace ss::gpu
