// The child processes of `splitserve up` (launcher.h) and the rule for restarting them.
//
// Supervisor starts children by name, each in its own process group with PR_SET_PDEATHSIG
// (SIGTERM), so a terminal's Ctrl-C reaches only the launcher and every child dies with it even
// when the launcher is killed. Names are grouped by prefix ("expert", "gpu", "coordinator"): the
// stop and kill calls take a prefix, "" meaning every child.
//
// RestartPolicy is systemd's Restart=on-failure with growing delays: the n-th restart in a row
// that did not bring the cluster back waits kFirstDelay * 2^n (at most kMaxDelay); a restart that
// brought it back (OnRecovered) resets the count. After kBurstLimit restarts in a row without a
// recovery the launcher gives up (systemd's StartLimitBurst), so a child that cannot start does
// not loop for ever.
//
// Threads: one owner thread for both classes.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

namespace ss {

class Supervisor {
 public:
  struct Child {
    std::string name;
    pid_t pid = -1;
    bool exited = false;
    int status = 0;                                         // waitpid's, once exited
    std::chrono::steady_clock::time_point stopped_since{};  // first seen stopped (SIGSTOP)
  };

  Supervisor() = default;
  ~Supervisor() { StopAll(); }
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  // Starts `args` as child `name` (replacing an exited child of that name); its stdout and stderr
  // are appended to `log_dir`/name.log when `log_dir` is set, else go to `output_fd` when it is
  // >= 0 (console.h's pipe), else are this process's. `cpus` non-empty: it runs on those CPUs
  // only. False when fork fails.
  bool Start(const std::string& name, const std::vector<std::string>& args,
             const std::string& log_dir, const std::vector<int>& cpus = {}, int output_fd = -1);

  // Reaps exited children; returns the first one that exited since the last call, or null.
  const Child* Reap();

  // The first running child that has been stopped (state T in /proc/PID/stat, as SIGSTOP leaves
  // it) for at least `grace`, or null.
  const Child* Stopped(std::chrono::milliseconds grace);

  // SIGTERM to the running children whose name starts with `prefix`; after `grace` SIGKILL to the
  // rest; reaps them all.
  void StopGroup(const std::string& prefix, std::chrono::milliseconds grace);
  // SIGKILL (which also ends a stopped child) to the running children whose name starts with
  // `prefix`; reaps them.
  void KillGroup(const std::string& prefix);
  // The order of a clean stop: the coordinator drains first, then the GPU workers, then the
  // expert workers.
  void StopAll();

 private:
  std::vector<Child> children_;
};

// "exited with status N" / "killed by signal N".
std::string DescribeExit(int status);

class RestartPolicy {
 public:
  static constexpr std::chrono::milliseconds kFirstDelay{500};
  static constexpr std::chrono::milliseconds kMaxDelay{8000};
  static constexpr int kBurstLimit = 5;

  // Called on a failure: the delay before the next restart, or a negative delay once kBurstLimit
  // restarts in a row did not bring the cluster back (give up).
  std::chrono::milliseconds NextDelay();
  // The cluster is whole again after the restarts.
  void OnRecovered() { failed_in_a_row_ = 0; }
  int failed_in_a_row() const { return failed_in_a_row_; }

 private:
  int failed_in_a_row_ = 0;
};

}  // namespace ss
