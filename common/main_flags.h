// What every absl-flags main of splitserve shares (splitserve-coordinator, -gpu-worker,
// -expert-worker, -generate, -golden):
//
//   --version      prints VersionLine(program) (common/build_info.h) and exits 0;
//   --help         lists the flags defined in splitserve's own sources, grouped by file (paths
//                  relative to the source tree); --helpfull adds absl's own;
//   --log_level    trace|debug|info|warning|error|critical|off (default info);
//   --log_format   text|json (default text; common/logging.h).
//
// Use, on main's thread:
//   ss::InitFlagsUsage(kName);                   // before absl::ParseCommandLine
//   ... absl::ParseCommandLine(argc, argv) ...
//   if (absl::Status s = ss::ApplyLogFlags(kName); !s.ok()) { print s.message(); return 2; }
// Every main also accepts the dashed spellings (--log-level) where it calls NormalizeFlagDashes
// (common/layer_list.h) before parsing.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace ss {

// Sets absl's usage config: --version's line, --help's filter and file names. `program` is the
// binary's name as users call it (not argv[0]).
void InitFlagsUsage(absl::string_view program);

// Applies --log_level and --log_format (ConfigureLogging); InvalidArgument naming the flag and
// the accepted values for a bad one (the caller's usage error, exit 2).
absl::Status ApplyLogFlags(absl::string_view program);

// A flag's definition file as --help shows it: relative to the source tree where it lies in it,
// else without leading "/", "./" and "../" (absl's "./absl/flags/parse.cc" ->
// "absl/flags/parse.cc").
std::string FlagFileName(absl::string_view file);

// Whether --help lists flags defined in `normalized_file` (FlagFileName's result): every file
// but absl's own (a path starting with "absl/" or holding "/absl/").
bool IsOwnFlagFile(absl::string_view normalized_file);

}  // namespace ss
