// What the `splitserve up` tests look at from outside: the launcher's children (/proc), their
// arguments, the shared-memory segments named after the launcher's pid, readiness and a short
// completion.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "httplib.h"
#include "tests/common/http_get.h"
#include "tests/test_util.h"

namespace ss::testing_util {

// Processes whose parent is `pid` (zombies left out).
inline std::vector<int> ChildrenOf(int pid) {
  std::vector<int> out;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(e.path() / "stat");
    std::string stat;
    std::getline(in, stat);
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 2));
    std::string state;
    int ppid = 0;
    rest >> state >> ppid;
    if (ppid == pid && state != "Z") out.push_back(std::stoi(name));
  }
  return out;
}

inline bool ProcessAlive(int pid) { return kill(pid, 0) == 0; }

// A process's arguments (/proc/PID/cmdline).
inline std::vector<std::string> Cmdline(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/cmdline");
  std::vector<std::string> args;
  for (std::string a; std::getline(in, a, '\0');) args.push_back(a);
  return args;
}

// The value after `flag` in args ("" when absent).
inline std::string FlagValue(const std::vector<std::string>& args, const std::string& flag) {
  for (size_t i = 0; i + 1 < args.size(); ++i) {
    if (args[i] == flag) return args[i + 1];
  }
  return "";
}

// The child of `launcher` whose binary name ends with `binary` ("splitserve-expert-worker"), or -1.
inline int ChildRunning(int launcher, const std::string& binary) {
  for (int child : ChildrenOf(launcher)) {
    const std::vector<std::string> args = Cmdline(child);
    if (!args.empty() && args[0].ends_with(binary)) return child;
  }
  return -1;
}

inline std::vector<std::string> ShmSegmentsOf(int launcher_pid) {
  std::vector<std::string> out;
  const std::string prefix = "splitserve-" + std::to_string(launcher_pid) + "-";
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
    if (e.path().filename().string().rfind(prefix, 0) == 0) out.push_back(e.path().string());
  }
  return out;
}

inline bool IsReady(int port) {
  return HttpGet(port, "/ready").find(" 200 ") != std::string::npos;
}

inline bool WaitReady(int port, ChildProcess& up) {
  for (int i = 0; i < 1200; ++i) {
    if (!up.Running()) return false;
    if (IsReady(port)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

// Ready as the launcher sees it: /ready answers 200 and the launcher printed its banner (it
// supervises -- restarts failed children -- from then on).
inline bool WaitServing(int port, ChildProcess& up, const std::string& log_path) {
  if (!WaitReady(port, up)) return false;
  for (int i = 0; i < 200; ++i) {
    std::ifstream in(log_path);
    const std::string log((std::istreambuf_iterator<char>(in)), {});
    if (log.find("splitserve up: ready in ") != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  return false;
}

// One short completion; the HTTP status, or -1 when no answer came within `timeout_s`.
inline int Complete(int port, int max_tokens = 4, int timeout_s = 30) {
  httplib::Client c("127.0.0.1", port);
  c.set_connection_timeout(2, 0);
  c.set_read_timeout(timeout_s, 0);
  auto r = c.Post("/v1/completions",
                  "{\"model\": \"tiny\", \"prompt\": \"Hello\", \"max_tokens\": " +
                      std::to_string(max_tokens) + "}",
                  "application/json");
  return r ? r->status : -1;
}

inline std::string ReadLog(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// True once every pid in `pids` has exited, waiting up to `timeout`.
inline bool AllGone(const std::vector<int>& pids, std::chrono::milliseconds timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (true) {
    bool any = false;
    for (int p : pids) any = any || ProcessAlive(p);
    if (!any) return true;
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace ss::testing_util
