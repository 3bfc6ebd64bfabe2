// The coordinator's cluster layer: the control plane (registration, rendezvous, heartbeats) and
// the ClusterEngine driving GPU workers' step streams (the cluster config itself:
// cluster_config_test.cc). The workers here are in-process fakes speaking proto/cluster.proto,
// whose "model" is predictable (the next token is the previous one + 1), so every planned chunk
// and every delivered token is checked.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cluster_protocol.h"
#include "common/model_config.h"
#include "coordinator/cluster_config.h"
#include "coordinator/cluster_engine.h"
#include "coordinator/control_service.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/cluster_credential_util.h"
#include "tests/coordinator/cluster_test_util.h"

namespace ss::coord {
namespace {

namespace pb = splitserve::v1;
using ::ss::testing_util::TestCredential;
using testing_util::kTwoStages;
using testing_util::TinyModel;

// ---- A fake GPU worker: next token = previous + 1 (skipping EOS), EOS after token 100 ----

class FakeWorker final : public pb::GpuWorker::Service {
 public:
  // `progress`: the count its heartbeats carry (the fixture's), raised by its busy steps.
  FakeWorker(std::string id, bool sampler, int64_t kv_blocks,
             std::atomic<uint64_t>* progress = nullptr)
      : id_(std::move(id)), sampler_(sampler), kv_blocks_(kv_blocks), progress_(progress) {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    b.RegisterService(this);
    server_ = b.BuildAndStart();
  }
  ~FakeWorker() override { server_->Shutdown(std::chrono::system_clock::now()); }

  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

  grpc::Status Status(grpc::ServerContext*, const pb::StatusRequest*,
                      pb::WorkerStatus* out) override {
    out->set_protocol_version(kClusterProtocolVersion);
    out->set_worker_id(id_);
    out->set_ready(true);
    out->set_kv_blocks(kv_blocks_);
    return grpc::Status::OK;
  }

  grpc::Status Steps(grpc::ServerContext* ctx,
                     grpc::ServerReaderWriter<pb::StepResult, pb::StepPlan>* stream) override {
    std::map<uint64_t, std::vector<int32_t>> seqs;  // a new stream starts with no sequences
    pb::StepPlan plan;
    while (stream->Read(&plan)) {
      ++plans_;
      pb::StepResult r;
      r.set_micro_batch_id(plan.micro_batch_id());
      for (uint64_t id : plan.release()) seqs.erase(id);
      for (const pb::SeqChunk& c : plan.chunks()) {
        std::vector<int32_t>& s = seqs[c.seq_id()];
        if (c.start() == 0) s.clear();
        if (static_cast<int64_t>(s.size()) != c.start()) {
          r.set_error("seq " + std::to_string(c.seq_id()) + " starts at " +
                      std::to_string(c.start()) + " but holds " + std::to_string(s.size()));
        }
        s.insert(s.end(), c.tokens().begin(), c.tokens().end());
        max_chunks_ = std::max<int>(max_chunks_, plan.chunks_size());
        if (sampler_ && c.samples()) {
          const int32_t last = s.back();
          int32_t next = last == 100 ? 1 : (last + 1) % 1024;
          if (next == 1 && last != 100) next = 2;
          // A mask or bans move the draw to the next id they allow (wrapping), as a model whose
          // likeliest ids were removed would.
          auto allowed = [&](int32_t id) {
            const std::string& m = c.allowed_tokens();
            if (!m.empty() && !((static_cast<uint8_t>(m[id / 8]) >> (id % 8)) & 1)) return false;
            return std::find(c.banned_tokens().begin(), c.banned_tokens().end(), id) ==
                   c.banned_tokens().end();
          };
          for (int k = 0; k < 1024 && !allowed(next); ++k) next = (next + 1) % 1024;
          if (!c.allowed_tokens().empty())
            mask_bytes_ = static_cast<int>(c.allowed_tokens().size());
          pb::Sample* smp = r.add_samples();
          smp->set_seq_id(c.seq_id());
          smp->set_token(next);
          if (c.sampling().top_logprobs() >= 0) {
            smp->set_logprob(-0.5f);
            for (int k = 0; k < c.sampling().top_logprobs(); ++k) {
              pb::TokenLogprob* t = smp->add_top();
              t->set_token(next + k);
              t->set_logprob(-0.5f - k);
            }
          }
        }
      }
      // Wire ids carry the connection epoch above bit 40 (cluster_engine.cc).
      const int64_t mb = static_cast<int64_t>(plan.micro_batch_id() & ((uint64_t{1} << 40) - 1));
      if (fail_micro_batch_.load() == mb) {
        r.set_error("injected failure");
        r.clear_samples();
      }
      if (die_.load()) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "worker died");
      // A slow step: busy (its progress rises, as a real worker's does per layer) or hung.
      for (int ms = 0; ms < delay_ms_.load(); ms += 10) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        if (busy_.load() && progress_ != nullptr) ++*progress_;
      }
      if (!stream->Write(r)) break;
      if (ctx->IsCancelled()) break;
    }
    return grpc::Status::OK;
  }
  grpc::Status PushStreams(grpc::ServerContext*, const pb::StageStreams*, pb::PushReply*) override {
    return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "fake");
  }

  std::atomic<int64_t> fail_micro_batch_{-1};
  std::atomic<bool> die_{false};
  std::atomic<int> delay_ms_{0};
  std::atomic<bool> busy_{false};  // its slow steps make progress
  std::atomic<int> plans_{0};
  std::atomic<int> max_chunks_{0};
  std::atomic<int> mask_bytes_{0};  // the size of the last allowed_tokens mask seen

 private:
  std::string id_;
  bool sampler_;
  int64_t kv_blocks_;
  std::atomic<uint64_t>* progress_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

// The control service on a loopback port, the config's fake workers registered with heartbeats
// (the last stage's TP rank 0 samples).
class ClusterFixture : public ::testing::Test {
 protected:
  virtual const char* ConfigText() const { return kTwoStages; }

