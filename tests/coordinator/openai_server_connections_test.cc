// The OpenAI gateway end to end on loopback (openai_server_test_util.h): connections (bursts, slow
// and oversized requests, clients that hang up) and what the server records of them (metrics,
// access log).
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/metrics/metrics.h"
#include "nlohmann/json.hpp"
#include "spdlog/sinks/ostream_sink.h"
#include "spdlog/spdlog.h"
#include "tests/coordinator/openai_server_test_util.h"

namespace ss::openai_server_test {
namespace {

TEST_F(OpenAiServerTest, DisconnectCancels) {
  TearDown();
  Start();
  // A long script at 20 ms a token: the client reads the first chunk and hangs up.
  std::vector<int32_t> script;
  for (int i = 0; i < 500; ++i) script.push_back(Ids(" tick")[0]);
  engine_ = nullptr;
  server_.reset();
  engine_ = std::make_unique<FakeEngine>(
      FakeEngine::Options{script, false, std::chrono::milliseconds(20)});
  GatewayConfig config;
  config.max_context_tokens = 4096;
  server_ = std::make_unique<OpenAiServer>(config, *tokenizer_, *engine_);
  auto port = server_->Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok());
  client_ = std::make_unique<httplib::Client>("127.0.0.1", *port);
  int chunks = 0;
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/chat/completions";
  req.body = ChatBody(true, false).dump();
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++chunks < 3; };
  auto r = client_->send(req);
  EXPECT_FALSE(r);  // cancelled by the receiver
  client_->stop();
  client_.reset();
  for (int i = 0; i < 200 && engine_->cancelled_count() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(engine_->cancelled_count(), 1);
}

// A burst of simultaneous connections well beyond cpp-httplib's built-in listen backlog (5) is
// taken at once: without the gateway's deeper backlog the kernel drops the SYNs that overflow
// the accept queue and those clients wait a TCP retransmission (1 s) before they are seen (a
// 8-client benchmark lost a second per burst to it). Every non-blocking connect must complete
// within half of that.
TEST_F(OpenAiServerTest, ConnectionBurstIsNotDropped) {
  TearDown();
  engine_ = std::make_unique<FakeEngine>(FakeEngine::Options{});
  server_ = std::make_unique<OpenAiServer>(GatewayConfig{}, *tokenizer_, *engine_);
  auto port = server_->Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status();
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(*port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  constexpr int kConnections = 64;
  std::vector<pollfd> fds;
  for (int i = 0; i < kConnections; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    ASSERT_GE(fd, 0);
    const int rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr);
    ASSERT_TRUE(rc == 0 || errno == EINPROGRESS) << std::strerror(errno);
    fds.push_back({fd, POLLOUT, 0});
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
  int connected = 0;
  std::vector<bool> done(kConnections, false);
  while (connected < kConnections && std::chrono::steady_clock::now() < deadline) {
    ASSERT_GE(::poll(fds.data(), fds.size(), 50), 0);
    for (int i = 0; i < kConnections; ++i) {
      if (done[i] || !(fds[i].revents & (POLLOUT | POLLERR | POLLHUP))) continue;
      int err = 0;
      socklen_t len = sizeof err;
      ASSERT_EQ(::getsockopt(fds[i].fd, SOL_SOCKET, SO_ERROR, &err, &len), 0);
      EXPECT_EQ(err, 0) << "connection " << i << ": " << std::strerror(err);
      done[i] = true;
      fds[i].events = 0;
      ++connected;
    }
  }
  for (const pollfd& p : fds) ::close(p.fd);
  EXPECT_EQ(connected, kConnections) << "connections still in SYN retransmission after 500 ms";
  // And the server still answers.
  httplib::Client c("127.0.0.1", *port);
  auto r = c.Get("/health");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
}

// The value of the sample `name` whose labels include every `labels` entry (as `k="v"`); -1 when
// there is none.
double Sample(const std::string& text, const std::string& name,
              const std::vector<std::string>& labels = {}) {
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    if (line.rfind(name + "{", 0) != 0 && line.rfind(name + " ", 0) != 0) continue;
    bool ok = true;
    for (const auto& l : labels) ok = ok && line.find(l) != std::string::npos;
    if (!ok) continue;
    return std::stod(line.substr(line.rfind(' ') + 1));
  }
  return -1;
}

constexpr char kModelLabel[] = "model_name=\"deepseek-v4\"";

// Error responses are counted after they are written, so a scrape right after the client got
// the response may not see the count yet: scrape again for up to 5 s until it reads `want`.
double SampleEventually(const std::function<std::string()>& scrape, const std::string& name,
                        const std::vector<std::string>& labels, double want) {
  double v = -1;
  for (int i = 0; i < 500; ++i) {
    v = Sample(scrape(), name, labels);
    if (v == want) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return v;
}

TEST_F(OpenAiServerTest, MetricsAfterRequests) {
  // 5 ms a token so that later tokens arrive in events of their own (inter-token latency).
  TearDown();
  engine_ = std::make_unique<FakeEngine>(
      FakeEngine::Options{Ids("The answer is 4."), false, std::chrono::milliseconds(5)});
  GatewayConfig config;
  config.max_context_tokens = 4096;
  server_ = std::make_unique<OpenAiServer>(config, *tokenizer_, *engine_);
  auto port = server_->Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok());
  client_ = std::make_unique<httplib::Client>("127.0.0.1", *port);
  client_->set_read_timeout(10, 0);

  auto r = Post("/v1/chat/completions", ChatBody(false, false).dump());
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const Json usage1 = Json::parse(r->body)["usage"];
  Json body = ChatBody(true, false);
  body["stream_options"] = Json{{"include_usage", true}};
  r = Post("/v1/chat/completions", body.dump());
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  const Json usage2 = Concat(Events(r->body)).usage;
  ASSERT_TRUE(usage2.is_object());

  // The stream's response object (and with it the running count) goes away just after [DONE].
  std::string text;
  for (int i = 0; i < 200; ++i) {
    auto m = client_->Get("/metrics");
    ASSERT_TRUE(m);
    ASSERT_EQ(m->status, 200);
    EXPECT_EQ(m->get_header_value("Content-Type"), "text/plain; version=0.0.4");
    text = m->body;
    if (Sample(text, "splitserve:num_requests_running", {kModelLabel}) == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (const char* name : {"splitserve:time_to_first_token_seconds_count",
                           "splitserve:inter_token_latency_seconds_count",
                           "splitserve:e2e_request_latency_seconds_count",
                           "splitserve:request_queue_time_seconds_count",
                           "splitserve:prompt_tokens_total", "splitserve:generation_tokens_total",
                           "splitserve:num_requests_running", "splitserve:num_requests_waiting",
                           "splitserve:kv_cache_usage_perc", "splitserve:request_success_total"}) {
    EXPECT_GE(Sample(text, name, {kModelLabel}), 0) << name << "\n" << text;
  }
  const double prompt =
      usage1["prompt_tokens"].get<double>() + usage2["prompt_tokens"].get<double>();
  const double gen =
      usage1["completion_tokens"].get<double>() + usage2["completion_tokens"].get<double>();
  EXPECT_EQ(Sample(text, "splitserve:prompt_tokens_total", {kModelLabel}), prompt);
  EXPECT_EQ(Sample(text, "splitserve:generation_tokens_total", {kModelLabel}), gen);
  EXPECT_EQ(Sample(text, "splitserve:time_to_first_token_seconds_count", {kModelLabel}), 2);
  EXPECT_EQ(Sample(text, "splitserve:e2e_request_latency_seconds_count", {kModelLabel}), 2);
  EXPECT_EQ(Sample(text, "splitserve:request_queue_time_seconds_count", {kModelLabel}), 2);
  const double itl = Sample(text, "splitserve:inter_token_latency_seconds_count", {kModelLabel});
  EXPECT_GT(itl, 0);
  EXPECT_LE(itl, gen - 2);
  EXPECT_EQ(
      Sample(text, "splitserve:request_success_total", {kModelLabel, "finished_reason=\"stop\""}),
      2);
  EXPECT_EQ(
      Sample(text, "splitserve:request_success_total", {kModelLabel, "finished_reason=\"length\""}),
      0);
  EXPECT_EQ(Sample(text, "splitserve:num_requests_running", {kModelLabel}), 0);
  EXPECT_EQ(Sample(text, "splitserve:num_requests_waiting", {kModelLabel}), 0);
  EXPECT_EQ(Sample(text, "splitserve:kv_cache_usage_perc", {kModelLabel}), 0);
  EXPECT_LT(Sample(text, "splitserve:http_request_errors_total", {kModelLabel}), 0);  // none yet
  // vLLM's per-request series: one observation per request, sums that match the usage.
  for (const char* name :
       {"splitserve:request_prefill_time_seconds_count",
        "splitserve:request_decode_time_seconds_count",
        "splitserve:request_inference_time_seconds_count",
        "splitserve:request_time_per_output_token_seconds_count",
        "splitserve:request_prompt_tokens_count", "splitserve:request_generation_tokens_count",
        "splitserve:request_params_n_count", "splitserve:request_params_max_tokens_count"}) {
    EXPECT_EQ(Sample(text, name, {kModelLabel}), 2) << name << "\n" << text;
  }
  EXPECT_EQ(Sample(text, "splitserve:request_prompt_tokens_sum", {kModelLabel}), prompt);
  EXPECT_EQ(Sample(text, "splitserve:request_generation_tokens_sum", {kModelLabel}), gen);
  EXPECT_EQ(Sample(text, "splitserve:request_params_n_sum", {kModelLabel}), 2);
  // vLLM's bucket ranges: first token up to 2,560 s, the request phases up to 7,680 s, token
  // counts 1-2-5 up to the context (4,096 here).
  EXPECT_EQ(
      Sample(text, "splitserve:time_to_first_token_seconds_bucket", {kModelLabel, "le=\"2560\""}),
      2)
      << text;
  EXPECT_EQ(
      Sample(text, "splitserve:e2e_request_latency_seconds_bucket", {kModelLabel, "le=\"7680\""}),
      2);
  EXPECT_EQ(
      Sample(text, "splitserve:inter_token_latency_seconds_bucket", {kModelLabel, "le=\"80\""}),
      itl);
  EXPECT_EQ(Sample(text, "splitserve:request_prompt_tokens_bucket", {kModelLabel, "le=\"2000\""}),
            2);
  EXPECT_EQ(Sample(text, "splitserve:request_prompt_tokens_bucket", {kModelLabel, "le=\"5000\""}),
            -1);
  // Every registry carries the process's own series.
  EXPECT_NE(text.find("\nprocess_resident_memory_bytes "), std::string::npos) << text;

  ExpectError(Post("/v1/chat/completions", "{not json"), 400);
  auto scrape = [&] {
    auto m = client_->Get("/metrics");
    return m ? m->body : std::string();
  };
  EXPECT_EQ(SampleEventually(scrape, "splitserve:http_request_errors_total",
                             {kModelLabel, "status_code=\"400\""}, 1),
            1)
      << scrape();
  EXPECT_EQ(Sample(scrape(), "splitserve:prompt_tokens_total", {kModelLabel}), prompt);
}

TEST_F(OpenAiServerTest, MetricsOpenSharedRegistryAndHook) {
  TearDown();
  metrics::Metrics registry;
  GatewayConfig config;
  config.api_keys = {"sk-good"};
  config.metrics = &registry;
  int64_t preemptions = 5;
  config.engine_gauges = [&preemptions] {
    EngineGauges g;
    g.kv_usage = 0.25;
    g.running = 3;
    g.waiting = 2;
    g.preemptions = preemptions;
    g.prefix_queries = 1000;
    g.prefix_hits = 768;
    g.prefix_blocks = 6;
    return g;
  };
  Start(config);
  ExpectError(client_->Get("/v1/models"), 401);
  auto m = client_->Get("/metrics");  // open like /health: no key needed
  ASSERT_TRUE(m);
  ASSERT_EQ(m->status, 200);
  EXPECT_EQ(Sample(m->body, "splitserve:kv_cache_usage_perc", {kModelLabel}), 0.25);
  EXPECT_EQ(Sample(m->body, "splitserve:num_requests_running", {kModelLabel}), 3);
  EXPECT_EQ(Sample(m->body, "splitserve:num_requests_waiting", {kModelLabel}), 2);
  EXPECT_EQ(Sample(m->body, "splitserve:num_preemptions_total", {kModelLabel}), 5);
  EXPECT_EQ(Sample(m->body, "splitserve:prefix_cache_queries_total", {kModelLabel}), 1000);
  EXPECT_EQ(Sample(m->body, "splitserve:prefix_cache_hits_total", {kModelLabel}), 768);
  EXPECT_EQ(Sample(m->body, "splitserve:prefix_cache_blocks", {kModelLabel}), 6);
  // The engine's cumulative counts become counter increments: a scrape adds what is new.
  preemptions = 7;
  EXPECT_EQ(
      Sample(client_->Get("/metrics")->body, "splitserve:num_preemptions_total", {kModelLabel}), 7);
  EXPECT_EQ(
      SampleEventually([&] { return registry.Serialize(); }, "splitserve:http_request_errors_total",
                       {kModelLabel, "status_code=\"401\""}, 1),
      1)
      << m->body;
  // A stream that fails after its 200 header counts as a 500.
  engine_->set_script(Ids("hello world"));
  engine_->set_fail(true);
  auto r = Post("/v1/chat/completions", ChatBody(true, false).dump(),
                {{"Authorization", "Bearer sk-good"}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  // The series live in the given registry.
  EXPECT_EQ(
      SampleEventually([&] { return registry.Serialize(); }, "splitserve:http_request_errors_total",
                       {kModelLabel, "status_code=\"500\""}, 1),
      1)
      << registry.Serialize();
  const std::string text = registry.Serialize();
  EXPECT_EQ(
      Sample(text, "splitserve:request_success_total", {kModelLabel, "finished_reason=\"stop\""}),
      0);
  TearDown();  // the server goes before the registry it was given
}

// One access-log line per request, after its response is written (streams included), with the
// request's tokens, TTFT, duration and finish; probes at debug level only.
TEST_F(OpenAiServerTest, AccessLogLinePerRequest) {
  auto out = std::make_shared<std::ostringstream>();
  auto logger = std::make_shared<spdlog::logger>(
      "access_test", std::make_shared<spdlog::sinks::ostream_sink_mt>(*out));
  logger->set_level(spdlog::level::info);
  const auto previous = spdlog::default_logger();
  spdlog::set_default_logger(logger);
  engine_->set_script(Ids("hello world"));
  auto r = Post("/v1/chat/completions", ChatBody(false, false).dump(),
                {{"X-Request-Id", "nonstream-1"}});
  ASSERT_EQ(r->status, 200);
  const Json usage = Json::parse(r->body)["usage"];
  r = Post("/v1/chat/completions", ChatBody(true, false).dump(), {{"X-Request-Id", "stream-1"}});
  ASSERT_EQ(r->status, 200);
  ExpectError(Post("/v1/chat/completions", "{not json", {{"X-Request-Id", "bad-1"}}), 400);
  ASSERT_EQ(client_->Get("/health")->status, 200);
  // The logger runs after the response is written, on each connection's own thread: wait for all
  // three lines (a stream's may come after a later request's).
  const auto logged = [&] {
    const std::string s = out->str();
    for (const char* id : {"request=nonstream-1", "request=stream-1", "request=bad-1"}) {
      if (s.find(id) == std::string::npos) return false;
    }
    return true;
  };
  for (int i = 0; i < 200 && !logged(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  spdlog::set_default_logger(previous);
  const std::string log = out->str();
  const auto line_of = [&](const std::string& id) {
    const size_t at = log.find("request=" + id);
    if (at == std::string::npos) return std::string();
    const size_t begin = log.rfind('\n', at) + 1;
    return log.substr(begin, log.find('\n', at) - begin);
  };
  const std::string a = line_of("nonstream-1");
  EXPECT_NE(a.find("\"POST /v1/chat/completions\" 200"), std::string::npos) << log;
  EXPECT_NE(a.find(absl::StrCat(" prompt=", usage["prompt_tokens"].get<int>(), " cached=0 output=",
                                usage["completion_tokens"].get<int>(), " ttft=")),
            std::string::npos)
      << a;
  EXPECT_NE(a.find(" finish=stop"), std::string::npos) << a;
  EXPECT_NE(a.find(" id=chatcmpl-"), std::string::npos) << a;
  const std::string b = line_of("stream-1");
  EXPECT_NE(b.find(absl::StrCat(" output=", usage["completion_tokens"].get<int>())),
            std::string::npos)
      << log;
  EXPECT_NE(b.find(" finish=stop"), std::string::npos) << b;
  const std::string c = line_of("bad-1");
  EXPECT_NE(c.find("\" 400 request=bad-1"), std::string::npos) << log;
  EXPECT_EQ(c.find("prompt="), std::string::npos) << c;
  EXPECT_EQ(log.find("/health"), std::string::npos) << log;  // debug level
}

// Issue 23 row 4: the body limit holds for a chunked body too. A 200 MB chunked body was read
// whole (the limit applied to Content-Length only); now the server answers 413 once the body
// passes max_body_bytes (1 MiB here) and closes the connection, keeping nothing (it discards at
// most 16 MiB more first), so the sender's writes fail after the limit, the discarded bytes and
// the sockets' buffers; the old server read all 256 MiB.
TEST_F(OpenAiServerTest, ChunkedBodyOverTheLimitIs413WithoutReadingIt) {
  const int fd = Connect();
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(SendAll(fd,
                      "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                      "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"));
  const std::string chunk_data(64 << 10, 'a');
  char size_line[32];
  std::snprintf(size_line, sizeof size_line, "%zx\r\n", chunk_data.size());
  const std::string chunk = size_line + chunk_data + "\r\n";
  constexpr size_t kMax = size_t{256} << 20;  // stop here if the server keeps reading
  size_t sent = 0;
  while (sent < kMax && SendAll(fd, chunk)) sent += chunk.size();
  const std::string response = ReadAll(fd, std::chrono::seconds(5));
  ::close(fd);
  EXPECT_LT(sent, size_t{40} << 20) << "the server kept reading the body";
  EXPECT_EQ(response.rfind("HTTP/1.1 413", 0), 0u) << response.substr(0, 200);
  EXPECT_NE(response.find("request body too large"), std::string::npos) << response;

  // A chunked body within the limit is served as before.
  engine_->set_script(Ids("ok"));
  const std::string body = ChatBody(false, false).dump();
  auto r = client_->Post(
      "/v1/chat/completions",
      [&](size_t offset, httplib::DataSink& sink) {
        if (offset < body.size()) {
          sink.write(body.data() + offset, std::min<size_t>(7, body.size() - offset));
        } else {
          sink.done();
        }
        return true;
      },
      "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  // Content-Length over the limit: 413 at once, also without reading the body.
  const int fd2 = Connect();
  ASSERT_GE(fd2, 0);
  ASSERT_TRUE(SendAll(fd2,
                      "POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                      "Content-Type: application/json\r\nContent-Length: 200000000\r\n\r\n"));
  const std::string r2 = ReadAll(fd2, std::chrono::seconds(5));
  ::close(fd2);
  EXPECT_EQ(r2.rfind("HTTP/1.1 413", 0), 0u) << r2.substr(0, 200);
  // Bodies httplib itself would read without a limit are refused before a byte of them is read:
  // another method's, an unknown POST route's, a GET's. The chunked body is never finished, so
  // an answer proves the server did not wait for it.
  for (const auto& [head, status] :
       std::vector<std::pair<std::string, std::string>>{{"PUT /v1/chat/completions", "405"},
                                                        {"POST /v1/nowhere", "404"},
                                                        {"GET /v1/models", "400"}}) {
    const int fd3 = Connect();
    ASSERT_GE(fd3, 0);
    ASSERT_TRUE(
        SendAll(fd3, head + " HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk));
    const std::string r3 = ReadAll(fd3, std::chrono::seconds(3));
    ::close(fd3);
    EXPECT_EQ(r3.rfind("HTTP/1.1 " + status, 0), 0u) << head << ": " << r3.substr(0, 200);
  }
}

// Issue 23 row 6: connections that send part of a request and stay open no longer take the
// server's whole capacity. With 4 connection threads, 8 such connections kept /health waiting for
// httplib's 5 s read timeout; now each must complete its request line and headers within
// head_timeout_ms (300 ms here), so /health answers within a second, and a connection that
// trickles a byte at a time (which resets a per-read timeout) is closed too. A stream lasting
// well past head_timeout_ms is untouched.
TEST_F(OpenAiServerTest, SlowConnectionsDoNotStarveTheServer) {
  GatewayConfig config;
  config.http_threads = 4;
  config.head_timeout_ms = 300;
  std::vector<int32_t> script(30, Ids(" tick")[0]);  // 30 ids at 50 ms: a 1.5 s stream
  StartWith(config, script, std::chrono::milliseconds(50));
  std::vector<int> slow;
  for (int i = 0; i < 8; ++i) {
    const int fd = Connect();
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(SendAll(fd, "GET /health HTTP/1.1\r\nHost: x\r\n"));  // no blank line
    slow.push_back(fd);
  }
  const int trickle = Connect();
  ASSERT_GE(trickle, 0);
  ASSERT_TRUE(SendAll(trickle, "GET /health HTTP/1.1\r\n"));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));

  const auto t0 = std::chrono::steady_clock::now();
  auto r = client_->Get("/health");
  const auto waited = std::chrono::steady_clock::now() - t0;
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_LT(waited, std::chrono::seconds(1));

  // The trickler sends a header byte every 50 ms; it is closed well before 2 s.
  bool trickle_closed = false;
  for (int i = 0; i < 40 && !trickle_closed; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    pollfd p{trickle, POLLIN, 0};
    char c;
    trickle_closed = !SendAll(trickle, "X") ||
                     (::poll(&p, 1, 0) > 0 && ::recv(trickle, &c, 1, MSG_DONTWAIT) <= 0);
  }
  EXPECT_TRUE(trickle_closed);
  ::close(trickle);
  for (int fd : slow) {
    char c;
    EXPECT_LE(::recv(fd, &c, 1, 0), 0) << "a slow connection is still open";
    ::close(fd);
  }

  // A stream of 1.5 s (5 head timeouts) is delivered whole.
  r = Post("/v1/chat/completions", ChatBody(true, false).dump());
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  const std::vector<std::string> events = Events(r->body);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back(), "[DONE]");
  EXPECT_EQ(Concat(events).finish, "stop");
}

// A header line without end, sent as fast as the server takes it: httplib 0.11 buffers the line
// whole, so the connection is dropped once it has received max_body_bytes + 1 MiB, long before
// the head deadline (the process would otherwise hold all of it), and the server keeps serving.
TEST_F(OpenAiServerTest, AnEndlessHeaderLineIsDroppedByItsBytes) {
  GatewayConfig config;
  config.max_body_bytes = 1u << 20;
  config.head_timeout_ms = 60000;
  StartWith(config, {Ids(" tick")[0]}, std::chrono::milliseconds(1));
  const int fd = Connect();
  ASSERT_GE(fd, 0);
  const timeval send_timeout{2, 0};  // a send the server stopped taking fails instead of hanging
  ASSERT_EQ(::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &send_timeout, sizeof send_timeout), 0);
  ASSERT_TRUE(SendAll(fd, "GET /health HTTP/1.1\r\nX-Long: "));
  const std::string chunk(64 << 10, 'a');
  size_t sent = 0;
  bool dropped = false;
  const auto t0 = std::chrono::steady_clock::now();
  while (!dropped && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20)) {
    dropped = !SendAll(fd, chunk);
    if (!dropped) sent += chunk.size();
  }
  ::close(fd);
  EXPECT_TRUE(dropped) << sent << " bytes sent";
  EXPECT_LT(sent, size_t{64} << 20);
  auto r = client_->Get("/health");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
}

// Issue 23 row 10: a non-streaming client that hangs up cancels its generation (it used to run to
// max_tokens for nobody), and aborts, streamed or not, are counted in
// request_success_total{finished_reason="abort"} as vLLM counts them.
TEST_F(OpenAiServerTest, ClientHangupsCancelAndCountAsAborts) {
  std::vector<int32_t> script(500, Ids(" tick")[0]);  // 10 s at 20 ms an id
  StartWith(GatewayConfig{}, script, std::chrono::milliseconds(20));
  const std::string body = ChatBody(false, false).dump();
  const int fd = Connect();
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(SendAll(fd,
                      "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                      "Content-Type: application/json\r\nContent-Length: " +
                          std::to_string(body.size()) + "\r\n\r\n" + body));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const auto t0 = std::chrono::steady_clock::now();
  ::close(fd);
  for (int i = 0; i < 200 && engine_->cancelled_count() < 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(engine_->cancelled_count(), 1);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
  auto scrape = [&] {
    auto m = client_->Get("/metrics");
    return m ? m->body : std::string();
  };
  const std::vector<std::string> abort = {kModelLabel, "finished_reason=\"abort\""};
  EXPECT_EQ(SampleEventually(scrape, "splitserve:request_success_total", abort, 1), 1) << scrape();

  // A stream whose client stops reading after two chunks.
  int chunks = 0;
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/chat/completions";
  req.body = ChatBody(true, false).dump();
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++chunks < 3; };
  {
    httplib::Client c("127.0.0.1", port_);
    EXPECT_FALSE(c.send(req));
  }
  EXPECT_EQ(SampleEventually(scrape, "splitserve:request_success_total", abort, 2), 2) << scrape();
  for (int i = 0; i < 200 && engine_->cancelled_count() < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(engine_->cancelled_count(), 2);
  // Aborts are not HTTP errors.
  EXPECT_LT(Sample(scrape(), "splitserve:http_request_errors_total", {kModelLabel}), 0) << scrape();
}

}  // namespace
}  // namespace ss::openai_server_test
