#include "common/load_progress.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/file_write.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

namespace ss {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr absl::Duration kReportInterval = absl::Milliseconds(200);

// The process's progress file (SetLoadProgressFile): every load begun while a path is set.
class Reporter {
 public:
  static Reporter& Get() {
    static Reporter* const r = new Reporter;  // never destroyed: loads may outlive main's locals
    return *r;
  }
  void SetPath(std::string path) {
    absl::MutexLock lock(&mu_);
    path_ = std::move(path);
  }
  // The new load's index, or -1 without a file.
  int Begin(const std::string& what, int64_t total) {
    absl::MutexLock lock(&mu_);
    if (path_.empty()) return -1;
    phases_.push_back(LoadPhase{.what = what, .total = total});
    Write();
    return static_cast<int>(phases_.size()) - 1;
  }
  void Update(int index, int64_t done, double seconds, bool finished) {
    absl::MutexLock lock(&mu_);
    if (index < 0 || index >= static_cast<int>(phases_.size()) || path_.empty()) return;
    LoadPhase& p = phases_[index];
    p.done = done;
    p.seconds = seconds;
    p.finished = finished;
    Write();
  }

 private:
  void Write() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    nlohmann::json phases = nlohmann::json::array();
    for (const LoadPhase& p : phases_) {
      phases.push_back({{"what", p.what},
                        {"done", p.done},
                        {"total", p.total},
                        {"seconds", p.seconds},
                        {"finished", p.finished}});
    }
    const absl::Status st =
        WriteFileAtomically(path_, nlohmann::json{{"phases", phases}}.dump() + "\n");
    if (!st.ok() && !warned_) {
      warned_ = true;
      spdlog::warn("load progress file: {}", std::string(st.message()));
    }
  }

  absl::Mutex mu_;
  std::string path_ ABSL_GUARDED_BY(mu_);
  std::vector<LoadPhase> phases_ ABSL_GUARDED_BY(mu_);
  bool warned_ ABSL_GUARDED_BY(mu_) = false;
};

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

LoadProgress::LoadProgress(std::string what, int64_t total_bytes, LoadProgressOptions o)
    : what_(std::move(what)),
      total_(total_bytes),
      o_(std::move(o)),
      report_(Reporter::Get().Begin(what_, total_)),
      start_(o_.now()),
      last_(start_),
      last_report_(start_) {}

void LoadProgress::Add(int64_t bytes) {
  std::string line;
  {
    absl::MutexLock lock(&mu_);
    done_ += bytes;
    if (finished_) return;
    const absl::Time t = o_.now();
    if (report_ >= 0 && t - last_report_ >= kReportInterval) {
      last_report_ = t;
      Reporter::Get().Update(report_, done_, absl::ToDoubleSeconds(t - start_), false);
    }
    if (t - last_ < o_.interval) return;
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
    const double seconds = absl::ToDoubleSeconds(o_.now() - start_);
    Reporter::Get().Update(report_, done_, seconds, true);
    if (!o_.log_summary) return;
    line = LoadProgressLine(what_, done_, total_, seconds, true);
  }
  spdlog::info("{}", line);
}

int64_t LoadProgress::done() const {
  absl::MutexLock lock(&mu_);
  return done_;
}

void SetLoadProgressFile(std::string path) { Reporter::Get().SetPath(std::move(path)); }

absl::StatusOr<std::vector<LoadPhase>> ParseLoadProgress(absl::string_view text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  const auto bad = [] { return absl::InvalidArgumentError("not a load progress file"); };
  if (!j.is_object() || !j.contains("phases") || !j["phases"].is_array()) return bad();
  std::vector<LoadPhase> out;
  for (const nlohmann::json& p : j["phases"]) {
    if (!p.is_object() || !p.value("what", nlohmann::json()).is_string() ||
        !p.value("done", nlohmann::json()).is_number_integer() ||
        !p.value("total", nlohmann::json()).is_number_integer() ||
        !p.value("seconds", nlohmann::json()).is_number() ||
        !p.value("finished", nlohmann::json()).is_boolean()) {
      return bad();
    }
    out.push_back(LoadPhase{.what = p["what"].get<std::string>(),
                            .done = p["done"].get<int64_t>(),
                            .total = p["total"].get<int64_t>(),
                            .seconds = p["seconds"].get<double>(),
                            .finished = p["finished"].get<bool>()});
  }
  return out;
}

}  // namespace ss
