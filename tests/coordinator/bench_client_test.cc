// `splitserve bench serve`'s client and load against the real OpenAI gateway over a FakeEngine
// (loopback): TTFT and ITL against the engine's step delay, token counts from usage (cached
// tokens too, present or absent), sequential turns and their indices, the concurrency limit, and
// every failure ending as a failed request with its reason.
#include "coordinator/bench/bench_client.h"

#include <gtest/gtest.h>

#include <csignal>
#include <memory>

#include "coordinator/bench/bench_metrics.h"
#include "coordinator/bench/bench_runner.h"
#include "coordinator/openai_server.h"
#include "coordinator/tokenizer.h"
#include "httplib.h"
#include "tests/coordinator/fake_engine.h"

namespace ss::bench {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr auto kStep = 40ms;

class BenchClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::signal(SIGPIPE, SIG_IGN);
    auto tok = Tokenizer::Load(SS_TINY_TOKENIZER);
    ASSERT_TRUE(tok.ok()) << tok.status();
    tokenizer_ = std::move(*tok);
    auto ids = tokenizer_->Encode("the quick brown fox jumps over the lazy dog again");
    ASSERT_TRUE(ids.ok());
    script_ = *ids;
    ASSERT_GE(script_.size(), 6u);
    engine_ = std::make_unique<FakeEngine>(FakeEngine::Options{script_, false, kStep});
    GatewayConfig config;
    config.model_name = "tiny";
    config.max_context_tokens = 4096;
    server_ = std::make_unique<OpenAiServer>(config, *tokenizer_, *engine_);
    auto port = server_->Start("127.0.0.1", 0);
    ASSERT_TRUE(port.ok()) << port.status();
    url_ = "http://127.0.0.1:" + std::to_string(*port);
  }
  void TearDown() override {
    if (server_) server_->Stop();
    server_.reset();
    engine_.reset();
  }

  ClientTarget Target() const {
    ClientTarget t;
    t.base_url = url_;
    t.endpoint = "/v1/completions";
    t.model = "tiny";
    t.timeout_s = 20;
    return t;
  }
  static Turn TurnOf(int64_t prompt_len, int64_t out) {
    Turn t;
    for (int64_t i = 0; i < prompt_len; ++i) t.prompt_ids.push_back(static_cast<int32_t>(20 + i));
    t.output_len = out;
    return t;
  }

  std::unique_ptr<Tokenizer> tokenizer_;
  std::vector<int32_t> script_;
  std::unique_ptr<FakeEngine> engine_;
  std::unique_ptr<OpenAiServer> server_;
  std::string url_;
};

TEST_F(BenchClientTest, TimesChunksAndCountsUsage) {
  CompletionClient client(Target());
  const RequestOutput r = client.Send(TurnOf(7, 5), Clock::now());
  ASSERT_TRUE(r.success) << r.error;
  EXPECT_EQ(r.prompt_len, 7);
  EXPECT_EQ(r.output_tokens, 5);  // max_tokens 5 of the longer script, from usage
  // The first id comes one step after the request; each later one a step apart.
  EXPECT_GE(r.ttft_s, 0.8 * std::chrono::duration<double>(kStep).count());
  ASSERT_GE(r.itl_s.size(), 3u);
  ASSERT_LE(r.itl_s.size(), 4u);
  for (double gap : r.itl_s) EXPECT_GE(gap, 0.5 * std::chrono::duration<double>(kStep).count());
  EXPECT_GE(r.latency_s, 5 * 0.8 * std::chrono::duration<double>(kStep).count());
  EXPECT_NEAR(*Tpot(r), (r.latency_s - r.ttft_s) / 4, 1e-12);
  EXPECT_EQ(FirstModelId(url_, "", 5).value_or(""), "tiny");
}

TEST_F(BenchClientTest, OutputTokensComeFromUsageNotTheRequest) {
  engine_->set_script({script_[0], script_[1]});  // ends (EOS) after 2 ids, asked for 50
  CompletionClient client(Target());
  const RequestOutput r = client.Send(TurnOf(3, 50), Clock::now());
  ASSERT_TRUE(r.success) << r.error;
  EXPECT_EQ(r.output_tokens, 2);
}

