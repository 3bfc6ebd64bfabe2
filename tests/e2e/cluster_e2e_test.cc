// The whole system on loopback, as issue 6 item 8 describes it: a coordinator, two GPU workers
// (cpu backend) as pipeline stages, two expert workers — layers 0-3 over shared memory, layers
// 4-6 over gRPC, each holding whole experts (slice 0/1) and running the scalar kernels, so the
// arithmetic is the reference's own — all as separate processes on tiny-a with the bundled tiny
// tokenizer. Every output is checked against the reference model run in this process. The
// processes share the tests' cluster token through the environment, and every gRPC service
// refuses a client without it.
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/cluster_protocol.h"
#include "common/model/model.h"
#include "coordinator/tokenizer.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "proto/cluster.grpc.pb.h"
#include "proto/expert.grpc.pb.h"
#include "tests/cluster_credential_util.h"
#include "tests/common/http_get.h"
#include "tests/test_util.h"

namespace ss {
namespace {

using json = nlohmann::json;
using testing_util::ChildProcess;

const std::string kBin = SS_BIN_DIR;
const std::string kModel = SS_TINY_A_DIR;
const std::string kTokenizer = SS_TINY_TOKENIZER;

// The reference continuation of `prompt`: up to `n` ids, each `pick(logits, generated so far)`,
// stopping after EOS (excluded).
using Pick = std::function<int32_t(std::vector<float> logits, const std::vector<int32_t>& out)>;
std::vector<int32_t> ReferenceDecode(const model::Model& m, const std::vector<int32_t>& prompt,
                                     int n, const Pick& pick) {
  model::SequenceState state = m.NewSequence();
  std::vector<int64_t> ids(prompt.begin(), prompt.end());
  std::vector<int32_t> out;
  int64_t start = 0;
  while (static_cast<int>(out.size()) < n) {
    model::ChunkRef chunk{&state, ids.data() + start, static_cast<int64_t>(ids.size()) - start,
                          start};
    auto logits = m.Forward(std::span<const model::ChunkRef>(&chunk, 1));
    EXPECT_TRUE(logits.ok()) << logits.status();
    const int32_t next = pick((*logits)[0], out);
    if (next == m.config().eos_token_id) break;
    out.push_back(next);
    start = static_cast<int64_t>(ids.size());
    ids.push_back(next);
  }
  return out;
}

int32_t Argmax(const std::vector<float>& l) {
  return static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
}

// The reference greedy continuation of `prompt`: up to `n` ids, stopping after EOS (excluded).
std::vector<int32_t> ReferenceGreedy(const model::Model& m, const std::vector<int32_t>& prompt,
                                     int n) {
  return ReferenceDecode(m, prompt, n, [](std::vector<float> l, const auto&) { return Argmax(l); });
}

class ClusterE2eTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    testing_util::ExportTestClusterToken();
    dir_ = new testing_util::TempDir("cluster_e2e");
    const std::string shm = "ss-e2e-" + std::to_string(getpid());
    const int grpc_port = testing_util::FreeLoopbackPort();
    expert_grpc_port_ = grpc_port;
    json cluster = {
        {"model_name", "tiny"},
        {"kv_block_tokens", 128},
        {"max_batch_tokens", 512},
        {"max_running", 32},
        {"heartbeat_interval_ms", 200},
        {"heartbeat_timeout_ms", 5000},
        {"stages",
         {{{"layers", "0-3"}, {"workers", {"gpu0"}}}, {{"layers", "4-6"}, {"workers", {"gpu1"}}}}},
        {"expert_workers",
         {{{"id", "e0"}, {"layers", "0-3"}, {"slice", "0/1"}, {"shm", shm}},
          {{"id", "e1"},
           {"layers", "4-6"},
           {"slice", "0/1"},
           {"grpc", "127.0.0.1:" + std::to_string(grpc_port)}}}}};
    std::ofstream(*dir_ / "cluster.json") << cluster.dump(2);
    auto log = [](const std::string& name) { return *dir_ / (name + ".log"); };
    procs_ = new std::vector<std::unique_ptr<ChildProcess>>();
    auto start = [&](std::vector<std::string> argv, const std::string& name) {
      procs_->push_back(std::make_unique<ChildProcess>(std::move(argv), log(name)));
    };
    start({kBin + "/splitserve-expert-worker", "--model", kModel, "--layers", "0-3", "--slice",
           "0/1", "--isa", "scalar", "--threads", "1", "--shm-name", shm},
          "e0");
    start({kBin + "/splitserve-expert-worker", "--model", kModel, "--layers", "4-6", "--slice",
           "0/1", "--isa", "scalar", "--threads", "1", "--grpc-listen",
           "127.0.0.1:" + std::to_string(grpc_port)},
          "e1");
    const std::string ports = *dir_ / "ports.json";
    start({kBin + "/splitserve-coordinator", "--model", kModel, "--tokenizer", kTokenizer,
           "--cluster", *dir_ / "cluster.json", "--port", "0", "--control-listen", "127.0.0.1:0",
           "--ports-file", ports},
          "coordinator");
    json p;
    for (int i = 0; i < 600 && !p.is_object(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      std::ifstream in(ports);
      if (in) p = json::parse(in, nullptr, false);
    }
    ASSERT_TRUE(p.is_object()) << "the coordinator did not write its ports";
    http_port_ = p["http"].get<int>();
    control_port_ = p["control"].get<int>();
    const std::string control = "127.0.0.1:" + std::to_string(control_port_);
    for (int s = 0; s < 2; ++s) {
      const std::string id = "gpu" + std::to_string(s);
      start({kBin + "/splitserve-gpu-worker", "--coordinator", control, "--worker-id", id,
             "--listen", "127.0.0.1:0", "--backend", "cpu", "--model", kModel, "--kv-tokens",
             "65536", "--port-file", *dir_ / (id + ".port")},
            id);
    }
    httplib::Client c("127.0.0.1", http_port_);
    bool ready = false;
    for (int i = 0; i < 1200 && !ready; ++i) {
      auto r = c.Get("/ready");
      ready = r && r->status == 200;
      if (!ready) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (!ready) {
      for (const char* n : {"coordinator", "gpu0", "gpu1", "e0", "e1"}) {
        std::ifstream in(log(n));
        std::stringstream ss;
        ss << in.rdbuf();
        ADD_FAILURE() << n << " log:\n" << ss.str();
      }
    }
    ASSERT_TRUE(ready) << "the cluster did not become ready";
    for (int s = 0; s < 2; ++s) {
      std::ifstream in(*dir_ / ("gpu" + std::to_string(s) + ".port"));
      in >> gpu_ports_[s];
      ASSERT_GT(gpu_ports_[s], 0) << "gpu" << s << " wrote no port";
    }
    auto m = model::Model::Load(kModel);
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = m->release();
    auto t = Tokenizer::Load(kTokenizer);
    ASSERT_TRUE(t.ok()) << t.status();
    tokenizer_ = t->release();
  }
  static void TearDownTestSuite() {
    if (procs_) {
      // Coordinator first (drains), then the workers; every one must exit cleanly.
      for (int i : {2, 3, 4, 0, 1}) {
        if (i < static_cast<int>(procs_->size())) {
          EXPECT_EQ((*procs_)[i]->Stop(), 0) << i;
        }
      }
    }
    delete procs_;
    delete model_;
    delete tokenizer_;
    delete dir_;
    procs_ = nullptr;
  }

  static httplib::Result Post(const std::string& path, const json& body) {
    httplib::Client c("127.0.0.1", http_port_);
    c.set_read_timeout(120, 0);
    return c.Post(path.c_str(), body.dump(), "application/json");
  }
  static std::vector<int32_t> PromptIds(const json& messages) {
    auto r = Post("/tokenize", {{"messages", messages}});
    EXPECT_TRUE(r && r->status == 200) << (r ? r->body : "no response");
    return json::parse(r->body)["tokens"].get<std::vector<int32_t>>();
  }
  static double KvUsage() {
    const std::string m = testing_util::HttpGet(http_port_, "/metrics");
    const size_t at = m.find("\nsplitserve:kv_cache_usage_perc{");
    if (at == std::string::npos) return -1;
    return std::stod(m.substr(m.find('}', at) + 1));
  }
  // Streams a chat completion; returns the content text; checks the SSE framing.
  static std::string StreamChat(const json& messages, int max_tokens) {
    json body = {{"model", "tiny"},          {"messages", messages},
                 {"max_tokens", max_tokens}, {"temperature", 0},
                 {"stream", true},           {"stream_options", {{"include_usage", true}}}};
    auto r = Post("/v1/chat/completions", body);
    EXPECT_TRUE(r && r->status == 200)
        << (r ? r->body : "no response: " + httplib::to_string(r.error()));
    if (!r) return "";
    std::string text;
    std::istringstream in(r->body);
    std::string line;
    std::vector<std::string> events;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      EXPECT_EQ(line.rfind("data: ", 0), 0u) << line;
      events.push_back(line.substr(6));
    }
    EXPECT_FALSE(events.empty());
    if (events.empty()) return "";
    EXPECT_EQ(events.back(), "[DONE]");
    for (size_t i = 0; i + 1 < events.size(); ++i) {
      const json j = json::parse(events[i], nullptr, false);
      EXPECT_TRUE(j.is_object()) << events[i];
      if (!j.is_object()) continue;
      EXPECT_EQ(j["object"], "chat.completion.chunk");
      if (!j["choices"].empty()) {
        const json& d = j["choices"][0]["delta"];
        if (d.contains("content") && d["content"].is_string()) text += d["content"];
        if (d.contains("reasoning_content") && d["reasoning_content"].is_string()) {
          text += d["reasoning_content"];
        }
      }
    }
    return text;
  }

