// Continuous batching end to end (issue 6 acceptance): `splitserve up` on the bundled tiny model
// (cpu backend, every process real), then decode throughput of one sequence alone against N
// concurrent sequences, through the OpenAI API. The baseline is the single sequence measured in
// the same run; the ratio is what batching buys.
//
//   build/bin/cluster_bench [--concurrency 8] [--tokens 48] [--stages 1] [--repeat 2] [--port P]
//                           [--model NAME]
//   (--port: measure a server already running there instead of starting `splitserve up`;
//   --model: the served model's name, default "tiny", the bundled model's)
//
// Each request is a streamed /v1/completions call with a short prompt of ids and temperature 0;
// throughput = completion tokens / wall time of the batch of requests (prefill included, the
// prompts are 8 tokens), and decode throughput = the tokens after each request's first / the
// span from the batch's first token to its last (prefill and time to first token left out).
// Last line: name=value pairs.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "httplib.h"
#include "nlohmann/json.hpp"
#include "tests/common/http_get.h"
#include "tests/test_util.h"

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

struct Batch {
  int64_t tokens = 0;
  double seconds = 0;
  double slowest = 0, fastest = 0;  // the longest and shortest single request of the batch
  // Decode only: tokens after each request's first, over the span from the first request's first
  // token to the last request's last token (prefill and time to first token left out).
  int64_t decode_tokens = 0;
  double decode_seconds = 0;
  double rate() const { return seconds > 0 ? tokens / seconds : 0; }
  double decode_rate() const { return decode_seconds > 0 ? decode_tokens / decode_seconds : 0; }
};

// n concurrent streamed completions of max_tokens tokens each.
Batch RunBatch(int port, const std::string& model, int n, int max_tokens, int salt) {
  std::vector<int64_t> got(n, 0);
  std::vector<double> took(n, 0.0);
  std::vector<Clock::time_point> first(n), last(n);
  std::vector<std::thread> threads;
  const auto t0 = Clock::now();
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      httplib::Client c("127.0.0.1", port);
      c.set_read_timeout(600, 0);
      std::vector<int> prompt = {0, 100 + i, 200 + salt, 300 + i, 400, 500 + salt, 600 + i, 700};
      json body = {{"model", model},           {"prompt", prompt},
                   {"max_tokens", max_tokens}, {"temperature", 0},
                   {"stream", true},           {"stream_options", {{"include_usage", true}}}};
      httplib::Request req;
      req.method = "POST";
      req.path = "/v1/completions";
      req.body = body.dump();
      req.set_header("Content-Type", "application/json");
      std::string pending;
      bool seen = false;
      req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
        pending.append(data, len);
        for (size_t nl; (nl = pending.find('\n')) != std::string::npos; pending.erase(0, nl + 1)) {
          const std::string line = pending.substr(0, nl);
          if (line.rfind("data: {", 0) != 0) continue;
          const json chunk = json::parse(line.substr(6), nullptr, false);
          if (chunk.is_discarded()) continue;
          if (chunk.contains("usage") && chunk["usage"].is_object()) {
            got[i] = chunk["usage"].value("completion_tokens", int64_t{0});
          }
          if (chunk.contains("choices") && !chunk["choices"].empty()) {
            last[i] = Clock::now();
            if (!seen) first[i] = last[i];
            seen = true;
          }
        }
        return true;
      };
      const auto start = Clock::now();
      auto r = c.send(req);
      took[i] = std::chrono::duration<double>(Clock::now() - start).count();
      if (!r || r->status != 200 || !seen) {
        std::fprintf(stderr, "request %d failed: %s\n", i, r ? r->body.c_str() : "no response");
        got[i] = 0;
      }
    });
  }
  for (auto& t : threads) t.join();
  Batch b;
  b.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  for (int64_t g : got) b.tokens += g;
  b.fastest = *std::min_element(took.begin(), took.end());
  b.slowest = *std::max_element(took.begin(), took.end());
  Clock::time_point lo = Clock::time_point::max(), hi = Clock::time_point::min();
  for (int i = 0; i < n; ++i) {
    if (got[i] < 2) continue;
    b.decode_tokens += got[i] - 1;
    lo = std::min(lo, first[i]);
    hi = std::max(hi, last[i]);
  }
  if (b.decode_tokens > 0) b.decode_seconds = std::chrono::duration<double>(hi - lo).count();
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  // --port: a running server instead of `splitserve up`.
  int concurrency = 8, tokens = 48, stages = 1, repeat = 2, existing_port = 0;
  std::string model = "tiny";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const int v = std::atoi(argv[i + 1]);
    if (a == "--model")
      model = argv[i + 1];
    else if (a == "--concurrency")
      concurrency = v;
    else if (a == "--tokens") tokens = v;
    else if (a == "--stages") stages = v;
    else if (a == "--repeat") repeat = v;
    else if (a == "--port") existing_port = v;
    else {
      std::fprintf(stderr, "unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  const int port = existing_port ? existing_port : ss::testing_util::FreeLoopbackPort();
  ss::testing_util::TempDir dir("cluster_bench");
  std::optional<ss::testing_util::ChildProcess> up;
  if (!existing_port) {
    up.emplace(std::vector<std::string>{std::string(SS_BIN_DIR) + "/splitserve", "up", "--port",
                                        std::to_string(port), "--stages", std::to_string(stages),
                                        "--log-dir", dir.path()},
               dir / "up.log");
  }
  bool ready = false;
  for (int i = 0; i < 1200 && !ready && (!up || up->Running()); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ready = ss::testing_util::HttpGet(port, "/ready").find(" 200 ") != std::string::npos;
  }
  if (!ready) {
    std::fprintf(stderr, "splitserve up did not become ready (logs in %s)\n", dir.path().c_str());
    return 1;
  }
  RunBatch(port, model, 1, 4, 99);  // warm-up
  double best1 = 0, bestn = 0, dbest1 = 0, dbestn = 0;
  for (int r = 0; r < repeat; ++r) {
    const Batch one = RunBatch(port, model, 1, tokens, r);
    const Batch many = RunBatch(port, model, concurrency, tokens, r);
    std::printf(
        "round %d: 1 sequence %lld tokens in %.2f s = %.1f tok/s (decode %.1f); %d sequences %lld "
        "tokens in %.2f s (requests %.2f-%.2f s) = %.1f tok/s (decode %.1f); ratio %.2f (decode "
        "%.2f)\n",
        r, static_cast<long long>(one.tokens), one.seconds, one.rate(), one.decode_rate(),
        concurrency, static_cast<long long>(many.tokens), many.seconds, many.fastest, many.slowest,
        many.rate(), many.decode_rate(), one.rate() > 0 ? many.rate() / one.rate() : 0.0,
        one.decode_rate() > 0 ? many.decode_rate() / one.decode_rate() : 0.0);
    best1 = std::max(best1, one.rate());
    bestn = std::max(bestn, many.rate());
    dbest1 = std::max(dbest1, one.decode_rate());
    dbestn = std::max(dbestn, many.decode_rate());
  }
  if (up) up->Stop();
  std::printf(
      "single_tok_s=%.1f concurrent_tok_s=%.1f concurrency=%d stages=%d ratio=%.2f "
      "single_decode_tok_s=%.1f concurrent_decode_tok_s=%.1f decode_ratio=%.2f\n",
      best1, bestn, concurrency, stages, best1 > 0 ? bestn / best1 : 0.0, dbest1, dbestn,
      dbest1 > 0 ? dbestn / dbest1 : 0.0);
  return 0;
}