TEST_F(BenchClientTest, FailuresEndAsFailedRequests) {
  CompletionClient client(Target());
  engine_->set_fail(true);
  RequestOutput r = client.Send(TurnOf(3, 5), Clock::now());
  EXPECT_FALSE(r.success);
  EXPECT_NE(r.error.find("error in stream"), std::string::npos) << r.error;
  engine_->set_fail(false);

  ClientTarget wrong = Target();
  wrong.model = "other-model";
  r = CompletionClient(wrong).Send(TurnOf(3, 5), Clock::now());
  EXPECT_FALSE(r.success);
  EXPECT_NE(r.error.find("HTTP 404"), std::string::npos) << r.error;

  engine_->set_overloaded(true);
  r = client.Send(TurnOf(3, 5), Clock::now());
  EXPECT_FALSE(r.success);
  EXPECT_NE(r.error.find("HTTP 5"), std::string::npos) << r.error;
  engine_->set_overloaded(false);

  // A hang: one id every 1.5 s against a 0.3 s timeout.
  TearDown();
  engine_ = std::make_unique<FakeEngine>(FakeEngine::Options{script_, false, 1500ms});
  GatewayConfig config;
  config.model_name = "tiny";
  server_ = std::make_unique<OpenAiServer>(config, *tokenizer_, *engine_);
  auto port = server_->Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok());
  url_ = "http://127.0.0.1:" + std::to_string(*port);
  ClientTarget quick = Target();
  quick.timeout_s = 0.3;
  const auto t0 = Clock::now();
  r = CompletionClient(quick).Send(TurnOf(3, 5), Clock::now());
  EXPECT_FALSE(r.success);
  EXPECT_NE(r.error.find("timed out"), std::string::npos) << r.error;
  EXPECT_LT(Clock::now() - t0, 1200ms);
  engine_->set_ready(false);

  // Nothing listening.
  ClientTarget dead = Target();
  dead.base_url = "http://127.0.0.1:1";
  r = CompletionClient(dead).Send(TurnOf(3, 5), Clock::now());
  EXPECT_FALSE(r.success);
  EXPECT_FALSE(r.error.empty());
  EXPECT_TRUE(absl::IsUnavailable(FirstModelId("http://127.0.0.1:1", "", 5).status()));
}

TEST_F(BenchClientTest, SendsTheApiKey) {
  TearDown();
  engine_ = std::make_unique<FakeEngine>(FakeEngine::Options{script_, false, 1ms});
  GatewayConfig config;
  config.model_name = "tiny";
  config.api_keys = {"sekrit"};
  server_ = std::make_unique<OpenAiServer>(config, *tokenizer_, *engine_);
  auto port = server_->Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok());
  url_ = "http://127.0.0.1:" + std::to_string(*port);
  RequestOutput r = CompletionClient(Target()).Send(TurnOf(3, 2), Clock::now());
  EXPECT_FALSE(r.success);
  EXPECT_NE(r.error.find("HTTP 401"), std::string::npos) << r.error;
  ClientTarget keyed = Target();
  keyed.api_key = "sekrit";
  r = CompletionClient(keyed).Send(TurnOf(3, 2), Clock::now());
  EXPECT_TRUE(r.success) << r.error;
  EXPECT_EQ(FirstModelId(url_, "sekrit", 5).value_or(""), "tiny");
}

// A server whose streams are broken in the ways a client must survive: each ends as a failed
// request naming the fault.
TEST(BenchClientBrokenServerTest, MalformedStreamsFail) {
  httplib::Server server;
  std::string body;
  server.Post("/v1/completions", [&](const httplib::Request&, httplib::Response& res) {
    res.set_content(body, "text/event-stream");
  });
  const int port = server.bind_to_any_port("127.0.0.1");
  ASSERT_GT(port, 0);
  std::thread listener([&] { server.listen_after_bind(); });
  ClientTarget t;
  t.base_url = "http://127.0.0.1:" + std::to_string(port);
  t.endpoint = "/v1/completions";
  t.model = "m";
  t.timeout_s = 5;
  Turn turn;
  turn.prompt_ids = {20, 21};
  turn.output_len = 2;
  const std::string chunk = "data: {\"choices\": [{\"text\": \"a\"}]}\n\n";
  const std::string usage =
      "data: {\"choices\": [], \"usage\": {\"prompt_tokens\": 2, \"completion_tokens\": 2}}\n\n";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {chunk + "data: {not json\n\n", "malformed stream event"},
      {chunk + chunk + usage, "ended before data: [DONE]"},
      {chunk + chunk + "data: [DONE]\n\n", "no usage"},
      {chunk + "data: {\"error\": {\"message\": \"boom\"}}\n\n", "error in stream: boom"},
  };
  auto client = std::make_unique<CompletionClient>(t);
  for (const auto& [b, why] : cases) {
    body = b;
    const RequestOutput r = client->Send(turn, Clock::now());
    EXPECT_FALSE(r.success) << b;
    EXPECT_NE(r.error.find(why), std::string::npos) << r.error;
    EXPECT_EQ(r.output_tokens, 0);
  }
  body = chunk + chunk + usage + "data: [DONE]\n\n";  // and a good one on the same client
  const RequestOutput ok = client->Send(turn, Clock::now());
  EXPECT_TRUE(ok.success) << ok.error;
  EXPECT_EQ(ok.output_tokens, 2);
  EXPECT_EQ(ok.itl_s.size(), 1u);
  // A reply whose only chunk has no text (a token ending mid-character): TTFT falls back to the
  // first chunk with a choice, never 0.
  body = "data: {\"choices\": [{\"text\": \"\", \"finish_reason\": \"length\"}]}\n\n" +
         std::string("data: {\"choices\": [], \"usage\": {\"prompt_tokens\": 2, ") +
         "\"completion_tokens\": 1}}\n\ndata: [DONE]\n\n";
  const RequestOutput one = client->Send(turn, Clock::now());
  EXPECT_TRUE(one.success) << one.error;
  EXPECT_GT(one.ttft_s, 0);
  EXPECT_LE(one.ttft_s, one.latency_s);
  client.reset();  // closes the kept-alive connection, so that the server stops at once
  server.stop();
  listener.join();
}

