#include "coordinator/openai_server.h"

#include <sys/socket.h>

#include <array>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <exception>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/metrics/metrics.h"
#include "coordinator/access_log.h"
#include "coordinator/anthropic_api.h"
#include "coordinator/connection_pool.h"
#include "coordinator/connection_socket.h"
#include "coordinator/cors.h"
#include "coordinator/openai_server_impl.h"
#include "httplib.h"
#include "spdlog/spdlog.h"

namespace ss {

namespace gateway {

ConnectionEndpoints Endpoints(const httplib::Request& req) {
  return ConnectionEndpoints{req.local_port, req.remote_addr, req.remote_port};
}

void SendJson(httplib::Response& res, const openai::Json& j) {
  res.status = 200;
  res.set_content(openai::Dump(j), "application/json");
}

int64_t NowSeconds() { return static_cast<int64_t>(std::time(nullptr)); }

}  // namespace gateway

namespace {

using gateway::Endpoints;
using gateway::kClientClosed;
using gateway::kRequestIdHeader;
using openai::ApiError;
using openai::Dump;
using openai::ErrorBody;
using openai::ToApiError;

// A connection waiting for a request's headers may have received this much beyond a maximal body
// (which a client may send right behind them) before it is dropped (receive_deadline.h).
constexpr uint64_t kHeadBytesAllowance = 1u << 20;

// Routes answered in Anthropic's shapes (errors included).
bool IsAnthropic(const httplib::Request& req) { return req.path == "/v1/messages"; }

// The error's body in the shape of the request's API.
std::string ErrorText(const httplib::Request& req, const ApiError& e) {
  return Dump(IsAnthropic(req) ? anthropic::ErrorBody(e.status, e.message) : ErrorBody(e));
}

void SendError(httplib::Response& res, const ApiError& e, const std::string& body) {
  res.status = e.status;
  if (e.retry_after_s > 0) res.set_header("Retry-After", std::to_string(e.retry_after_s));
  res.set_content(body, "application/json");
}
void SendError(httplib::Response& res, const ApiError& e) { SendError(res, e, Dump(ErrorBody(e))); }

bool HasBody(const httplib::Request& req) {
  return req.has_header("Transfer-Encoding") ||
         (req.has_header("Content-Length") && req.get_header_value("Content-Length") != "0");
}

// Answers with `e` and then closes the connection, for a request whose body was not read (or not
// all of it): httplib would otherwise parse the rest of the body as the next request. A chunked
// provider that finishes the response and then returns false makes httplib drop the connection;
// before that, what the client still sends is discarded for a while (up to 16 MiB or 1 s, when
// the request carries a body), so that the close does not reset the connection under the
// response.
void SendErrorAndClose(const httplib::Request& req, httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_header("Connection", "close");
  auto body = std::make_shared<std::string>(ErrorText(req, e));
  res.set_chunked_content_provider(
      "application/json",
      [body, ep = Endpoints(req), linger = HasBody(req)](size_t, httplib::DataSink& sink) {
        sink.write(body->data(), body->size());
        sink.done();
        if (const int fd = linger ? FindConnectionSocket(ep) : -1; fd >= 0) {
          LingeringShutdown(fd, size_t{16} << 20, std::chrono::seconds(1));
        }
        return false;
      });
}

// A client's X-Request-Id is used when it is 1..128 characters of [A-Za-z0-9._:-] (it goes into
// the log); otherwise the gateway makes one.
bool UsableRequestId(const std::string& id) {
  if (id.empty() || id.size() > 128) return false;
  for (char c : id) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != ':' &&
        c != '-') {
      return false;
    }
  }
  return true;
}

// Health probes and scrapes: open without a key, not counted as errors, logged at debug level.
bool IsProbe(const std::string& path) {
  return path == "/health" || path == "/ready" || path == "/metrics" || path == "/ping";
}

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;
uint64_t Mix(uint64_t z) {  // splitmix64's finaliser
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Statuses httplib sets itself (404 route, 400 unparsable request) get a body too.
httplib::Server::HandlerResponse RenderHttplibError(const httplib::Request& req,
                                                    httplib::Response& res) {
  if (!res.body.empty() || res.has_header("Content-Type")) {
    return httplib::Server::HandlerResponse::Unhandled;
  }
  ApiError e{res.status, "", "invalid_request_error", "", "", 0};
  if (res.status == 404) {
    e.message = absl::StrCat("no route ", req.method, " ", req.path);
  } else if (res.status == 413) {
    e.message = "request body too large";
  } else {
    e.message = absl::StrCat("HTTP ", res.status);
    if (res.status >= 500) e.type = "server_error";
  }
  res.set_content(Dump(ErrorBody(e)), "application/json");
  return httplib::Server::HandlerResponse::Handled;
}

}  // namespace

