#include "coordinator/load_display.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace ss {
namespace {

constexpr std::chrono::milliseconds kTtyInterval{250};
constexpr std::chrono::seconds kLineInterval{5};
constexpr std::chrono::seconds kQuietStart{1};  // loads shorter than this show nothing
constexpr int kBarWidth = 20;
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

LoadSummary SummarizeLoads(const std::vector<ChildLoad>& children) {
  LoadSummary s;
  std::vector<std::string> parts;
  for (const ChildLoad& c : children) {
    if (c.phases.empty()) continue;
    int64_t done = 0, total = 0;
    bool finished = true, unknown = false;
    for (const LoadPhase& p : c.phases) {
      done += p.done;
      total += p.finished ? p.done : p.total;  // an estimate ends as what was loaded
      finished = finished && p.finished;
      unknown = unknown || p.total <= 0;
    }
    s.any = true;
    s.done += done;
    s.total += total;
    s.finished = s.finished && finished;
    if (finished) {
      parts.push_back(absl::StrCat(c.name, " done"));
    } else if (unknown) {
      parts.push_back(absl::StrFormat("%s %.2f GiB", c.name, done / kGiB));
    } else {
      parts.push_back(absl::StrFormat("%s %d%%", c.name, std::min(done, total) * 100 / total));
    }
  }
  s.children = absl::StrJoin(parts, ", ");
  return s;
}

std::string LoadDisplayLine(const LoadSummary& s, double seconds, int bar_width, int max_columns) {
  std::string line = "splitserve up: ";
  if (bar_width > 0) {
    const int filled =
        s.total > 0 ? static_cast<int>(std::min(s.done, s.total) * bar_width / s.total) : 0;
    absl::StrAppend(&line, "[", std::string(filled, '#'), std::string(bar_width - filled, '-'),
                    "] ");
  }
  absl::StrAppend(&line, LoadProgressLine("loading", s.done, s.total, seconds, false));
  if (!s.children.empty()) absl::StrAppend(&line, " (", s.children, ")");
  if (max_columns > 0 && static_cast<int>(line.size()) > max_columns) line.resize(max_columns);
  return line;
}

LoadDisplay::LoadDisplay(std::vector<std::pair<std::string, std::string>> files, std::FILE* out,
                         Console* console)
    : files_(std::move(files)), out_(out), console_(console) {}

void LoadDisplay::Restart(Clock::time_point now) {
  for (const auto& [name, path] : files_) std::remove(path.c_str());
  start_ = next_ = now;
  shown_ = false;
  active_ = true;
}

LoadSummary LoadDisplay::Read() const {
  std::vector<ChildLoad> children;
  for (const auto& [name, path] : files_) {
    ChildLoad c{.name = name, .phases = {}};
    if (absl::StatusOr<std::vector<LoadPhase>> p = ParseLoadProgress(ReadAll(path)); p.ok()) {
      c.phases = *std::move(p);
    }
    children.push_back(std::move(c));
  }
  return SummarizeLoads(children);
}

void LoadDisplay::Poll(Clock::time_point now) {
  if (!active_ || now < next_ || now - start_ < kQuietStart) return;
  next_ = now + (console_ != nullptr ? std::chrono::duration_cast<Clock::duration>(kTtyInterval)
                                     : std::chrono::duration_cast<Clock::duration>(kLineInterval));
  const LoadSummary s = Read();
  if (!s.any) return;
  const double seconds = std::chrono::duration<double>(now - start_).count();
  if (console_ != nullptr) {
    console_->SetStatus(LoadDisplayLine(s, seconds, kBarWidth, console_->columns() - 1));
  } else {
    std::fprintf(out_, "%s\n", LoadDisplayLine(s, seconds, 0, 0).c_str());
    std::fflush(out_);
  }
  shown_ = true;
}

void LoadDisplay::Stop(Clock::time_point now, bool ready) {
  if (!active_) return;
  active_ = false;
  if (console_ != nullptr) console_->ClearStatus();
  if (shown_ && ready) {
    const LoadSummary s = Read();
    std::fprintf(out_, "splitserve up: %s\n",
                 LoadProgressLine("loaded", s.done, s.total,
                                  std::chrono::duration<double>(now - start_).count(), true)
                     .c_str());
  }
  std::fflush(out_);
}

}  // namespace ss
