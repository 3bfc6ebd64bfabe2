// The gateway's access log: one line per answered request (spdlog, info level; /health, /ready
// and /metrics at debug level, as probes and scrapes come every few seconds):
//
//   access 127.0.0.1:40312 "POST /v1/chat/completions" 200 request=4f0c...e1 id=chatcmpl-9a3...
//     prompt=812 cached=768 output=64 ttft=0.412s duration=2.018s finish=stop
//
// (one line; the fields after the status only for generation requests). A generation request's
// handler Record()s its summary against its httplib::Response when the outcome is known; the
// server's logger, which runs once the response is written (streams included), Take()s it.
// Records are keyed by the Response's address and checked against its X-Request-Id, and at most
// kMaxRecords wait (oldest dropped), so a response that is never logged cannot leak or be
// mistaken for a later one.
//
// Thread-safe.
#pragma once

#include <cstddef>
#include <deque>
#include <optional>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/gateway_metrics.h"

namespace ss {

struct AccessRecord {
  std::string request_id;     // the response's X-Request-Id
  std::string completion_id;  // chatcmpl-... / cmpl-...
  RequestSummary summary;
};

// The line's text (without spdlog's prefix). `record` is null for requests that generated
// nothing.
std::string AccessLine(const std::string& remote, const std::string& method,
                       const std::string& path, int status, const std::string& request_id,
                       const AccessRecord* record);

class AccessLog {
 public:
  static constexpr size_t kMaxRecords = 4096;

  void Record(const void* response, AccessRecord record);
  std::optional<AccessRecord> Take(const void* response, const std::string& request_id);

 private:
  absl::Mutex mu_;
  std::deque<std::pair<const void*, AccessRecord>> records_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ss
