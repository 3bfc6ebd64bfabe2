// End to end, with processes: splitserve-gpu-worker processes (cpu backend, standalone flags)
// as two pipeline stages of tiny-a, this test acting as the coordinator through
// proto/cluster.proto. Greedy tokens must equal the reference model's own, bit for bit: with
// local experts, and with an splitserve-expert-worker (--isa scalar, whole experts) serving the
// routed experts over shared memory (stage 0) and gRPC (stage 1), its max_tokens small enough
// that the prefill's expert calls are cut into chunks. A fake coordinator checks the control
// plane: registration, rendezvous, heartbeats, leaving when no longer a member or when the
// coordinator is gone.
#include <netinet/in.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/model/model.h"
#include "gtest/gtest.h"
#include "tests/gpu_worker/gpu_worker_test_util.h"
#include "tests/test_util.h"
#include "tests/tools/test_configs.h"

namespace ss::gpu {
namespace {

using testing_util::kTinyA;
using testing_util::WorkerClient;
using testing_util::pb::StepPlan;
using testing_util::pb::StepResult;
namespace pb = testing_util::pb;

// The workers and expert workers this test starts share the tests' cluster token.
[[maybe_unused]] const bool kTokenExported = (::ss::testing_util::ExportTestClusterToken(), true);

// A child process that dies with the test (tests/test_util.h): `binary` with `args`.
class Child : public ::ss::testing_util::ChildProcess {
 public:
  Child(const std::string& binary, std::vector<std::string> args)
      : ChildProcess(Prepend(binary, std::move(args))) {}
  int WaitExit(absl::Duration timeout) {
    return ::ss::testing_util::ChildProcess::WaitExit(absl::ToChronoMilliseconds(timeout));
  }

