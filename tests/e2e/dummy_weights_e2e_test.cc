// `splitserve up --load-format dummy` (issue 25): a model directory holding only
// DeepSeek-V4-Flash's config.json and the real DeepSeek tokenizer, shrunk with --hf-overrides to
// dimensions the cpu backend serves in seconds (the vocabulary kept, so the real tokenizer fits),
// serves completions and chat on loopback with every weight generated in memory; bad --load-format
// / --hf-overrides values are refused at start, and a directory without safetensors needs
// --load-format dummy.
//
// DummyFlashServer starts one server for the test suite (SetUpTestSuite); each TEST_F is a step
// against it (ctest runs each test in its own process, so each starts it once).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "tests/e2e/up_process.h"
#include "tests/test_util.h"

namespace ss {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using testing_util::ChildProcess;
using testing_util::ChildRunning;
using testing_util::Cmdline;
using testing_util::FlagValue;
using testing_util::ReadLog;

// Flash's structure at a size the cpu backend serves fast: Flash's vocabulary (129280, so the
// real tokenizer fits), hc_mult, hash routing, compressors of both ratios and an MTP block; every
// dimension at the smallest value ParseModelConfig accepts (multiples of 128, head_dim - rope 64).
constexpr char kSmallFlash[] =
    R"({"hidden_size": 256, "num_hidden_layers": 4, "compress_ratios": [0, 4, 128, 4, 0],)"
    R"( "num_attention_heads": 4, "head_dim": 128, "q_lora_rank": 128, "o_groups": 2,)"
    R"( "o_lora_rank": 128, "sliding_window": 16, "max_position_embeddings": 1024,)"
    R"( "index_n_heads": 4, "index_head_dim": 128, "index_topk": 8, "n_routed_experts": 16,)"
    R"( "moe_intermediate_size": 128, "num_hash_layers": 2})";

std::string Splitserve() { return std::string(SS_BIN_DIR) + "/splitserve"; }

// A model directory with Flash's config.json and the DeepSeek tokenizer, and nothing else.
void WriteModelDir(const fs::path& dir) {
  fs::create_directories(dir);
  fs::copy_file(SS_FLASH_CONFIG, dir / "config.json");
  fs::copy_file(SS_TOKENIZER_JSON, dir / "tokenizer.json");
}

class DummyFlashServer : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing_util::TempDir("dummy_flash");
    model_ = *dir_ / "flash";
    WriteModelDir(model_);
    port_ = testing_util::FreeLoopbackPortBlock();
    log_ = *dir_ / "up.log";
    const auto t0 = std::chrono::steady_clock::now();
    up_ = new ChildProcess(
        {Splitserve(), "up", "--backend", "cpu", "--load-format", "dummy", "--model", model_,
         "--hf-overrides", kSmallFlash, "--port", std::to_string(port_), "--kv-tokens", "8192",
         "--log-dir", *dir_ / "logs"},
        log_);
    ready_ = testing_util::WaitServing(port_, *up_, log_);
    ready_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (ready_) std::printf("start to ready: %.1f s\n", ready_s_);
  }

  static void TearDownTestSuite() {
    if (up_ != nullptr) {
      const int code = up_->Stop();
      EXPECT_EQ(code, 0) << ReadLog(log_);
    }
    delete up_;
    delete dir_;
    up_ = nullptr;
    dir_ = nullptr;
  }

  void SetUp() override { ASSERT_TRUE(ready_) << ReadLog(log_); }

  // POST `body` to `path`; the parsed answer (asserting HTTP 200).
  static json Post(const std::string& path, const json& body) {
    httplib::Client c("127.0.0.1", port_);
    c.set_connection_timeout(2, 0);
    c.set_read_timeout(30, 0);
    auto r = c.Post(path, body.dump(), "application/json");
    EXPECT_TRUE(r) << path << ": no answer";
    if (!r) return json();
    EXPECT_EQ(r->status, 200) << r->body;
    return json::parse(r->body, nullptr, /*allow_exceptions=*/false);
  }

  static inline testing_util::TempDir* dir_ = nullptr;
  static inline ChildProcess* up_ = nullptr;
  static inline std::string model_, log_;
  static inline int port_ = 0;
  static inline bool ready_ = false;
  static inline double ready_s_ = 0;
};

