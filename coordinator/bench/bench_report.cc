#include "coordinator/bench/bench_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ss::bench {
namespace {

using OJson = nlohmann::ordered_json;

struct MetricName {
  const char* key;
  const char* title;  // the table's section
  const char* abbrev;
};
constexpr MetricName kMetrics[] = {
    {"ttft", "Time to First Token", "TTFT"},
    {"tpot", "Time per Output Token (excl. 1st token)", "TPOT"},
    {"itl", "Inter-token Latency", "ITL"},
    {"e2el", "End-to-end Latency", "E2EL"},
};

std::string Centered(const std::string& s, char fill) {
  constexpr size_t kWidth = 50;
  if (s.size() >= kWidth) return s;
  const size_t left = (kWidth - s.size()) / 2;
  return std::string(left, fill) + s + std::string(kWidth - s.size() - left, fill);
}

std::string Row(const std::string& name, const std::string& value) {
  return absl::StrFormat("%-40s %-10s\n", name, value);
}
std::string Row(const std::string& name, double value) {
  return Row(name, absl::StrFormat("%.2f", value));
}

// Python's str(float), as vLLM's file names spell the rate: "inf", "20.0", "2.5".
std::string RateString(double rate) {
  if (std::isinf(rate)) return "inf";
  std::string s = absl::StrCat(rate);
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

}  // namespace

std::string PercentileWord(double p) {
  return p == std::floor(p) ? absl::StrCat(static_cast<int64_t>(p)) : absl::StrCat(p);
}

std::string FormatTable(const BenchOptions& o, const BenchMetrics& m) {
  std::string t = Centered(" Serving Benchmark Result ", '=') + "\n";
  t += Row("Successful requests:", absl::StrCat(m.completed));
  t += Row("Failed requests:", absl::StrCat(m.failed));
  if (o.max_concurrency > 0) {
    t += Row("Maximum request concurrency:", absl::StrCat(o.max_concurrency));
  }
  if (!std::isinf(o.request_rate)) t += Row("Request rate configured (RPS):", o.request_rate);
  t += Row("Benchmark duration (s):", m.duration_s);
  t += Row("Total input tokens:", absl::StrCat(m.total_input));
  t += Row("Total cached input tokens:", absl::StrCat(m.total_cached_tokens));
  t += Row("Total generated tokens:", absl::StrCat(m.total_output));
  t += Row("Request throughput (req/s):", m.request_throughput);
  if (m.request_goodput) t += Row("Request goodput (req/s):", *m.request_goodput);
  t += Row("Output token throughput (tok/s):", m.output_throughput);
  t += Row("Peak output token throughput (tok/s):", m.max_output_tokens_per_s);
  t += Row("Peak concurrent requests:", m.max_concurrent_requests);
  t += Row("Total Token throughput (tok/s):", m.total_token_throughput);
  for (const MetricName& n : kMetrics) {
    if (std::find(o.percentile_metrics.begin(), o.percentile_metrics.end(), n.key) ==
        o.percentile_metrics.end()) {
      continue;
    }
    const LatencyStats& s = m.latency.at(n.key);
    t += Centered(n.title, '-') + "\n";
    t += Row(absl::StrCat("Mean ", n.abbrev, " (ms):"), s.mean_ms);
    t += Row(absl::StrCat("Median ", n.abbrev, " (ms):"), s.median_ms);
    for (const auto& [p, v] : s.percentiles_ms) {
      t += Row(absl::StrCat("P", PercentileWord(p), " ", n.abbrev, " (ms):"), v);
    }
  }
  if (!m.turns.empty()) {
    t += Centered("Time to First Token by turn", '-') + "\n";
    for (size_t k = 0; k < m.turns.size(); ++k) {
      const TurnMetrics& tm = m.turns[k];
      const std::string turn = absl::StrCat("turn ", k + 1);
      t += Row(absl::StrCat("Successful requests ", turn, ":"), absl::StrCat(tm.completed));
      t += Row(absl::StrCat("Mean TTFT ", turn, " (ms):"), tm.ttft.mean_ms);
      t += Row(absl::StrCat("Median TTFT ", turn, " (ms):"), tm.ttft.median_ms);
      for (const auto& [p, v] : tm.ttft.percentiles_ms) {
        t += Row(absl::StrCat("P", PercentileWord(p), " TTFT ", turn, " (ms):"), v);
      }
      t += Row(absl::StrCat("Mean input tokens ", turn, ":"), tm.mean_prompt_tokens);
      t += Row(absl::StrCat("Mean cached tokens ", turn, ":"), tm.mean_cached_tokens);
    }
  }
  t += std::string(50, '=') + "\n";
  return t;
}

OJson ResultJson(const BenchOptions& o, const RunInfo& info, const BenchMetrics& m,
                 const std::vector<RequestOutput>& outputs) {
  OJson j;
  j["date"] = info.date;
  j["endpoint_type"] = o.backend;
  j["backend"] = o.backend;
  j["label"] = o.label.empty() ? o.backend : o.label;
  j["model_id"] = info.model_id;
  j["tokenizer_id"] = o.tokenizer.empty() ? info.model_id : o.tokenizer;
  j["num_prompts"] = info.num_requests;
  j["dataset_name"] = o.dataset_name;
  j["num_conversations"] = info.num_conversations;
  j["request_rate"] = std::isinf(o.request_rate) ? OJson("inf") : OJson(o.request_rate);
  j["burstiness"] = o.burstiness;
  j["max_concurrency"] = o.max_concurrency > 0 ? OJson(o.max_concurrency) : OJson(nullptr);
  for (const auto& [k, v] : o.metadata) j[k] = v;
  j["duration"] = m.duration_s;
  j["completed"] = m.completed;
  j["failed"] = m.failed;
  j["total_input_tokens"] = m.total_input;
  j["total_output_tokens"] = m.total_output;
  j["total_cached_tokens"] = m.total_cached_tokens;
  j["request_throughput"] = m.request_throughput;
  j["request_goodput"] = m.request_goodput ? OJson(*m.request_goodput) : OJson(nullptr);
  j["output_throughput"] = m.output_throughput;
  j["total_token_throughput"] = m.total_token_throughput;
  j["max_output_tokens_per_s"] = m.max_output_tokens_per_s;
  j["max_concurrent_requests"] = m.max_concurrent_requests;
  OJson input_lens = OJson::array(), output_lens = OJson::array(), ttfts = OJson::array(),
        itls = OJson::array(), errors = OJson::array(), starts = OJson::array();
  for (const RequestOutput& r : outputs) {
    input_lens.push_back(r.prompt_len);
    output_lens.push_back(r.output_tokens);
    ttfts.push_back(r.ttft_s);
    itls.push_back(r.itl_s);
    errors.push_back(r.error);
    starts.push_back(r.start_s);
  }
  j["input_lens"] = std::move(input_lens);
  j["output_lens"] = std::move(output_lens);
  j["ttfts"] = std::move(ttfts);
  j["itls"] = std::move(itls);
  j["errors"] = std::move(errors);
  j["start_times"] = std::move(starts);
  for (const MetricName& n : kMetrics) {
    const LatencyStats& s = m.latency.at(n.key);
    j[absl::StrCat("mean_", n.key, "_ms")] = s.mean_ms;
    j[absl::StrCat("median_", n.key, "_ms")] = s.median_ms;
    j[absl::StrCat("std_", n.key, "_ms")] = s.std_ms;
    for (const auto& [p, v] : s.percentiles_ms) {
      j[absl::StrCat("p", PercentileWord(p), "_", n.key, "_ms")] = v;
    }
  }
  if (!m.turns.empty()) {
    OJson turns = OJson::array();
    for (size_t k = 0; k < m.turns.size(); ++k) {
      const TurnMetrics& tm = m.turns[k];
      OJson t;
      t["turn"] = k + 1;
      t["completed"] = tm.completed;
      t["mean_ttft_ms"] = tm.ttft.mean_ms;
      t["median_ttft_ms"] = tm.ttft.median_ms;
      t["std_ttft_ms"] = tm.ttft.std_ms;
      for (const auto& [p, v] : tm.ttft.percentiles_ms) {
        t[absl::StrCat("p", PercentileWord(p), "_ttft_ms")] = v;
      }
      t["mean_prompt_tokens"] = tm.mean_prompt_tokens;
      t["mean_cached_tokens"] = tm.mean_cached_tokens;
      turns.push_back(std::move(t));
    }
    j["turns"] = std::move(turns);
  }
  return j;
}

std::string ResultPath(const BenchOptions& o, const RunInfo& info) {
  std::string name = o.result_filename;
  if (name.empty()) {
    std::string model = info.model_id;
    if (const size_t slash = model.rfind('/'); slash != std::string::npos) {
      model = model.substr(slash + 1);
    }
    name =
        absl::StrCat(o.label.empty() ? o.backend : o.label, "-", RateString(o.request_rate), "qps",
                     o.max_concurrency > 0 ? absl::StrCat("-concurrency", o.max_concurrency) : "",
                     "-", model, "-", info.date, ".json");
  }
  if (o.result_dir.empty()) return name;
  return (std::filesystem::path(o.result_dir) / name).string();
}

absl::Status WriteResult(const std::string& path, const OJson& result) {
  std::error_code ec;
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  std::ofstream out(path);
  if (!out) return absl::UnavailableError(absl::StrCat("cannot write the result to ", path));
  out << result.dump(2) << "\n";
  out.close();
  if (!out) return absl::UnavailableError(absl::StrCat("cannot write the result to ", path));
  return absl::OkStatus();
}

}  // namespace ss::bench