 private:
  static std::vector<std::string> Prepend(const std::string& binary, std::vector<std::string> a) {
    a.insert(a.begin(), binary);
    return a;
  }
};

std::string TempPath(const std::string& tag) {
  return (std::filesystem::path(::testing::TempDir()) / absl::StrCat("ss_gw_", tag, "_", getpid()))
      .string();
}

// Every TempPath of this process is removed when the tests end, whatever they left.
class RemoveTempPaths : public ::testing::Environment {
 public:
  void TearDown() override {
    const std::string suffix = absl::StrCat("_", getpid());
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(::testing::TempDir(), ec)) {
      const std::string name = e.path().filename().string();
      if (name.rfind("ss_gw_", 0) == 0 && name.size() > suffix.size() &&
          name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
        std::filesystem::remove(e.path(), ec);
      }
    }
  }
};
[[maybe_unused]] ::testing::Environment* const kRemoveTempPaths =
    ::testing::AddGlobalTestEnvironment(new RemoveTempPaths);

// Waits for a worker's --port-file.
int WaitPort(const std::string& path, absl::Duration timeout = absl::Seconds(30)) {
  const absl::Time until = absl::Now() + timeout;
  while (absl::Now() < until) {
    std::ifstream f(path);
    int port = 0;
    if (f >> port && port > 0) return port;
    absl::SleepFor(absl::Milliseconds(20));
  }
  ADD_FAILURE() << "no port in " << path;
  return 0;
}

// A free loopback port (bound and released; the expert worker binds it right after).
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

std::unique_ptr<Child> StartStage(int stage, const std::string& layers,
                                  const std::string& port_file, const std::string& next,
                                  const std::string& experts) {
  std::filesystem::remove(port_file);
  std::vector<std::string> args = {
      "--model",      kTinyA,    "--listen",    "127.0.0.1:0",
      "--port-file",  port_file, "--stage",     std::to_string(stage),
      "--num-stages", "2",       "--layers",    layers,
      "--kv-tokens",  "4096",    "--worker-id", absl::StrCat("gpu", stage)};
  if (!next.empty()) args.insert(args.end(), {"--next-stage", next});
  if (!experts.empty()) args.insert(args.end(), {"--experts", experts});
  return std::make_unique<Child>(SS_BIN_DIR "/splitserve-gpu-worker", args);
}

const std::vector<std::vector<int32_t>> kPrompts = {{0, 17, 300, 42, 99, 7, 512, 3, 1000, 64, 5},
                                                    {0, 900, 12, 12, 33}};
constexpr int kSteps = 8;

struct Pipeline {
  std::unique_ptr<Child> s0, s1;
  std::unique_ptr<WorkerClient> c0, c1;
};

// Stage 1 first (stage 0 needs its address), then stage 0; both polled until ready.
void StartPipeline(Pipeline* p, const std::string& experts0, const std::string& experts1) {
  const std::string f0 = TempPath("port0"), f1 = TempPath("port1");
  p->s1 = StartStage(1, "4-6", f1, "", experts1);
  const int port1 = WaitPort(f1);
  p->s0 = StartStage(0, "0-3", f0, absl::StrCat("127.0.0.1:", port1), experts0);
  const int port0 = WaitPort(f0);
  p->c0 = std::make_unique<WorkerClient>(absl::StrCat("127.0.0.1:", port0));
  p->c1 = std::make_unique<WorkerClient>(absl::StrCat("127.0.0.1:", port1));
  for (WorkerClient* c : {p->c0.get(), p->c1.get()}) {
    const auto st = c->WaitReady();
    EXPECT_TRUE(st.ready()) << st.error();
    EXPECT_EQ(st.protocol_version(), kClusterProtocolVersion);
    EXPECT_EQ(st.kv_blocks(), 4096 / 128);
    EXPECT_GT(st.weight_bytes(), 0);
  }
}

TEST(GpuWorkerPipeline, TwoStagesGiveTheReferenceGreedyTokens) {
  auto model = model::Model::Load(kTinyA);
  ASSERT_TRUE(model.ok()) << model.status();
  const auto want = testing_util::ReferenceGreedy(**model, kPrompts, kSteps);
  Pipeline p;
  StartPipeline(&p, "", "");
  p.c0->OpenSteps();
  p.c1->OpenSteps();
  const auto got = testing_util::RunGreedy({p.c0.get(), p.c1.get()}, kPrompts, kSteps);
  EXPECT_EQ(got, want);

  // Released sequences are gone on both stages: a continuation is refused by both.
  StepPlan release = testing_util::Plan(100);
  release.add_release(1);
  release.add_release(2);
  p.c0->Send(release);
  p.c1->Send(release);
  EXPECT_EQ(p.c0->Receive().error(), "");
  EXPECT_EQ(p.c1->Receive().error(), "");
  StepPlan after = testing_util::Plan(101);
  testing_util::AddChunk(&after, 1, 11 + kSteps - 1, {5});
  p.c0->Send(after);
  p.c1->Send(after);
  const StepResult r0 = p.c0->Receive(), r1 = p.c1->Receive();
  EXPECT_NE(r0.error().find("sequence 1"), std::string::npos) << r0.error();
  EXPECT_NE(r1.error().find("sequence 1"), std::string::npos) << r1.error();

  // Recomputing from scratch (start 0 again) gives the same tokens: nothing leaked.
  const auto again = testing_util::RunGreedy({p.c0.get(), p.c1.get()}, kPrompts, 3, 200);
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(again[i], std::vector<int32_t>(want[i].begin(), want[i].begin() + 3));
  }
  EXPECT_TRUE(p.c0->CloseSteps().ok());
  EXPECT_TRUE(p.c1->CloseSteps().ok());
  EXPECT_EQ(p.s0->Stop(), 0);
  EXPECT_EQ(p.s1->Stop(), 0);
}

