// `splitserve bench serve`'s options: vLLM's `vllm bench serve` flag names and meanings (where one
// exists), parsed once from argv into a validated BenchOptions.
//
// Differences from vLLM, all documented in --help: --metric-percentiles defaults to "90,99"
// (vLLM: "99"); --num-warmups defaults to 0; --prefix-repetition-turns (multi-turn prefix reuse)
// and --request-timeout are ours; only the OpenAI completions backends (openai, vllm) exist.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ss::bench {

struct BenchOptions {
  // Target.
  std::string backend = "vllm";
  std::string base_url;  // "" = http://host:port
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string endpoint = "/v1/completions";
  std::string model;  // "" = the first id of GET /v1/models
  std::string served_model_name;
  std::string tokenizer;  // tokenizer.json or a directory holding one; "" = the default id range
  std::string api_key;    // from OPENAI_API_KEY

  // Dataset.
  std::string dataset_name = "random";  // random | prefix-repeat | custom
  std::string dataset_path;
  int64_t num_prompts = 1000;
  int64_t random_input_len = 1024;
  int64_t random_output_len = 128;
  double random_range_ratio = 0.0;
  int64_t random_prefix_len = 0;
  int64_t prefix_len = 256;  // --prefix-repetition-prefix-len
  int64_t suffix_len = 256;
  int64_t num_prefixes = 10;
  int64_t prefix_output_len = 128;
  int64_t turns = 1;
  int64_t custom_output_len = 256;
  uint64_t seed = 0;

  // Sampling.
  double temperature = 0.0;
  bool ignore_eos = false;

  // Load.
  double request_rate = std::numeric_limits<double>::infinity();
  double burstiness = 1.0;
  int64_t max_concurrency = 0;  // 0 = unlimited
  int64_t num_warmups = 0;
  double request_timeout_s = 3600;

  // Metrics and output.
  std::vector<std::string> percentile_metrics = {"ttft", "tpot", "itl", "e2el"};
  std::vector<double> metric_percentiles = {90, 99};
  std::map<std::string, double> goodput_ms;  // metric -> SLO in ms
  bool save_result = false;
  bool save_detailed = false;
  std::string result_dir;
  std::string result_filename;
  std::string label;
  std::vector<std::pair<std::string, std::string>> metadata;
  bool disable_tqdm = false;

  bool help = false;

  // The URL every request goes to: base_url (or http://host:port) + endpoint.
  std::string BaseUrl() const;
};

// Parses argv (argv[0] is "serve"); an unknown flag, a missing or malformed value, or an
// inconsistent combination is an InvalidArgument naming the flag. `env_api_key` is
// OPENAI_API_KEY's value (nullptr when unset).
absl::StatusOr<BenchOptions> ParseBenchOptions(int argc, char** argv, const char* env_api_key);

// --help's text.
std::string BenchServeUsage();

}  // namespace ss::bench
