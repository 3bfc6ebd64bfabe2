// common/logging.h: level and format parsing, ConfigureLogging's errors and effect, and the JSON
// lines formatter (fields, escaping of quotes, backslashes and control characters, UTF-8 passed
// through, invalid UTF-8 replaced so that every line parses). Also common/build_info.h's line and
// common/main_flags.h's file names.
#include "common/logging.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <memory>
#include <regex>
#include <sstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/build_info.h"
#include "common/main_flags.h"
#include "nlohmann/json.hpp"
#include "spdlog/details/log_msg.h"
#include "spdlog/sinks/ostream_sink.h"
#include "spdlog/spdlog.h"

namespace ss {
namespace {

using nlohmann::json;

TEST(LoggingTest, ParsesLevels) {
  const std::pair<const char*, spdlog::level::level_enum> cases[] = {
      {"trace", spdlog::level::trace},       {"debug", spdlog::level::debug},
      {"info", spdlog::level::info},         {"warning", spdlog::level::warn},
      {"warn", spdlog::level::warn},         {"error", spdlog::level::err},
      {"critical", spdlog::level::critical}, {"off", spdlog::level::off},
      {"INFO", spdlog::level::info},         {"Warning", spdlog::level::warn}};
  for (const auto& [name, level] : cases) {
    absl::StatusOr<spdlog::level::level_enum> l = ParseLogLevel(name);
    ASSERT_TRUE(l.ok()) << name << ": " << l.status();
    EXPECT_EQ(*l, level) << name;
  }
  for (const char* bad : {"", "bogus", "err", "information", "info "}) {
    absl::StatusOr<spdlog::level::level_enum> l = ParseLogLevel(bad);
    ASSERT_FALSE(l.ok()) << bad;
    EXPECT_EQ(l.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(l.status().message().find(std::string("'") + bad + "'"), absl::string_view::npos);
    EXPECT_NE(l.status().message().find("critical"), absl::string_view::npos);
  }
}

TEST(LoggingTest, ParsesFormats) {
  EXPECT_EQ(*ParseLogFormat("text"), LogFormat::kText);
  EXPECT_EQ(*ParseLogFormat("json"), LogFormat::kJson);
  EXPECT_EQ(*ParseLogFormat("JSON"), LogFormat::kJson);
  EXPECT_FALSE(ParseLogFormat("xml").ok());
  EXPECT_FALSE(ParseLogFormat("").ok());
}

TEST(LoggingTest, ConfigureLoggingNamesTheBadFlag) {
  absl::Status s = ConfigureLogging("prog", "bogus", "text");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(s.message(), "--log_level 'bogus'")) << s;
  s = ConfigureLogging("prog", "info", "xml");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(s.message(), "--log_format 'xml'")) << s;
}

// One line of JsonLogFormatter for `payload`, as text.
std::string Format(absl::string_view payload, spdlog::level::level_enum level = spdlog::level::info,
                   absl::string_view logger = "") {
  JsonLogFormatter f("prog");
  const spdlog::details::log_msg msg(spdlog::string_view_t(logger.data(), logger.size()), level,
                                     spdlog::string_view_t(payload.data(), payload.size()));
  spdlog::memory_buf_t buf;
  f.format(msg, buf);
  return std::string(buf.data(), buf.size());
}

TEST(JsonLogFormatterTest, OneObjectPerLineWithEveryField) {
  const std::string line = Format("hello", spdlog::level::warn);
  ASSERT_FALSE(line.empty());
  EXPECT_EQ(line.back(), '\n');
  EXPECT_EQ(line.find('\n'), line.size() - 1);
  const json j = json::parse(line);
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j.size(), 5u);
  EXPECT_EQ(j["message"], "hello");
  EXPECT_EQ(j["level"], "warning");
  EXPECT_EQ(j["logger"], "prog");  // the default logger has no name
  EXPECT_EQ(j["pid"], static_cast<int>(getpid()));
  EXPECT_TRUE(std::regex_match(j["time"].get<std::string>(),
                               std::regex(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z)")))
      << j["time"];
  EXPECT_EQ(json::parse(Format("x", spdlog::level::err, "engine"))["logger"], "engine");
  EXPECT_EQ(json::parse(Format("x", spdlog::level::critical))["level"], "critical");
  EXPECT_EQ(json::parse(Format("x", spdlog::level::trace))["level"], "trace");
}

TEST(JsonLogFormatterTest, EscapesQuotesBackslashesAndControlCharacters) {
  const std::string payload = std::string("say \"hi\" \\ path\nnext\tcol\r\b\f") + '\x01' + '\x1f' +
                              std::string(1, '\0') + "end";
  const std::string line = Format(payload);
  EXPECT_NE(line.find(R"(say \"hi\" \\ path\nnext\tcol\r\b\f\u0001\u001f\u0000end)"),
            std::string::npos)
      << line;
  EXPECT_EQ(line.find('\n'), line.size() - 1);  // no raw newline inside
  EXPECT_EQ(json::parse(line)["message"], payload);
}

TEST(JsonLogFormatterTest, PassesUtf8ThroughAndReplacesInvalidBytes) {
  const std::string utf8 =
      "caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x99\x82";  // café 日本 🙂
  const std::string line = Format(utf8);
  EXPECT_NE(line.find(utf8), std::string::npos) << line;  // as is, not \u-escaped
  EXPECT_EQ(json::parse(line)["message"], utf8);

  const std::string kFffd = "\xEF\xBF\xBD";
  const std::pair<std::string, std::string> invalid[] = {
      {"a\xFF"
       "b",
       "a" + kFffd + "b"},                                  // never valid
      {"a\xC3", "a" + kFffd},                               // truncated at the end
      {"\xC0\xAF", kFffd + kFffd},                          // overlong '/'
      {"\xED\xA0\x80", kFffd + kFffd + kFffd},              // a surrogate
      {"\xF4\x90\x80\x80", kFffd + kFffd + kFffd + kFffd},  // past U+10FFFF
      {"\xE6\x97"
       "x",
       kFffd + kFffd + "x"},  // cut short by ASCII
  };
  for (const auto& [in, want] : invalid) {
    const json j = json::parse(Format(in));  // throws if the line is not valid JSON / UTF-8
    EXPECT_EQ(j["message"], want);
  }
}

TEST(LoggingTest, ConfigureLoggingSetsLevelAndJsonOnTheDefaultLogger) {
  std::ostringstream out;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out);
  const std::shared_ptr<spdlog::logger> saved = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>("", sink));
  ASSERT_TRUE(ConfigureLogging("prog", "warning", "json").ok());
  spdlog::info("not shown");
  spdlog::warn("shown \"{}\"", 7);
  spdlog::default_logger()->flush();
  const std::string text = out.str();
  ASSERT_TRUE(ConfigureLogging("prog", "info", "text").ok());
  spdlog::set_default_logger(saved);
  EXPECT_EQ(text.find("not shown"), std::string::npos) << text;
  ASSERT_EQ(std::count(text.begin(), text.end(), '\n'), 1) << text;
  const json j = json::parse(text);
  EXPECT_EQ(j["message"], "shown \"7\"");
  EXPECT_EQ(j["level"], "warning");
  EXPECT_EQ(j["logger"], "prog");
}