// Every child got the load format and the overrides (the workers rewrite their flags' dashes in
// place: /proc shows --load_format); the model directory still holds only what the test put there.
TEST_F(DummyFlashServer, EveryProcessGetsTheWeightSource) {
  const int gpu = ChildRunning(up_->pid(), "splitserve-gpu-worker");
  const int expert = ChildRunning(up_->pid(), "splitserve-expert-worker");
  const int coordinator = ChildRunning(up_->pid(), "splitserve-coordinator");
  ASSERT_GT(gpu, 0);
  ASSERT_GT(expert, 0);
  ASSERT_GT(coordinator, 0);
  for (const int pid : {gpu, expert}) {
    const std::vector<std::string> args = Cmdline(pid);
    EXPECT_EQ(FlagValue(args, "--load_format"), "dummy") << args[0];
    EXPECT_EQ(FlagValue(args, "--hf_overrides"), kSmallFlash) << args[0];
  }
  EXPECT_EQ(FlagValue(Cmdline(coordinator), "--hf_overrides"), kSmallFlash);
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(model_)) files.push_back(e.path().filename());
  std::sort(files.begin(), files.end());
  EXPECT_EQ(files, (std::vector<std::string>{"config.json", "tokenizer.json"}));
}

// A token-id prompt through /v1/completions: tokens come back and the usage counts add up.
TEST_F(DummyFlashServer, CompletionFromTokenIds) {
  const std::vector<int> prompt = {0, 1842, 4536, 892, 17, 31925, 100000, 127999, 305, 9, 77, 2};
  constexpr int kMaxTokens = 8;
  const json j = Post(
      "/v1/completions",
      {{"model", "flash"}, {"prompt", prompt}, {"max_tokens", kMaxTokens}, {"temperature", 0}});
  ASSERT_TRUE(j.is_object()) << j;
  EXPECT_FALSE(j.contains("error")) << j;
  EXPECT_EQ(j["object"], "text_completion") << j;
  ASSERT_EQ(j["choices"].size(), 1u) << j;
  const json& choice = j["choices"][0];
  EXPECT_TRUE(choice["text"].is_string()) << j;
  const json& usage = j["usage"];
  EXPECT_EQ(usage["prompt_tokens"], static_cast<int>(prompt.size())) << j;
  const int completion = usage["completion_tokens"].get<int>();
  EXPECT_GE(completion, 1) << j;
  EXPECT_LE(completion, kMaxTokens) << j;
  if (choice["finish_reason"] == "length") {
    EXPECT_EQ(completion, kMaxTokens) << j;
  }
  EXPECT_EQ(usage["total_tokens"], static_cast<int>(prompt.size()) + completion) << j;
}

// A chat request through the real tokenizer and chat template.
TEST_F(DummyFlashServer, ChatCompletion) {
  constexpr int kMaxTokens = 6;
  const json j = Post(
      "/v1/chat/completions",
      {{"model", "flash"},
       {"messages", json::array({{{"role", "user"}, {"content", "Hello! How are you today?"}}})},
       {"max_tokens", kMaxTokens}});
  ASSERT_TRUE(j.is_object()) << j;
  EXPECT_FALSE(j.contains("error")) << j;
  EXPECT_EQ(j["object"], "chat.completion") << j;
  ASSERT_EQ(j["choices"].size(), 1u) << j;
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant") << j;
  const json& usage = j["usage"];
  EXPECT_GT(usage["prompt_tokens"].get<int>(), 7) << j;  // the template's tokens and the text's
  const int completion = usage["completion_tokens"].get<int>();
  EXPECT_GE(completion, 1) << j;
  EXPECT_LE(completion, kMaxTokens) << j;
  EXPECT_EQ(usage["total_tokens"], usage["prompt_tokens"].get<int>() + completion) << j;
}

