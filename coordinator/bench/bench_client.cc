#include "coordinator/bench/bench_client.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "httplib.h"
#include "nlohmann/json.hpp"

namespace ss::bench {
namespace {

using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr size_t kMaxErrorBody = 2000;  // of an error response, kept in `error`

// "http://h:p/prefix" -> {"http://h:p", "/prefix"}.
std::pair<std::string, std::string> SplitUrl(const std::string& url) {
  const size_t scheme = url.find("://");
  const size_t slash = url.find('/', scheme == std::string::npos ? 0 : scheme + 3);
  if (slash == std::string::npos) return {url, ""};
  std::string prefix = url.substr(slash);
  while (!prefix.empty() && prefix.back() == '/') prefix.pop_back();
  return {url.substr(0, slash), prefix};
}

std::unique_ptr<httplib::Client> MakeClient(const std::string& host_port, double timeout_s) {
  auto c = std::make_unique<httplib::Client>(host_port);
  const auto t = std::chrono::duration<double>(timeout_s);
  const auto connect = std::min<std::chrono::duration<double>>(t, std::chrono::seconds(10));
  c->set_connection_timeout(std::chrono::duration_cast<std::chrono::microseconds>(connect));
  c->set_read_timeout(std::chrono::duration_cast<std::chrono::microseconds>(t));
  c->set_write_timeout(std::chrono::duration_cast<std::chrono::microseconds>(t));
  return c;
}

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// The stream's state, fed one SSE line at a time.
struct StreamParse {
  Clock::time_point sent;
  Clock::time_point last_token;
  bool got_token = false;
  // The first chunk with any choice (text or not): TTFT's fallback when no chunk carried text
  // (a reply of one token whose bytes end mid-character decodes to nothing).
  Clock::time_point first_choice;
  bool got_choice = false;
  bool done = false;
  bool have_usage = false;
  std::string error;
  RequestOutput* out = nullptr;

  // false once the stream is known to have failed.
  bool Line(std::string_view line, Clock::time_point now) {
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || line[0] == ':') return true;  // event separator or comment
    if (line.rfind("data:", 0) != 0) return true;     // event:, id:, retry: -- not used
    line.remove_prefix(5);
    while (!line.empty() && line[0] == ' ') line.remove_prefix(1);
    if (line == "[DONE]") {
      done = true;
      return true;
    }
    Json j = Json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      error = "malformed stream event: " + std::string(line.substr(0, 200));
      return false;
    }
    if (j.contains("error")) {
      const Json& e = j["error"];
      error = absl::StrCat("error in stream: ",
                           e.is_object() && e.contains("message") && e["message"].is_string()
                               ? e["message"].get<std::string>()
                               : e.dump());
      return false;
    }
    if (j.contains("choices") && j["choices"].is_array() && !j["choices"].empty()) {
      if (!got_choice) first_choice = now;
      got_choice = true;
      const Json& c = j["choices"][0];
      if (c.is_object() && c.contains("text") && c["text"].is_string() &&
          !c["text"].get_ref<const std::string&>().empty()) {
        if (!got_token) {
          out->ttft_s = Seconds(now - sent);
        } else {
          out->itl_s.push_back(Seconds(now - last_token));
        }
        got_token = true;
        last_token = now;
      }
    }
    if (j.contains("usage") && j["usage"].is_object()) {
      const Json& u = j["usage"];
      if (u.contains("prompt_tokens") && u["prompt_tokens"].is_number_integer()) {
        out->prompt_len = u["prompt_tokens"].get<int64_t>();
      }
      if (u.contains("completion_tokens") && u["completion_tokens"].is_number_integer()) {
        out->output_tokens = u["completion_tokens"].get<int64_t>();
        have_usage = true;
      }
      if (u.contains("prompt_tokens_details") && u["prompt_tokens_details"].is_object()) {
        const Json& d = u["prompt_tokens_details"];
        if (d.contains("cached_tokens") && d["cached_tokens"].is_number_integer()) {
          out->cached_tokens = d["cached_tokens"].get<int64_t>();
        }
      }
    }
    return true;
  }
};

}  // namespace

CompletionClient::CompletionClient(ClientTarget target) : target_(std::move(target)) {
  auto [host_port, prefix] = SplitUrl(target_.base_url);
  path_ = prefix + target_.endpoint;
  http_ = MakeClient(host_port, target_.timeout_s);
  http_->set_keep_alive(true);
}

CompletionClient::~CompletionClient() = default;

