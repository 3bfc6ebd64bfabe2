// The OpenAI gateway's end-to-end test fixture (openai_server*_test.cc): an OpenAiServer on
// loopback over a FakeEngine scripted with ids of real DeepSeek-V4 text (the tokenizer is loaded
// once per suite), httplib::Client as the client, and raw sockets for what a client library cannot
// send.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "coordinator/dsv4_format.h"
#include "coordinator/openai_server.h"
#include "coordinator/tokenizer.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "tests/coordinator/fake_engine.h"

// A named namespace: every test file must share the one fixture type (gtest checks that all tests
// of a suite use the same class).
namespace ss::openai_server_test {

using Json = nlohmann::ordered_json;

class OpenAiServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::signal(SIGPIPE, SIG_IGN);
    auto tok = Tokenizer::Load(SS_TOKENIZER_JSON);
    ASSERT_TRUE(tok.ok()) << tok.status();
    auto added = ReadAddedTokensFile(SS_TOKENIZER_DATA "/v4_added_tokens.json");  // ｜DSML｜ etc.
    ASSERT_TRUE(added.ok()) << added.status();
    ASSERT_TRUE((*tok)->AddSpecialTokens(*added).ok());
    tokenizer_ = tok->release();
  }
  static void TearDownTestSuite() { delete tokenizer_; }

  void Start(GatewayConfig config = {}) {
    config.max_body_bytes = 1 << 20;
    Launch(config, FakeEngine::Options{});
  }
  void SetUp() override { Start(); }
  // Restarts with `config` (its max_context_tokens set to 4096) and an engine that delivers
  // `script` one id every `delay`.
  void StartWith(GatewayConfig config, std::vector<int32_t> script,
                 std::chrono::milliseconds delay) {
    TearDown();
    Launch(config, FakeEngine::Options{std::move(script), false, delay});
  }
  // The gateway with `config` (max_context_tokens 4096) over a fake engine of `engine`.
  void Launch(GatewayConfig config, FakeEngine::Options engine) {
    config.max_context_tokens = 4096;
    engine_ = std::make_unique<FakeEngine>(std::move(engine));
    server_ = std::make_unique<OpenAiServer>(config, *tokenizer_, *engine_);
    auto port = server_->Start("127.0.0.1", 0);
    ASSERT_TRUE(port.ok()) << port.status();
    port_ = *port;
    client_ = std::make_unique<httplib::Client>("127.0.0.1", *port);
    client_->set_read_timeout(10, 0);
  }
  // A blocking TCP connection to the server (-1 on failure), with 5 s send/receive timeouts.
  int Connect() const {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port_));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    timeval tv{5, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
      ::close(fd);
      return -1;
    }
    return fd;
  }
  static bool SendAll(int fd, const std::string& data) {
    size_t done = 0;
    while (done < data.size()) {
      const ssize_t n = ::send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
      if (n <= 0) return false;
      done += static_cast<size_t>(n);
    }
    return true;
  }
  // Everything the server sends until it closes the connection or `timeout` passes.
  static std::string ReadAll(int fd, std::chrono::milliseconds timeout) {
    std::string out;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      char buf[4096];
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) break;
      out.append(buf, static_cast<size_t>(n));
    }
    return out;
  }
  // Restarts with an engine that delivers `script` one id every `delay`.
  void Restart(std::vector<int32_t> script, std::chrono::milliseconds delay) {
    TearDown();
    engine_ = std::make_unique<FakeEngine>(FakeEngine::Options{std::move(script), false, delay});
    GatewayConfig config;
    config.max_context_tokens = 4096;
    server_ = std::make_unique<OpenAiServer>(config, *tokenizer_, *engine_);
    auto port = server_->Start("127.0.0.1", 0);
    ASSERT_TRUE(port.ok()) << port.status();
    client_ = std::make_unique<httplib::Client>("127.0.0.1", *port);
    client_->set_read_timeout(10, 0);
  }
  void WaitCancelled(int n) {
    for (int i = 0; i < 500 && engine_->cancelled_count() < n; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_EQ(engine_->cancelled_count(), n);
  }
  void TearDown() override {
    client_.reset();
    server_.reset();
    engine_.reset();
  }

  std::vector<int32_t> Ids(const std::string& text) {
    auto ids = tokenizer_->Encode(text);
    EXPECT_TRUE(ids.ok());
    return *ids;
  }

  httplib::Result Post(const std::string& path, const std::string& body,
                       const httplib::Headers& headers = {}) {
    return client_->Post(path.c_str(), headers, body, "application/json");
  }

  static Json ChatBody(bool stream, bool thinking) {
    Json b = Json::object();
    b["model"] = "deepseek-v4";
    b["messages"] = Json::array({Json{{"role", "user"}, {"content", "What is 2+2?"}}});
    b["chat_template_kwargs"] = Json{{"thinking", thinking}};
    b["stream"] = stream;
    return b;
  }

  // Parses an SSE body: every event's data; checks the framing.
  static std::vector<std::string> Events(const std::string& body) {
    std::vector<std::string> out;
    size_t pos = 0;
    while (pos < body.size()) {
      size_t end = body.find("\n\n", pos);
      EXPECT_NE(end, std::string::npos) << "unterminated event";
      if (end == std::string::npos) break;
      std::string ev = body.substr(pos, end - pos);
      EXPECT_EQ(ev.rfind("data: ", 0), 0u) << ev;
      out.push_back(ev.substr(6));
      pos = end + 2;
    }
    return out;
  }

  static void ExpectError(const httplib::Result& r, int status, const std::string& param = "") {
    ASSERT_TRUE(r) << "no response";
    EXPECT_EQ(r->status, status) << r->body;
    Json j = Json::parse(r->body, nullptr, false);
    ASSERT_TRUE(j.is_object()) << r->body;
    ASSERT_TRUE(j.contains("error")) << r->body;
    const Json& e = j["error"];
    EXPECT_TRUE(e["message"].is_string());
    EXPECT_TRUE(e["type"].is_string());
    EXPECT_TRUE(e.contains("param"));
    EXPECT_TRUE(e.contains("code"));
    if (!param.empty()) {
      EXPECT_EQ(e["param"], param) << r->body;
    }
  }

  static inline Tokenizer* tokenizer_ = nullptr;
  std::unique_ptr<FakeEngine> engine_;
  std::unique_ptr<OpenAiServer> server_;
  std::unique_ptr<httplib::Client> client_;
  int port_ = 0;  // set by Start() and StartWith()
};