// ---------------------------------------------------------------------------------------------

StatsSample OpenAiServer::Impl::Stats() const {
  StatsSample s;
  s.prompt_tokens = gm->prompt_tokens_total();
  s.generation_tokens = gm->generation_tokens_total();
  const EngineGauges g = config.engine_gauges ? config.engine_gauges() : EngineGauges{};
  s.running = g.running.value_or(gm->open_requests());
  s.waiting = g.waiting.value_or(0);
  s.kv_usage = g.kv_usage.value_or(0.0);
  s.prefix_queries = g.prefix_queries.value_or(0);
  s.prefix_hits = g.prefix_hits.value_or(0);
  return s;
}

std::string OpenAiServer::Impl::NewRequestId() {
  const uint64_t n = ++next_request_id;
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016llx%016llx",
                static_cast<unsigned long long>(Mix(request_id_salt[0] + kGolden * n)),
                static_cast<unsigned long long>(Mix(request_id_salt[1] + kGolden * n)));
  return buf;
}

std::array<uint64_t, 2> OpenAiServer::Impl::RandomSalt() {
  std::random_device rd;  // the kernel's entropy (getrandom)
  std::array<uint64_t, 2> salt{};
  for (uint64_t& s : salt) s = (uint64_t{rd()} << 32) ^ rd();
  return salt;
}

absl::Status OpenAiServer::Impl::ServerError(const httplib::Response& res, const std::string& what,
                                             const std::string& detail) {
  const std::string id = res.get_header_value(kRequestIdHeader);
  spdlog::error("request {}: {}: {}", id, what, detail);
  return absl::InternalError(absl::StrCat(what, "; see the server log for request ", id));
}

void OpenAiServer::Impl::LogAccess(const httplib::Request& req, const httplib::Response& res) {
  const std::string id = res.get_header_value(kRequestIdHeader);
  const std::optional<AccessRecord> record = access.Take(&res, id);
  const std::string line =
      AccessLine(absl::StrCat(req.remote_addr, ":", req.remote_port), req.method, req.path,
                 res.status, id, record ? &*record : nullptr);
  if (IsProbe(req.path)) {
    spdlog::debug("{}", line);
  } else {
    spdlog::info("{}", line);
  }
}

bool OpenAiServer::Impl::Authorized(const httplib::Request& req) const {
  if (config.api_keys.empty()) return true;
  // Anthropic's clients send the key as x-api-key.
  if (const std::string key = req.get_header_value("x-api-key"); !key.empty()) {
    for (const auto& k : config.api_keys) {
      if (k == key) return true;
    }
  }
  const std::string auth = req.get_header_value("Authorization");
  constexpr std::string_view kBearer = "Bearer ";
  if (auth.size() <= kBearer.size() || auth.compare(0, kBearer.size(), kBearer) != 0) {
    return false;
  }
  const std::string key = auth.substr(kBearer.size());
  for (const auto& k : config.api_keys) {
    if (k == key) return true;
  }
  return false;
}

void OpenAiServer::Impl::Guard(const httplib::Request& req, httplib::Response& res, Handler fn) {
  if (absl::Status s = (this->*fn)(req, res); !s.ok()) {
    const ApiError e = ToApiError(s);
    SendError(res, e, ErrorText(req, e));
  }
}

// Before routing: the request id, CORS, and the refusals that must come before any body is read.
httplib::Server::HandlerResponse OpenAiServer::Impl::PreRoute(const httplib::Request& req,
                                                              httplib::Response& res) {
  deadline->HeadReceived(Endpoints(req));
  std::string id = req.get_header_value(kRequestIdHeader);
  res.set_header(kRequestIdHeader, UsableRequestId(id) ? id : NewRequestId());
  if (!HasBody(req) && HandlePreflight(cors, req, res)) {
    return httplib::Server::HandlerResponse::Handled;
  }
  AddCorsHeaders(cors, req, res);
  // Only GET and POST have routes. httplib reads the body of any other method that may carry
  // one into memory without a limit before routing, and a body left unread would be parsed as
  // the next request: both are refused here, before any body is read.
  if (req.method != "GET" && req.method != "HEAD" && req.method != "POST") {
    SendErrorAndClose(req, res,
                      ApiError{405, absl::StrCat("method ", req.method, " not allowed"),
                               "invalid_request_error", "", "", 0});
    return httplib::Server::HandlerResponse::Handled;
  }
  if (req.method != "POST" && HasBody(req)) {
    SendErrorAndClose(req, res,
                      ApiError{400, absl::StrCat(req.method, " with a body"),
                               "invalid_request_error", "", "", 0});
    return httplib::Server::HandlerResponse::Handled;
  }
  if (IsProbe(req.path) || Authorized(req)) {
    return httplib::Server::HandlerResponse::Unhandled;
  }
  SendErrorAndClose(req, res,
                    ApiError{401, "Incorrect API key provided", "invalid_request_error", "",
                             "invalid_api_key", 0});
  return httplib::Server::HandlerResponse::Handled;
}

