// Progress of a long load in the log (spdlog, info): a line at most every `interval` while bytes
// arrive, and one at the end, so that an operator watching a start-up of minutes sees it move:
//
//   loading weights to CUDA device 0: 3.21 of 8.24 GiB (39%), 2.10 GB/s, about 2 s left
//   loading weights to CUDA device 0: 8.24 GiB in 4.0 s (2.21 GB/s)
//
// With an expected total of 0 (unknown) the lines give bytes and rate only; a total that turns out
// too small shows at most 100%. Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ss {

// The line for `done` of `total` bytes (0: unknown) after `seconds`; `final` gives the summary.
std::string LoadProgressLine(const std::string& what, int64_t done, int64_t total, double seconds,
                             bool final);

class LoadProgress {
 public:
  // `now` is the clock (tests pass their own).
  LoadProgress(std::string what, int64_t total_bytes, absl::Duration interval = absl::Seconds(5),
               std::function<absl::Time()> now = absl::Now);
  void Add(int64_t bytes);
  // Logs the summary line (once).
  void Done();
  int64_t done() const;

 private:
  const std::string what_;
  const int64_t total_;
  const absl::Duration interval_;
  const std::function<absl::Time()> now_;
  mutable absl::Mutex mu_;
  const absl::Time start_;
  absl::Time last_ ABSL_GUARDED_BY(mu_);
  int64_t done_ ABSL_GUARDED_BY(mu_) = 0;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace ss