// Streams `body` and returns the concatenated deltas plus the parsed events.
struct Streamed {
  std::string reasoning, content;
  Json tool_calls = Json::array();
  std::string finish;
  Json usage;
  bool done = false;
};

inline Streamed Concat(const std::vector<std::string>& events) {
  Streamed s;
  for (size_t i = 0; i < events.size(); ++i) {
    if (events[i] == "[DONE]") {
      EXPECT_EQ(i + 1, events.size()) << "[DONE] must be last";
      s.done = true;
      continue;
    }
    Json c = Json::parse(events[i], nullptr, false);
    EXPECT_TRUE(c.is_object()) << events[i];
    if (!c.is_object()) continue;
    EXPECT_EQ(c["object"], "chat.completion.chunk");
    if (c.contains("usage")) s.usage = c["usage"];
    for (const auto& ch : c["choices"]) {
      const Json& d = ch["delta"];
      if (d.contains("reasoning_content")) s.reasoning += d["reasoning_content"].get<std::string>();
      if (d.contains("content")) s.content += d["content"].get<std::string>();
      if (d.contains("tool_calls")) {
        for (const auto& t : d["tool_calls"]) s.tool_calls.push_back(t);
      }
      if (!ch["finish_reason"].is_null()) s.finish = ch["finish_reason"];
    }
  }
  return s;
}

}  // namespace ss::openai_server_test