TEST(GpuWorkerPipeline, ExpertWorkerBehindTheLayersGivesTheReferenceGreedyTokens) {
  auto model = model::Model::Load(kTinyA);
  ASSERT_TRUE(model.ok()) << model.status();
  const auto want = testing_util::ReferenceGreedy(**model, kPrompts, kSteps);
  const std::string shm = absl::StrCat("ss-gw-e2e-", getpid());
  const int grpc_port = FreePort();
  Child experts(SS_BIN_DIR "/splitserve-expert-worker",
                {"--model", kTinyA, "--layers", "0-6", "--slice", "0/1", "--isa", "scalar",
                 "--threads", "1", "--max-tokens", "4", "--shm-name", shm, "--grpc-listen",
                 absl::StrCat("127.0.0.1:", grpc_port)});
  Pipeline p;
  StartPipeline(&p, absl::StrCat("0-3=shm:", shm), absl::StrCat("4-6=grpc:127.0.0.1:", grpc_port));
  p.c0->OpenSteps();
  p.c1->OpenSteps();
  const auto got = testing_util::RunGreedy({p.c0.get(), p.c1.get()}, kPrompts, kSteps);
  EXPECT_EQ(got, want) << "routed experts on the expert worker must be the reference's own";

  // The expert worker dies: the next step fails with an error naming the layer and endpoint,
  // on stage 0 and (from stage 0's error) on stage 1; both keep serving.
  EXPECT_EQ(experts.Kill(), 128 + SIGKILL);
  // A killed worker leaves its segments (calls and store); the client keeps its map.
  shm_unlink(("/" + shm).c_str());
  shm_unlink(absl::StrCat("/", shm, "-store").c_str());
  StepPlan plan = testing_util::Plan(50);
  testing_util::AddChunk(&plan, 7, 0, {1, 2, 3});
  p.c0->Send(plan);
  p.c1->Send(plan);
  const StepResult r0 = p.c0->Receive(), r1 = p.c1->Receive();
  EXPECT_NE(r0.error().find("layer 0"), std::string::npos) << r0.error();
  EXPECT_NE(r0.error().find(shm), std::string::npos) << r0.error();
  EXPECT_NE(r1.error().find("previous stage"), std::string::npos) << r1.error();
  testing_util::pb::WorkerStatus st;
  EXPECT_TRUE(p.c0->Status(&st).ok());
  EXPECT_TRUE(st.ready());
  EXPECT_TRUE(p.c0->CloseSteps().ok());
  EXPECT_TRUE(p.c1->CloseSteps().ok());
  EXPECT_EQ(p.s0->Stop(), 0);
  EXPECT_EQ(p.s1->Stop(), 0);
}

// The coordinator's control plane as the worker sees it: one known worker id ("gpu0") with a
// one-stage role of all of tiny-a's layers, the peers, and heartbeats answered with `member`.
// Registrations must carry the tests' cluster token.
class FakeCoordinator final : public pb::Coordinator::Service {
 public:
  FakeCoordinator() {
    ::grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", ::grpc::InsecureServerCredentials(), &port_);
    b.RegisterService(this);
    server_ = b.BuildAndStart();
  }
  ~FakeCoordinator() override { Stop(); }
  void Stop() {
    if (server_) server_->Shutdown(std::chrono::system_clock::now());
    server_.reset();
  }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }

  ::grpc::Status Register(::grpc::ServerContext* ctx, const pb::RegisterRequest* req,
                          pb::RegisterReply* reply) override {
    if (auto st = credential_.Check(*ctx, "Register"); !st.ok()) return st;
    if (req->protocol_version() != kClusterProtocolVersion) {
      return ::grpc::Status(::grpc::StatusCode::FAILED_PRECONDITION, "protocol version");
    }
    if (req->worker_id() != "gpu0") {
      return ::grpc::Status(::grpc::StatusCode::NOT_FOUND,
                            absl::StrCat("no GPU worker '", req->worker_id(), "' in the config"));
    }
    std::lock_guard<std::mutex> lock(mu_);
    address_ = req->address();
    backend_ = req->backend();
    reply->set_protocol_version(kClusterProtocolVersion);
    pb::Role* r = reply->mutable_role();
    r->set_stage(0);
    r->set_num_stages(1);
    r->set_tp_rank(0);
    r->set_tp_size(1);
    r->set_first_layer(0);
    r->set_end_layer(7);
    r->set_kv_block_tokens(16);
    r->set_heartbeat_interval_ms(100);
    r->set_model_name("tiny-a");
    return ::grpc::Status::OK;
  }
  ::grpc::Status Rendezvous(::grpc::ServerContext*, const pb::RendezvousRequest* req,
                            pb::RendezvousReply* reply) override {
    std::lock_guard<std::mutex> lock(mu_);
    pb::PeerInfo* p = reply->add_peers();
    p->set_worker_id(req->worker_id());
    p->set_address(address_);
    ++rendezvous_;
    return ::grpc::Status::OK;
  }
  ::grpc::Status Heartbeat(::grpc::ServerContext*, const pb::HeartbeatRequest* req,
                           pb::HeartbeatReply* reply) override {
    progress_.store(req->progress());
    ++beats_;
    reply->set_member(member_.load());
    return ::grpc::Status::OK;
  }

  std::string registered_address() {
    std::lock_guard<std::mutex> lock(mu_);
    return address_;
  }
  std::atomic<int> beats_{0};
  std::atomic<uint64_t> progress_{0};  // of the latest heartbeat
  std::atomic<bool> member_{true};
  int rendezvous_ = 0;
  std::string backend_;

 private:
  const ClusterCredential credential_ = ::ss::testing_util::TestCredential();
  int port_ = 0;
  std::unique_ptr<::grpc::Server> server_;
  std::mutex mu_;
  std::string address_;
};

