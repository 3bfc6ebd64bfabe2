#include "coordinator/bench/bench_metrics.h"

#include <algorithm>
#include <cmath>

namespace ss::bench {

double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const double rank = p / 100.0 * static_cast<double>(values.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, values.size() - 1);
  const double frac = rank - static_cast<double>(lo);
  return values[lo] + frac * (values[hi] - values[lo]);
}

LatencyStats Summarize(const std::vector<double>& seconds, const std::vector<double>& percentiles) {
  LatencyStats s;
  for (double p : percentiles) s.percentiles_ms.emplace_back(p, 0.0);
  if (seconds.empty()) return s;
  double sum = 0;
  for (double v : seconds) sum += v;
  const double mean = sum / static_cast<double>(seconds.size());
  double sq = 0;
  for (double v : seconds) sq += (v - mean) * (v - mean);
  s.mean_ms = mean * 1000;
  s.std_ms = std::sqrt(sq / static_cast<double>(seconds.size())) * 1000;
  s.median_ms = Percentile(seconds, 50) * 1000;
  for (auto& [p, v] : s.percentiles_ms) v = Percentile(seconds, p) * 1000;
  return s;
}

std::optional<double> Tpot(const RequestOutput& r) {
  if (r.output_tokens < 2) return std::nullopt;
  return (r.latency_s - r.ttft_s) / static_cast<double>(r.output_tokens - 1);
}

BenchMetrics ComputeMetrics(const std::vector<RequestOutput>& outputs, double duration_s,
                            const std::vector<double>& percentiles,
                            const std::map<std::string, double>& goodput_ms) {
  BenchMetrics m;
  m.duration_s = duration_s;
  std::vector<double> ttft, tpot, itl, e2el;
  int64_t good = 0;
  double t0 = 0;
  bool any = false;
  for (const RequestOutput& r : outputs) {
    if (!r.success) {
      ++m.failed;
      continue;
    }
    if (!any || r.start_s < t0) t0 = r.start_s;
    any = true;
    ++m.completed;
    m.total_input += r.prompt_len;
    m.total_output += r.output_tokens;
    m.total_cached_tokens += r.cached_tokens;
    ttft.push_back(r.ttft_s);
    const std::optional<double> t = Tpot(r);
    if (t) tpot.push_back(*t);
    itl.insert(itl.end(), r.itl_s.begin(), r.itl_s.end());
    e2el.push_back(r.latency_s);
    bool ok = true;
    for (const auto& [metric, slo] : goodput_ms) {
      const double v = metric == "ttft" ? r.ttft_s : metric == "tpot" ? t.value_or(0) : r.latency_s;
      ok = ok && v * 1000 <= slo;
    }
    good += ok ? 1 : 0;
  }
  if (duration_s > 0) {
    m.request_throughput = static_cast<double>(m.completed) / duration_s;
    m.output_throughput = static_cast<double>(m.total_output) / duration_s;
    m.total_token_throughput = static_cast<double>(m.total_input + m.total_output) / duration_s;
    if (!goodput_ms.empty()) m.request_goodput = static_cast<double>(good) / duration_s;
  } else if (!goodput_ms.empty()) {
    m.request_goodput = 0;
  }
  // Output tokens per wall-clock second from the first request's start (each text-bearing
  // chunk carries an equal share of its request's usage tokens), and requests in flight at once
  // (a sweep over the requests' [start, end) intervals).
  std::vector<double> tokens_per_s;
  std::vector<std::pair<double, int>> edges;  // (time, +1 start / -1 end)
  for (const RequestOutput& r : outputs) {
    if (!r.success) continue;
    const double start = r.start_s - t0;
    const double chunks = 1.0 + static_cast<double>(r.itl_s.size());
    const double per_chunk = static_cast<double>(r.output_tokens) / chunks;
    double t = start + r.ttft_s;
    auto bump = [&](double at) {
      const size_t sec = static_cast<size_t>(std::max(0.0, at));
      if (tokens_per_s.size() <= sec) tokens_per_s.resize(sec + 1, 0.0);
      tokens_per_s[sec] += per_chunk;
    };
    bump(t);
    for (double gap : r.itl_s) bump(t += gap);
    edges.emplace_back(start, +1);
    edges.emplace_back(start + r.latency_s, -1);
  }
  for (double v : tokens_per_s) m.max_output_tokens_per_s = std::max(m.max_output_tokens_per_s, v);
  std::sort(edges.begin(), edges.end());  // an end sorts before a start at the same time
  int in_flight = 0;
  for (const auto& [time, delta] : edges) {
    in_flight += delta;
    m.max_concurrent_requests = std::max(m.max_concurrent_requests, double(in_flight));
  }
  m.latency["ttft"] = Summarize(ttft, percentiles);
  m.latency["tpot"] = Summarize(tpot, percentiles);
  m.latency["itl"] = Summarize(itl, percentiles);
  m.latency["e2el"] = Summarize(e2el, percentiles);

  // Per turn: the turn count is the largest index among all requests (failed ones too, so that a
  // turn whose requests all failed still shows with 0 completed).
  int64_t num_turns = 0;
  for (const RequestOutput& r : outputs) num_turns = std::max(num_turns, r.turn + 1);
  if (num_turns > 1) {
    const size_t n = static_cast<size_t>(num_turns);
    std::vector<std::vector<double>> turn_ttft(n);
    std::vector<double> prompt(n, 0.0), cached(n, 0.0);
    m.turns.resize(n);
    for (const RequestOutput& r : outputs) {
      if (!r.success || r.turn < 0) continue;
      const size_t k = static_cast<size_t>(r.turn);
      ++m.turns[k].completed;
      turn_ttft[k].push_back(r.ttft_s);
      prompt[k] += static_cast<double>(r.prompt_len);
      cached[k] += static_cast<double>(r.cached_tokens);
    }
    for (size_t k = 0; k < n; ++k) {
      TurnMetrics& t = m.turns[k];
      t.ttft = Summarize(turn_ttft[k], percentiles);
      if (t.completed > 0) {
        t.mean_prompt_tokens = prompt[k] / static_cast<double>(t.completed);
        t.mean_cached_tokens = cached[k] / static_cast<double>(t.completed);
      }
    }
  }
  return m;
}

}  // namespace ss::bench
