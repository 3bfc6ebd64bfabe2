// Progress of a long load in the log (spdlog, info): a line at most every `interval` while bytes
// arrive, and one at the end, so that an operator watching a start-up of minutes sees it move:
//
//   loading weights to CUDA device 0: 3.21 of 8.24 GiB (39%), 2.10 GB/s, about 2 s left
//   loading weights to CUDA device 0: 8.24 GiB in 4.0 s (2.21 GB/s)
//
// With an expected total of 0 (unknown) the lines give bytes and rate only; a total that turns out
// too small shows at most 100%. Thread-safe.
//
// The same progress also goes to a file when the process names one (SetLoadProgressFile; the
// workers' --load_progress_file): `splitserve up` reads its children's files and draws one bar.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ss {

// The line for `done` of `total` bytes (0: unknown) after `seconds`; `final` gives the summary.
std::string LoadProgressLine(const std::string& what, int64_t done, int64_t total, double seconds,
                             bool final);

struct LoadProgressOptions {
  absl::Duration interval = absl::Seconds(5);   // between two log lines
  bool log_summary = true;                      // false: Done logs nothing (the caller's own line)
  std::function<absl::Time()> now = absl::Now;  // the clock (tests pass their own)
};

class LoadProgress {
 public:
  LoadProgress(std::string what, int64_t total_bytes, LoadProgressOptions o = {});
  void Add(int64_t bytes);
  // Logs the summary line (once), and marks the phase finished in the progress file.
  void Done();
  int64_t done() const;

 private:
  const std::string what_;
  const int64_t total_;
  const LoadProgressOptions o_;
  const int report_;  // this load's index in the progress file (-1: none)
  mutable absl::Mutex mu_;
  const absl::Time start_;
  absl::Time last_ ABSL_GUARDED_BY(mu_);
  absl::Time last_report_ ABSL_GUARDED_BY(mu_);
  int64_t done_ ABSL_GUARDED_BY(mu_) = 0;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

// One load as the progress file lists it.
struct LoadPhase {
  std::string what;
  int64_t done = 0;
  int64_t total = 0;  // 0: unknown
  double seconds = 0;
  bool finished = false;
};

// From now on every LoadProgress of this process is listed in `path` ("": none; the loads made
// before stay out): a JSON object {"phases": [{"what", "done", "total", "seconds", "finished"},
// ...]} in the order the loads began, written whole (WriteFileAtomically: a reader never sees a
// part) when a load begins, at most every 200 ms while its bytes arrive, and when it is done. A
// file that cannot be written is logged once as a warning; loading goes on.
void SetLoadProgressFile(std::string path);

// The phases of such a file's text; InvalidArgument for anything else.
absl::StatusOr<std::vector<LoadPhase>> ParseLoadProgress(absl::string_view text);

}  // namespace ss
