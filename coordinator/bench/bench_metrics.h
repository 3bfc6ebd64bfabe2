// The statistics of a `splitserve bench serve` run, as vLLM's `calculate_metrics` defines them.
//
//   TTFT   time to the first text-bearing chunk, per successful request
//   TPOT   (e2e latency - TTFT) / (output tokens - 1), per successful request with > 1 output
//          token (left out of TPOT's statistics otherwise; counted as 0 against a tpot SLO)
//   ITL    every gap between text-bearing chunks, all requests together
//   E2EL   end-to-end latency, per successful request
// Each reported as mean, median, population standard deviation and percentiles, in ms;
// percentiles interpolate linearly between closest ranks (numpy's default). An empty sample
// reports 0 everywhere. Throughputs divide by the run's duration; token counts come from the
// server's usage. Goodput counts the successful requests that meet every given SLO.
//
// splitserve additions (not in vLLM's metrics): total_cached_tokens, the successful requests'
// sum of usage.prompt_tokens_details.cached_tokens (0 from servers that do not report it), and,
// when some conversation has more than one turn, statistics per turn index (RequestOutput::turn)
// over that turn's successful requests, so that a follow-up turn's prefix-cache gain shows.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "coordinator/bench/bench_client.h"

namespace ss::bench {

// numpy.percentile(values, p) (linear interpolation); `values` need not be sorted; 0 when empty.
double Percentile(std::vector<double> values, double p);

struct LatencyStats {
  double mean_ms = 0, median_ms = 0, std_ms = 0;
  std::vector<std::pair<double, double>> percentiles_ms;  // (p, value)
};

LatencyStats Summarize(const std::vector<double>& seconds, const std::vector<double>& percentiles);

// TPOT of one request in seconds; nullopt with fewer than 2 output tokens.
std::optional<double> Tpot(const RequestOutput& r);

struct TurnMetrics {
  int64_t completed = 0;  // successful requests of this turn index
  LatencyStats ttft;
  double mean_prompt_tokens = 0;  // 0 when none completed
  double mean_cached_tokens = 0;
};

struct BenchMetrics {
  int64_t completed = 0, failed = 0;
  int64_t total_input = 0, total_output = 0;
  int64_t total_cached_tokens = 0;
  double duration_s = 0;
  double request_throughput = 0;
  std::optional<double> request_goodput;  // set when SLOs were given
  double output_throughput = 0;
  double total_token_throughput = 0;
  double max_output_tokens_per_s = 0;           // most output tokens in one wall-clock second
  double max_concurrent_requests = 0;           // most requests in flight at one instant
  std::map<std::string, LatencyStats> latency;  // "ttft", "tpot", "itl", "e2el"
  // [k] = turn k (0-based) of every conversation; empty when every request has turn 0.
  std::vector<TurnMetrics> turns;
};

// `goodput_ms`: metric ("ttft", "tpot", "e2el") -> SLO in ms.
BenchMetrics ComputeMetrics(const std::vector<RequestOutput>& outputs, double duration_s,
                            const std::vector<double>& percentiles,
                            const std::map<std::string, double>& goodput_ms);

}  // namespace ss::bench