// usage.prompt_tokens_details.cached_tokens is read when there; a server that leaves it out or
// sends null (vLLM without --enable-prompt-tokens-details) still works, with 0 cached.
TEST(BenchClientBrokenServerTest, CachedTokensFromUsageWhenPresent) {
  httplib::Server server;
  std::string body;
  server.Post("/v1/completions", [&](const httplib::Request&, httplib::Response& res) {
    res.set_content(body, "text/event-stream");
  });
  const int port = server.bind_to_any_port("127.0.0.1");
  ASSERT_GT(port, 0);
  std::thread listener([&] { server.listen_after_bind(); });
  ClientTarget t;
  t.base_url = "http://127.0.0.1:" + std::to_string(port);
  t.endpoint = "/v1/completions";
  t.model = "m";
  t.timeout_s = 5;
  Turn turn;
  turn.prompt_ids = {20, 21, 22, 23};
  turn.output_len = 2;
  auto stream = [](const std::string& details) {
    return "data: {\"choices\": [{\"text\": \"a\"}]}\n\n"
           "data: {\"choices\": [{\"text\": \"b\"}]}\n\n"
           "data: {\"choices\": [], \"usage\": {\"prompt_tokens\": 4, "
           "\"completion_tokens\": 2, \"total_tokens\": 6" +
           details + "}}\n\ndata: [DONE]\n\n";
  };
  const std::vector<std::pair<std::string, int64_t>> cases = {
      {", \"prompt_tokens_details\": {\"cached_tokens\": 3}", 3},
      {"", 0},
      {", \"prompt_tokens_details\": null", 0},
      {", \"prompt_tokens_details\": {}", 0},
      {", \"prompt_tokens_details\": {\"cached_tokens\": null}", 0},
  };
  auto client = std::make_unique<CompletionClient>(t);
  for (const auto& [details, cached] : cases) {
    body = stream(details);
    const RequestOutput r = client->Send(turn, Clock::now());
    ASSERT_TRUE(r.success) << details << ": " << r.error;
    EXPECT_EQ(r.prompt_len, 4) << details;
    EXPECT_EQ(r.output_tokens, 2) << details;
    EXPECT_EQ(r.cached_tokens, cached) << details;
  }
  // A failed request reports no cached tokens even when its usage carried some.
  body = stream(", \"prompt_tokens_details\": {\"cached_tokens\": 3}");
  body.resize(body.size() - std::string("data: [DONE]\n\n").size());
  const RequestOutput cut = client->Send(turn, Clock::now());
  EXPECT_FALSE(cut.success);
  EXPECT_EQ(cut.cached_tokens, 0);
  client.reset();
  server.stop();
  listener.join();
}

TEST_F(BenchClientTest, TurnsAreSequentialAndConcurrencyIsBounded) {
  std::vector<Conversation> convs(3);
  for (Conversation& c : convs) c.turns = {TurnOf(4, 3), TurnOf(9, 3)};
  LoadResult r =
      RunLoad(convs, std::vector<double>(3, 0.0), /*max_concurrency=*/0, Target(), nullptr);
  ASSERT_EQ(r.outputs.size(), 6u);
  for (size_t i = 0; i < 6; i += 2) {
    ASSERT_TRUE(r.outputs[i].success && r.outputs[i + 1].success) << r.outputs[i].error;
    EXPECT_GE(r.outputs[i + 1].start_s, r.outputs[i].start_s + r.outputs[i].latency_s);
    EXPECT_EQ(r.outputs[i + 1].prompt_len, 9);
    EXPECT_EQ(r.outputs[i].turn, 0);
    EXPECT_EQ(r.outputs[i + 1].turn, 1);
    EXPECT_EQ(r.outputs[i].cached_tokens, 0);  // the gateway's usage says 0 for a FakeEngine
  }
  // One slot: the three conversations (6 requests of >= 3 steps) run one after another.
  std::atomic<int64_t> finished{0};
  r = RunLoad(convs, std::vector<double>(3, 0.0), 1, Target(), &finished);
  EXPECT_EQ(finished.load(), 6);
  EXPECT_GE(r.duration_s, 6 * 3 * 0.8 * std::chrono::duration<double>(kStep).count());
  for (size_t i = 1; i < 6; ++i) {
    EXPECT_GE(r.outputs[i].start_s, r.outputs[i - 1].start_s + r.outputs[i - 1].latency_s);
  }
}

}  // namespace
}  // namespace ss::bench