// The issue's acceptance run: `splitserve bench serve --num-prompts 8` against the dummy model,
// random token-id prompts drawn from the real tokenizer's vocabulary; every request succeeds and
// the result JSON carries vLLM's keys with the server's token counts.
TEST_F(DummyFlashServer, BenchServeEightPrompts) {
  const std::string log = *dir_ / "bench.log";
  const std::string results = *dir_ / "results";
  ChildProcess bench({Splitserve(),
                      "bench",
                      "serve",
                      "--port",
                      std::to_string(port_),
                      "--num-prompts",
                      "8",
                      "--random-input-len",
                      "48",
                      "--random-output-len",
                      "6",
                      "--max-concurrency",
                      "4",
                      "--tokenizer",
                      model_ + "/tokenizer.json",
                      "--save-result",
                      "--result-dir",
                      results,
                      "--result-filename",
                      "r.json",
                      "--disable-tqdm"},
                     log);
  const int rc = bench.WaitExit(std::chrono::seconds(60));
  if (rc < 0) bench.Kill();
  ASSERT_EQ(rc, 0) << ReadLog(log);
  std::ifstream f(results + "/r.json");
  ASSERT_TRUE(f) << ReadLog(log);
  const json r = json::parse(f, nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(r.is_object()) << ReadLog(log);
  EXPECT_EQ(r["completed"], 8) << r;
  EXPECT_EQ(r["failed"], 0) << r;
  EXPECT_EQ(r["total_input_tokens"], 8 * 48) << r;
  int64_t out = 0;
  for (const json& n : r["output_lens"]) {
    EXPECT_GE(n.get<int64_t>(), 1);
    EXPECT_LE(n.get<int64_t>(), 6);
    out += n.get<int64_t>();
  }
  EXPECT_EQ(r["total_output_tokens"], out) << r;
  for (const json& e : r["errors"]) EXPECT_EQ(e, "") << r;
  for (const char* k : {"duration", "request_throughput", "output_throughput",
                        "total_token_throughput", "mean_ttft_ms", "median_ttft_ms", "p90_ttft_ms",
                        "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms",
                        "mean_itl_ms", "p99_itl_ms", "mean_e2el_ms", "p99_e2el_ms"}) {
    ASSERT_TRUE(r.contains(k)) << k;
    EXPECT_TRUE(r[k].is_number()) << k;
  }
  EXPECT_GT(r["output_throughput"].get<double>(), 0) << r;
}

struct Refusal {
  std::vector<std::string> args;
  int code;
  std::string message;
};

// Bad values are refused before anything starts, each naming its flag or field; without
// safetensors the weights must be dummy.
TEST(DummyFlashFlags, BadValuesAreRefusedAtStart) {
  testing_util::TempDir dir("dummy_flash_flags");
  const fs::path model = dir / "flash";
  WriteModelDir(model);
  const std::vector<Refusal> refusals = {
      {{"--load-format", "pt"}, 2, "--load-format 'pt': one of auto, safetensors, dummy"},
      {{"--load-format", "dummy", "--hf-overrides", "{\"hidden_size\": "},
       2,
       "--hf-overrides: malformed JSON"},
      {{"--load-format", "dummy", "--hf-overrides", "[4]"}, 2, "--hf-overrides: must be a JSON"},
      {{"--load-format", "dummy", "--hf-overrides", "{\"hidden_size\": 100}"},
       1,
       "config.json with --hf-overrides: field 'hidden_size' = 100 must be a multiple of 128"},
      {{"--load-format", "dummy", "--hf-overrides", "{\"num_hidden_layers\": 4}"},
       1,
       "field 'compress_ratios' has 44 entries"},
      {{"--dummy-router-skew", "0.2"}, 2, "--dummy-router-skew needs --load-format dummy"},
      {{"--load-format", "dummy", "--dummy-router-skew", "-1"},
       2,
       "--dummy-router-skew -1: must be a finite number >= 0"},
      {{"--load-format", "dummy", "--dummy-router-skew", "hot"},
       2,
       "--dummy-router-skew hot: must be a finite number >= 0"},
      {{}, 1, "--load-format dummy generates the weights instead"},
      {{"--load-format", "safetensors"}, 1, "safetensors"},
  };
  for (const Refusal& r : refusals) {
    std::vector<std::string> argv = {Splitserve(), "up", "--backend", "cpu", "--model", model};
    argv.insert(argv.end(), r.args.begin(), r.args.end());
    const std::string log = dir / "refused.log";
    fs::remove(log);
    ChildProcess p(argv, log);
    const int code = p.WaitExit(std::chrono::seconds(10));
    if (code == -1) p.Kill();
    const std::string what = r.args.empty() ? "(no flags)" : r.args.back();
    EXPECT_EQ(code, r.code) << what << ": " << ReadLog(log);
    EXPECT_NE(ReadLog(log).find(r.message), std::string::npos) << what << ": " << ReadLog(log);
    EXPECT_EQ(ReadLog(log).find("ready in"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace ss
