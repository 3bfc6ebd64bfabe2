#include "coordinator/console.h"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace ss {
namespace {

constexpr char kEraseLine[] = "\r\033[K";

}  // namespace

absl::StatusOr<std::unique_ptr<Console>> Console::Create(std::FILE* out, bool relay) {
  std::unique_ptr<Console> c(new Console(out));
  if (relay) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) {
      return absl::InternalError(absl::StrCat("pipe2: ", std::strerror(errno)));
    }
    c->read_fd_ = fds[0];
    c->write_fd_ = fds[1];
    c->relay_ = std::thread([p = c.get()] { p->Relay(); });
  }
  return c;
}

Console::~Console() { Stop(); }

int Console::columns() const {
  winsize w{};
  if (ioctl(fileno(out_), TIOCGWINSZ, &w) == 0 && w.ws_col > 0) return w.ws_col;
  return 80;
}

void Console::SetStatus(const std::string& line) {
  if (line.empty()) return ClearStatus();
  absl::MutexLock lock(&mu_);
  status_ = line;
  std::fprintf(out_, "%s%s\r", kEraseLine, status_.c_str());
  std::fflush(out_);
}

void Console::ClearStatus() {
  absl::MutexLock lock(&mu_);
  if (status_.empty()) return;
  status_.clear();
  std::fputs(kEraseLine, out_);
  std::fflush(out_);
}

void Console::Stop() {
  if (write_fd_ >= 0) {
    close(write_fd_);
    write_fd_ = -1;
  }
  if (relay_.joinable()) relay_.join();
  if (read_fd_ >= 0) {
    close(read_fd_);
    read_fd_ = -1;
  }
}

// Copies whole lines (a child's partial line waits for its end, or for the end of the pipe).
void Console::Relay() {
  std::string pending;
  char buf[1 << 16];
  while (true) {
    const ssize_t n = read(read_fd_, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    pending.append(buf, static_cast<size_t>(n));
    const size_t end = pending.rfind('\n');
    if (end == std::string::npos) continue;
    Write(pending.data(), end + 1);
    pending.erase(0, end + 1);
  }
  if (!pending.empty()) {
    pending.push_back('\n');
    Write(pending.data(), pending.size());
  }
}

void Console::Write(const char* data, size_t n) {
  absl::MutexLock lock(&mu_);
  if (!status_.empty()) std::fputs(kEraseLine, out_);
  std::fwrite(data, 1, n, out_);
  if (!status_.empty()) std::fprintf(out_, "%s\r", status_.c_str());
  std::fflush(out_);
}

}  // namespace ss