RequestOutput CompletionClient::Send(const Turn& turn, Clock::time_point run_start) {
  RequestOutput out;
  out.prompt_len = turn.prompt_text.empty() ? turn.PromptLen() : 0;
  Json body = {{"model", target_.model},
               {"max_tokens", turn.output_len},
               {"temperature", target_.temperature},
               {"stream", true},
               {"stream_options", {{"include_usage", true}}}};
  if (turn.prompt_text.empty()) {
    body["prompt"] = turn.prompt_ids;
  } else {
    body["prompt"] = turn.prompt_text;
  }
  if (target_.ignore_eos) body["ignore_eos"] = true;

  httplib::Request req;
  req.method = "POST";
  req.path = path_;
  req.body = body.dump();
  req.headers.emplace("Content-Type", "application/json");
  req.headers.emplace("Accept", "text/event-stream");
  if (!target_.api_key.empty()) {
    req.headers.emplace("Authorization", "Bearer " + target_.api_key);
  }

  StreamParse parse;
  parse.out = &out;
  std::string pending;     // bytes after the last complete line
  std::string error_body;  // of a non-200 answer
  int status = 0;
  bool timed_out = false;
  req.response_handler = [&](const httplib::Response& r) {
    status = r.status;
    return true;
  };
  const double timeout_s = target_.timeout_s;
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    const Clock::time_point now = Clock::now();
    if (Seconds(now - parse.sent) > timeout_s) {
      timed_out = true;
      return false;
    }
    if (status != 200) {
      error_body.append(data,
                        std::min(n, kMaxErrorBody - std::min(kMaxErrorBody, error_body.size())));
      return true;
    }
    pending.append(data, n);
    size_t begin = 0;
    for (size_t nl; (nl = pending.find('\n', begin)) != std::string::npos; begin = nl + 1) {
      if (!parse.Line(std::string_view(pending).substr(begin, nl - begin), now)) return false;
    }
    pending.erase(0, begin);
    return true;
  };

  parse.sent = Clock::now();
  out.start_s = Seconds(parse.sent - run_start);
  httplib::Result res = http_->send(req);
  out.latency_s = Seconds(Clock::now() - parse.sent);

  if (!parse.error.empty()) {
    out.error = parse.error;
  } else if (timed_out || (res.error() == httplib::Error::Read && out.latency_s >= timeout_s)) {
    out.error = absl::StrCat("timed out after ", timeout_s, " s (--request-timeout)");
  } else if (status != 0 && status != 200) {
    out.error = absl::StrCat("HTTP ", status, ": ", error_body);
  } else if (!res && !parse.done) {
    out.error = absl::StrCat("request failed: ", httplib::to_string(res.error()));
  } else if (!parse.done) {
    out.error = "the stream ended before data: [DONE]";
  } else if (!parse.have_usage) {
    out.error = "the stream carried no usage (stream_options.include_usage not honoured)";
  }
  out.success = out.error.empty();
  if (out.success && !parse.got_token) {
    out.ttft_s = parse.got_choice ? Seconds(parse.first_choice - parse.sent) : out.latency_s;
  }
  if (!out.success) {
    out.output_tokens = 0;
    out.cached_tokens = 0;
    out.itl_s.clear();
    out.ttft_s = 0;
    http_->stop();  // the connection may be mid-stream: start the next request on a new one
  }
  return out;
}

absl::StatusOr<std::string> FirstModelId(const std::string& base_url, const std::string& api_key,
                                         double timeout_s) {
  auto [host_port, prefix] = SplitUrl(base_url);
  std::unique_ptr<httplib::Client> c = MakeClient(host_port, std::min(timeout_s, 30.0));
  httplib::Headers headers;
  if (!api_key.empty()) headers.emplace("Authorization", "Bearer " + api_key);
  const std::string url = base_url + "/v1/models";
  httplib::Result r = c->Get(prefix + "/v1/models", headers);
  if (!r) {
    return absl::UnavailableError(
        absl::StrCat("cannot reach the server at ", url, ": ", httplib::to_string(r.error()),
                     r.error() == httplib::Error::Connection ? " (nothing listening there?)" : ""));
  }
  if (r->status != 200) {
    return absl::FailedPreconditionError(
        absl::StrCat("GET ", url, ": HTTP ", r->status, ": ", r->body.substr(0, kMaxErrorBody)));
  }
  Json j = Json::parse(r->body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.contains("data") || !j["data"].is_array() || j["data"].empty() ||
      !j["data"][0].contains("id") || !j["data"][0]["id"].is_string()) {
    return absl::FailedPreconditionError(
        absl::StrCat("GET ", url, ": no model id in the answer (pass --model)"));
  }
  return j["data"][0]["id"].get<std::string>();
}

}  // namespace ss::bench
