// Deadlines on receiving a request, which cpp-httplib 0.11 lacks (its read timeout applies to each
// read, so a client sending a byte now and then holds a connection thread forever): a connection
// must deliver a request's line and headers within `head_timeout` of being accepted or of its
// previous response, and the body within `body_timeout` of the headers; otherwise a watcher
// thread shuts its socket down (the thread serving it sees end-of-file and closes it). Once the
// whole request is received the connection is exempt until its response is complete, so a long
// generation or stream is never cut.
//
// The gateway reports each request's progress by its connection's endpoints (connection_socket.h):
// HeadReceived() from httplib's pre-routing handler, Received() once the handler has the body,
// Done() from the logger after the response. The watcher scans the process's sockets on the
// server's port every min(head_timeout, body_timeout) / 4 (at least 20 ms, at most 500 ms), so a
// deadline is enforced up to one scan late; a connection is timed from the first scan that sees it.
//
// Bytes: while a connection waits for a request's line and headers it may receive at most
// `head_bytes` (TCP_INFO's byte count, from the connection's start or its previous response),
// else it is shut down at the next scan: httplib buffers a request line or header line whole
// before it checks its length, so without this one fast client could make the process hold
// whatever it sends within head_timeout. `head_bytes` must leave room for a body the client sends
// right behind the headers (the gateway bounds the body itself once the headers are in). A
// connection's memory is so bounded by head_bytes plus what it sends within one scan period.
//
// Threading: Start() / Stop() from the server's owner; the reports from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/connection_socket.h"

namespace ss {

class ReceiveDeadline {
 public:
  ReceiveDeadline(std::chrono::milliseconds head_timeout, std::chrono::milliseconds body_timeout,
                  uint64_t head_bytes);
  ~ReceiveDeadline();  // Stop()s

  // Watches the connections accepted on `local_port`.
  void Start(int local_port);
  void Stop();  // idempotent

  void HeadReceived(const ConnectionEndpoints& e);
  void Received(const ConnectionEndpoints& e);
  void Done(const ConnectionEndpoints& e);

  // Connections shut down for missing a deadline so far.
  int closed_count() const;

 private:
  using Clock = std::chrono::steady_clock;
  enum class Phase { kHead, kBody, kExempt };
  struct Entry {
    Phase phase = Phase::kHead;
    Clock::time_point since;
    bool seen = false;        // in the latest scan
    uint64_t head_start = 0;  // TCP_INFO bytes when the kHead phase began
  };
  using Key = std::pair<std::string, int>;  // peer address, peer port

  void Set(const ConnectionEndpoints& e, Phase phase, uint64_t bytes = 0);
  bool Overdue(const ConnectionSocket& s, const Entry& entry, Clock::time_point now) const;
  void Watch() ABSL_LOCKS_EXCLUDED(mu_);

  const std::chrono::milliseconds head_timeout_, body_timeout_, period_;
  const uint64_t head_bytes_;
  int local_port_ = -1;
  std::thread thread_;
  mutable absl::Mutex mu_;
  absl::CondVar cv_;
  std::map<Key, Entry> entries_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  int closed_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ss
