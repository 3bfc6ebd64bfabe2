// The standard `process_*` series of Prometheus client libraries, for the calling process, read
// from /proc/self when collected (Linux):
//   process_cpu_seconds_total       counter: user + system CPU time
//   process_resident_memory_bytes   gauge:   resident set size
//   process_virtual_memory_bytes    gauge:   virtual memory size
//   process_start_time_seconds      gauge:   start time, seconds since the Unix epoch
//   process_open_fds                gauge:   open file descriptors
//   process_max_fds                 gauge:   the soft RLIMIT_NOFILE
// Names carry no `splitserve:` prefix: they are the names every exporter uses, so existing
// dashboards and alerts find them. A value that cannot be read is left out (never reported as 0).
// Thread-safe: Collect() keeps no state.
#pragma once

#include <vector>

#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"

namespace ss::metrics {

class ProcessMetrics : public prometheus::Collectable {
 public:
  std::vector<prometheus::MetricFamily> Collect() const override;
};

}  // namespace ss::metrics
