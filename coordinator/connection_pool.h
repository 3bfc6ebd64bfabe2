// The gateway's connection threads (an httplib::TaskQueue, the job being one accepted connection
// served until it closes): a thread per open connection, started on demand up to `max_threads`,
// so connections that send slowly or idle (each blocks its thread in a read) take threads that
// would otherwise sit unused, not a fixed pool that is the server's whole capacity. Connections
// beyond the cap wait in FIFO order for a thread. Threads idle for `idle_exit` exit.
//
// Threading: enqueue() from httplib's listener thread, shutdown() once from it at the end of
// listen(); jobs run on the pool's threads. shutdown() runs the jobs already queued, then joins.
#pragma once

#include <chrono>
#include <cstddef>
#include <deque>
#include <functional>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "httplib.h"

namespace ss {

class ConnectionPool : public httplib::TaskQueue {
 public:
  explicit ConnectionPool(size_t max_threads,
                          std::chrono::milliseconds idle_exit = std::chrono::seconds(10));
  ~ConnectionPool() override;  // shutdown()s

  void enqueue(std::function<void()> fn) override;
  void shutdown() override;

 private:
  void Work() ABSL_LOCKS_EXCLUDED(mu_);
  void JoinExitedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);  // joins threads that left Work()

  const size_t max_threads_;
  const std::chrono::milliseconds idle_exit_;
  absl::Mutex mu_;
  absl::CondVar cv_;
  std::deque<std::function<void()>> jobs_ ABSL_GUARDED_BY(mu_);
  std::unordered_map<std::thread::id, std::thread> threads_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread::id> exited_ ABSL_GUARDED_BY(mu_);
  size_t idle_ ABSL_GUARDED_BY(mu_) = 0;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace ss
