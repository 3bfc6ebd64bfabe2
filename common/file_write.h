// Writing a small file whole: readers (a launcher polling for a port file, systemd reading a
// drop-in) see either no file or all of it, never a part.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace ss {

// Writes `bytes` to `path` through a temporary file beside it (path.tmp.<pid>), renamed into
// place once it is complete; creates no directories. On failure the temporary file is removed
// and the error (FailedPrecondition) names the file and the reason.
absl::Status WriteFileAtomically(const std::string& path, absl::string_view bytes);

}  // namespace ss
