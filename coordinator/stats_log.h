// Periodic engine statistics in the log, as vLLM prints them every 10 s:
//
//   engine: avg prompt throughput: 812.4 tokens/s, avg generation throughput: 41.0 tokens/s,
//     running: 3 reqs, waiting: 1 reqs, KV cache usage: 37.5%, prefix cache hit rate: 92.1%
//
// (one line). A line is written for every interval with activity (tokens, or requests running or
// waiting) and for the first idle interval after one, so an idle server stays quiet.
//
// Threading: Start() and Stop() from one owner thread; `sample` runs on the logger's thread.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ss {

struct StatsSample {
  double prompt_tokens = 0, generation_tokens = 0;  // cumulative
  int64_t running = 0, waiting = 0;
  double kv_usage = 0;                          // [0, 1]
  int64_t prefix_queries = 0, prefix_hits = 0;  // cumulative
};

// The line for the interval from `prev` to `cur` (`seconds` long), or nullopt when it stays
// quiet; `active` carries whether the previous interval was active and is updated.
std::optional<std::string> StatsLine(const StatsSample& prev, const StatsSample& cur,
                                     double seconds, bool& active);

class StatsLogger {
 public:
  StatsLogger(absl::Duration interval, std::function<StatsSample()> sample);
  ~StatsLogger();  // Stop()s
  void Start();
  void Stop();  // idempotent

 private:
  void Run();

  const absl::Duration interval_;
  const std::function<StatsSample()> sample_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace ss
