// What this binary was built from: the project version (CMake's project(VERSION)), the git commit
// of the source tree when it was built, and the build type. Every splitserve binary prints
// VersionLine() for --version.
//
// The commit is taken at build time, not at configure time (cmake/build_commit.cmake, run on
// every build; only this library recompiles and the binaries relink when it changes): a short
// hash, with "+dirty" when a tracked file differed from it, or "unknown" for a source tree that
// is not a git work tree (a tarball). Thread-safe: constants only.
#pragma once

#include <string>

#include "absl/strings/string_view.h"

namespace ss {

struct BuildInfo {
  absl::string_view version;     // "0.1.0"
  absl::string_view commit;      // "4e8be7e", "4e8be7e+dirty" or "unknown"
  absl::string_view build_type;  // CMake's build type ("Release", "Debug", ...); "" if none
  bool assertions = false;       // NDEBUG was not defined: assert() and debug checks are on
};

const BuildInfo& GetBuildInfo();

// "<program> <version> (commit <commit>, <build type>)", one line without a newline; the build
// type is followed by ", assertions on" where NDEBUG was not defined, and is "no build type"
// where CMake had none. E.g. "splitserve 0.1.0 (commit 4e8be7e, Release)".
std::string VersionLine(absl::string_view program);

}  // namespace ss
