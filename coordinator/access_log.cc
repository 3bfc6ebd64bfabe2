#include "coordinator/access_log.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ss {

std::string AccessLine(const std::string& remote, const std::string& method,
                       const std::string& path, int status, const std::string& request_id,
                       const AccessRecord* record) {
  std::string line = absl::StrCat("access ", remote, " \"", method, " ", path, "\" ", status,
                                  " request=", request_id.empty() ? "-" : request_id);
  if (record == nullptr) return line;
  const RequestSummary& s = record->summary;
  absl::StrAppend(&line, " id=", record->completion_id, " prompt=", s.prompt_tokens,
                  " cached=", s.cached_tokens, " output=", s.generated_tokens,
                  " ttft=", s.ttft_s ? absl::StrFormat("%.3fs", *s.ttft_s) : std::string("-"),
                  absl::StrFormat(" duration=%.3fs", s.duration_s),
                  " finish=", s.finish == FinishReason::kNone ? "-" : FinishReasonName(s.finish));
  return line;
}

void AccessLog::Record(const void* response, AccessRecord record) {
  absl::MutexLock lock(&mu_);
  if (records_.size() >= kMaxRecords) records_.pop_front();
  records_.emplace_back(response, std::move(record));
}

std::optional<AccessRecord> AccessLog::Take(const void* response, const std::string& request_id) {
  absl::MutexLock lock(&mu_);
  for (auto it = records_.begin(); it != records_.end(); ++it) {
    if (it->first != response) continue;
    std::optional<AccessRecord> out;
    if (it->second.request_id == request_id) out = std::move(it->second);
    records_.erase(it);
    return out;
  }
  return std::nullopt;
}

}  // namespace ss
