#include "coordinator/connection_pool.h"

#include <utility>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace ss {

ConnectionPool::ConnectionPool(size_t max_threads, std::chrono::milliseconds idle_exit)
    : max_threads_(max_threads < 1 ? 1 : max_threads), idle_exit_(idle_exit) {}

ConnectionPool::~ConnectionPool() { shutdown(); }

void ConnectionPool::enqueue(std::function<void()> fn) {
  absl::MutexLock lock(&mu_);
  JoinExitedLocked();
  jobs_.push_back(std::move(fn));
  if (idle_ >= jobs_.size() || threads_.size() >= max_threads_) {
    cv_.Signal();
    return;
  }
  std::thread t([this] { Work(); });
  const std::thread::id id = t.get_id();
  threads_.emplace(id, std::move(t));
}

void ConnectionPool::shutdown() {
  absl::MutexLock lock(&mu_);
  shutdown_ = true;
  cv_.SignalAll();
  while (!threads_.empty()) {
    JoinExitedLocked();
    if (threads_.empty()) break;
    while (exited_.empty()) cv_.Wait(&mu_);
  }
}

void ConnectionPool::Work() {
  mu_.Lock();
  for (;;) {
    ++idle_;
    const absl::Time deadline = absl::Now() + absl::FromChrono(idle_exit_);
    bool timed_out = false;
    while (jobs_.empty() && !shutdown_ && !timed_out) {
      timed_out = cv_.WaitWithDeadline(&mu_, deadline);
    }
    const bool have = !jobs_.empty() || shutdown_;
    --idle_;
    if (jobs_.empty() && (shutdown_ || !have)) break;
    if (jobs_.empty()) continue;
    std::function<void()> job = std::move(jobs_.front());
    jobs_.pop_front();
    mu_.Unlock();
    job();
    job = nullptr;
    mu_.Lock();
  }
  exited_.push_back(std::this_thread::get_id());
  cv_.SignalAll();
  mu_.Unlock();
}

void ConnectionPool::JoinExitedLocked() {
  for (const std::thread::id id : exited_) {
    auto it = threads_.find(id);
    if (it == threads_.end()) continue;
    it->second.join();  // it has left Work() and only returns: no lock it could wait for
    threads_.erase(it);
  }
  exited_.clear();
}

}  // namespace ss
