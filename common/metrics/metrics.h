// ss_metrics: a small wrapper around prometheus-cpp for every splitserve process
// (ARCHITECTURE.md: "Prometheus scrape (/metrics on every process)").
//
// A Metrics owns one prometheus::Registry and, once Listen() succeeds, an HTTP exposer (civetweb,
// owned privately: its headers stay out of this one) serving the registry's text exposition on
// GET /metrics. Every metric name is put under the `splitserve:` prefix, and the standard
// `process_*` series (process_metrics.h) come with every registry:
//
//   ss::metrics::Metrics m;
//   prometheus::Counter& calls = m.Counter("expert_calls_total", "calls", {{"transport", "shm"}});
//   if (absl::Status st = m.Listen("127.0.0.1:9400"); !st.ok()) ...
//   calls.Increment();
//
// The helpers get-or-create a family by name and then a metric by its labels, so calling one twice
// with the same name and labels returns the same metric. The returned references live as long as
// the Metrics. prometheus-cpp metrics are thread-safe; create them up front where a hot path uses
// them (creation takes the family's mutex).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/labels.h"
#include "prometheus/registry.h"

namespace prometheus {
class Exposer;
}  // namespace prometheus

namespace ss::metrics {

class ProcessMetrics;

inline constexpr char kPrefix[] = "splitserve:";

using Labels = prometheus::Labels;  // std::map<std::string, std::string>

// Latency buckets in seconds, 10 us .. 1,000 s, roughly x2.5 per step.
std::vector<double> LatencyBuckets();
// 1, 2, 5, 10, 20, 50, ... up to and including the last one <= `max` (vLLM's build_1_2_5_buckets,
// for token counts). At least {1}.
std::vector<double> Buckets125(double max);

class Metrics {
 public:
  Metrics();
  ~Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // Starts serving GET /metrics on HOST:PORT (PORT 0 = any free port; see port()). An address
  // without a port, a bad port or a bind failure is an error. At most once.
  absl::Status Listen(const std::string& host_port);
  // The bound port after a successful Listen(), else 0.
  int port() const { return port_; }

  // `name` without the prefix ("expert_calls_total" -> "splitserve:expert_calls_total").
  prometheus::Counter& Counter(std::string_view name, std::string_view help,
                               const Labels& labels = {});
  prometheus::Gauge& Gauge(std::string_view name, std::string_view help, const Labels& labels = {});
  prometheus::Histogram& Histogram(std::string_view name, std::string_view help,
                                   const Labels& labels = {},
                                   const std::vector<double>& buckets = LatencyBuckets());

  // Runs `refresh` before every collection (each GET /metrics, each Serialize()), on the thread
  // that collects, one collection's hooks at a time: for gauges that are cheaper to read when
  // asked than to keep current (rate-limit the expensive ones inside `refresh`). Whatever
  // `refresh` captures must outlive this Metrics (a scrape may run until its destructor).
  void OnScrape(std::function<void()> refresh);

  // The Prometheus text exposition (format 0.0.4) of everything registered: what /metrics serves.
  std::string Serialize() const;

  const std::shared_ptr<prometheus::Registry>& registry() const { return registry_; }

 private:
  class ScrapeHooks;  // a collectable that runs the OnScrape hooks and collects nothing
  std::shared_ptr<ScrapeHooks> hooks_;
  std::shared_ptr<ProcessMetrics> process_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_ = 0;
  absl::Mutex mu_;
  std::map<std::string, prometheus::Family<prometheus::Counter>*> counters_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, prometheus::Family<prometheus::Gauge>*> gauges_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, prometheus::Family<prometheus::Histogram>*> histograms_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace ss::metrics
