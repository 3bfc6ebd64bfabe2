#include "common/file_write.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace ss {

absl::Status WriteFileAtomically(const std::string& path, absl::string_view bytes) {
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot write ", tmp, ": ", std::strerror(errno)));
  }
  const bool written = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  if (std::fclose(f) != 0 || !written) {
    std::remove(tmp.c_str());
    return absl::FailedPreconditionError(absl::StrCat("cannot write ", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    std::remove(tmp.c_str());
    return absl::FailedPreconditionError(
        absl::StrCat("cannot rename ", tmp, " to ", path, ": ", std::strerror(e)));
  }
  return absl::OkStatus();
}

}  // namespace ss
