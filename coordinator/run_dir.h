// The private run directory of `splitserve up` (launcher.h): the cluster config and the
// coordinator's ports file live there.
//
// Where: under $XDG_RUNTIME_DIR when it is set (and a directory), else under the temp directory
// ($TMPDIR or /tmp), as a fresh mkdtemp directory "splitserve-up-XXXXXX" (mode 0700, so no other
// user can create or replace anything in it). Files in it are created with O_CREAT | O_EXCL |
// O_NOFOLLOW: a name that exists, or a symlink planted there, is an error and never followed. The
// launcher's pid goes to "<dir>/pid".
//
// Stale state: a run killed outright (SIGKILL) leaves its directory and perhaps shared-memory
// segments named "splitserve-<pid>-..." behind. CleanStale removes, under the same base, every
// "splitserve-up-*" directory of this user (not a symlink) whose pid file names a process that no
// longer exists, and unlinks every /dev/shm/splitserve-<pid>-* segment of this user whose pid no
// longer exists. Another user's entries, symlinks and running runs are left alone.
//
// Removal: the RunDir object removes its directory (symlinks in it are removed, not followed) when
// destroyed, so every return path of the launcher cleans up; a SIGKILL is cleaned by the next
// start's CleanStale.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ss {

class RunDir {
 public:
  // CleanStale, then creates the directory and its pid file.
  static absl::StatusOr<RunDir> Create();
  RunDir(RunDir&& other) noexcept : path_(std::move(other.path_)) { other.path_.clear(); }
  RunDir& operator=(RunDir&&) = delete;
  ~RunDir();

  const std::string& path() const { return path_; }
  // path()/name.
  std::string File(const std::string& name) const { return path_ + "/" + name; }
  // Writes path()/name (which must not exist yet), mode 0600, without following symlinks.
  absl::Status WriteNew(const std::string& name, const std::string& content) const;

  // The base directory: $XDG_RUNTIME_DIR when set and a directory, else the temp directory.
  static std::string Base();
  // Removes the stale run directories under `base` and stale shared-memory segments (above);
  // returns how many entries it removed.
  static int CleanStale(const std::string& base);

 private:
  explicit RunDir(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

}  // namespace ss