  static testing_util::TempDir* dir_;
  static std::vector<std::unique_ptr<ChildProcess>>* procs_;
  static int http_port_;
  static int control_port_;
  static int gpu_ports_[2];
  static int expert_grpc_port_;
  static model::Model* model_;
  static Tokenizer* tokenizer_;
};

testing_util::TempDir* ClusterE2eTest::dir_ = nullptr;
std::vector<std::unique_ptr<ChildProcess>>* ClusterE2eTest::procs_ = nullptr;
int ClusterE2eTest::http_port_ = 0;
int ClusterE2eTest::control_port_ = 0;
int ClusterE2eTest::gpu_ports_[2] = {0, 0};
int ClusterE2eTest::expert_grpc_port_ = 0;
model::Model* ClusterE2eTest::model_ = nullptr;
Tokenizer* ClusterE2eTest::tokenizer_ = nullptr;

// Every gRPC service of the running cluster -- the coordinator's control plane, both GPU workers,
// the gRPC expert worker -- answers a client without the cluster token (a plain gRPC client) and
// one with another token UNAUTHENTICATED on every method, and the cluster keeps serving: a
// second Steps stream, a Register of gpu0, heartbeats and pushed streams change nothing. A client
// with the token is answered.
TEST_F(ClusterE2eTest, EveryServiceRefusesAClientWithoutTheClusterToken) {
  namespace pb = ::splitserve::v1;
  const auto addr = [](int port) { return "127.0.0.1:" + std::to_string(port); };
  absl::StatusOr<ClusterCredential> wrong = ClusterCredential::FromToken(std::string(64, '0'));
  ASSERT_TRUE(wrong.ok());
  const auto deadline = [] { return std::chrono::system_clock::now() + std::chrono::seconds(5); };
  for (int who = 0; who < 2; ++who) {
    const auto channel = [&](int port) {
      return who == 0 ? grpc::CreateChannel(addr(port), grpc::InsecureChannelCredentials())
                      : wrong->CreateChannel(addr(port));
    };
    const char* whom = who == 0 ? "no token" : "a wrong token";
    auto control = pb::Coordinator::NewStub(channel(control_port_));
    {
      grpc::ClientContext ctx;
      ctx.set_deadline(deadline());
      pb::RegisterRequest req;
      req.set_protocol_version(kClusterProtocolVersion);
      req.set_worker_id("gpu0");
      req.set_address("127.0.0.1:1");
      req.set_backend("cpu");
      pb::RegisterReply rep;
      EXPECT_EQ(control->Register(&ctx, req, &rep).error_code(), grpc::StatusCode::UNAUTHENTICATED)
          << whom;
      EXPECT_FALSE(rep.has_role());
    }
    {
      grpc::ClientContext ctx;
      ctx.set_deadline(deadline());
      pb::RendezvousRequest req;
      req.set_protocol_version(kClusterProtocolVersion);
      req.set_worker_id("gpu0");
      pb::RendezvousReply rep;
      EXPECT_EQ(control->Rendezvous(&ctx, req, &rep).error_code(),
                grpc::StatusCode::UNAUTHENTICATED)
          << whom;
    }
    {
      grpc::ClientContext ctx;
      ctx.set_deadline(deadline());
      pb::HeartbeatRequest req;
      req.set_protocol_version(kClusterProtocolVersion);
      req.set_worker_id("gpu1");
      pb::HeartbeatReply rep;
      EXPECT_EQ(control->Heartbeat(&ctx, req, &rep).error_code(), grpc::StatusCode::UNAUTHENTICATED)
          << whom;
    }
    for (int port : gpu_ports_) {
      auto gpu = pb::GpuWorker::NewStub(channel(port));
      {
        grpc::ClientContext ctx;
        ctx.set_deadline(deadline());
        pb::StatusRequest req;
        req.set_protocol_version(kClusterProtocolVersion);
        pb::WorkerStatus rep;
        EXPECT_EQ(gpu->Status(&ctx, req, &rep).error_code(), grpc::StatusCode::UNAUTHENTICATED)
            << whom;
        EXPECT_EQ(rep.worker_id(), "");
      }
      {
        grpc::ClientContext ctx;
        ctx.set_deadline(deadline());
        pb::StageStreams req;
        req.set_protocol_version(kClusterProtocolVersion);
        req.set_micro_batch_id(12345);
        req.set_error("forged");
        pb::PushReply rep;
        EXPECT_EQ(gpu->PushStreams(&ctx, req, &rep).error_code(), grpc::StatusCode::UNAUTHENTICATED)
            << whom;
      }
      {
        grpc::ClientContext ctx;
        ctx.set_deadline(deadline());
        auto steps = gpu->Steps(&ctx);
        pb::StepPlan plan;
        plan.set_protocol_version(kClusterProtocolVersion);
        plan.set_shutdown(true);
        steps->Write(plan);
        steps->WritesDone();
        pb::StepResult r;
        EXPECT_FALSE(steps->Read(&r)) << whom;
        EXPECT_EQ(steps->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED) << whom;
      }
    }
    auto expert = pb::ExpertService::NewStub(channel(expert_grpc_port_));
    {
      grpc::ClientContext ctx;
      ctx.set_deadline(deadline());
      pb::InfoRequest req;
      req.set_protocol_version(1);  // kGrpcProtocolVersion
      pb::InfoResponse rep;
      EXPECT_EQ(expert->Info(&ctx, req, &rep).error_code(), grpc::StatusCode::UNAUTHENTICATED)
          << whom;
      EXPECT_EQ(rep.layers_size(), 0);
    }
    {
      grpc::ClientContext ctx;
      ctx.set_deadline(deadline());
      pb::ExpertRequest req;
      req.set_protocol_version(1);  // kGrpcProtocolVersion
      req.set_layer(4);
      req.set_tokens(1);
      req.set_top_k(1);
      pb::ExpertResponse rep;
      EXPECT_EQ(expert->Compute(&ctx, req, &rep).error_code(), grpc::StatusCode::UNAUTHENTICATED)
          << whom;
    }
  }
  // With the token: answered.
  auto gpu =
      pb::GpuWorker::NewStub(testing_util::TestCredential().CreateChannel(addr(gpu_ports_[0])));
  grpc::ClientContext ctx;
  ctx.set_deadline(deadline());
  pb::StatusRequest req;
  req.set_protocol_version(kClusterProtocolVersion);
  pb::WorkerStatus rep;
  ASSERT_TRUE(gpu->Status(&ctx, req, &rep).ok());
  EXPECT_EQ(rep.worker_id(), "gpu0");
  EXPECT_TRUE(rep.ready());
  // The cluster still serves: the strangers' Steps streams and Register changed nothing.
  auto r = Post("/v1/completions", {{"model", "tiny"},
                                    {"prompt", std::vector<int32_t>{0, 5, 6}},
                                    {"max_tokens", 3},
                                    {"temperature", 0}});
  ASSERT_TRUE(r && r->status == 200) << (r ? r->body : "no response");
}

TEST_F(ClusterE2eTest, GreedyChatEqualsTheReferenceContinuation) {
  const json messages = {{{"role", "user"}, {"content", "Hello there, tiny model!"}}};
  const std::vector<int32_t> prompt = PromptIds(messages);
  ASSERT_FALSE(prompt.empty());
  const std::vector<int32_t> want = ReferenceGreedy(*model_, prompt, 12);
  ASSERT_FALSE(want.empty());
  auto r = Post("/v1/chat/completions", {{"model", "tiny"},
                                         {"messages", messages},
                                         {"max_tokens", 12},
                                         {"temperature", 0},
                                         {"logprobs", true}});
  ASSERT_TRUE(r && r->status == 200) << (r ? r->body : "no response");
  const json j = json::parse(r->body);
  EXPECT_EQ(j["usage"]["prompt_tokens"], prompt.size());
  EXPECT_EQ(j["usage"]["completion_tokens"], want.size());
  // Each generated token's bytes, as the logprobs report them, are the expected id's bytes.
  const json& content = j["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), want.size()) << r->body;
  for (size_t i = 0; i < want.size(); ++i) {
    const std::optional<std::string_view> token = tokenizer_->TokenBytes(want[i]);
    ASSERT_TRUE(token.has_value()) << want[i];
    std::vector<int> bytes;
    for (const unsigned char ch : *token) bytes.push_back(ch);
    EXPECT_EQ(content[i]["bytes"].get<std::vector<int>>(), bytes) << "token " << i;
  }
}

TEST_F(ClusterE2eTest, CompletionOfPromptIdsEqualsTheReference) {
  const std::vector<int32_t> prompt = {0, 300, 301, 302, 303, 400, 500};
  const std::vector<int32_t> want = ReferenceGreedy(*model_, prompt, 16);
  auto r = Post("/v1/completions",
                {{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 16}, {"temperature", 0}});
  ASSERT_TRUE(r && r->status == 200) << (r ? r->body : "no response");
  const json j = json::parse(r->body);
  EXPECT_EQ(j["choices"][0]["text"], *tokenizer_->Decode(want));
  EXPECT_EQ(j["usage"]["completion_tokens"], want.size());
}

// vLLM's penalties, min_tokens and logit_bias, each computed here on the reference model's logits
// with the sampler's formulas (gpu_worker/sampler.h), written out independently, and compared
// with what the cluster generates; each also changes the plain greedy output, so a parameter
// that had no effect would fail.
TEST_F(ClusterE2eTest, PenaltiesMinTokensAndLogitBiasFollowTheirFormulasOnTheModel) {
  const std::vector<int32_t> prompt = {0, 300, 301, 302, 303, 400, 500, 300, 301};
  const std::vector<int32_t> plain = ReferenceGreedy(*model_, prompt, 24);
  auto complete = [&](json extra) {
    json body = {{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 24}, {"temperature", 0}};
    body.update(extra);
    auto r = Post("/v1/completions", body);
    EXPECT_TRUE(r && r->status == 200) << (r ? r->body : "no response");
    return r && r->status == 200 ? json::parse(r->body) : json();
  };
  const float rep = 1.5f, freq = 0.7f, pres = 0.4f;
  const std::vector<int32_t> penalised =
      ReferenceDecode(*model_, prompt, 24, [&](std::vector<float> l, const auto& out) {
        std::map<int32_t, int32_t> count;
        for (int32_t id : out) ++count[id];
        std::vector<bool> seen(l.size(), false);
        for (int32_t id : prompt) seen[id] = true;
        for (int32_t id : out) seen[id] = true;
        for (size_t i = 0; i < l.size(); ++i) {
          if (seen[i]) l[i] = l[i] > 0.0f ? l[i] / rep : l[i] * rep;
        }
        for (const auto& [id, n] : count) l[id] -= freq * static_cast<float>(n) + pres;
        return Argmax(l);
      });
  ASSERT_NE(penalised, plain) << "pick other penalties: these do not change the output";
  json j = complete(
      {{"repetition_penalty", rep}, {"frequency_penalty", freq}, {"presence_penalty", pres}});
  EXPECT_EQ(j["choices"][0]["text"], *tokenizer_->Decode(penalised));

  // min_tokens: EOS is held back for 5 ids even with +100 on it, then comes at once.
  const int32_t eos = model_->config().eos_token_id;
  const std::vector<int32_t> held =
      ReferenceDecode(*model_, prompt, 24, [&](std::vector<float> l, const auto& out) {
        if (out.size() < 5) {
          l[eos] = -INFINITY;
          return Argmax(l);
        }
        return eos;
      });
  ASSERT_EQ(held.size(), 5u);
  j = complete({{"min_tokens", 5}, {"logit_bias", {{std::to_string(eos), 100}}}});
  EXPECT_EQ(j["choices"][0]["text"], *tokenizer_->Decode(held));
  EXPECT_EQ(j["usage"]["completion_tokens"], 5);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  // Without min_tokens the bias ends it at once; min_tokens above max_tokens is a 400.
  j = complete({{"logit_bias", {{std::to_string(eos), 100}}}});
  EXPECT_EQ(j["usage"]["completion_tokens"], 0);
  auto r = Post("/v1/completions",
                {{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 4}, {"min_tokens", 5}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400) << r->body;
  EXPECT_NE(r->body.find("min_tokens"), std::string::npos) << r->body;
}

// ignore_eos, stop_token_ids, include_stop_str_in_output, min_p and seed on the model, each against
// what the reference's greedy continuation says it must do.
// Prefix caching through the whole cluster (two pipeline stages, cpu backend): prompts that are
// prefixes of one another resume from the snapshots earlier prompts left at their last block
// boundary (B = 128), at prompt ends inside a group of 4, inside a group of 128 and inside the
// window; each reports its cached tokens, continues exactly as the reference model computing
// from position 0, and the prefix-cache metrics add up to what the API reported.
TEST_F(ClusterE2eTest, PrefixCacheHitsContinueAsComputedFromScratch) {
  std::mt19937 rng(2026);
  std::vector<int32_t> base(760);
  for (int32_t& t : base) t = static_cast<int32_t>(16 + rng() % 984);
  auto metric = [](const std::string& name) {
    const std::string m = testing_util::HttpGet(http_port_, "/metrics");
    const size_t at = m.find("\nsplitserve:" + name + "{");
    return at == std::string::npos ? -1.0 : std::stod(m.substr(m.find('}', at) + 1));
  };
  const double queries0 = metric("prefix_cache_queries_total");
  const double hits0 = metric("prefix_cache_hits_total");
  int64_t prompt_sum = 0, cached_sum = 0;
  // {prompt length, the cached tokens it must report}
  const std::vector<std::pair<int, int>> cases = {{130, 0},   {131, 128}, {300, 128}, {258, 256},
                                                  {317, 256}, {700, 256}, {740, 640}};
  for (const auto& [len, want_cached] : cases) {
    SCOPED_TRACE(absl::StrCat("prompt of ", len));
    const std::vector<int32_t> prompt(base.begin(), base.begin() + len);
    std::vector<float> first_logits;
    const std::vector<int32_t> want =
        ReferenceDecode(*model_, prompt, 6, [&](std::vector<float> l, const auto& out) {
          if (out.empty()) first_logits = l;
          return Argmax(l);
        });
    auto r = Post("/v1/completions", {{"model", "tiny"},
                                      {"prompt", prompt},
                                      {"max_tokens", 6},
                                      {"temperature", 0},
                                      {"logprobs", 1}});
    ASSERT_TRUE(r && r->status == 200) << (r ? r->body : "no response");
    const json j = json::parse(r->body);
    EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"], want_cached);
    prompt_sum += len;
    cached_sum += j["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>();
    EXPECT_EQ(j["choices"][0]["text"], *tokenizer_->Decode(want));
    // The first token's logprob against the reference's log-softmax from position 0.
    ASSERT_FALSE(want.empty());
    const float mx = *std::max_element(first_logits.begin(), first_logits.end());
    double z = 0;
    for (const float v : first_logits) z += std::exp(static_cast<double>(v - mx));
    const double ref = static_cast<double>(first_logits[want[0]] - mx) - std::log(z);
    EXPECT_NEAR(j["choices"][0]["logprobs"]["token_logprobs"][0].get<double>(), ref, 1e-4);
  }
  EXPECT_EQ(metric("prefix_cache_queries_total") - queries0, static_cast<double>(prompt_sum));
  EXPECT_EQ(metric("prefix_cache_hits_total") - hits0, static_cast<double>(cached_sum));
  EXPECT_GT(metric("prefix_cache_blocks"), 0);
}

TEST_F(ClusterE2eTest, EosStopIdsStopStringsMinPAndSeedActOnTheModel) {
  const std::vector<int32_t> prompt = {0, 310, 311, 312, 400, 401};
  const std::vector<int32_t> greedy = ReferenceGreedy(*model_, prompt, 12);
  ASSERT_GE(greedy.size(), 4u);
  auto complete = [&](json extra) {
    json body = {{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 12}, {"temperature", 0}};
    body.update(extra);
    auto r = Post("/v1/completions", body);
    EXPECT_TRUE(r && r->status == 200) << (r ? r->body : "no response");
    return r && r->status == 200 ? json::parse(r->body) : json();
  };
  const int32_t eos = model_->config().eos_token_id;
  // +100 on EOS ends generation at once; with ignore_eos EOS is an ordinary id, generated 5 times.
  json j = complete(
      {{"logit_bias", {{std::to_string(eos), 100}}}, {"ignore_eos", true}, {"max_tokens", 5}});
  EXPECT_EQ(j["usage"]["completion_tokens"], 5);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  // A stop id: generation ends before it, the id not returned.
  j = complete({{"stop_token_ids", {greedy[2]}}});
  EXPECT_EQ(j["choices"][0]["text"],
            *tokenizer_->Decode(std::vector<int32_t>(greedy.begin(), greedy.begin() + 2)));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  // A stop string (the third id's text), returned or not.
  const std::string before =
      *tokenizer_->Decode(std::vector<int32_t>(greedy.begin(), greedy.begin() + 2));
  const std::string third = *tokenizer_->Decode(std::vector<int32_t>{greedy[2]});
  ASSERT_TRUE(!third.empty() && before.find(third) == std::string::npos) << "pick another prompt";
  j = complete({{"stop", {third}}});
  EXPECT_EQ(j["choices"][0]["text"], before);
  j = complete({{"stop", {third}}, {"include_stop_str_in_output", true}});
  EXPECT_EQ(j["choices"][0]["text"], before + third);
  // min_p 1 keeps only the likeliest id: sampling at temperature 1 becomes greedy.
  j = complete({{"temperature", 1.0}, {"min_p", 1.0}, {"seed", 5}});
  EXPECT_EQ(j["choices"][0]["text"], *tokenizer_->Decode(greedy));
  // A seed replays a sampled continuation; another seed (almost surely) differs.
  const json a = complete({{"temperature", 1.5}, {"seed", 11}});
  const json b = complete({{"temperature", 1.5}, {"seed", 11}});
  const json c = complete({{"temperature", 1.5}, {"seed", 12}});
  EXPECT_EQ(a["choices"][0]["text"], b["choices"][0]["text"]);
  EXPECT_NE(a["choices"][0]["text"], c["choices"][0]["text"]);
}

// n choices are n sequences: choice i is exactly the single request with seed + i.
TEST_F(ClusterE2eTest, NChoicesEqualTheirSingleRunsWithSeedPlusIndex) {
  const std::vector<int32_t> prompt = {0, 320, 321, 322};
  auto complete = [&](json extra) {
    json body = {{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 10}, {"temperature", 1.2}};
    body.update(extra);
    auto r = Post("/v1/completions", body);
    EXPECT_TRUE(r && r->status == 200) << (r ? r->body : "no response");
    return r && r->status == 200 ? json::parse(r->body) : json();
  };
  const json many = complete({{"n", 3}, {"seed", 70}});
  ASSERT_EQ(many["choices"].size(), 3u);
  std::set<std::string> distinct;
  size_t tokens = 0;
  for (int i = 0; i < 3; ++i) {
    const json one = complete({{"seed", 70 + i}});
    EXPECT_EQ(many["choices"][i]["text"], one["choices"][0]["text"]) << i;
    EXPECT_EQ(many["choices"][i]["index"], i);
    distinct.insert(many["choices"][i]["text"].get<std::string>());
    tokens += one["usage"]["completion_tokens"].get<size_t>();
  }
  EXPECT_GT(distinct.size(), 1u);
  EXPECT_EQ(many["usage"]["completion_tokens"], tokens);
  EXPECT_EQ(many["usage"]["prompt_tokens"], prompt.size());
}

// n > 1 prefills the prompt once: choice 0 computes it and the other choices resume from the
// snapshot it left at its last block boundary (the engine's prefix-cache hits grow by that much
// per extra choice), and each choice still equals its single run with seed + index.
TEST_F(ClusterE2eTest, NChoicesPrefillThePromptOnce) {
  std::vector<int32_t> prompt(300);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(16 + (i * 37) % 900);
  auto hits = [] {
    const std::string m = testing_util::HttpGet(http_port_, "/metrics");
    const size_t at = m.find("\nsplitserve:prefix_cache_hits_total{");
    return at == std::string::npos ? -1.0 : std::stod(m.substr(m.find('}', at) + 1));
  };
  auto complete = [&](json extra) {
    json body = {{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 6}, {"temperature", 1.0}};
    body.update(extra);
    auto r = Post("/v1/completions", body);
    EXPECT_TRUE(r && r->status == 200) << (r ? r->body : "no response");
    return r && r->status == 200 ? json::parse(r->body) : json();
  };
  const double before = hits();
  const json many = complete({{"n", 3}, {"seed", 90}});
  ASSERT_EQ(many["choices"].size(), 3u);
  EXPECT_EQ(hits() - before, 2 * 256) << "choices 1 and 2 resume at 256 (B = 128)";
  EXPECT_EQ(many["usage"]["prompt_tokens_details"]["cached_tokens"], 256);
  for (int i = 0; i < 3; ++i) {
    const json one = complete({{"seed", 90 + i}});
    EXPECT_EQ(many["choices"][i]["text"], one["choices"][0]["text"]) << i;
  }
}

TEST_F(ClusterE2eTest, ConcurrentStreamsMatchTheirSoloRuns) {
  constexpr int kN = 16;
  std::vector<json> prompts;
  for (int i = 0; i < kN; ++i) {
    prompts.push_back(json::array(
        {{{"role", "user"}, {"content", "Request number " + std::to_string(i) + " says hi"}}}));
  }
  std::vector<std::string> solo(kN), together(kN);
  for (int i = 0; i < kN; ++i) solo[i] = StreamChat(prompts[i], 10);
  std::vector<std::thread> threads;
  for (int i = 0; i < kN; ++i) {
    threads.emplace_back([&, i] { together[i] = StreamChat(prompts[i], 10); });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kN; ++i) {
    EXPECT_EQ(together[i], solo[i]) << i;
  }
  std::set<std::string> distinct(solo.begin(), solo.end());
  EXPECT_GT(distinct.size(), 1u);  // the prompts really differ
}

TEST_F(ClusterE2eTest, CancelledStreamReturnsKvUsageToBaseline) {
  const double baseline = KvUsage();
  ASSERT_GE(baseline, 0.0);
  {
    httplib::Client c("127.0.0.1", http_port_);
    int chunks = 0;
    json body = {{"model", "tiny"},
                 {"messages", {{{"role", "user"}, {"content", "go on forever"}}}},
                 {"max_tokens", 900},
                 {"temperature", 0.7},
                 {"stream", true}};
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/chat/completions";
    req.body = body.dump();
    req.set_header("Content-Type", "application/json");
    req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) {
      return ++chunks < 4;  // false: the client hangs up mid-stream
    };
    c.send(req);
    EXPECT_GE(chunks, 4);
  }
  double usage = -1;
  for (int i = 0; i < 200; ++i) {
    usage = KvUsage();
    if (usage == baseline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(usage, baseline);
}

TEST_F(ClusterE2eTest, MalformedRequestsGetErrorsAndServingContinues) {
  httplib::Client c("127.0.0.1", http_port_);
  const std::vector<std::string> bad = {
      "{",
      "[]",
      R"({"model": "tiny", "messages": "hi"})",
      R"({"model": "nope", "messages": [{"role": "user", "content": "x"}]})",
      R"({"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": -3})",
      R"({"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1000000})",
      "{\"model\": \"tiny\", \"messages\": [{\"role\": \"user\", \"content\": \"\xff\xfe\"}]}"};
  for (const std::string& b : bad) {
    auto r = c.Post("/v1/chat/completions", b, "application/json");
    ASSERT_TRUE(r) << b;
    EXPECT_GE(r->status, 400) << b;
    EXPECT_LT(r->status, 500) << b;
    EXPECT_TRUE(json::parse(r->body, nullptr, false).contains("error")) << r->body;
  }
  auto ok = Post("/v1/chat/completions", {{"model", "tiny"},
                                          {"messages", {{{"role", "user"}, {"content", "ok?"}}}},
                                          {"max_tokens", 4}});
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
}

// The coordinator does not start without a cluster token (exit 2, saying how to give one), nor
// with a token and --insecure_cluster at once; SPLITSERVE_CLUSTER_TOKEN is enough.
TEST(CoordinatorBinary, RefusesToStartWithoutAClusterToken) {
  testing_util::TempDir dir("coordinator_token");
  std::ofstream(dir / "cluster.json") << R"({"model_name": "tiny", "stages": [{"layers": "0-6",
      "workers": ["gpu0"]}], "expert_workers": []})";
  const std::vector<std::string> base = {kBin + "/splitserve-coordinator",
                                         "--model",
                                         kModel,
                                         "--tokenizer",
                                         kTokenizer,
                                         "--cluster",
                                         dir / "cluster.json",
                                         "--port",
                                         "0",
                                         "--control-listen",
                                         "127.0.0.1:0"};
  const auto run = [&](std::vector<std::string> extra, const std::string& log) {
    std::vector<std::string> argv = base;
    argv.insert(argv.end(), extra.begin(), extra.end());
    ChildProcess p(argv, dir / log);
    const int status = p.WaitExit(std::chrono::seconds(30));
    if (status == -1) p.Stop();
    return std::make_pair(status, testing_util::ReadAll(dir / log));
  };
  const char* saved = std::getenv(kClusterTokenEnv);
  const std::string token = saved ? saved : "";
  unsetenv(kClusterTokenEnv);
  const auto none = run({}, "none.log");
  EXPECT_EQ(none.first, 2) << none.second;
  EXPECT_NE(none.second.find("no cluster token"), std::string::npos) << none.second;
  const auto both =
      run({"--insecure-cluster", "--cluster-token-file", dir / "cluster.json"}, "both.log");
  EXPECT_EQ(both.first, 2) << both.second;
  EXPECT_NE(both.second.find("exclude each other"), std::string::npos) << both.second;
  // With the token it starts (and keeps running until stopped).
  testing_util::ExportTestClusterToken();
  {
    ChildProcess p(base, dir / "ok.log");
    EXPECT_EQ(p.WaitExit(std::chrono::milliseconds(1500)), -1)
        << testing_util::ReadAll(dir / "ok.log");
    EXPECT_EQ(p.Stop(), 0);
  }
  if (saved) setenv(kClusterTokenEnv, token.c_str(), 1);
}

}  // namespace
}  // namespace ss
