// `splitserve bench serve` as a user runs it: against `splitserve up` on the bundled tiny model
// (eight requests, every one completed, token counts from the server's usage, vLLM's result
// keys), and against a port where nothing listens (a clear error, non-zero exit, no result).
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>

#include "nlohmann/json.hpp"
#include "tests/e2e/up_process.h"

namespace ss {
namespace {

using json = nlohmann::json;
using testing_util::ChildProcess;
using testing_util::ReadLog;

constexpr auto kBenchTimeout = std::chrono::seconds(60);

TEST(BenchServeE2eTest, EightRequestsAgainstTheBundledModel) {
  testing_util::TempDir dir("bench_serve");
  const int port = testing_util::FreeLoopbackPortBlock();
  const std::string up_log = dir / "up.log";
  ChildProcess up({std::string(SS_BIN_DIR) + "/splitserve", "up", "--port", std::to_string(port),
                   "--log-dir", dir / "logs", "--max-model-len", "512"},
                  up_log);
  ASSERT_TRUE(testing_util::WaitReady(port, up)) << ReadLog(up_log);

  const std::string log = dir / "bench.log";
  ChildProcess bench({std::string(SS_BIN_DIR) + "/splitserve",
                      "bench",
                      "serve",
                      "--port",
                      std::to_string(port),
                      "--num-prompts",
                      "8",
                      "--random-input-len",
                      "32",
                      "--random-output-len",
                      "8",
                      "--max-concurrency",
                      "4",
                      "--save-result",
                      "--result-dir",
                      dir / "results",
                      "--result-filename",
                      "r.json",
                      "--metadata",
                      "suite=e2e",
                      "--disable-tqdm"},
                     log);
  const int rc = bench.WaitExit(kBenchTimeout);
  if (rc < 0) bench.Kill();
  ASSERT_EQ(rc, 0) << ReadLog(log);
  const std::string out = ReadLog(log);
  EXPECT_NE(out.find("============ Serving Benchmark Result ============"), std::string::npos)
      << out;

  std::ifstream f(dir / "results/r.json");
  ASSERT_TRUE(f) << out;
  const json r = json::parse(f);
  EXPECT_EQ(r["completed"], 8);
  EXPECT_EQ(r["failed"], 0);
  EXPECT_EQ(r["num_prompts"], 8);
  EXPECT_EQ(r["model_id"], "tiny");  // the first id of GET /v1/models
  EXPECT_EQ(r["max_concurrency"], 4);
  EXPECT_EQ(r["suite"], "e2e");
  EXPECT_EQ(r["total_input_tokens"], 8 * 32);  // usage.prompt_tokens
  // Output tokens as the server counted them: at most 8 each (the model may stop at EOS).
  int64_t out_sum = 0;
  for (const json& n : r["output_lens"]) {
    EXPECT_GE(n.get<int64_t>(), 1);
    EXPECT_LE(n.get<int64_t>(), 8);
    out_sum += n.get<int64_t>();
  }
  EXPECT_EQ(r["total_output_tokens"], out_sum);
  for (const json& e : r["errors"]) EXPECT_EQ(e, "");
  EXPECT_EQ(r["input_lens"].size(), 8u);
  EXPECT_EQ(r["ttfts"].size(), 8u);
  EXPECT_EQ(r["itls"].size(), 8u);
  for (const char* k :
       {"duration", "request_throughput", "output_throughput", "total_token_throughput",
        "mean_ttft_ms", "median_ttft_ms", "p90_ttft_ms", "p99_ttft_ms", "mean_tpot_ms",
        "median_tpot_ms", "p99_tpot_ms", "mean_itl_ms", "p99_itl_ms", "mean_e2el_ms", "p99_e2el_ms",
        "max_output_tokens_per_s", "max_concurrent_requests"}) {
    ASSERT_TRUE(r.contains(k)) << k;
    EXPECT_TRUE(r[k].is_number()) << k;
  }
  EXPECT_GT(r["output_throughput"].get<double>(), 0);
  EXPECT_GT(r["mean_ttft_ms"].get<double>(), 0);
  EXPECT_LE(r["mean_ttft_ms"].get<double>(), r["mean_e2el_ms"].get<double>());
  EXPECT_EQ(up.Stop(), 0) << ReadLog(up_log);
}

TEST(BenchServeE2eTest, NothingListeningIsAClearError) {
  testing_util::TempDir dir("bench_serve_dead");
  const int port = testing_util::FreeLoopbackPortBlock();
  const std::string log = dir / "bench.log";
  ChildProcess bench(
      {std::string(SS_BIN_DIR) + "/splitserve", "bench", "serve", "--port", std::to_string(port),
       "--num-prompts", "2", "--save-result", "--result-dir", dir / "results", "--disable-tqdm"},
      log);
  const int rc = bench.WaitExit(kBenchTimeout);
  if (rc < 0) bench.Kill();
  EXPECT_EQ(rc, 1);
  EXPECT_NE(
      ReadLog(log).find("cannot reach the server at http://127.0.0.1:" + std::to_string(port)),
      std::string::npos)
      << ReadLog(log);
  EXPECT_FALSE(std::filesystem::exists(dir / "results"));

  // A bad flag: exit 2, the flag named.
  ChildProcess bad({std::string(SS_BIN_DIR) + "/splitserve", "bench", "serve", "--port",
                    std::to_string(port), "--random-input-length", "5"},
                   dir / "bad.log");
  EXPECT_EQ(bad.WaitExit(kBenchTimeout), 2);
  EXPECT_NE(ReadLog(dir / "bad.log").find("unknown flag '--random-input-length'"),
            std::string::npos);
}

}  // namespace
}  // namespace ss
