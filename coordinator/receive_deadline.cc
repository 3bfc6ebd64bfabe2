#include "coordinator/receive_deadline.h"

#include <sys/socket.h>

#include <algorithm>
#include <optional>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "spdlog/spdlog.h"

namespace ss {

ReceiveDeadline::ReceiveDeadline(std::chrono::milliseconds head_timeout,
                                 std::chrono::milliseconds body_timeout, uint64_t head_bytes)
    : head_timeout_(head_timeout),
      body_timeout_(body_timeout),
      period_(std::clamp(std::min(head_timeout, body_timeout) / 4, std::chrono::milliseconds(20),
                         std::chrono::milliseconds(50))),
      head_bytes_(head_bytes) {}

ReceiveDeadline::~ReceiveDeadline() { Stop(); }

void ReceiveDeadline::Start(int local_port) {
  local_port_ = local_port;
  thread_ = std::thread([this] { Watch(); });
}

void ReceiveDeadline::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.SignalAll();
  if (thread_.joinable()) thread_.join();
}

void ReceiveDeadline::Set(const ConnectionEndpoints& e, Phase phase, uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  Entry& entry = entries_[Key(e.peer_addr, e.peer_port)];
  entry.phase = phase;
  entry.since = Clock::now();
  entry.seen = true;
  entry.head_start = bytes;
}

void ReceiveDeadline::HeadReceived(const ConnectionEndpoints& e) { Set(e, Phase::kBody); }
void ReceiveDeadline::Received(const ConnectionEndpoints& e) { Set(e, Phase::kExempt); }
void ReceiveDeadline::Done(const ConnectionEndpoints& e) {
  // The next request's bytes count from here (a pipelined request's early bytes count against it).
  const int fd = FindConnectionSocket(e);
  Set(e, Phase::kHead, fd < 0 ? 0 : BytesReceived(fd).value_or(0));
}

bool ReceiveDeadline::Overdue(const ConnectionSocket& s, const Entry& entry,
                              Clock::time_point now) const {
  if (entry.phase == Phase::kExempt) return false;
  if (now - entry.since > (entry.phase == Phase::kHead ? head_timeout_ : body_timeout_))
    return true;
  if (entry.phase != Phase::kHead) return false;
  const std::optional<uint64_t> bytes = BytesReceived(s.fd);
  return bytes && *bytes > entry.head_start && *bytes - entry.head_start > head_bytes_;
}

int ReceiveDeadline::closed_count() const {
  absl::MutexLock lock(&mu_);
  return closed_;
}

void ReceiveDeadline::Watch() {
  absl::MutexLock lock(&mu_);
  while (!stop_) {
    const Clock::time_point scan_start = Clock::now();
    mu_.Unlock();
    const std::vector<ConnectionSocket> sockets = ConnectionSockets(local_port_);
    mu_.Lock();
    const Clock::time_point now = Clock::now();
    for (auto& [key, entry] : entries_) entry.seen = false;
    int closed = 0;
    for (const ConnectionSocket& s : sockets) {
      const Key key(s.endpoints.peer_addr, s.endpoints.peer_port);
      auto [it, inserted] = entries_.try_emplace(key);
      Entry& entry = it->second;
      entry.seen = true;
      if (inserted) entry.since = now;
      if (!Overdue(s, entry, now)) continue;
      // Re-checked just before: the descriptor may have been closed and reused since the scan.
      if (SocketHasEndpoints(s.fd, s.endpoints)) {
        ::shutdown(s.fd, SHUT_RDWR);
        ++closed;
      }
      entries_.erase(it);
    }
    // Gone from the scan: closed (an entry reported after the scan began may be a connection it
    // missed).
    std::erase_if(entries_,
                  [&](const auto& kv) { return !kv.second.seen && kv.second.since < scan_start; });
    closed_ += closed;
    if (closed > 0) {
      spdlog::warn(
          "HTTP: closed {} connection(s) that sent no complete request in time or within {} bytes",
          closed, head_bytes_);
    }
    const absl::Time wake = absl::Now() + absl::FromChrono(period_);
    while (!stop_ && !cv_.WaitWithDeadline(&mu_, wake)) {
    }
  }
}

}  // namespace ss
