#include "common/logging.h"

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "spdlog/pattern_formatter.h"
#include "spdlog/spdlog.h"

namespace ss {
namespace {

constexpr char kLevels[] = "trace, debug, info, warning, error, critical or off";

const char* LevelName(spdlog::level::level_enum l) {
  switch (l) {
    case spdlog::level::trace:
      return "trace";
    case spdlog::level::debug:
      return "debug";
    case spdlog::level::info:
      return "info";
    case spdlog::level::warn:
      return "warning";
    case spdlog::level::err:
      return "error";
    case spdlog::level::critical:
      return "critical";
    default:
      return "off";
  }
}

void Append(spdlog::memory_buf_t& dest, absl::string_view s) {
  dest.append(s.data(), s.data() + s.size());
}

// The length of the valid UTF-8 sequence at s[i] (1-4), or 0 if none starts there (RFC 3629:
// no overlong forms, no surrogates, nothing past U+10FFFF).
size_t Utf8SequenceLength(absl::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const auto cont = [&](size_t k) { return i + k < s.size() && (b(k) & 0xC0) == 0x80; };
  const unsigned char c = b(0);
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return cont(1) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    if (!cont(1) || !cont(2)) return 0;
    if (c == 0xE0 && b(1) < 0xA0) return 0;   // overlong
    if (c == 0xED && b(1) >= 0xA0) return 0;  // surrogate
    return 3;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    if (!cont(1) || !cont(2) || !cont(3)) return 0;
    if (c == 0xF0 && b(1) < 0x90) return 0;   // overlong
    if (c == 0xF4 && b(1) >= 0x90) return 0;  // past U+10FFFF
    return 4;
  }
  return 0;
}

// `s` as the body of a JSON string (without the quotes).
void AppendJsonEscaped(spdlog::memory_buf_t& dest, absl::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80) {
      const size_t n = Utf8SequenceLength(s, i);
      if (n == 0) {
        Append(dest, "\xEF\xBF\xBD");  // U+FFFD for this byte
        ++i;
      } else {
        Append(dest, s.substr(i, n));
        i += n;
      }
      continue;
    }
    switch (c) {
      case '"':
        Append(dest, "\\\"");
        break;
      case '\\':
        Append(dest, "\\\\");
        break;
      case '\b':
        Append(dest, "\\b");
        break;
      case '\f':
        Append(dest, "\\f");
        break;
      case '\n':
        Append(dest, "\\n");
        break;
      case '\r':
        Append(dest, "\\r");
        break;
      case '\t':
        Append(dest, "\\t");
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          Append(dest, buf);
        } else {
          dest.push_back(static_cast<char>(c));
        }
    }
    ++i;
  }
}

}  // namespace

absl::StatusOr<spdlog::level::level_enum> ParseLogLevel(absl::string_view name) {
  const std::string n = absl::AsciiStrToLower(name);
  if (n == "trace") return spdlog::level::trace;
  if (n == "debug") return spdlog::level::debug;
  if (n == "info") return spdlog::level::info;
  if (n == "warning" || n == "warn") return spdlog::level::warn;
  if (n == "error") return spdlog::level::err;
  if (n == "critical") return spdlog::level::critical;
  if (n == "off") return spdlog::level::off;
  return absl::InvalidArgumentError(absl::StrCat("'", name, "': expected ", kLevels));
}

absl::StatusOr<LogFormat> ParseLogFormat(absl::string_view name) {
  const std::string n = absl::AsciiStrToLower(name);
  if (n == "text") return LogFormat::kText;
  if (n == "json") return LogFormat::kJson;
  return absl::InvalidArgumentError(absl::StrCat("'", name, "': expected text or json"));
}

absl::Status ConfigureLogging(absl::string_view program, absl::string_view level,
                              absl::string_view format) {
  const absl::StatusOr<spdlog::level::level_enum> l = ParseLogLevel(level);
  if (!l.ok())
    return absl::InvalidArgumentError(absl::StrCat("--log_level ", l.status().message()));
  const absl::StatusOr<LogFormat> f = ParseLogFormat(format);
  if (!f.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--log_format ", f.status().message()));
  }
  spdlog::set_level(*l);
  if (*f == LogFormat::kJson) {
    spdlog::set_formatter(std::make_unique<JsonLogFormatter>(std::string(program)));
  } else {
    spdlog::set_formatter(std::make_unique<spdlog::pattern_formatter>());
  }
  return absl::OkStatus();
}

JsonLogFormatter::JsonLogFormatter(std::string default_logger_name)
    : default_logger_name_(std::move(default_logger_name)), pid_(static_cast<int>(getpid())) {}

void JsonLogFormatter::format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) {
  using std::chrono::duration_cast;
  using std::chrono::microseconds;
  const std::time_t secs = std::chrono::system_clock::to_time_t(msg.time);
  const int64_t micros = duration_cast<microseconds>(msg.time.time_since_epoch()).count() % 1000000;
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char time[48];
  std::snprintf(time, sizeof time, "%04d-%02d-%02dT%02d:%02d:%02d.%06lldZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<long long>(micros < 0 ? micros + 1000000 : micros));
  Append(dest, "{\"time\":\"");
  Append(dest, time);
  Append(dest, "\",\"level\":\"");
  Append(dest, LevelName(msg.level));
  Append(dest, "\",\"logger\":\"");
  const absl::string_view logger(msg.logger_name.data(), msg.logger_name.size());
  AppendJsonEscaped(dest, logger.empty() ? default_logger_name_ : logger);
  Append(dest, absl::StrCat("\",\"pid\":", pid_, ",\"message\":\""));
  AppendJsonEscaped(dest, absl::string_view(msg.payload.data(), msg.payload.size()));
  Append(dest, "\"}\n");
}

std::unique_ptr<spdlog::formatter> JsonLogFormatter::clone() const {
  return std::make_unique<JsonLogFormatter>(default_logger_name_);
}

}  // namespace ss
