// Log level and format of a splitserve process (spdlog), shared by every main: --log_level
// trace|debug|info|warning|error|critical|off and --log_format text|json (`splitserve up`:
// --log-level / --log-format, passed on to the processes it starts).
//
// text: spdlog's default pattern ("[2026-12-03 04:40:00.123] [info] message").
// json: one JSON object a line, for log collectors:
//   {"time":"2026-12-03T04:40:00.123456Z","level":"info","logger":"splitserve-coordinator",
//    "pid":1234,"message":"..."}
// time is UTC with microseconds; level one of trace, debug, info, warning, error, critical;
// logger the spdlog logger's name, or the program's for the default (unnamed) logger. The message
// is escaped as JSON requires (", \ and control characters); valid UTF-8 passes through as is and
// each byte of an invalid UTF-8 sequence becomes U+FFFD, so every line parses.
//
// Threading: ConfigureLogging once in main, after flag parsing and before threads log; the
// formatter itself is used by spdlog under its sinks' locks (one instance per sink, clone()).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "spdlog/common.h"
#include "spdlog/formatter.h"

namespace ss {

enum class LogFormat { kText, kJson };

// Case-insensitive "trace", "debug", "info", "warning" (or "warn"), "error", "critical", "off".
// InvalidArgument naming the value and the accepted ones otherwise.
absl::StatusOr<spdlog::level::level_enum> ParseLogLevel(absl::string_view name);

// "text" or "json" (case-insensitive); InvalidArgument otherwise.
absl::StatusOr<LogFormat> ParseLogFormat(absl::string_view name);

// Sets the level and format of every spdlog logger (the default one and those registered later).
// `program` names the default logger in JSON lines. InvalidArgument naming the flag
// ("--log_level ..." / "--log_format ...") for a bad value; nothing is changed then.
absl::Status ConfigureLogging(absl::string_view program, absl::string_view level,
                              absl::string_view format);

// The JSON-lines formatter described above. `default_logger_name` stands in for an empty logger
// name.
class JsonLogFormatter final : public spdlog::formatter {
 public:
  explicit JsonLogFormatter(std::string default_logger_name);

  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override;
  std::unique_ptr<spdlog::formatter> clone() const override;

 private:
  std::string default_logger_name_;
  int pid_;
};

}  // namespace ss
