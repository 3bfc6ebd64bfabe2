#include "common/stop_signals.h"

#include <pthread.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

namespace ss {
namespace {

sigset_t StopSet() {
  sigset_t s;
  sigemptyset(&s);
  sigaddset(&s, SIGINT);
  sigaddset(&s, SIGTERM);
  return s;
}

}  // namespace

void BlockStopSignals(Sigpipe sigpipe) {
  const sigset_t s = StopSet();
  pthread_sigmask(SIG_BLOCK, &s, nullptr);
  if (sigpipe == Sigpipe::kIgnore) signal(SIGPIPE, SIG_IGN);
}

int WaitForStopSignal(absl::Duration timeout) {
  const sigset_t s = StopSet();
  if (timeout == absl::InfiniteDuration()) {
    int sig = 0;
    return sigwait(&s, &sig) == 0 ? sig : 0;
  }
  const timespec ts =
      absl::ToTimespec(timeout < absl::ZeroDuration() ? absl::ZeroDuration() : timeout);
  const int sig = sigtimedwait(&s, nullptr, &ts);
  return sig > 0 ? sig : 0;
}

void DieOfSignal(int sig) {
  signal(sig, SIG_DFL);
  sigset_t one;
  sigemptyset(&one);
  sigaddset(&one, sig);
  pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
  raise(sig);  // delivered to this thread, now unblocked: the process ends here
  _exit(128 + sig);
}

const char* StopSignalName(int sig) {
  switch (sig) {
    case SIGINT:
      return "SIGINT";
    case SIGTERM:
      return "SIGTERM";
    default:
      return "another signal";
  }
}

StopSignalThread::StopSignalThread(std::function<void(int sig)> on_stop)
    : thread_([this, on_stop = std::move(on_stop)] {
        int sig = 0;
        while ((sig = WaitForStopSignal()) == 0) {
        }
        if (!closing_.load()) on_stop(sig);
      }) {}

StopSignalThread::~StopSignalThread() {
  closing_.store(true);
  // Blocked in every thread, the signal stays pending for this one until its sigwait takes it.
  pthread_kill(thread_.native_handle(), SIGTERM);
  thread_.join();
}

}  // namespace ss
