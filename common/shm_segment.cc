#include "common/shm_segment.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "spdlog/spdlog.h"

namespace ss {
namespace {

// Reads /proc/<pid>/stat; returns false if it cannot be read. `state` and `start` are fields 3
// and 22 (the command name in field 2 may contain spaces and parentheses: parse after the last
// ')').
bool ReadProcStat(int pid, char* state, uint64_t* start) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", pid);
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[1024];
  const ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
  ::close(fd);
  if (n <= 0) return false;
  buf[n] = '\0';
  const char* p = std::strrchr(buf, ')');
  if (p == nullptr || p[1] != ' ') return false;
  p += 2;
  *state = *p;
  // Fields after ')' start at field 3 (state); field 22 is the 20th of them.
  for (int field = 3; field < 22; ++field) {
    p = std::strchr(p, ' ');
    if (p == nullptr) return false;
    ++p;
  }
  *start = std::strtoull(p, nullptr, 10);
  return true;
}

absl::Status Errno(absl::string_view what, absl::string_view name, int err) {
  return absl::InternalError(absl::StrCat(what, " ", name, ": ", std::strerror(err)));
}

// Removes a leftover segment whose owner is dead, or says why it must stay.
absl::Status ReclaimStale(const std::string& name, const ShmSegmentKind& kind) {
  const int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) {
    if (errno == ENOENT) return absl::OkStatus();  // gone meanwhile
    return Errno("shm_open (existing)", name, errno);
  }
  struct stat st;
  ShmOwnerPrefix h{};
  const bool stat_ok = ::fstat(fd, &st) == 0;
  const ssize_t got =
      stat_ok && st.st_size >= static_cast<off_t>(sizeof(h)) ? ::pread(fd, &h, sizeof(h), 0) : 0;
  ::close(fd);
  const std::string where = absl::StrCat("/dev/shm", name);
  if (!stat_ok || got != static_cast<ssize_t>(sizeof(h))) {
    return absl::FailedPreconditionError(
        absl::StrCat(where, " exists but is not a readable ", kind.what,
                     " (or is being created); remove it if no server is starting"));
  }
  if (h.magic != kind.magic && h.magic != 0) {
    return absl::FailedPreconditionError(
        absl::StrFormat("%s exists and is not a %s (magic 0x%016x, expected 0x%016x)", where,
                        kind.what, h.magic, kind.magic));
  }
  if (h.owner_pid == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(where,
                     " exists with no owner recorded (being created?); remove it if no server is "
                     "starting"));
  }
  if (ProcessAlive(h.owner_pid, h.owner_start_time)) {
    return absl::AlreadyExistsError(
        absl::StrCat("shm segment ", name, " is owned by live process ", h.owner_pid));
  }
  spdlog::warn("shm: reclaiming stale {} {} of dead process {} (version {})", kind.what, name,
               h.owner_pid, h.version);
  if (::shm_unlink(name.c_str()) != 0 && errno != ENOENT) {
    return Errno("shm_unlink (stale)", name, errno);
  }
  return absl::OkStatus();
}

}  // namespace

uint64_t ProcessStartTime(int pid) {
  char state = 0;
  uint64_t start = 0;
  return ReadProcStat(pid, &state, &start) ? start : 0;
}

bool ProcessAlive(int pid, uint64_t start_time) {
  if (pid <= 0) return false;
  if (::kill(pid, 0) != 0 && errno == ESRCH) return false;
  char state = 0;
  uint64_t start = 0;
  if (!ReadProcStat(pid, &state, &start)) {
    // Gone between the two checks, or /proc is hidden: trust kill().
    return ::kill(pid, 0) == 0 || errno != ESRCH;
  }
  if (state == 'Z' || state == 'X' || state == 'x') return false;
  return start_time == 0 || start == start_time;
}

uint64_t PidNamespaceId() {
  struct stat st;
  if (::stat("/proc/self/ns/pid", &st) != 0) return 0;
  return static_cast<uint64_t>(st.st_ino);
}

absl::StatusOr<int> CreateShmSegment(const std::string& name, const ShmSegmentKind& kind,
                                     bool reclaim_stale) {
  for (int attempt = 0;; ++attempt) {
    const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd >= 0) {
      if (::fchmod(fd, 0600) != 0) {  // whatever the umask did
        const int err = errno;
        ::close(fd);
        ::shm_unlink(name.c_str());
        return Errno("fchmod", name, err);
      }
      return fd;
    }
    if (errno != EEXIST) return Errno("shm_open", name, errno);
    if (!reclaim_stale || attempt == 2) {
      return absl::AlreadyExistsError(absl::StrCat("shm segment ", name, " already exists"));
    }
    if (absl::Status st = ReclaimStale(name, kind); !st.ok()) return st;
  }
}

}  // namespace ss
