#include "common/build_info.h"

#include "absl/strings/str_cat.h"

// Set by common/CMakeLists.txt (SS_VERSION, SS_BUILD_TYPE); the commit comes from the
// build-time generated build_commit.cc.
#ifndef SS_VERSION
#error "SS_VERSION must be defined by the build"
#endif
#ifndef SS_BUILD_TYPE
#error "SS_BUILD_TYPE must be defined by the build"
#endif

namespace ss {
namespace build_info_internal {
const char* GitCommit();  // build_commit.cc (generated)
}  // namespace build_info_internal

const BuildInfo& GetBuildInfo() {
  static const BuildInfo info{
      .version = SS_VERSION,
      .commit = build_info_internal::GitCommit(),
      .build_type = SS_BUILD_TYPE,
#ifdef NDEBUG
      .assertions = false,
#else
      .assertions = true,
#endif
  };
  return info;
}

std::string VersionLine(absl::string_view program) {
  const BuildInfo& b = GetBuildInfo();
  return absl::StrCat(program, " ", b.version, " (commit ", b.commit, ", ",
                      b.build_type.empty() ? "no build type" : b.build_type,
                      b.assertions ? ", assertions on" : "", ")");
}

}  // namespace ss
