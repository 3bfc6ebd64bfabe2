#include "coordinator/stats_log.h"

#include <utility>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "spdlog/spdlog.h"

namespace ss {

std::optional<std::string> StatsLine(const StatsSample& prev, const StatsSample& cur,
                                     double seconds, bool& active) {
  const double prompt = cur.prompt_tokens - prev.prompt_tokens;
  const double generation = cur.generation_tokens - prev.generation_tokens;
  const bool now_active = prompt > 0 || generation > 0 || cur.running > 0 || cur.waiting > 0;
  const bool print = now_active || active;
  active = now_active;
  if (!print) return std::nullopt;
  const int64_t queries = cur.prefix_queries - prev.prefix_queries;
  const int64_t hits = cur.prefix_hits - prev.prefix_hits;
  const double s = seconds > 0 ? seconds : 1;
  return absl::StrFormat(
      "engine: avg prompt throughput: %.1f tokens/s, avg generation throughput: %.1f tokens/s, "
      "running: %d reqs, waiting: %d reqs, KV cache usage: %.1f%%, prefix cache hit rate: %.1f%%",
      prompt / s, generation / s, cur.running, cur.waiting, 100.0 * cur.kv_usage,
      queries > 0 ? 100.0 * static_cast<double>(hits) / static_cast<double>(queries) : 0.0);
}

StatsLogger::StatsLogger(absl::Duration interval, std::function<StatsSample()> sample)
    : interval_(interval), sample_(std::move(sample)) {}

StatsLogger::~StatsLogger() { Stop(); }

void StatsLogger::Start() {
  if (thread_.joinable()) return;
  thread_ = std::thread([this] { Run(); });
}

void StatsLogger::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void StatsLogger::Run() {
  StatsSample prev = sample_();
  absl::Time then = absl::Now();
  bool active = false;
  absl::MutexLock lock(&mu_);
  while (!mu_.AwaitWithTimeout(absl::Condition(&stop_), interval_)) {
    mu_.Unlock();
    const StatsSample cur = sample_();
    const absl::Time now = absl::Now();
    if (auto line = StatsLine(prev, cur, absl::ToDoubleSeconds(now - then), active)) {
      spdlog::info("{}", *line);
    }
    prev = cur;
    then = now;
    mu_.Lock();
  }
}

}  // namespace ss
