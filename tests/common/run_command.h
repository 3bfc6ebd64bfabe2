// Runs a shell command line for tests of the binaries' command lines: its exit status and what it
// wrote to stdout (redirect stderr in `cmd` to capture or drop it).
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace ss::testing_util {

struct CommandResult {
  int status = -1;     // exit status, or 128 + signal; -1 when it could not start
  std::string output;  // stdout
};

inline CommandResult RunCommand(const std::string& cmd) {
  CommandResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof(buf), p)) r.output.append(buf, n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return r;
}

}  // namespace ss::testing_util
