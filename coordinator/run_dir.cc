#include "coordinator/run_dir.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace ss {
namespace {

namespace fs = std::filesystem;

constexpr char kDirPrefix[] = "splitserve-up-";
constexpr char kShmPrefix[] = "splitserve-";

// True when `pid` names no process (kill answers ESRCH).
bool PidGone(int64_t pid) {
  return pid > 0 && kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;
}

// lstat: a real directory (not a symlink) owned by this user.
bool OwnDirectory(const std::string& path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == getuid();
}

// The pid in `dir`/pid, read without following a symlink; 0 when there is none.
int64_t PidFile(const std::string& dir) {
  const int fd = open((dir + "/pid").c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return 0;
  char buf[32] = {};
  const ssize_t n = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  int64_t pid = 0;
  return n > 0 && absl::SimpleAtoi(absl::string_view(buf, static_cast<size_t>(n)), &pid) ? pid
                                                                                          : 0;
}

}  // namespace

std::string RunDir::Base() {
  if (const char* xdg = std::getenv("XDG_RUNTIME_DIR"); xdg != nullptr && xdg[0] == '/') {
    std::error_code ec;
    if (fs::is_directory(xdg, ec)) return xdg;
  }
  std::error_code ec;
  const fs::path tmp = fs::temp_directory_path(ec);
  return ec ? "/tmp" : tmp.string();
}

int RunDir::CleanStale(const std::string& base) {
  int removed = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(base, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(kDirPrefix, 0) != 0 || !OwnDirectory(e.path().string())) continue;
    if (!PidGone(PidFile(e.path().string()))) continue;
    std::error_code rm;
    fs::remove_all(e.path(), rm);  // removes symlinks inside, never their targets
    if (!rm) ++removed;
  }
  for (const auto& e : fs::directory_iterator("/dev/shm", ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(kShmPrefix, 0) != 0) continue;
    const size_t dash = name.find('-', sizeof(kShmPrefix) - 1);
    int64_t pid = 0;
    if (dash == std::string::npos ||
        !absl::SimpleAtoi(name.substr(sizeof(kShmPrefix) - 1, dash - sizeof(kShmPrefix) + 1),
                          &pid)) {
      continue;
    }
    struct stat st;
    if (lstat(e.path().c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != getuid() ||
        !PidGone(pid)) {
      continue;
    }
    if (shm_unlink(("/" + name).c_str()) == 0) ++removed;
  }
  return removed;
}

absl::StatusOr<RunDir> RunDir::Create() {
  const std::string base = Base();
  CleanStale(base);
  std::string templ = absl::StrCat(base, "/", kDirPrefix, "XXXXXX");
  if (mkdtemp(templ.data()) == nullptr) {  // mode 0700
    return absl::InternalError(
        absl::StrCat("cannot create a run directory under ", base, ": ", std::strerror(errno)));
  }
  RunDir dir(templ);
  if (absl::Status st = dir.WriteNew("pid", absl::StrCat(getpid(), "\n")); !st.ok()) return st;
  return dir;
}

RunDir::~RunDir() {
  if (path_.empty()) return;
  std::error_code ec;
  fs::remove_all(path_, ec);
}

absl::Status RunDir::WriteNew(const std::string& name, const std::string& content) const {
  const std::string path = File(name);
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("cannot create ", path, ": ", std::strerror(errno)));
  }
  size_t done = 0;
  while (done < content.size()) {
    const ssize_t n = write(fd, content.data() + done, content.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      close(fd);
      return absl::InternalError(absl::StrCat("cannot write ", path, ": ", std::strerror(err)));
    }
    done += static_cast<size_t>(n);
  }
  if (close(fd) != 0) {
    return absl::InternalError(absl::StrCat("cannot write ", path, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace ss
