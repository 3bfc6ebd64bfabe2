// `splitserve up`'s terminal: a status line (the load bar, load_display.h) kept below what its
// children print.
//
// A status line is drawn from column 0 with the cursor left there, and redrawn after each batch
// of the children's lines. The children write into one pipe (child_fd(), their stdout and
// stderr: a line of up to PIPE_BUF bytes arrives whole) that a relay thread copies to the
// terminal, erasing the status line before and drawing it again after. Without the relay (the
// children log to files) only the status line is drawn.
//
// Threads: SetStatus / ClearStatus / columns from any thread; Stop once, after every child that
// holds child_fd() has ended (the relay then reads to the end of the pipe).
#pragma once

#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace ss {

class Console {
 public:
  // `out`: the terminal. With `relay`, child_fd() is a pipe into it.
  static absl::StatusOr<std::unique_ptr<Console>> Create(std::FILE* out, bool relay);
  ~Console();
  Console(const Console&) = delete;
  Console& operator=(const Console&) = delete;

  // The children's stdout and stderr (dup2 it; not inherited otherwise: close-on-exec), or -1
  // without the relay.
  int child_fd() const { return write_fd_; }
  // The terminal's width in columns (80 when unknown).
  int columns() const;
  // Draws `line` as the status line (replacing the one before); "" is ClearStatus.
  void SetStatus(const std::string& line);
  void ClearStatus();
  // Closes this process's end of the pipe and waits for the relay to copy the rest.
  void Stop();

 private:
  explicit Console(std::FILE* out) : out_(out) {}
  void Relay();
  void Write(const char* data, size_t n);

  std::FILE* const out_;
  int read_fd_ = -1, write_fd_ = -1;
  std::thread relay_;
  absl::Mutex mu_;
  std::string status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ss