// Every response passes here once written: the connection's next request is timed from now;
// count the errors (probes, scrapes and clients that went away excepted).
void OpenAiServer::Impl::Responded(const httplib::Request& req, const httplib::Response& res) {
  deadline->Done(Endpoints(req));
  LogAccess(req, res);
  if (res.status < 400 || res.status == kClientClosed) return;
  if (IsProbe(req.path)) return;
  gm->Error(res.status).Increment();
}

void OpenAiServer::Impl::ServeGet(Handler fn, const httplib::Request& req, httplib::Response& res) {
  deadline->Received(Endpoints(req));
  Guard(req, res, fn);
}

// POST bodies are read here, not by httplib, which bounds only a Content-Length body: a chunked
// (or compressed) one is counted as it arrives and refused with 413 past max_body_bytes, without
// reading further. A refused body is left unread and its connection closed.
void OpenAiServer::Impl::ServePost(Handler fn, const httplib::Request& req, httplib::Response& res,
                                   const httplib::ContentReader& reader) {
  const size_t limit = config.max_body_bytes;
  const ApiError too_large{413,
                           absl::StrCat("request body too large (the limit is ", limit, " bytes)"),
                           "invalid_request_error",
                           "",
                           "",
                           0};
  if (req.has_header("Content-Length")) {
    uint64_t n = 0;
    if (!absl::SimpleAtoi(req.get_header_value("Content-Length"), &n)) {
      return SendErrorAndClose(
          req, res, ApiError{400, "invalid Content-Length", "invalid_request_error", "", "", 0});
    }
    if (n > limit) return SendErrorAndClose(req, res, too_large);
  }
  std::string body;
  bool over = false;
  const bool read = reader([&](const char* data, size_t n) {
    if (n > limit - body.size()) {
      over = true;
      return false;
    }
    body.append(data, n);
    return true;
  });
  if (over) return SendErrorAndClose(req, res, too_large);
  if (!read) {
    return SendErrorAndClose(
        req, res,
        ApiError{400, "the request body could not be read", "invalid_request_error", "", "", 0});
  }
  deadline->Received(Endpoints(req));
  httplib::Request with_body = req;
  with_body.body = std::move(body);
  Guard(with_body, res, fn);
}

void OpenAiServer::Impl::Install(httplib::Server& s) {
  s.set_payload_max_length(config.max_body_bytes);
  s.set_keep_alive_timeout(std::max(1, config.keep_alive_timeout_s));
  s.set_pre_routing_handler(
      [this](const httplib::Request& req, httplib::Response& res) { return PreRoute(req, res); });
  s.set_error_handler(httplib::Server::HandlerWithResponse(RenderHttplibError));
  s.set_logger(
      [this](const httplib::Request& req, const httplib::Response& res) { Responded(req, res); });
  s.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
    SendError(res, ToApiError(ServerError(res, "internal error", "exception in a handler")));
  });
  auto get = [this](Handler fn) {
    return
        [this, fn](const httplib::Request& req, httplib::Response& res) { ServeGet(fn, req, res); };
  };
  auto post = [this](Handler fn) {
    return [this, fn](const httplib::Request& req, httplib::Response& res,
                      const httplib::ContentReader& reader) { ServePost(fn, req, res, reader); };
  };
  s.Post("/v1/chat/completions", post(&Impl::HandleChat));
  s.Post("/v1/completions", post(&Impl::HandleCompletion));
  s.Post("/v1/messages", post(&Impl::HandleMessages));
  s.Post("/v1/responses", post(&Impl::HandleResponses));
  s.Post("/tokenize", post(&Impl::HandleTokenize));
  s.Post("/detokenize", post(&Impl::HandleDetokenize));
  s.Post("/ping", post(&Impl::HandlePing));
  // Any other POST: 404 without reading its body (httplib would read it without a limit).
  s.Post(".*",
         [](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader&) {
           SendErrorAndClose(req, res,
                             ApiError{404, absl::StrCat("no route ", req.method, " ", req.path),
                                      "invalid_request_error", "", "", 0});
         });
  s.Get("/v1/models", get(&Impl::HandleModels));
  s.Get("/ping", get(&Impl::HandlePing));
  s.Get("/version", get(&Impl::HandleVersion));
  s.Get("/load", get(&Impl::HandleLoad));
  s.Get("/metrics", get(&Impl::HandleMetrics));
  s.Get("/health", [this](const httplib::Request& req, httplib::Response& res) {
    deadline->Received(Endpoints(req));
    res.set_content("{\"status\":\"ok\"}", "application/json");
  });
  s.Get("/ready", [this](const httplib::Request& req, httplib::Response& res) {
    deadline->Received(Endpoints(req));
    if (engine->Ready()) {
      res.set_content("{\"status\":\"ready\"}", "application/json");
    } else {
      SendError(res, ApiError{503, "not ready", "server_error", "", "not_ready", 1});
    }
  });
}

