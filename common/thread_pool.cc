#include "common/thread_pool.h"

#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <latch>
#include <limits>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace ss {
namespace {

static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t) &&
                  std::atomic<uint32_t>::is_always_lock_free,
              "futex words must be plain 32-bit atomics");

using Clock = std::chrono::steady_clock;

// The pool whose task the current thread is running (owned workers: always their pool).
thread_local const ThreadPool* tls_pool = nullptr;

void FutexWait(std::atomic<uint32_t>* word, uint32_t expected) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT_PRIVATE, expected, nullptr,
            nullptr, 0);
}

void FutexWake(std::atomic<uint32_t>* word, int count) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE_PRIVATE, count, nullptr,
            nullptr, 0);
}

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Polls pred() until it holds or `spin_us` elapse; returns pred()'s last value. The first
// kPauseUs poll with a pause instruction only (a back-to-back job arrives well within that);
// after that each poll also yields, so a peer that shares this core (an oversubscribed or busy
// machine) can run instead of waiting for our time slice to end.
constexpr int kPauseUs = 2;

template <typename Pred>
bool SpinUntil(int spin_us, Pred pred) {
  if (pred()) return true;
  const Clock::time_point start = Clock::now();
  const Clock::time_point pause_end =
      start + std::chrono::microseconds(std::min(spin_us, kPauseUs));
  const Clock::time_point deadline = start + std::chrono::microseconds(spin_us);
  bool yielding = false;
  for (uint32_t i = 1;; ++i) {
    if (pred()) return true;
    if (yielding) {
      sched_yield();
    } else {
      CpuRelax();
    }
    if (yielding || (i & 63) == 0) {
      const Clock::time_point now = Clock::now();
      if (now >= deadline) return pred();
      yielding = now >= pause_end;
    }
  }
}

std::atomic<int64_t> g_pin_refusals{0};

bool PinTo(int cpu) {
  if (cpu < 0) return true;
  const int ncpu = std::max(cpu + 1, CPU_SETSIZE);
  cpu_set_t* set = CPU_ALLOC(ncpu);
  const size_t size = CPU_ALLOC_SIZE(ncpu);
  CPU_ZERO_S(size, set);
  CPU_SET_S(cpu, size, set);
  const int rc = pthread_setaffinity_np(pthread_self(), size, set);
  CPU_FREE(set);
  if (rc == 0) return true;
  if (g_pin_refusals.fetch_add(1) != 0) return false;
  spdlog::warn(absl::StrCat("pinning a thread to CPU ", cpu, " was refused (", std::strerror(rc),
                            "); threads run unpinned (reported once per process)"));
  return false;
}

// Restores tls_pool when a caller's share ends (a caller may itself be another pool's worker).
class TaskScope {
 public:
  explicit TaskScope(const ThreadPool* pool) : saved_(tls_pool) { tls_pool = pool; }
  ~TaskScope() { tls_pool = saved_; }

 private:
  const ThreadPool* saved_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ThreadPool>> ThreadPool::Create(const ThreadPoolOptions& options) {
  if (options.num_threads < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("thread pool: num_threads ", options.num_threads, " < 1"));
  }
  if (!options.cpus.empty() && static_cast<int>(options.cpus.size()) != options.num_threads) {
    return absl::InvalidArgumentError(absl::StrCat(
        "thread pool: ", options.cpus.size(), " CPUs given for ", options.num_threads, " threads"));
  }
  if (options.spin_us < 0) {
    return absl::InvalidArgumentError(absl::StrCat("thread pool: spin_us ", options.spin_us));
  }
  std::unique_ptr<ThreadPool> pool(new ThreadPool(options));
  std::latch started(options.num_threads - 1);
  for (int w = 1; w < options.num_threads; ++w) {
    pool->threads_.emplace_back([p = pool.get(), w, &started] {
      tls_pool = p;
      const std::string name = absl::StrCat(p->name_, "-", w).substr(0, 15);
      pthread_setname_np(pthread_self(), name.c_str());
      if (!p->cpus_.empty() && !PinTo(p->cpus_[w])) p->unpinned_workers_.fetch_add(1);
      started.count_down();
      p->WorkerLoop(w);
    });
  }
  started.wait();
  return pool;
}

ThreadPool::ThreadPool(const ThreadPoolOptions& options)
    : size_(options.num_threads),
      cpus_(options.cpus),
      spin_us_(options.spin_us),
      name_(options.name) {}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_seq_cst);
  generation_.fetch_add(1, std::memory_order_seq_cst);
  FutexWake(&generation_, INT_MAX);
  for (std::thread& t : threads_) t.join();
}

int64_t ThreadPool::pin_refusals() { return g_pin_refusals.load(); }

void ThreadPool::WaitInTask(absl::FunctionRef<bool()> ready) {
  // INT_MAX us: SpinUntil's deadline is never reached in practice; the loop ends when ready().
  while (!SpinUntil(std::numeric_limits<int>::max(), ready)) {
  }
}

bool ThreadPool::PinCallingThread() const { return cpus_.empty() || PinTo(cpus_[0]); }

absl::Status ThreadPool::ParallelFor(int64_t n, absl::FunctionRef<void(int64_t, int)> fn) {
  const auto with_next = [fn](int64_t i, int64_t, int worker) { fn(i, worker); };
  return For(n, with_next, nullptr, false);
}

absl::Status ThreadPool::ParallelFor(int64_t n, absl::FunctionRef<void(int64_t, int)> fn,
                                     absl::FunctionRef<void()> on_drained) {
  const auto with_next = [fn](int64_t i, int64_t, int worker) { fn(i, worker); };
  return For(n, with_next, &on_drained, false);
}

