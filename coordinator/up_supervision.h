// `splitserve up`'s supervision of its children (launcher.h "Supervision" gives the rules): it
// starts the coordinator, then, once the coordinator has written its ports, the workers; waits
// for GET /ready and prints the banner; and from then on restarts the workers (or everything)
// when a child exits, stops, or the coordinator stays unready, following RestartPolicy.
//
// One loop, one phase at a time:
//   kPorts    the coordinator is starting: wait for its ports file, then start the workers;
//   kReady    wait for GET /ready 200 (the load bar is drawn meanwhile);
//   kServing  probe /ready every kProbeInterval;
//   kBackoff  after a failure: wait the policy's delay, then start what was killed.
// Every line it prints (ready banner, "serving again", "restarting ...", "stopping", "stopped")
// and the order of its side effects are part of the command's interface.
//
// Ownership and order: the Supervisor (and with it every child) belongs to this object. The
// caller keeps `plan`, `console` and `load_display` alive for this object's whole life; the
// Console must be created after BlockStopSignals and destroyed after this object (launcher.cc).
// Threads: one thread, the one that blocked the stop signals.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "coordinator/console.h"
#include "coordinator/load_display.h"
#include "coordinator/supervisor.h"
#include "coordinator/up_plan.h"

namespace httplib {
class Client;
}  // namespace httplib

namespace ss {

class UpSupervision {
 public:
  // `console`: null when stdout is not a terminal.
  UpSupervision(const LaunchPlan& plan, std::string model_name, Console* console,
                LoadDisplay* load_display);
  ~UpSupervision();
  UpSupervision(const UpSupervision&) = delete;
  UpSupervision& operator=(const UpSupervision&) = delete;

  // Starts the coordinator and supervises until SIGINT / SIGTERM (exit code 0) or a failure it
  // does not restart from (1, after printing it); then stops every child. Call once, with the
  // stop signals blocked (common/stop_signals.h).
  int Run();

 private:
  using Clock = std::chrono::steady_clock;
  enum class Phase { kBackoff, kPorts, kReady, kServing };
  // What one step of the loop found wrong; `what` empty: nothing.
  struct Failure {
    std::string what;           // for the message
    bool all = false;           // the coordinator failed: restart it with the workers
    bool child_failed = false;  // a child died or stopped (not a deadline)
  };

  bool StartCoordinator(int http_port);
  bool StartWorkers(int control_port);
  void UnlinkSegments();
  // One step: a child that died or stopped, else the current phase's step.
  Failure Step(Clock::time_point now);
  void StepBackoff(Clock::time_point now, Failure* f);
  void StepPorts(Clock::time_point now, Failure* f);
  void StepReady(Clock::time_point now, Failure* f);
  void StepServing(Clock::time_point now, Failure* f);
  // Kills what failed and schedules its restart (kBackoff); false when `up` gives up instead.
  bool ScheduleRestart(Clock::time_point now, const Failure& f);

  const LaunchPlan& plan_;
  const std::string model_name_;
  Console* const console_;
  LoadDisplay* const load_display_;
  const int child_out_;  // the children's stdout and stderr (Console::child_fd), or -1

  Supervisor sup_;
  RestartPolicy policy_;
  Phase phase_ = Phase::kPorts;
  bool served_ = false;       // the cluster was whole at least once
  bool restart_all_ = false;  // kBackoff: the coordinator too
  int http_port_ = 0, control_port_ = 0;
  Clock::time_point start_, deadline_;  // deadline_: kPorts, kReady
  Clock::time_point restart_at_, failed_at_, not_ready_since_, next_probe_;
  std::unique_ptr<httplib::Client> client_;  // to the coordinator's HTTP port, from kPorts on
};

}  // namespace ss
