#include "common/metrics/metrics.h"

#include <exception>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/metrics/process_metrics.h"
#include "prometheus/collectable.h"
#include "prometheus/exposer.h"
#include "prometheus/metric_family.h"
#include "prometheus/text_serializer.h"

namespace ss::metrics {

std::vector<double> LatencyBuckets() {
  return {1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2,  2.5e-2, 5e-2,
          0.1,  0.25,   0.5,  1.0,  2.5,    5.0,  10.0, 25.0,   50.0, 100.0, 250.0,  1000.0};
}

std::vector<double> Buckets125(double max) {
  std::vector<double> out;
  for (double scale = 1; out.empty() || scale <= max; scale *= 10) {
    for (double m : {1.0, 2.0, 5.0}) {
      if (m * scale <= max || out.empty()) out.push_back(m * scale);
    }
  }
  return out;
}

class Metrics::ScrapeHooks : public prometheus::Collectable {
 public:
  void Add(std::function<void()> refresh) {
    absl::MutexLock lock(&mu_);
    hooks_.push_back(std::move(refresh));
  }
  std::vector<prometheus::MetricFamily> Collect() const override {
    absl::MutexLock lock(&mu_);
    for (const std::function<void()>& hook : hooks_) hook();
    return {};
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<std::function<void()>> hooks_ ABSL_GUARDED_BY(mu_);
};

Metrics::Metrics()
    : hooks_(std::make_shared<ScrapeHooks>()),
      process_(std::make_shared<ProcessMetrics>()),
      registry_(std::make_shared<prometheus::Registry>()) {}

Metrics::~Metrics() = default;  // the exposer stops (and lets go of the registry) first

absl::Status Metrics::Listen(const std::string& host_port) {
  if (exposer_ != nullptr) return absl::FailedPreconditionError("metrics: already listening");
  const size_t colon = host_port.rfind(':');
  int port = -1;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(host_port.substr(colon + 1), &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("metrics: '", host_port, "' is not HOST:PORT"));
  }
  try {
    auto exposer = std::make_unique<prometheus::Exposer>(host_port, /*num_threads=*/1);
    const std::vector<int> ports = exposer->GetListeningPorts();
    if (ports.empty()) {
      return absl::UnavailableError(absl::StrCat("metrics: not listening on '", host_port, "'"));
    }
    exposer->RegisterCollectable(hooks_);  // collected in order: the hooks first
    exposer->RegisterCollectable(registry_);
    exposer->RegisterCollectable(process_);
    port_ = ports.front();
    exposer_ = std::move(exposer);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("metrics: cannot listen on '", host_port, "': ", e.what()));
  }
  return absl::OkStatus();
}

prometheus::Counter& Metrics::Counter(std::string_view name, std::string_view help,
                                      const Labels& labels) {
  absl::MutexLock lock(&mu_);
  auto& family = counters_[std::string(name)];
  if (family == nullptr) {
    family = &prometheus::BuildCounter()
                  .Name(std::string(kPrefix) + std::string(name))
                  .Help(std::string(help))
                  .Register(*registry_);
  }
  return family->Add(labels);
}

prometheus::Gauge& Metrics::Gauge(std::string_view name, std::string_view help,
                                  const Labels& labels) {
  absl::MutexLock lock(&mu_);
  auto& family = gauges_[std::string(name)];
  if (family == nullptr) {
    family = &prometheus::BuildGauge()
                  .Name(std::string(kPrefix) + std::string(name))
                  .Help(std::string(help))
                  .Register(*registry_);
  }
  return family->Add(labels);
}

prometheus::Histogram& Metrics::Histogram(std::string_view name, std::string_view help,
                                          const Labels& labels,
                                          const std::vector<double>& buckets) {
  absl::MutexLock lock(&mu_);
  auto& family = histograms_[std::string(name)];
  if (family == nullptr) {
    family = &prometheus::BuildHistogram()
                  .Name(std::string(kPrefix) + std::string(name))
                  .Help(std::string(help))
                  .Register(*registry_);
  }
  return family->Add(labels, buckets);
}

void Metrics::OnScrape(std::function<void()> refresh) { hooks_->Add(std::move(refresh)); }

std::string Metrics::Serialize() const {
  hooks_->Collect();
  std::ostringstream out;
  std::vector<prometheus::MetricFamily> families = registry_->Collect();
  for (prometheus::MetricFamily& f : process_->Collect()) families.push_back(std::move(f));
  prometheus::TextSerializer().Serialize(out, families);
  return out.str();
}

}  // namespace ss::metrics
