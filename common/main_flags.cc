#include "common/main_flags.h"

#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/build_info.h"
#include "common/logging.h"

ABSL_FLAG(std::string, log_level, "info",
          "log level: trace, debug, info, warning, error, critical or off");
ABSL_FLAG(std::string, log_format, "text",
          "log format: text (spdlog's lines) or json (one JSON object a line: time, level, logger, "
          "pid, message)");

namespace ss {
namespace {

// The source tree as this file's own path shows it (absolute, or relative if the compiler was
// given relative paths): __FILE__ less "common/main_flags.cc".
absl::string_view SourceRoot() {
  constexpr absl::string_view kSelf = "common/main_flags.cc";
  absl::string_view file = __FILE__;
  if (absl::EndsWith(file, kSelf)) file.remove_suffix(kSelf.size());
  return file;
}

}  // namespace

std::string FlagFileName(absl::string_view file) {
  const absl::string_view root = SourceRoot();
  if (!root.empty() && absl::StartsWith(file, root)) {
    file.remove_prefix(root.size());
    return std::string(file);
  }
  for (bool again = true; again;) {
    again = false;
    for (absl::string_view p : {"/", "./", "../"}) {
      if (absl::StartsWith(file, p)) {
        file.remove_prefix(p.size());
        again = true;
      }
    }
  }
  return std::string(file);
}

bool IsOwnFlagFile(absl::string_view normalized_file) {
  return !absl::StartsWith(normalized_file, "absl/") &&
         !absl::StrContains(normalized_file, "/absl/");
}

void InitFlagsUsage(absl::string_view program) {
  absl::FlagsUsageConfig usage;
  usage.version_string = [name = std::string(program)] { return VersionLine(name) + "\n"; };
  usage.normalize_filename = [](absl::string_view file) { return FlagFileName(file); };
  // Given the normalized name, or the raw one by absl versions that filter before normalizing.
  usage.contains_help_flags = [](absl::string_view file) {
    return IsOwnFlagFile(FlagFileName(file));
  };
  usage.contains_helpshort_flags = usage.contains_help_flags;
  usage.contains_helppackage_flags = usage.contains_help_flags;
  absl::SetFlagsUsageConfig(usage);
}

absl::Status ApplyLogFlags(absl::string_view program) {
  return ConfigureLogging(program, absl::GetFlag(FLAGS_log_level), absl::GetFlag(FLAGS_log_format));
}

}  // namespace ss
