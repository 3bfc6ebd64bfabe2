#include "common/load_progress.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_format.h"
#include "spdlog/spdlog.h"

namespace ss {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

}  // namespace

std::string LoadProgressLine(const std::string& what, int64_t done, int64_t total, double seconds,
                             bool final) {
  const double rate = seconds > 0 ? static_cast<double>(done) / seconds / 1e9 : 0.0;
  if (final) {
    return absl::StrFormat("%s: %.2f GiB in %.1f s (%.2f GB/s)", what, done / kGiB, seconds, rate);
  }
  if (total <= 0) {
    return absl::StrFormat("%s: %.2f GiB, %.2f GB/s", what, done / kGiB, rate);
  }
  const int64_t shown = std::min(done, total);
  std::string line = absl::StrFormat("%s: %.2f of %.2f GiB (%d%%), %.2f GB/s", what, shown / kGiB,
                                     total / kGiB, shown * 100 / total, rate);
  if (rate > 0 && done < total) {
    const double left = static_cast<double>(total - done) / (rate * 1e9);
    absl::StrAppendFormat(&line, ", about %.0f s left", std::ceil(left));
  }
  return line;
}

LoadProgress::LoadProgress(std::string what, int64_t total_bytes, absl::Duration interval,
                           std::function<absl::Time()> now)
    : what_(std::move(what)),
      total_(total_bytes),
      interval_(interval),
      now_(std::move(now)),
      start_(now_()),
      last_(start_) {}

void LoadProgress::Add(int64_t bytes) {
  std::string line;
  {
    absl::MutexLock lock(&mu_);
    done_ += bytes;
    const absl::Time t = now_();
    if (finished_ || t - last_ < interval_) return;
    last_ = t;
    line = LoadProgressLine(what_, done_, total_, absl::ToDoubleSeconds(t - start_), false);
  }
  spdlog::info("{}", line);
}

void LoadProgress::Done() {
  std::string line;
  {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    finished_ = true;
    line = LoadProgressLine(what_, done_, total_, absl::ToDoubleSeconds(now_() - start_), true);
  }
  spdlog::info("{}", line);
}

int64_t LoadProgress::done() const {
  absl::MutexLock lock(&mu_);
  return done_;
}

}  // namespace ss