absl::Status ThreadPool::ParallelForAhead(int64_t n,
                                          absl::FunctionRef<void(int64_t, int64_t, int)> fn,
                                          absl::FunctionRef<void()> on_drained) {
  return For(n, fn, &on_drained, true);
}

absl::Status ThreadPool::For(int64_t n, absl::FunctionRef<void(int64_t, int64_t, int)> fn,
                             absl::FunctionRef<void()>* on_drained, bool ahead) {
  if (tls_pool == this) {
    return absl::FailedPreconditionError(
        "ThreadPool::ParallelFor called from inside a task of the same pool: nested parallelism "
        "would deadlock; run the inner loop serially");
  }
  if (n <= 0) {
    if (on_drained != nullptr) (*on_drained)();
    return absl::OkStatus();
  }
  std::lock_guard<std::mutex> lock(call_mu_);
  job_fn_ = &fn;
  job_ahead_ = ahead;
  job_drained_ = on_drained;
  drained_called_.store(false, std::memory_order_relaxed);
  const absl::Status st = Run(n, /*each_worker=*/false);
  job_drained_ = nullptr;
  return st;
}

absl::Status ThreadPool::RunOnEachWorker(absl::FunctionRef<void(int)> fn) {
  if (tls_pool == this) {
    return absl::FailedPreconditionError(
        "ThreadPool::RunOnEachWorker called from inside a task of the same pool");
  }
  std::lock_guard<std::mutex> lock(call_mu_);
  job_each_fn_ = &fn;
  return Run(size_, /*each_worker=*/true);
}

absl::Status ThreadPool::Run(int64_t n, bool each_worker) {
  TaskScope scope(this);
  job_n_ = n;
  job_each_ = each_worker;
  if (size_ == 1 || (!each_worker && n == 1)) {
    RunShare(0);  // nothing to share: no wake-up
    return absl::OkStatus();
  }
  job_grain_ = each_worker ? 1 : std::max<int64_t>(1, n / (8 * int64_t{size_}));
  next_.store(0, std::memory_order_relaxed);
  remaining_.store(static_cast<uint32_t>(size_ - 1), std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_seq_cst) > 0) FutexWake(&generation_, INT_MAX);
  RunShare(0);
  WaitForOthers();
  return absl::OkStatus();
}

void ThreadPool::RunShare(int worker) {
  if (job_each_) {
    (*job_each_fn_)(worker);
    return;
  }
  const int64_t n = job_n_, grain = job_grain_;
  if (size_ == 1 || n == 1) {
    for (int64_t i = 0; i < n; ++i) {
      if (i == n - 1 && job_drained_ != nullptr) (*job_drained_)();  // the last index taken
      (*job_fn_)(i, i + 1 < n ? i + 1 : -1, worker);
    }
    return;
  }
  // ParallelForAhead: grains are taken ahead while more than a grain per worker is left.
  const int64_t ahead_until = job_ahead_ ? n - grain * size_ : 0;
  int64_t begin = next_.fetch_add(grain, std::memory_order_relaxed);
  while (begin < n) {
    const int64_t end = std::min(n, begin + grain);
    for (int64_t i = begin; i + 1 < end; ++i) (*job_fn_)(i, i + 1, worker);
    int64_t next = n;  // not taken yet
    if (end < ahead_until && next_.load(std::memory_order_relaxed) < ahead_until) {
      next = next_.fetch_add(grain, std::memory_order_relaxed);
    }
    (*job_fn_)(end - 1, next < n ? next : -1, worker);
    begin = next < n ? next : next_.fetch_add(grain, std::memory_order_relaxed);
  }
  // Read first: every worker ends here, and only the first needs the read-modify-write.
  if (job_drained_ != nullptr && !drained_called_.load(std::memory_order_relaxed) &&
      !drained_called_.exchange(true, std::memory_order_acq_rel)) {
    (*job_drained_)();
  }
}

void ThreadPool::WaitForOthers() {
  const auto done = [this] { return remaining_.load(std::memory_order_acquire) == 0; };
  if (SpinUntil(spin_us_, done)) return;
  caller_sleeping_.store(1, std::memory_order_seq_cst);
  for (;;) {
    const uint32_t r = remaining_.load(std::memory_order_seq_cst);
    if (r == 0) break;
    FutexWait(&remaining_, r);
  }
  caller_sleeping_.store(0, std::memory_order_relaxed);
}

void ThreadPool::WorkerLoop(int worker) {
  uint32_t seen = 0;
  for (;;) {
    const auto changed = [this, seen] {
      return generation_.load(std::memory_order_acquire) != seen;
    };
    if (!SpinUntil(spin_us_, changed)) {
      for (;;) {
        sleepers_.fetch_add(1, std::memory_order_seq_cst);
        if (generation_.load(std::memory_order_seq_cst) == seen) FutexWait(&generation_, seen);
        sleepers_.fetch_sub(1, std::memory_order_seq_cst);
        if (changed()) break;
      }
    }
    if (stop_.load(std::memory_order_acquire)) return;
    seen = generation_.load(std::memory_order_acquire);
    RunShare(worker);
    if (remaining_.fetch_sub(1, std::memory_order_seq_cst) == 1 &&
        caller_sleeping_.load(std::memory_order_seq_cst) != 0) {
      FutexWake(&remaining_, 1);
    }
  }
}

}  // namespace ss