  void SetUp() override {
    model_ = TinyModel();
    absl::StatusOr<ClusterConfig> c = ParseClusterConfig(ConfigText(), model_);
    ASSERT_TRUE(c.ok()) << c.status();
    ids_ = c->GpuWorkerIds();
    const std::string sampler = c->stages.back().workers.front();
    control_ = std::make_unique<ControlService>(*c, TestCredential(), absl::Seconds(5));
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &control_port_);
    b.RegisterService(control_.get());
    control_server_ = b.BuildAndStart();
    stub_ = pb::Coordinator::NewStub(TestCredential().CreateChannel(ControlAddress()));
    progress_ = std::make_unique<std::atomic<uint64_t>[]>(ids_.size());
    for (size_t i = 0; i < ids_.size(); ++i) {
      workers_.push_back(std::make_unique<FakeWorker>(
          ids_[i], ids_[i] == sampler, i + 1 == ids_.size() ? 48 : 64, &progress_[i]));
    }
    for (auto& w : workers_) ASSERT_TRUE(RegisterWorker(w.get()).ok());
    heartbeats_ = std::thread([this] {
      while (!stop_.load()) {
        for (size_t i = 0; i < ids_.size(); ++i) {
          const std::string& id = ids_[i];
          if (silent_.load() == id) continue;
          if (ticking_.load() == static_cast<int>(i)) ++progress_[i];
          grpc::ClientContext ctx;
          pb::HeartbeatRequest req;
          req.set_protocol_version(kClusterProtocolVersion);
          req.set_worker_id(id);
          req.set_progress(progress_[i].load());
          pb::HeartbeatReply rep;
          stub_->Heartbeat(&ctx, req, &rep);
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    });
  }
  void TearDown() override {
    if (engine_) engine_->Stop();
    stop_.store(true);
    if (heartbeats_.joinable()) heartbeats_.join();
    control_->Shutdown();
    control_server_->Shutdown(std::chrono::system_clock::now());
  }

  std::string ControlAddress() const { return "127.0.0.1:" + std::to_string(control_port_); }

  grpc::Status RegisterWorker(FakeWorker* w, uint32_t version = kClusterProtocolVersion,
                              const char* id = nullptr, const char* backend = nullptr,
                              pb::Coordinator::Stub* stub = nullptr,
                              pb::RegisterReply* reply = nullptr) {
    grpc::ClientContext ctx;
    pb::RegisterRequest req;
    req.set_protocol_version(version);
    std::string name = id ? id : "";
    for (size_t i = 0; i < workers_.size() && name.empty(); ++i) {
      if (workers_[i].get() == w) name = ids_[i];
    }
    req.set_worker_id(name);
    req.set_address(w->address());
    req.set_backend(backend ? backend : (ids_.size() > 2 ? "cuda" : "cpu"));
    pb::RegisterReply rep;
    return (stub ? stub : stub_.get())->Register(&ctx, req, reply ? reply : &rep);
  }

  void StartEngine(absl::Duration stall_timeout = absl::Seconds(10),
                   absl::Duration step_timeout = absl::Seconds(20)) {
    ClusterEngineOptions o;
    o.step_timeout = step_timeout;
    o.stall_timeout = stall_timeout;
    engine_ = std::make_unique<ClusterEngine>(*control_, model_, o);
    engine_->Start();
    ASSERT_TRUE(WaitReady());
  }
  bool WaitReady() {
    for (int i = 0; i < 500 && !engine_->Ready(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return engine_->Ready();
  }

  struct Outcome {
    std::vector<int32_t> tokens;
    std::vector<TokenLogprobs> logprobs;
    FinishReason finish = FinishReason::kNone;
    std::string error;
  };
  static Outcome Drain(GenerationStream& s) {
    Outcome o;
    for (int i = 0; i < 2000 && o.finish == FinishReason::kNone; ++i) {
      std::optional<GenerationEvent> e = s.Next(std::chrono::milliseconds(10));
      if (!e) continue;
      o.tokens.insert(o.tokens.end(), e->tokens.begin(), e->tokens.end());
      o.logprobs.insert(o.logprobs.end(), e->logprobs.begin(), e->logprobs.end());
      o.finish = e->finish;
      o.error = e->error;
    }
    return o;
  }
  std::shared_ptr<GenerationStream> Submit(std::vector<int32_t> prompt, int max_tokens,
                                           std::shared_ptr<CancellationToken> cancel = nullptr,
                                           std::vector<int32_t> stop_ids = {}) {
    GenerationRequest r;
    r.prompt = std::move(prompt);
    r.sampling.temperature = 0;
    r.sampling.max_tokens = max_tokens;
    r.sampling.stop_token_ids = std::move(stop_ids);
    r.cancel = cancel ? cancel : std::make_shared<CancellationToken>();
    SubmitOutcome out = engine_->Submit(std::move(r));
    EXPECT_EQ(out.status, SubmitStatus::kAccepted);
    return out.stream;
  }
  // Worker `i` dies while a long request runs (its steps slowed so that it is still running);
  // returns that request's outcome.
  Outcome DieMidRequest(int i) {
    workers_[i]->delay_ms_.store(10);
    auto s = Submit({30}, 200);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    workers_[i]->die_.store(true);
    return Drain(*s);
  }
  // Worker `i` comes back as a restarted process would: serving, at full speed, registered again.
  void Revive(int i) {
    workers_[i]->die_.store(false);
    workers_[i]->delay_ms_.store(0);
    ASSERT_TRUE(RegisterWorker(workers_[i].get()).ok()) << ids_[i];
  }

  ModelConfig model_;
  std::unique_ptr<ControlService> control_;
  int control_port_ = 0;
  std::unique_ptr<grpc::Server> control_server_;
  std::unique_ptr<pb::Coordinator::Stub> stub_;
  // Each worker's step progress (the initial workers raise theirs while busy), sent with its
  // heartbeats; the worker at index ticking_ raises it with every heartbeat. Declared before the
  // workers, which point at it.
  std::unique_ptr<std::atomic<uint64_t>[]> progress_;
  std::atomic<int> ticking_{-1};
  std::vector<std::unique_ptr<FakeWorker>> workers_;
  std::unique_ptr<ClusterEngine> engine_;
  std::thread heartbeats_;
  std::atomic<bool> stop_{false};
  std::atomic<const char*> silent_{""};
  std::vector<std::string> ids_;
};

TEST_F(ClusterFixture, RegistrationChecksVersionIdAndLiveness) {
  EXPECT_EQ(RegisterWorker(workers_[0].get(), kClusterProtocolVersion + 1).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(RegisterWorker(workers_[0].get(), kClusterProtocolVersion, "gpu7").error_code(),
            grpc::StatusCode::NOT_FOUND);
  // gpu0 is registered and heartbeating: a second process with its id is refused.
  EXPECT_EQ(RegisterWorker(workers_[0].get()).error_code(), grpc::StatusCode::ALREADY_EXISTS);
  const std::vector<MemberInfo> m = control_->Members();
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[1].address, workers_[1]->address());
  EXPECT_TRUE(control_->WaitAllAlive(absl::Seconds(1)));
}

// A supervisor restarts a killed worker before its heartbeats go stale: the new process is
// accepted because the old one no longer answers, and the engine serves with it.
TEST_F(ClusterFixture, ARestartedWorkerReplacesOneThatNoLongerAnswers) {
  workers_[1] = std::make_unique<FakeWorker>(ids_[1], true, 48);  // the old one's server is gone
  ASSERT_TRUE(RegisterWorker(workers_[1].get()).ok());
  const std::vector<MemberInfo> m = control_->Members();
  EXPECT_EQ(m[1].generation, 2u);
  EXPECT_EQ(m[1].address, workers_[1]->address());
  EXPECT_FALSE(m[1].dead);
  StartEngine();
  Outcome o = Drain(*Submit({20}, 3));
  EXPECT_EQ(o.tokens, (std::vector<int32_t>{21, 22, 23}));
  // Restarted while the engine serves: it reconnects to the new process.
  workers_[1] = std::make_unique<FakeWorker>(ids_[1], true, 48);
  ASSERT_TRUE(RegisterWorker(workers_[1].get()).ok());
  for (int i = 0; i < 100 && engine_->Ready(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(WaitReady());
  Outcome again = Drain(*Submit({40}, 3));
  EXPECT_EQ(again.tokens, (std::vector<int32_t>{41, 42, 43}));
}

// A micro-batch unanswered for stall_timeout (a stopped or hung worker) makes the engine not
// ready until it is answered.
TEST_F(ClusterFixture, AStalledMicroBatchMakesTheEngineNotReady) {
  StartEngine(absl::Milliseconds(300));
  workers_[0]->delay_ms_.store(1500);
  auto s = Submit({10}, 1);
  bool not_ready = false;
  for (int i = 0; i < 100 && !not_ready; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    not_ready = !engine_->Ready();
  }
  EXPECT_TRUE(not_ready);
  workers_[0]->delay_ms_.store(0);
  Outcome o = Drain(*s);
  EXPECT_EQ(o.tokens, (std::vector<int32_t>{11}));
  EXPECT_TRUE(engine_->Ready());
}

// A micro-batch that takes longer than both timeouts while its worker keeps making progress (a
// long prefill on slow expert workers) is no stall: the engine stays ready and it is answered.
TEST_F(ClusterFixture, ALongMicroBatchWhoseWorkerProgressesIsNotAStall) {
  StartEngine(absl::Milliseconds(300), absl::Milliseconds(800));
  workers_[0]->busy_.store(true);
  workers_[0]->delay_ms_.store(1500);
  auto s = Submit({10}, 1);
  Outcome o;
  int not_ready = 0;
  for (int i = 0; i < 400 && o.finish == FinishReason::kNone; ++i) {
    if (!engine_->Ready()) ++not_ready;
    if (std::optional<GenerationEvent> e = s->Next(std::chrono::milliseconds(10))) {
      o.tokens.insert(o.tokens.end(), e->tokens.begin(), e->tokens.end());
      o.finish = e->finish;
      o.error = e->error;
    }
  }
  EXPECT_EQ(not_ready, 0);
  EXPECT_EQ(o.finish, FinishReason::kLength) << o.error;
  EXPECT_EQ(o.tokens, (std::vector<int32_t>{11}));
  EXPECT_TRUE(engine_->Ready());
}

// A worker hung inside a step (no progress) stalls its micro-batch after stall_timeout and fails
// it after step_timeout, naming the worker -- even while a worker that has already answered the
// micro-batch keeps making progress.
TEST_F(ClusterFixture, AHungWorkerStallsAndFailsItsMicroBatchWithoutProgress) {
  StartEngine(absl::Milliseconds(300), absl::Milliseconds(900));
  ticking_.store(1);
  workers_[0]->delay_ms_.store(2000);
  const auto t0 = std::chrono::steady_clock::now();
  auto s = Submit({10}, 1);
  bool not_ready = false;
  for (int i = 0; i < 80 && !not_ready; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    not_ready = !engine_->Ready();
  }
  EXPECT_TRUE(not_ready);
  Outcome o = Drain(*s);
  EXPECT_EQ(o.finish, FinishReason::kError);
  EXPECT_NE(o.error.find("made no progress"), std::string::npos) << o.error;
  EXPECT_NE(o.error.find(ids_[0]), std::string::npos) << o.error;
  EXPECT_EQ(o.error.find(ids_[1]), std::string::npos) << o.error;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(1900));
}

TEST_F(ClusterFixture, TimeoutsMustExceedTwoHeartbeatIntervals) {
  ClusterEngineOptions o;  // the config heartbeats every 50 ms
  o.stall_timeout = absl::Milliseconds(100);
  o.step_timeout = absl::Milliseconds(100);
  EXPECT_TRUE(CheckEngineOptions(o, control_->config()).ok());
  o.stall_timeout = absl::Milliseconds(99);
  EXPECT_EQ(CheckEngineOptions(o, control_->config()).code(), absl::StatusCode::kInvalidArgument);
  o.stall_timeout = absl::Seconds(10);
  o.step_timeout = absl::Milliseconds(60);
  EXPECT_EQ(CheckEngineOptions(o, control_->config()).code(), absl::StatusCode::kInvalidArgument);
}

// Every control-plane call without the cluster token (a plain gRPC client) or with another one
// is refused with UNAUTHENTICATED and changes nothing: a Register of a live or a stalled worker's
// id takes nothing over and reveals no role (expert segment names), a Rendezvous does not count
// as the worker's, and heartbeats do not keep a silent worker alive. The silent worker, once
// declared dead, registers again with the token (a restarted process rejoins).
TEST_F(ClusterFixture, ControlPlaneRefusesCallsWithoutTheClusterToken) {
  absl::StatusOr<ClusterCredential> wrong = ClusterCredential::FromToken(std::string(64, 'f'));
  ASSERT_TRUE(wrong.ok());
  std::vector<std::unique_ptr<pb::Coordinator::Stub>> strangers;
  strangers.push_back(pb::Coordinator::NewStub(
      grpc::CreateChannel(ControlAddress(), grpc::InsecureChannelCredentials())));
  strangers.push_back(pb::Coordinator::NewStub(wrong->CreateChannel(ControlAddress())));
  const std::vector<MemberInfo> before = control_->Members();
  silent_.store("gpu1");
  FakeWorker impostor("impostor", false, 64);
  for (auto& stranger : strangers) {
    for (const char* id : {"gpu0", "gpu1"}) {
      pb::RegisterReply reply;
      const grpc::Status st =
          RegisterWorker(&impostor, kClusterProtocolVersion, id, nullptr, stranger.get(), &reply);
      EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << id;
      EXPECT_EQ(st.error_message().find("seg0"), std::string::npos) << st.error_message();
      EXPECT_FALSE(reply.has_role());
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
    pb::RendezvousRequest rreq;
    rreq.set_protocol_version(kClusterProtocolVersion);
    rreq.set_worker_id("gpu0");
    pb::RendezvousReply rrep;
    EXPECT_EQ(stranger->Rendezvous(&ctx, rreq, &rrep).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(rrep.peers_size(), 0);
  }
  // gpu0's Rendezvous was not counted: gpu1's (with the token) still waits for it.
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(300));
    pb::RendezvousRequest rreq;
    rreq.set_protocol_version(kClusterProtocolVersion);
    rreq.set_worker_id("gpu1");
    pb::RendezvousReply rrep;
    EXPECT_EQ(stub_->Rendezvous(&ctx, rreq, &rrep).error_code(),
              grpc::StatusCode::DEADLINE_EXCEEDED);
  }
  // Forged heartbeats for the silent gpu1 do not keep it a member.
  std::vector<std::string> dead;
  for (int i = 0; i < 100 && dead.empty(); ++i) {
    for (auto& stranger : strangers) {
      grpc::ClientContext ctx;
      pb::HeartbeatRequest req;
      req.set_protocol_version(kClusterProtocolVersion);
      req.set_worker_id("gpu1");
      pb::HeartbeatReply rep;
      EXPECT_EQ(stranger->Heartbeat(&ctx, req, &rep).error_code(),
                grpc::StatusCode::UNAUTHENTICATED);
      EXPECT_FALSE(rep.member());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    dead = control_->CheckHeartbeats();
  }
  EXPECT_EQ(dead, std::vector<std::string>{"gpu1"});
  const std::vector<MemberInfo> after = control_->Members();
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_EQ(after[i].address, before[i].address) << after[i].id;
    EXPECT_EQ(after[i].generation, before[i].generation) << after[i].id;
  }
  EXPECT_FALSE(after[0].dead);
  // Dead, gpu1 may register again -- with the token only.
  EXPECT_EQ(
      RegisterWorker(&impostor, kClusterProtocolVersion, "gpu1", nullptr, strangers.front().get())
          .error_code(),
      grpc::StatusCode::UNAUTHENTICATED);
  silent_.store("");
  pb::RegisterReply reply;
  ASSERT_TRUE(
      RegisterWorker(workers_[1].get(), kClusterProtocolVersion, nullptr, nullptr, nullptr, &reply)
          .ok());
  EXPECT_TRUE(reply.has_role());
  EXPECT_EQ(control_->Members()[1].generation, before[1].generation + 1);
  EXPECT_TRUE(control_->WaitAllAlive(absl::Seconds(1)));
}

TEST_F(ClusterFixture, RendezvousWaitsForEveryWorker) {
  pb::RendezvousReply reply0;
  std::thread first([&] {
    grpc::ClientContext ctx;
    pb::RendezvousRequest req;
    req.set_protocol_version(kClusterProtocolVersion);
    req.set_worker_id("gpu0");
    EXPECT_TRUE(stub_->Rendezvous(&ctx, req, &reply0).ok());
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(reply0.peers_size(), 0);  // still blocked: gpu1 has not met
  grpc::ClientContext ctx;
  pb::RendezvousRequest req;
  req.set_protocol_version(kClusterProtocolVersion);
  req.set_worker_id("gpu1");
  pb::RendezvousReply reply1;
  ASSERT_TRUE(stub_->Rendezvous(&ctx, req, &reply1).ok());
  first.join();
  ASSERT_EQ(reply1.peers_size(), 2);
  EXPECT_EQ(reply1.peers(1).address(), workers_[1]->address());
  EXPECT_EQ(reply1.peers(1).stage(), 1);
  EXPECT_EQ(reply1.nccl_ids_size(), 0);  // TP 1: no groups
  EXPECT_EQ(reply0.peers_size(), 2);

  // A TP 1 worker has no group to publish an id for.
  grpc::ClientContext ctx2;
  pb::NcclGroupId* g = req.add_nccl_ids();
  g->set_group(TpGroupName(1));
  g->set_unique_id(std::string(kNcclUniqueIdBytes, 'x'));
  EXPECT_EQ(stub_->Rendezvous(&ctx2, req, &reply1).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(ClusterFixture, SilentWorkerIsDeclaredDeadAndMayRegisterAgain) {
  silent_.store("gpu1");
  std::vector<std::string> dead;
  for (int i = 0; i < 100 && dead.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    dead = control_->CheckHeartbeats();
  }
  ASSERT_EQ(dead, std::vector<std::string>{"gpu1"});
  grpc::ClientContext ctx;
  pb::HeartbeatRequest req;
  req.set_protocol_version(kClusterProtocolVersion);
  req.set_worker_id("gpu1");
  pb::HeartbeatReply rep;
  ASSERT_TRUE(stub_->Heartbeat(&ctx, req, &rep).ok());
  EXPECT_FALSE(rep.member());
  EXPECT_TRUE(RegisterWorker(workers_[1].get()).ok());
  EXPECT_EQ(control_->Members()[1].generation, 2u);
}

TEST_F(ClusterFixture, GeneratesStopsAndFinishesLikeTheModel) {
  StartEngine();
  EXPECT_EQ(engine_->KvBlocks(), 48);  // the smallest pool
  Outcome a = Drain(*Submit({10, 11, 12}, 5));
  EXPECT_EQ(a.tokens, (std::vector<int32_t>{13, 14, 15, 16, 17}));
  EXPECT_EQ(a.finish, FinishReason::kLength);
  Outcome b = Drain(*Submit({97, 98}, 10));  // 99, 100, then EOS (not delivered)
  EXPECT_EQ(b.tokens, (std::vector<int32_t>{99, 100}));
  EXPECT_EQ(b.finish, FinishReason::kEos);
  Outcome c = Drain(*Submit({50}, 10, nullptr, {53}));
  EXPECT_EQ(c.tokens, (std::vector<int32_t>{51, 52}));
  EXPECT_EQ(c.finish, FinishReason::kStop);
  Outcome d = Drain(*Submit({4000}, 3));
  EXPECT_EQ(d.finish, FinishReason::kError);
  EXPECT_NE(d.error.find("outside the vocabulary"), std::string::npos) << d.error;
  EXPECT_DOUBLE_EQ(engine_->KvUsage(), 0.0);
}

TEST_F(ClusterFixture, IgnoreEosRunsOnPastEos) {
  StartEngine();
  GenerationRequest r;
  r.prompt = {97, 98};  // 99, 100, then EOS (id 1), 2, 3
  r.sampling.temperature = 0;
  r.sampling.max_tokens = 5;
  r.sampling.ignore_eos = true;
  r.cancel = std::make_shared<CancellationToken>();
  Outcome o = Drain(*engine_->Submit(std::move(r)).stream);
  ASSERT_EQ(model_.eos_token_id, 1);
  EXPECT_EQ(o.tokens, (std::vector<int32_t>{99, 100, 1, 2, 3}));
  EXPECT_EQ(o.finish, FinishReason::kLength);
}

// Allows exactly `script`, one id per draw, then only EOS; records what it was given.
class ScriptedConstraint : public TokenConstraint {
 public:
  ScriptedConstraint(std::vector<int32_t> script, int32_t eos, bool refuse = false)
      : script_(std::move(script)), eos_(eos), refuse_(refuse) {}
  void FillAllowed(std::span<uint32_t> mask) override {
    std::fill(mask.begin(), mask.end(), 0u);
    const int32_t id = next_ < script_.size() ? script_[next_] : eos_;
    mask[id / 32] |= 1u << (id % 32);
    ++fills_;
  }
  bool Accept(int32_t id) override {
    if (refuse_ || next_ >= script_.size() || script_[next_] != id) return false;
    ++next_;
    return true;
  }
  size_t accepted() const { return next_; }
  int fills() const { return fills_; }

 private:
  std::vector<int32_t> script_;
  int32_t eos_;
  bool refuse_;
  size_t next_ = 0;
  int fills_ = 0;
};

TEST_F(ClusterFixture, AConstraintDecidesEveryDrawAndSeesEveryId) {
  StartEngine();
  auto run = [&](std::shared_ptr<ScriptedConstraint> c) {
    GenerationRequest r;
    r.prompt = {10};  // the model alone: 11, 12, ...
    r.sampling.temperature = 0;
    r.sampling.max_tokens = 10;
    r.cancel = std::make_shared<CancellationToken>();
    r.constraint = c;
    return Drain(*engine_->Submit(std::move(r)).stream);
  };
  auto c = std::make_shared<ScriptedConstraint>(std::vector<int32_t>{500, 7, 300}, 1);
  Outcome o = run(c);
  EXPECT_EQ(o.tokens, (std::vector<int32_t>{500, 7, 300}));
  EXPECT_EQ(o.finish, FinishReason::kEos);
  EXPECT_EQ(c->accepted(), 3u);
  EXPECT_EQ(c->fills(), 4);  // three ids and the EOS
  EXPECT_EQ(workers_[1]->mask_bytes_.load(), (model_.vocab_size + 31) / 32 * 4);
  // An id the constraint refuses ends the request with an error.
  o = run(std::make_shared<ScriptedConstraint>(std::vector<int32_t>{20}, 1, /*refuse=*/true));
  EXPECT_EQ(o.finish, FinishReason::kError);
  EXPECT_NE(o.error.find("constraint"), std::string::npos) << o.error;
  EXPECT_TRUE(o.tokens.empty());
  EXPECT_DOUBLE_EQ(engine_->KvUsage(), 0.0);
}

TEST_F(ClusterFixture, LogprobsTravelWithTheirTokens) {
  StartEngine();
  GenerationRequest r;
  r.prompt = {20};
  r.sampling.max_tokens = 3;
  r.sampling.top_logprobs = 2;
  r.cancel = std::make_shared<CancellationToken>();
  Outcome o = Drain(*engine_->Submit(std::move(r)).stream);
  ASSERT_EQ(o.tokens, (std::vector<int32_t>{21, 22, 23}));
  ASSERT_EQ(o.logprobs.size(), 3u);
  EXPECT_FLOAT_EQ(o.logprobs[1].logprob, -0.5f);
  ASSERT_EQ(o.logprobs[1].top.size(), 2u);
  EXPECT_EQ(o.logprobs[1].top[1].first, 23);
}

TEST_F(ClusterFixture, ConcurrentRequestsBatchWithoutChangingResults) {
  StartEngine();
  std::vector<std::shared_ptr<GenerationStream>> streams;
  for (int i = 0; i < 16; ++i) {
    // Long prompts (300 tokens for some) make prefill chunks share micro-batches with decodes.
    std::vector<int32_t> prompt(i % 3 == 0 ? 300 : 1 + i, 200 + i);
    prompt.back() = 200 + 10 * i;
    streams.push_back(Submit(prompt, 20));
  }
  for (int i = 0; i < 16; ++i) {
    Outcome o = Drain(*streams[i]);
    ASSERT_EQ(o.finish, FinishReason::kLength) << i << " " << o.error;
    ASSERT_EQ(o.tokens.size(), 20u);
    for (int k = 0; k < 20; ++k) EXPECT_EQ(o.tokens[k], 200 + 10 * i + 1 + k) << i;
  }
  EXPECT_GT(workers_[1]->max_chunks_.load(), 1);  // sequences really shared micro-batches
  EXPECT_DOUBLE_EQ(engine_->KvUsage(), 0.0);
  EXPECT_EQ(engine_->NumRunning(), 0);
}

TEST_F(ClusterFixture, CancelFreesTheKvCache) {
  StartEngine();
  workers_[1]->delay_ms_.store(20);
  auto cancel = std::make_shared<CancellationToken>();
  auto s = Submit({300}, 500, cancel);
  // Wait for some tokens, then cancel.
  std::vector<int32_t> got;
  for (int i = 0; i < 500 && got.size() < 3; ++i) {
    if (auto e = s->Next(std::chrono::milliseconds(10))) {
      got.insert(got.end(), e->tokens.begin(), e->tokens.end());
    }
  }
  ASSERT_GE(got.size(), 3u);
  EXPECT_GT(engine_->KvUsage(), 0.0);
  cancel->Cancel();
  Outcome o = Drain(*s);
  EXPECT_EQ(o.finish, FinishReason::kCancelled);
  EXPECT_DOUBLE_EQ(engine_->KvUsage(), 0.0);
}

TEST_F(ClusterFixture, FailedMicroBatchEndsOnlyItsSequences) {
  StartEngine();
  workers_[0]->fail_micro_batch_.store(0);  // the very first micro-batch
  Outcome bad = Drain(*Submit({10}, 4));
  EXPECT_EQ(bad.finish, FinishReason::kError);
  EXPECT_NE(bad.error.find("injected failure"), std::string::npos) << bad.error;
  EXPECT_TRUE(engine_->Ready());
  Outcome good = Drain(*Submit({10}, 4));
  EXPECT_EQ(good.tokens, (std::vector<int32_t>{11, 12, 13, 14}));
  EXPECT_DOUBLE_EQ(engine_->KvUsage(), 0.0);
}

TEST_F(ClusterFixture, DeadWorkerFailsRequestsAndTheClusterRecovers) {
  StartEngine();
  Outcome o = DieMidRequest(1);
  EXPECT_EQ(o.finish, FinishReason::kError);
  EXPECT_NE(o.error.find("gpu1"), std::string::npos) << o.error;
  // Not ready until gpu1 registers again (a restarted process would).
  for (int i = 0; i < 100 && engine_->Ready(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_FALSE(engine_->Ready());
  GenerationRequest r;
  r.prompt = {1};
  r.cancel = std::make_shared<CancellationToken>();
  EXPECT_EQ(engine_->Submit(std::move(r)).status, SubmitStatus::kNotReady);
  Revive(1);
  ASSERT_TRUE(WaitReady());
  Outcome again = Drain(*Submit({40}, 3));
  EXPECT_EQ(again.tokens, (std::vector<int32_t>{41, 42, 43}));
}

TEST_F(ClusterFixture, DrainLetsRunningRequestsFinish) {
  StartEngine();
  workers_[1]->delay_ms_.store(5);
  auto s = Submit({60}, 20);
  engine_->BeginDrain();
  EXPECT_FALSE(engine_->Ready());
  GenerationRequest r;
  r.prompt = {1};
  r.cancel = std::make_shared<CancellationToken>();
  EXPECT_EQ(engine_->Submit(std::move(r)).status, SubmitStatus::kNotReady);
  EXPECT_TRUE(engine_->WaitIdle(absl::Seconds(10)));
  Outcome o = Drain(*s);
  EXPECT_EQ(o.finish, FinishReason::kLength);
  EXPECT_EQ(o.tokens.size(), 20u);
}

// ---- TP 2 x PP 2: four workers, gpu0/gpu1 stage 0, gpu2/gpu3 stage 1 ----

constexpr char kTp2Pp2[] = R"({
  "model_name": "tiny", "kv_block_tokens": 128, "max_batch_tokens": 256, "max_running": 32,
  "heartbeat_interval_ms": 50, "heartbeat_timeout_ms": 3000,
  "stages": [{"layers": "0-3", "workers": ["gpu0", "gpu1"]},
             {"layers": "4-6", "workers": ["gpu2", "gpu3"]}]})";

class TpClusterFixture : public ClusterFixture {
 protected:
  const char* ConfigText() const override { return kTp2Pp2; }

  // Rendezvous of `id` publishing `ids` (group -> bytes); `deadline_ms` bounds the wait.
  grpc::Status Meet(const std::string& id, const std::map<std::string, std::string>& ids,
                    pb::RendezvousReply* reply, int deadline_ms = 5000) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(deadline_ms));
    pb::RendezvousRequest req;
    req.set_protocol_version(kClusterProtocolVersion);
    req.set_worker_id(id);
    for (const auto& [group, bytes] : ids) {
      pb::NcclGroupId* g = req.add_nccl_ids();
      g->set_group(group);
      g->set_unique_id(bytes);
    }
    return stub_->Rendezvous(&ctx, req, reply);
  }
  // Every worker meets at once, worker i publishing publish(i): their statuses, and their replies
  // in `replies` when given.
  std::vector<grpc::Status> MeetEach(
      const std::function<std::map<std::string, std::string>(int)>& publish,
      std::vector<pb::RendezvousReply>* replies = nullptr) {
    const int n = static_cast<int>(ids_.size());
    std::vector<grpc::Status> st(n);
    std::vector<pb::RendezvousReply> got(n);
    std::vector<std::thread> threads;
    for (int i = 0; i < n; ++i) {
      threads.emplace_back([&, i] { st[i] = Meet(ids_[i], publish(i), &got[i]); });
    }
    for (std::thread& t : threads) t.join();
    if (replies != nullptr) *replies = std::move(got);
    return st;
  }
  // Expects every status OK, naming the worker.
  void ExpectAllOk(const std::vector<grpc::Status>& st) {
    for (size_t i = 0; i < st.size(); ++i) {
      EXPECT_TRUE(st[i].ok()) << ids_[i] << ": " << st[i].error_message();
    }
  }
  // Every worker meets at once; rank 0 of stage s publishes `tag_s` x 128.
  std::vector<pb::RendezvousReply> MeetAll(char tag0, char tag1) {
    std::vector<pb::RendezvousReply> replies;
    ExpectAllOk(MeetEach(
        [&](int i) {
          std::map<std::string, std::string> publish;
          if (i == 0) publish[TpGroupName(0)] = std::string(kNcclUniqueIdBytes, tag0);
          if (i == 2) publish[TpGroupName(1)] = std::string(kNcclUniqueIdBytes, tag1);
          return publish;
        },
        &replies));
    return replies;
  }
  static std::string IdOf(const pb::RendezvousReply& r, const std::string& group) {
    for (const pb::NcclGroupId& g : r.nccl_ids()) {
      if (g.group() == group) return g.unique_id();
    }
    return "";
  }
  bool Dead(int i) const { return control_->Members()[i].dead; }
};

TEST_F(TpClusterFixture, RolesGiveRanksAndTheCpuBackendIsRefusedAtTpTwo) {
  absl::StatusOr<pb::Role> r3 = RoleFor(control_->config(), "gpu3");
  ASSERT_TRUE(r3.ok());
  EXPECT_EQ(r3->stage(), 1);
  EXPECT_EQ(r3->tp_rank(), 1);
  EXPECT_EQ(r3->tp_size(), 2);
  control_->DeclareDead("gpu1", control_->Members()[1].generation);
  const grpc::Status cpu =
      RegisterWorker(workers_[1].get(), kClusterProtocolVersion, "gpu1", "cpu");
  EXPECT_EQ(cpu.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(cpu.error_message().find("TP 1 only"), std::string::npos) << cpu.error_message();
}

TEST_F(TpClusterFixture, RendezvousRelaysEachStagesIdFromItsRankZero) {
  pb::RendezvousReply r;
  // Only a stage's rank 0 may publish, only its own group, only 128 bytes.
  EXPECT_EQ(Meet("gpu1", {{TpGroupName(0), std::string(kNcclUniqueIdBytes, 'a')}}, &r).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Meet("gpu0", {{TpGroupName(1), std::string(kNcclUniqueIdBytes, 'a')}}, &r).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Meet("gpu0", {{TpGroupName(0), std::string(5, 'a')}}, &r).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  const std::vector<pb::RendezvousReply> replies = MeetAll('x', 'y');
  for (int i = 0; i < 4; ++i) {
    ASSERT_EQ(replies[i].peers_size(), 4) << i;
    EXPECT_EQ(IdOf(replies[i], TpGroupName(0)), std::string(kNcclUniqueIdBytes, 'x')) << i;
    EXPECT_EQ(IdOf(replies[i], TpGroupName(1)), std::string(kNcclUniqueIdBytes, 'y')) << i;
    for (int p = 0; p < 4; ++p) {
      EXPECT_EQ(replies[i].peers(p).worker_id(), ids_[p]);
      EXPECT_EQ(replies[i].peers(p).address(), workers_[p]->address());
      EXPECT_EQ(replies[i].peers(p).stage(), p / 2);
      EXPECT_EQ(replies[i].peers(p).tp_rank(), p % 2);
    }
  }
}

TEST_F(TpClusterFixture, ARankZeroThatPublishesNothingFailsItsStage) {
  const std::vector<grpc::Status> st = MeetEach([](int i) {
    std::map<std::string, std::string> publish;
    if (i == 2) publish[TpGroupName(1)] = std::string(kNcclUniqueIdBytes, 'y');
    return publish;
  });
  for (int i : {0, 1}) {
    EXPECT_EQ(st[i].error_code(), grpc::StatusCode::FAILED_PRECONDITION) << i;
    EXPECT_NE(st[i].error_message().find("'gpu0'"), std::string::npos) << st[i].error_message();
  }
  EXPECT_TRUE(st[2].ok() && st[3].ok());
}

TEST_F(TpClusterFixture, ATpGroupLivesAndDiesAsOne) {
  MeetAll('x', 'y');
  // The engine declares gpu1 dead: gpu0 goes with it, stage 1 stays.
  control_->DeclareDead("gpu1", control_->Members()[1].generation);
  EXPECT_TRUE(Dead(0) && Dead(1));
  EXPECT_FALSE(Dead(2) || Dead(3));
  grpc::ClientContext hb_ctx;
  pb::HeartbeatRequest hb;
  hb.set_protocol_version(kClusterProtocolVersion);
  hb.set_worker_id("gpu0");
  pb::HeartbeatReply rep;
  ASSERT_TRUE(stub_->Heartbeat(&hb_ctx, hb, &rep).ok());
  EXPECT_FALSE(rep.member());
  // Both restart: neither registration kills the other (neither has met yet), and the group's
  // old id is gone until the new rank 0 publishes a new one.
  ASSERT_TRUE(RegisterWorker(workers_[1].get()).ok());
  ASSERT_TRUE(RegisterWorker(workers_[0].get()).ok());
  EXPECT_FALSE(Dead(0) || Dead(1));
  std::vector<pb::RendezvousReply> r(2);
  std::thread t0([&] {
    EXPECT_TRUE(Meet("gpu0", {{TpGroupName(0), std::string(kNcclUniqueIdBytes, 'z')}}, &r[0]).ok());
  });
  ASSERT_TRUE(Meet("gpu1", {}, &r[1]).ok());  // stage 1 met before and is still a member
  t0.join();
  EXPECT_EQ(IdOf(r[1], TpGroupName(0)), std::string(kNcclUniqueIdBytes, 'z'));
  EXPECT_EQ(control_->Members()[0].generation, 2u);

  // gpu3 goes silent and a new gpu3 registers before anyone noticed: its peer gpu2, which
  // formed a group with the old process, is declared dead.
  silent_.store("gpu3");
  std::this_thread::sleep_for(std::chrono::milliseconds(3200));
  ASSERT_TRUE(RegisterWorker(workers_[3].get()).ok());
  EXPECT_TRUE(Dead(2));
  EXPECT_FALSE(Dead(3) || Dead(0) || Dead(1));
  silent_.store("");
  // Missed heartbeats take the whole group too.
  silent_.store("gpu0");
  std::vector<std::string> dead;
  for (int i = 0; i < 100 && dead.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    dead = control_->CheckHeartbeats();
  }
  EXPECT_EQ(dead, (std::vector<std::string>{"gpu0", "gpu1"}));
}

// The nccl stage transport (proto/cluster.proto 3b): the senders publish their links' ids, and
// every GPU worker shares one fate.
class LinkedClusterFixture : public TpClusterFixture {
 protected:
  const char* ConfigText() const override { return kLinked; }
  static constexpr char kLinked[] = R"({
    "model_name": "tiny", "kv_block_tokens": 128, "max_batch_tokens": 256, "max_running": 32,
    "heartbeat_interval_ms": 50, "heartbeat_timeout_ms": 3000, "stage_transport": "nccl",
    "stages": [{"layers": "0-3", "workers": ["gpu0", "gpu1"]},
               {"layers": "4-6", "workers": ["gpu2", "gpu3"]}]})";
  // What each worker publishes: its TP group's id as a stage's rank 0, its link's as a sender.
  static std::map<std::string, std::string> Publish(int i, bool link = true) {
    std::map<std::string, std::string> p;
    if (i == 0) p[TpGroupName(0)] = std::string(kNcclUniqueIdBytes, 'x');
    if (i == 2) p[TpGroupName(1)] = std::string(kNcclUniqueIdBytes, 'y');
    if (i < 2 && link)
      p[PpLinkName(0, i)] = std::string(kNcclUniqueIdBytes, static_cast<char>('0' + i));
    return p;
  }
};

TEST_F(LinkedClusterFixture, RendezvousRelaysTheLinksIdsFromTheirSenders) {
  pb::RendezvousReply r;
  // The last stage sends on no link; a worker publishes only its own link.
  EXPECT_EQ(
      Meet("gpu2", {{PpLinkName(1, 0), std::string(kNcclUniqueIdBytes, 'a')}}, &r).error_code(),
      grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(
      Meet("gpu0", {{PpLinkName(0, 1), std::string(kNcclUniqueIdBytes, 'a')}}, &r).error_code(),
      grpc::StatusCode::INVALID_ARGUMENT);
  std::vector<pb::RendezvousReply> replies;
  ExpectAllOk(MeetEach([](int i) { return Publish(i); }, &replies));
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(IdOf(replies[i], PpLinkName(0, 0)), std::string(kNcclUniqueIdBytes, '0')) << i;
    EXPECT_EQ(IdOf(replies[i], PpLinkName(0, 1)), std::string(kNcclUniqueIdBytes, '1')) << i;
    EXPECT_EQ(IdOf(replies[i], TpGroupName(1)), std::string(kNcclUniqueIdBytes, 'y')) << i;
  }
}

TEST_F(LinkedClusterFixture, ASenderThatPublishesNoLinkFailsTheRendezvous) {
  const std::vector<grpc::Status> st = MeetEach([](int i) { return Publish(i, /*link=*/i != 1); });
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(st[i].error_code(), grpc::StatusCode::FAILED_PRECONDITION) << i;
    EXPECT_NE(st[i].error_message().find("'gpu1'"), std::string::npos) << st[i].error_message();
  }
}

TEST_F(LinkedClusterFixture, EveryGpuWorkerSharesOneFateAndTheCpuBackendIsRefused) {
  ExpectAllOk(MeetEach([](int i) { return Publish(i); }));
  // One dead worker of stage 1 takes stage 0 too: their links would hang.
  control_->DeclareDead("gpu3", control_->Members()[3].generation);
  EXPECT_TRUE(Dead(0) && Dead(1) && Dead(2) && Dead(3));
  const grpc::Status cpu =
      RegisterWorker(workers_[0].get(), kClusterProtocolVersion, "gpu0", "cpu");
  EXPECT_EQ(cpu.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(cpu.error_message().find("stage_transport"), std::string::npos) << cpu.error_message();
  // They all register again; a worker that registers again after the links formed takes the
  // others down with it.
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(RegisterWorker(workers_[i].get()).ok()) << i;
  EXPECT_FALSE(Dead(0) || Dead(1) || Dead(2) || Dead(3));
  ExpectAllOk(MeetEach([](int i) { return Publish(i); }));
  silent_.store("gpu3");
  std::this_thread::sleep_for(std::chrono::milliseconds(3200));
  ASSERT_TRUE(RegisterWorker(workers_[3].get()).ok());
  EXPECT_TRUE(Dead(0) && Dead(1) && Dead(2));
  EXPECT_FALSE(Dead(3));
  silent_.store("");
}

TEST_F(LinkedClusterFixture, OneDeadWorkerStopsThePipelineUntilEveryWorkerIsBack) {
  StartEngine();
  Outcome o = DieMidRequest(3);
  EXPECT_EQ(o.finish, FinishReason::kError);
  // The engine declared gpu3 dead, and with it every other GPU worker (their links would hang).
  for (int i = 0; i < 200 && !(Dead(0) && Dead(1) && Dead(2)); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(Dead(0) && Dead(1) && Dead(2) && Dead(3));
  Revive(3);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_FALSE(engine_->Ready());  // the others have not come back yet
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(RegisterWorker(workers_[i].get()).ok()) << i;
  ASSERT_TRUE(WaitReady());
  Outcome again = Drain(*Submit({40}, 3));
  EXPECT_EQ(again.tokens, (std::vector<int32_t>{41, 42, 43}));
}

TEST_F(TpClusterFixture, EveryRankGetsEveryPlanAndOneFailedRankFailsTheMicroBatch) {
  StartEngine();
  Outcome a = Drain(*Submit({10, 11, 12}, 5));
  EXPECT_EQ(a.tokens, (std::vector<int32_t>{13, 14, 15, 16, 17}));
  // Same plans, same order, on all four (the fakes check each sequence's positions).
  const int plans = workers_[0]->plans_.load();
  EXPECT_GT(plans, 0);
  for (int i = 1; i < 4; ++i) EXPECT_EQ(workers_[i]->plans_.load(), plans) << ids_[i];

  // Rank 1 of the last stage (not the sampler) fails a micro-batch: its requests fail, naming it.
  const int64_t next = workers_[3]->plans_.load();
  workers_[3]->fail_micro_batch_.store(next);
  Outcome bad = Drain(*Submit({20}, 4));
  EXPECT_EQ(bad.finish, FinishReason::kError);
  EXPECT_NE(bad.error.find("gpu3"), std::string::npos) << bad.error;
  EXPECT_NE(bad.error.find("injected failure"), std::string::npos) << bad.error;
  Outcome good = Drain(*Submit({30}, 3));
  EXPECT_EQ(good.tokens, (std::vector<int32_t>{31, 32, 33}));

  // A rank dies: requests fail with its name, its TP peer is declared dead with it, and the
  // cluster serves again once both have registered again.
  workers_[1]->delay_ms_.store(10);
  auto s = Submit({40}, 200);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  workers_[1]->die_.store(true);
  Outcome o = Drain(*s);
  EXPECT_EQ(o.finish, FinishReason::kError);
  EXPECT_NE(o.error.find("gpu1"), std::string::npos) << o.error;
  EXPECT_TRUE(Dead(0) && Dead(1));
  EXPECT_FALSE(Dead(2) || Dead(3));
  workers_[1]->die_.store(false);
  workers_[1]->delay_ms_.store(0);
  ASSERT_TRUE(RegisterWorker(workers_[1].get()).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(engine_->Ready());  // gpu0 is still dead
  ASSERT_TRUE(RegisterWorker(workers_[0].get()).ok());
  ASSERT_TRUE(WaitReady());
  Outcome again = Drain(*Submit({50}, 3));
  EXPECT_EQ(again.tokens, (std::vector<int32_t>{51, 52, 53}));
}

}  // namespace
}  // namespace ss::coord