// ---------------------------------------------------------------------------------------------

OpenAiServer::OpenAiServer(GatewayConfig config, const Tokenizer& tokenizer,
                           GenerationEngine& engine)
    : impl_(std::make_unique<Impl>()), server_(std::make_unique<httplib::Server>()) {
  impl_->config = std::move(config);
  impl_->tokenizer = &tokenizer;
  impl_->engine = &engine;
  impl_->structured =
      std::make_unique<openai::StructuredOutput>(tokenizer, impl_->config.model_vocab_size);
  if (impl_->config.metrics == nullptr) {
    impl_->owned_metrics = std::make_unique<metrics::Metrics>();
    impl_->registry = impl_->owned_metrics.get();
  } else {
    impl_->registry = impl_->config.metrics;
  }
  impl_->cors = CorsPolicy{impl_->config.allowed_origins, impl_->config.allow_credentials,
                           impl_->config.allowed_methods, impl_->config.allowed_headers};
  impl_->gm = std::make_unique<GatewayMetrics>(*impl_->registry, impl_->config.model_name,
                                               impl_->config.max_context_tokens);
  impl_->deadline = std::make_unique<ReceiveDeadline>(
      std::chrono::milliseconds(std::max(1, impl_->config.head_timeout_ms)),
      std::chrono::milliseconds(std::max(1, impl_->config.body_timeout_ms)),
      impl_->config.max_body_bytes + kHeadBytesAllowance);
  impl_->Install(*server_);
}

OpenAiServer::~OpenAiServer() { Stop(); }

absl::StatusOr<int> OpenAiServer::Start(const std::string& host, int port) {
  if (thread_.joinable()) return absl::FailedPreconditionError("server already started");
  // cpp-httplib listens with a backlog of 5, compiled into Debian's library: a burst of more
  // simultaneous connections than that has its SYNs dropped, and those clients wait a whole TCP
  // retransmission timeout (1 s) before the server sees them. The listening socket is captured
  // when it is created and listened on again with the system's maximum backlog.
  auto listen_fd = std::make_shared<std::atomic<int>>(-1);
  server_->set_socket_options([listen_fd](socket_t sock) {
    httplib::default_socket_options(sock);
    listen_fd->store(sock);
  });
  int bound = port;
  if (port == 0) {
    bound = server_->bind_to_any_port(host);
    if (bound <= 0) return absl::UnavailableError(absl::StrCat("cannot bind ", host, ":0"));
  } else if (!server_->bind_to_port(host, port)) {
    return absl::UnavailableError(absl::StrCat("cannot bind ", host, ":", port));
  }
  if (const int fd = listen_fd->load(); fd >= 0 && ::listen(fd, SOMAXCONN) != 0) {
    spdlog::warn("HTTP listen backlog stays at cpp-httplib's 5: listen: {}", std::strerror(errno));
  }
  const size_t threads = static_cast<size_t>(std::max(1, impl_->config.http_threads));
  server_->new_task_queue = [threads] { return new ConnectionPool(threads); };
  impl_->deadline->Start(bound);
  if (impl_->config.log_stats_interval_s > 0) {
    Impl* impl = impl_.get();
    impl_->stats_log = std::make_unique<StatsLogger>(
        absl::Seconds(impl_->config.log_stats_interval_s), [impl] { return impl->Stats(); });
    impl_->stats_log->Start();
  }
  thread_ = std::thread([this] { server_->listen_after_bind(); });
  while (!server_->is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return bound;
}

void OpenAiServer::Stop() {
  if (!thread_.joinable()) return;
  server_->stop();
  thread_.join();
  impl_->deadline->Stop();
  if (impl_->stats_log) impl_->stats_log->Stop();
}

}  // namespace ss
