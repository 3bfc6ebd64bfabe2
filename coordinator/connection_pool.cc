#include "coordinator/connection_pool.h"

#include <utility>

namespace ss {

ConnectionPool::ConnectionPool(size_t max_threads, std::chrono::milliseconds idle_exit)
    : max_threads_(max_threads < 1 ? 1 : max_threads), idle_exit_(idle_exit) {}

ConnectionPool::~ConnectionPool() { shutdown(); }

void ConnectionPool::enqueue(std::function<void()> fn) {
  std::lock_guard<std::mutex> lock(mu_);
  JoinExitedLocked();
  jobs_.push_back(std::move(fn));
  if (idle_ >= jobs_.size() || threads_.size() >= max_threads_) {
    cv_.notify_one();
    return;
  }
  std::thread t([this] { Work(); });
  const std::thread::id id = t.get_id();
  threads_.emplace(id, std::move(t));
}

void ConnectionPool::shutdown() {
  std::unique_lock<std::mutex> lock(mu_);
  shutdown_ = true;
  cv_.notify_all();
  while (!threads_.empty()) {
    JoinExitedLocked();
    if (threads_.empty()) break;
    cv_.wait(lock, [&] { return !exited_.empty(); });
  }
}

void ConnectionPool::Work() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    ++idle_;
    const bool have = cv_.wait_for(lock, idle_exit_, [&] { return !jobs_.empty() || shutdown_; });
    --idle_;
    if (jobs_.empty() && (shutdown_ || !have)) break;
    if (jobs_.empty()) continue;
    std::function<void()> job = std::move(jobs_.front());
    jobs_.pop_front();
    lock.unlock();
    job();
    job = nullptr;
    lock.lock();
  }
  exited_.push_back(std::this_thread::get_id());
  cv_.notify_all();
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
