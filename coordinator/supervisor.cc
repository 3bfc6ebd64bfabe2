#include "coordinator/supervisor.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"

namespace ss {
namespace {

pid_t Spawn(const std::vector<std::string>& args, const std::string& log_path,
            const std::vector<int>& cpus, int output_fd) {
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) {
    if (c >= 0 && c < CPU_SETSIZE) CPU_SET(c, &set);
  }
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid != 0) return pid;
  // Child: only async-signal-safe calls until exec.
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (getppid() != parent) _exit(127);  // the launcher died before prctl took effect
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  if (!cpus.empty()) sched_setaffinity(0, sizeof(set), &set);  // refused: the launcher's CPUs
  if (!log_path.empty()) {
    const int fd =
        open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
  } else if (output_fd >= 0) {
    dup2(output_fd, 1);
    dup2(output_fd, 2);
  }
  execv(argv[0], argv.data());
  _exit(127);
}

// The state letter of /proc/PID/stat ('R', 'S', 'T', ...), or 0.
char ProcessState(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat;
  std::getline(in, stat);
  const size_t close = stat.rfind(')');
  return close == std::string::npos || close + 2 >= stat.size() ? 0 : stat[close + 2];
}

bool Matches(const Supervisor::Child& c, const std::string& prefix) {
  return !c.exited && c.name.rfind(prefix, 0) == 0;
}

}  // namespace

std::string DescribeExit(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exited with status ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return absl::StrCat("killed by signal ", WTERMSIG(status));
  return "ended";
}

bool Supervisor::Start(const std::string& name, const std::vector<std::string>& args,
                       const std::string& log_dir, const std::vector<int>& cpus, int output_fd) {
  const std::string log = log_dir.empty() ? "" : absl::StrCat(log_dir, "/", name, ".log");
  const pid_t pid = Spawn(args, log, cpus, output_fd);
  if (pid < 0) {
    std::fprintf(stderr, "splitserve up: cannot start %s\n", name.c_str());
    return false;
  }
  std::erase_if(children_, [&](const Child& c) { return c.exited && c.name == name; });
  children_.push_back(Child{name, pid});
  return true;
}

const Supervisor::Child* Supervisor::Reap() {
  for (Child& c : children_) {
    if (c.exited) continue;
    int status = 0;
    if (waitpid(c.pid, &status, WNOHANG) == c.pid) {
      c.exited = true;
      c.status = status;
      return &c;
    }
  }
  return nullptr;
}

const Supervisor::Child* Supervisor::Stopped(std::chrono::milliseconds grace) {
  const auto now = std::chrono::steady_clock::now();
  for (Child& c : children_) {
    if (c.exited) continue;
    if (ProcessState(c.pid) != 'T') {
      c.stopped_since = {};
      continue;
    }
    if (c.stopped_since == std::chrono::steady_clock::time_point{}) c.stopped_since = now;
    if (now - c.stopped_since >= grace) return &c;
  }
  return nullptr;
}

void Supervisor::StopGroup(const std::string& prefix, std::chrono::milliseconds grace) {
  for (Child& c : children_) {
    if (Matches(c, prefix)) {
      kill(c.pid, SIGTERM);
      kill(c.pid, SIGCONT);  // a stopped child takes SIGTERM only once it runs
    }
  }
  const auto deadline = std::chrono::steady_clock::now() + grace;
  while (std::chrono::steady_clock::now() < deadline) {
    bool any = false;
    for (Child& c : children_) {
      if (!Matches(c, prefix)) continue;
      if (waitpid(c.pid, &c.status, WNOHANG) == c.pid) {
        c.exited = true;
      } else {
        any = true;
      }
    }
    if (!any) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (Child& c : children_) {
    if (!Matches(c, prefix)) continue;
    std::fprintf(stderr, "splitserve up: %s did not stop in time: SIGKILL\n", c.name.c_str());
  }
  KillGroup(prefix);
}

void Supervisor::KillGroup(const std::string& prefix) {
  for (Child& c : children_) {
    if (Matches(c, prefix)) kill(c.pid, SIGKILL);
  }
  for (Child& c : children_) {
    if (!Matches(c, prefix)) continue;
    waitpid(c.pid, &c.status, 0);
    c.exited = true;
  }
}

void Supervisor::StopAll() {
  StopGroup("coordinator", std::chrono::seconds(40));
  StopGroup("gpu", std::chrono::seconds(10));
  StopGroup("expert", std::chrono::seconds(10));
  StopGroup("", std::chrono::seconds(5));
}

std::chrono::milliseconds RestartPolicy::NextDelay() {
  if (failed_in_a_row_ >= kBurstLimit) return std::chrono::milliseconds(-1);
  std::chrono::milliseconds delay = kFirstDelay;
  for (int i = 0; i < failed_in_a_row_ && delay < kMaxDelay; ++i) delay *= 2;
  ++failed_in_a_row_;
  return std::min(delay, kMaxDelay);
}

}  // namespace ss
