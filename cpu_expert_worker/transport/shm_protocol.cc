#include "cpu_expert_worker/transport/shm_protocol.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/int_math.h"

namespace ss::expert::shm {

absl::StatusOr<ShmLayout> ComputeLayout(const ShmShape& s) {
  if (s.slot_count == 0 || s.max_tokens == 0 || s.dim == 0 || s.top_k == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("shm layout: slot_count, max_tokens, dim and top_k must be >= 1 (got ",
                     s.slot_count, ", ", s.max_tokens, ", ", s.dim, ", ", s.top_k, ")"));
  }
  if (s.slot_count > kShmMaxSlots) {
    return absl::InvalidArgumentError(
        absl::StrCat("shm layout: slot_count ", s.slot_count, " > ", kShmMaxSlots));
  }
  // 32-bit inputs: every product below fits in 64 bits.
  const uint64_t t = s.max_tokens, d = s.dim, k = s.top_k;
  ShmLayout l;
  l.shape = s;
  l.x_offset = sizeof(SlotControl);
  l.ids_offset = l.x_offset + RoundUp(t * d * sizeof(uint16_t), kShmPageBytes);
  l.weights_offset = l.ids_offset + RoundUp(t * k * sizeof(int32_t), kShmPageBytes);
  l.out_offset = l.weights_offset + RoundUp(t * k * sizeof(float), kShmPageBytes);
  l.slot_stride = l.out_offset + RoundUp(t * d * sizeof(float), kShmPageBytes);
  if (l.slot_stride > kShmMaxSegmentBytes / s.slot_count) {
    return absl::InvalidArgumentError(absl::StrCat("shm layout: ", s.slot_count, " slots of ",
                                                   l.slot_stride, " bytes exceed ",
                                                   kShmMaxSegmentBytes, " bytes"));
  }
  l.segment_bytes = sizeof(SegmentHeader) + l.slot_stride * s.slot_count;
  return l;
}

absl::StatusOr<std::string> ShmObjectName(std::string_view name) {
  std::string_view rest = name;
  if (!rest.empty() && rest.front() == '/') rest.remove_prefix(1);
  bool ok = !rest.empty() && rest.size() <= 200 && rest != "." && rest != "..";
  for (const char c : rest) {
    ok = ok && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                c == '.' || c == '_' || c == '-');
  }
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shm segment name '", std::string(name), "': expected 1-200 characters of [A-Za-z0-9._-] ",
        "after an optional leading '/'"));
  }
  return absl::StrCat("/", std::string(rest));
}

namespace internal {

int64_t MonotonicNowNs() {
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

int64_t DeadlineToMonotonicNs(absl::Time deadline) {
  if (deadline == absl::InfiniteFuture()) return INT64_MAX;
  if (deadline == absl::InfinitePast()) return 0;
  const int64_t now = MonotonicNowNs();
  const int64_t left = absl::ToInt64Nanoseconds(deadline - absl::Now());  // saturates
  if (left > 0 && now > INT64_MAX - left) return INT64_MAX;
  return now + left;
}

absl::Time MonotonicNsToDeadline(int64_t mono_ns) {
  if (mono_ns == INT64_MAX) return absl::InfiniteFuture();
  return absl::Now() + absl::Nanoseconds(mono_ns - MonotonicNowNs());
}

bool FutexWait(uint32_t* word, uint32_t expected, int64_t timeout_ns) {
  timespec ts;
  ts.tv_sec = static_cast<time_t>(timeout_ns / 1000000000);
  ts.tv_nsec = static_cast<long>(timeout_ns % 1000000000);
  // Not FUTEX_PRIVATE: the word lives in memory shared between processes.
  return ::syscall(SYS_futex, word, FUTEX_WAIT, expected, &ts, nullptr, 0) == 0;
}

void FutexWake(uint32_t* word, int count) {
  ::syscall(SYS_futex, word, FUTEX_WAKE, count, nullptr, nullptr, 0);
}

void SpinStep(int64_t spun_ns) {
  if (spun_ns >= 2000) {
    ::sched_yield();
    return;
  }
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

}  // namespace internal
}  // namespace ss::expert::shm
