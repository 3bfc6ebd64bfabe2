// Small helpers shared by tests.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace ss::testing_util {

// The whole file as bytes; a file that cannot be opened fails the test and gives "".
inline std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << path;
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// What was written to `f` (a std::tmpfile) so far, from its start.
inline std::string ReadAll(std::FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::string s;
  char buf[512];
  while (size_t n = std::fread(buf, 1, sizeof buf, f)) s.append(buf, n);
  return s;
}

// A fresh directory under the test temp dir, removed when the object goes away.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "ss_test") {
    std::string tmpl =
        (std::filesystem::path(::testing::TempDir()) / (prefix + "_XXXXXX")).string();
    EXPECT_NE(::mkdtemp(tmpl.data()), nullptr);
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string operator/(const std::string& name) const {
    return (std::filesystem::path(path_) / name).string();
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A child process running `argv` (argv[0] = the binary's path). It dies with the test
// (PR_SET_PDEATHSIG), so a crashing test leaves nothing behind. With `log_path` its stdout and
// stderr go to that file. Stop() sends SIGTERM and returns the exit status (0 = clean shutdown;
// 128 + signal when killed); Kill() the same with SIGKILL; Wait() only waits; WaitExit(timeout)
// waits at most `timeout` (-1: still running).
class ChildProcess {
 public:
  explicit ChildProcess(std::vector<std::string> argv, const std::string& log_path = "") {
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    const pid_t parent = getpid();
    pid_ = fork();
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (getppid() != parent) _exit(127);
      if (!log_path.empty()) {
        const int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
          dup2(fd, 1);
          dup2(fd, 2);
        }
      }
      execv(args[0], args.data());
      _exit(127);
    }
    EXPECT_GT(pid_, 0);
  }
  ~ChildProcess() { Stop(); }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  int Stop() { return Wait(/*terminate=*/true); }
  int Kill() {
    if (pid_ > 0) kill(pid_, SIGKILL);
    return Wait();
  }
  int WaitExit(std::chrono::milliseconds timeout) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (Running()) {
      if (std::chrono::steady_clock::now() >= until) return -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return status_;
  }
  int Wait(bool terminate = false) {
    if (pid_ <= 0) return status_;
    if (terminate) kill(pid_, SIGTERM);
    int st = 0;
    waitpid(pid_, &st, 0);
    pid_ = -1;
    status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    return status_;
  }
  // True while the process runs (reaps it when it has exited).
  bool Running() {
    if (pid_ <= 0) return false;
    int st = 0;
    if (waitpid(pid_, &st, WNOHANG) == pid_) {
      pid_ = -1;
      status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      return false;
    }
    return true;
  }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  int status_ = -1;
};

}  // namespace ss::testing_util