TEST(BuildInfoTest, VersionLine) {
  const BuildInfo& b = GetBuildInfo();
  EXPECT_EQ(b.version, SS_PROJECT_VERSION);
  EXPECT_FALSE(b.commit.empty());
  EXPECT_TRUE(
      std::regex_match(std::string(b.commit), std::regex("[0-9a-f]{4,40}(\\+dirty)?|unknown")))
      << b.commit;
  const std::string line = VersionLine("prog");
  EXPECT_EQ(line, absl::StrCat("prog ", SS_PROJECT_VERSION, " (commit ", b.commit, ", ",
                               b.build_type.empty() ? "no build type" : b.build_type,
                               b.assertions ? ", assertions on" : "", ")"));
  EXPECT_EQ(line.find('\n'), std::string::npos);
}

TEST(MainFlagsTest, FlagFileNames) {
  // Relative to the source tree, which this test's own path shows (tests/common/...).
  const std::string self = __FILE__;
  const std::string root =
      self.substr(0, self.size() - std::string("tests/common/logging_test.cc").size());
  EXPECT_EQ(FlagFileName(root + "coordinator/coordinator_main.cc"),
            "coordinator/coordinator_main.cc");
  EXPECT_EQ(FlagFileName("./absl/flags/parse.cc"), "absl/flags/parse.cc");
  EXPECT_EQ(FlagFileName("/build/x/absl/flags/parse.cc"), "build/x/absl/flags/parse.cc");
  EXPECT_EQ(FlagFileName("../../gpu_worker/worker_flags.cc"), "gpu_worker/worker_flags.cc");
  EXPECT_TRUE(IsOwnFlagFile("coordinator/coordinator_main.cc"));
  EXPECT_FALSE(IsOwnFlagFile("absl/flags/parse.cc"));
  EXPECT_FALSE(IsOwnFlagFile(FlagFileName("./absl/flags/usage_flags.cc")));
  EXPECT_FALSE(IsOwnFlagFile(FlagFileName("/build/abseil-cpp/absl/flags/parse.cc")));
}

}  // namespace
}  // namespace ss
