// The results of a `splitserve bench serve` run in vLLM's shapes: the printed table
// ("============ Serving Benchmark Result ============") and the result JSON, whose keys are
// `vllm bench serve`'s (completed, request_throughput, mean_ttft_ms, p99_itl_ms, input_lens, ...)
// so that scripts read either tool's files.
//
// splitserve additions, beside vLLM's keys and rows (which stay as they are): the table's
// "Total cached input tokens:" row and the JSON's `total_cached_tokens` (always), and when the
// run had conversations of more than one turn, the table's "Time to First Token by turn" section
// and the JSON's `turns`: one object per turn, {"turn": 1-based, "completed", "mean_ttft_ms",
// "median_ttft_ms", "std_ttft_ms", "p{P}_ttft_ms" for each --metric-percentiles P,
// "mean_prompt_tokens", "mean_cached_tokens"}.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "coordinator/bench/bench_metrics.h"
#include "coordinator/bench/bench_options.h"
#include "nlohmann/json.hpp"

namespace ss::bench {

struct RunInfo {
  std::string model_id;
  std::string date;  // YYYYmmdd-HHMMSS, local time
  int64_t num_requests = 0;
  int64_t num_conversations = 0;
};

// "p99" for 99, "p99.9" for 99.9 (vLLM's key spelling).
std::string PercentileWord(double p);

// The table, with latency sections for --percentile-metrics only.
std::string FormatTable(const BenchOptions& o, const BenchMetrics& m);

// Every aggregate of vLLM's result (latency keys for all four metrics), the per-request arrays
// (input_lens, output_lens, ttfts, itls, errors, start_times) and --metadata's pairs.
nlohmann::ordered_json ResultJson(const BenchOptions& o, const RunInfo& info, const BenchMetrics& m,
                                  const std::vector<RequestOutput>& outputs);

// --result-filename, or vLLM's default name:
// {backend}-{rate}qps[-concurrency{N}]-{model's last path part}-{date}.json.
std::string ResultPath(const BenchOptions& o, const RunInfo& info);

absl::Status WriteResult(const std::string& path, const nlohmann::ordered_json& result);

}  // namespace ss::bench
