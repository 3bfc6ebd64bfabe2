#include "common/metrics/process_metrics.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"

namespace ss::metrics {
namespace {

prometheus::MetricFamily One(const char* name, const char* help, prometheus::MetricType type,
                             double value) {
  prometheus::MetricFamily f;
  f.name = name;
  f.help = help;
  f.type = type;
  prometheus::ClientMetric m;
  if (type == prometheus::MetricType::Counter) {
    m.counter.value = value;
  } else {
    m.gauge.value = value;
  }
  f.metric.push_back(m);
  return f;
}

// /proc/self/stat's fields after the command (which is in parentheses and may hold spaces):
// fields[0] is the state (field 3 of proc(5)).
std::optional<std::vector<std::string>> StatFields() {
  std::ifstream in("/proc/self/stat");
  std::string line;
  if (!std::getline(in, line)) return std::nullopt;
  const size_t close = line.rfind(')');
  if (close == std::string::npos || close + 2 > line.size()) return std::nullopt;
  std::vector<std::string> fields = absl::StrSplit(line.substr(close + 2), ' ', absl::SkipEmpty());
  return fields;
}

std::optional<double> BootTimeSeconds() {
  std::ifstream in("/proc/stat");
  std::string key;
  double value = 0;
  while (in >> key) {
    if (key == "btime" && in >> value) return value;
    in.ignore(1 << 20, '\n');
  }
  return std::nullopt;
}

std::optional<double> OpenFds() {
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return std::nullopt;
  double n = 0;
  while (const dirent* e = ::readdir(dir)) {
    if (e->d_name[0] != '.') ++n;
  }
  ::closedir(dir);
  return n - 1;  // the directory's own descriptor
}

}  // namespace

std::vector<prometheus::MetricFamily> ProcessMetrics::Collect() const {
  using prometheus::MetricType;
  std::vector<prometheus::MetricFamily> out;
  const double ticks = static_cast<double>(::sysconf(_SC_CLK_TCK));
  const double page = static_cast<double>(::sysconf(_SC_PAGESIZE));
  // proc(5): utime 14, stime 15, starttime 22, vsize 23, rss 24 (1-based; fields[0] is field 3).
  if (const auto f = StatFields(); f && f->size() >= 22 && ticks > 0) {
    double utime = 0, stime = 0, start = 0, vsize = 0, rss = 0;
    if (absl::SimpleAtod((*f)[11], &utime) && absl::SimpleAtod((*f)[12], &stime)) {
      out.push_back(One("process_cpu_seconds_total", "Total user and system CPU time in seconds.",
                        MetricType::Counter, (utime + stime) / ticks));
    }
    if (absl::SimpleAtod((*f)[20], &vsize)) {
      out.push_back(One("process_virtual_memory_bytes", "Virtual memory size in bytes.",
                        MetricType::Gauge, vsize));
    }
    if (absl::SimpleAtod((*f)[21], &rss)) {
      out.push_back(One("process_resident_memory_bytes", "Resident memory size in bytes.",
                        MetricType::Gauge, rss * page));
    }
    if (const auto boot = BootTimeSeconds(); boot && absl::SimpleAtod((*f)[19], &start)) {
      out.push_back(One("process_start_time_seconds",
                        "Start time of the process since unix epoch in seconds.", MetricType::Gauge,
                        *boot + start / ticks));
    }
  }
  if (const auto fds = OpenFds()) {
    out.push_back(
        One("process_open_fds", "Number of open file descriptors.", MetricType::Gauge, *fds));
  }
  if (rlimit r{}; ::getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur != RLIM_INFINITY) {
    out.push_back(One("process_max_fds", "Maximum number of open file descriptors.",
                      MetricType::Gauge, static_cast<double>(r.rlim_cur)));
  }
  return out;
}

}  // namespace ss::metrics
