// The process's stop signals, SIGINT and SIGTERM, shared by every splitserve main: they are
// blocked in all threads and taken synchronously (sigwait) by whoever waits for them, so no thread
// is interrupted by a handler and a stop arriving during start-up stays pending until someone
// waits.
//
// Order: BlockStopSignals() first thing in main, before any thread starts (threads inherit the
// mask; one started earlier would take a stop signal with the default action, ending the
// process). Then either wait on one thread with WaitForStopSignal(), or run a StopSignalThread.
// Children started with fork + exec inherit the blocked mask and must clear it
// (coordinator/supervisor.cc does).
#pragma once

#include <atomic>
#include <functional>
#include <thread>

#include "absl/time/time.h"

namespace ss {

enum class Sigpipe {
  kDefault,  // leave SIGPIPE's disposition as it is
  kIgnore,   // a write to a closed socket returns EPIPE instead of ending the process
};

// Blocks SIGINT and SIGTERM in the calling thread (and so in every thread it starts afterwards);
// with Sigpipe::kIgnore also ignores SIGPIPE.
void BlockStopSignals(Sigpipe sigpipe);

// Waits up to `timeout` for SIGINT or SIGTERM (BlockStopSignals first); returns the signal
// number, or 0 if none came in time.
int WaitForStopSignal(absl::Duration timeout = absl::InfiniteDuration());

// Ends the process by `sig` with its default action, as if it had never been blocked (for a
// stop that comes before there is anything to stop gracefully).
[[noreturn]] void DieOfSignal(int sig);

// "SIGINT" or "SIGTERM" ("another signal" for any other number).
const char* StopSignalName(int sig);

// A thread that waits for the first stop signal and calls on_stop(sig) on itself, once.
// Destroying it before a signal came wakes and joins the thread without calling on_stop.
// BlockStopSignals must have been called. Construct and destroy on one thread.
class StopSignalThread {
 public:
  explicit StopSignalThread(std::function<void(int sig)> on_stop);
  ~StopSignalThread();
  StopSignalThread(const StopSignalThread&) = delete;
  StopSignalThread& operator=(const StopSignalThread&) = delete;

 private:
  std::atomic<bool> closing_{false};
  std::thread thread_;
};

}  // namespace ss