std::unique_ptr<Child> StartRegistered(const std::string& coordinator, const std::string& id,
                                       const std::string& port_file,
                                       std::vector<std::string> extra = {}) {
  std::filesystem::remove(port_file);
  std::vector<std::string> args = {"--model",
                                   kTinyA,
                                   "--coordinator",
                                   coordinator,
                                   "--worker-id",
                                   id,
                                   "--listen",
                                   "127.0.0.1:0",
                                   "--port-file",
                                   port_file,
                                   "--kv-tokens",
                                   "4096",
                                   "--coordinator-timeout-ms",
                                   "1500"};
  args.insert(args.end(), extra.begin(), extra.end());
  return std::make_unique<Child>(SS_BIN_DIR "/splitserve-gpu-worker", std::move(args));
}

TEST(GpuWorkerControlPlane, RegistersServesAndLeavesWhenTheCoordinatorSaysSo) {
  auto model = model::Model::Load(kTinyA);
  ASSERT_TRUE(model.ok()) << model.status();
  FakeCoordinator coord;
  const std::string pf = TempPath("reg");
  auto worker = StartRegistered(coord.address(), "gpu0", pf);
  const int port = WaitPort(pf);
  WorkerClient client(absl::StrCat("127.0.0.1:", port));
  const auto st = client.WaitReady();
  ASSERT_TRUE(st.ready()) << st.error();
  EXPECT_EQ(st.worker_id(), "gpu0");
  EXPECT_EQ(st.kv_blocks(), 4096 / 16);  // the role's block size
  EXPECT_EQ(coord.registered_address(), absl::StrCat("127.0.0.1:", port));
  EXPECT_EQ(coord.backend_, "cpu");
  EXPECT_EQ(coord.rendezvous_, 1);
  const std::vector<std::vector<int32_t>> prompts = {{0, 4, 8, 15, 16, 23, 42}};
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (coord.beats_.load() < 1 && absl::Now() < until) absl::SleepFor(absl::Milliseconds(20));
  EXPECT_EQ(coord.progress_.load(), 0u) << "loading is no step progress";
  client.OpenSteps();
  EXPECT_EQ(testing_util::RunGreedy({&client}, prompts, 3),
            testing_util::ReferenceGreedy(**model, prompts, 3));
  // The heartbeats carry the steps' progress: at least each step's start and end and its 7
  // layers (cpu backend).
  const int beats = coord.beats_.load();
  while ((coord.beats_.load() < beats + 2 || coord.progress_.load() < 3 * (2 + 7)) &&
         absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_GE(coord.progress_.load(), 3u * (2 + 7));
  coord.member_.store(false);
  EXPECT_EQ(worker->WaitExit(absl::Seconds(10)), 0) << "a worker that is no longer a member exits";
}

TEST(GpuWorkerControlPlane, RefusedOrLostCoordinatorEndsTheWorker) {
  FakeCoordinator coord;
  auto stranger = StartRegistered(coord.address(), "gpu9", TempPath("stranger"));
  EXPECT_EQ(stranger->WaitExit(absl::Seconds(10)), 1) << "an unknown worker id is refused";
  const std::string pf = TempPath("lost");
  auto worker = StartRegistered(coord.address(), "gpu0", pf);
  WorkerClient client(absl::StrCat("127.0.0.1:", WaitPort(pf)));
  ASSERT_TRUE(client.WaitReady().ready());
  coord.Stop();
  EXPECT_EQ(worker->WaitExit(absl::Seconds(15)), 1)
      << "a worker whose coordinator is unreachable past --coordinator-timeout-ms exits";
}

// A worker whose token is not the coordinator's is refused at once (exit 1, naming the refusal);
// one without any token does not start (exit 2), unless --insecure-cluster says so explicitly.
TEST(GpuWorkerControlPlane, AWorkerWithoutTheCoordinatorsTokenIsRefused) {
  FakeCoordinator coord;
  const std::string token_file = TempPath("token");
  { std::ofstream(token_file) << std::string(64, 'c') << "\n"; }
  std::filesystem::permissions(
      token_file, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  const absl::Time t0 = absl::Now();
  auto wrong = StartRegistered(coord.address(), "gpu0", TempPath("wrong"),
                               {"--cluster-token-file", token_file});
  EXPECT_EQ(wrong->WaitExit(absl::Seconds(10)), 1) << "a wrong token is refused";
  EXPECT_LT(absl::Now() - t0, absl::Seconds(8)) << "refused at once, not retried";
  EXPECT_EQ(coord.registered_address(), "");
  unsetenv(kClusterTokenEnv);
  auto none = StartRegistered(coord.address(), "gpu0", TempPath("none"));
  ::ss::testing_util::ExportTestClusterToken();
  EXPECT_EQ(none->WaitExit(absl::Seconds(10)), 2) << "no token: refuses to start";
  std::filesystem::remove(token_file);
}

// --plan at DeepSeek-V4-Flash sizes: weights per GPU and KV capacity for a layout, and a
// refusal (exit 1, saying why) for one that does not fit.
TEST(GpuWorkerPlan, ReportsFlashLayoutsAndRefusesWhatDoesNotFit) {
  ::ss::testing_util::TempDir dir("gw_plan");
  std::ofstream(dir / "config.json") << ::ss::testing_util::kFlashConfig;
  auto run = [&](const std::string& flags, std::string* output) {
    const std::string cmd = std::string(SS_BIN_DIR "/splitserve-gpu-worker --plan --model ") +
                            dir.path() + " " + flags + " 2>&1";
    FILE* p = popen(cmd.c_str(), "r");
    char buf[4096];
    for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) output->append(buf, n);
    const int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  };
  std::string fits, refused, bad;
  EXPECT_EQ(run("--plan_tp 2 --plan_pp 2 --plan_gib 24", &fits), 0) << fits;
  EXPECT_NE(fits.find("stage 1 (layers 21-42), each of 2 GPU(s): weights"), std::string::npos)
      << fits;
  EXPECT_NE(fits.find("fits: the pipeline holds"), std::string::npos) << fits;
  EXPECT_EQ(run("--plan_tp 1 --plan_pp 1 --plan_gib 8", &refused), 1) << refused;
  EXPECT_NE(refused.find("DOES NOT FIT"), std::string::npos) << refused;
  EXPECT_EQ(run("--plan_tp 3", &bad), 1) << bad;  // 3 does not divide the 64 heads
  EXPECT_NE(bad.find("num_attention_heads"), std::string::npos) << bad;
  // The streamed path's ring and workspace are counted by default (auto: 3 GiB where the KV pool
  // keeps its tokens beside it, the resident experts' figure with 1 GiB); ring 0 turns both off.
  EXPECT_NE(fits.find("streamed experts: ring 3072.0 MiB (auto) + workspace"), std::string::npos)
      << fits;
  EXPECT_NE(fits.find("resident experts (--gpu-experts auto, beside a 1024 MiB ring"),
            std::string::npos)
      << fits;
  std::string fixed_ring;
  EXPECT_EQ(run("--plan_tp 2 --plan_pp 2 --plan_gpu_prefill_ring_mib 1024", &fixed_ring), 0)
      << fixed_ring;
  EXPECT_NE(fixed_ring.find("streamed experts: ring 1024.0 MiB + workspace"), std::string::npos)
      << fixed_ring;
  std::string no_ring, bad_ring;
  EXPECT_EQ(run("--plan_tp 2 --plan_pp 2 --plan_gpu_prefill_ring_mib 0", &no_ring), 0) << no_ring;
  EXPECT_EQ(no_ring.find("streamed experts:"), std::string::npos) << no_ring;
  EXPECT_NE(no_ring.find("never streamed"), std::string::npos) << no_ring;
  EXPECT_EQ(run("--plan_gpu_prefill_ring_mib -1", &bad_ring), 2) << bad_ring;
  EXPECT_NE(bad_ring.find("--plan_gpu_prefill_ring_mib '-1': expected auto"), std::string::npos)
      << bad_ring;
}

}  // namespace
}  // namespace ss::gpu
