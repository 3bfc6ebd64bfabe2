#include "cpu_expert_worker/transport/shm_server.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <exception>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status.h"
#include "spdlog/spdlog.h"

namespace ss::expert::shm {
namespace {

using internal::FutexWait;
using internal::FutexWake;
using internal::MonotonicNowNs;
using internal::SpinStep;
using internal::Word;

constexpr auto kSeqCst = std::memory_order_seq_cst;

absl::Status Errno(absl::string_view what, absl::string_view name, int err) {
  return absl::InternalError(absl::StrCat(what, " ", name, ": ", std::strerror(err)));
}

// Wakes the slot's client if it may be asleep on the state word (it sets client_waiting first).
void WakeClientIfWaiting(SlotControl* c) {
  if (Word(c->client_waiting).load(kSeqCst) != 0) FutexWake(&c->state, 1);
}

// Writes the response fields of a slot the caller holds in kProcessing.
void WriteResponse(SlotControl* c, uint64_t sequence, const absl::Status& status) {
  const absl::string_view msg = status.message();
  const size_t n = std::min(msg.size(), kShmMessageBytes - 1);
  if (n > 0) std::memcpy(c->message, msg.data(), n);
  c->message[n] = '\0';
  c->message_len = static_cast<uint32_t>(n);
  c->status_code = static_cast<int32_t>(status.code());
  c->response_sequence = sequence;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShmServer>> ShmServer::Create(const ShmServerOptions& options,
                                                             ExpertHandler handler) {
  if (!handler) return absl::InvalidArgumentError("ShmServer: no handler");
  ASSIGN_OR_RETURN(std::string name, ShmObjectName(options.name));
  if (options.serving_threads < 1 || options.serving_threads > 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("ShmServer: serving_threads ", options.serving_threads, " not in [1, 256]"));
  }
  if (options.spin < absl::ZeroDuration() || options.idle_wait <= absl::ZeroDuration() ||
      options.heartbeat_interval <= absl::ZeroDuration() ||
      options.client_sweep_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "ShmServer: spin must be >= 0 and idle_wait, heartbeat_interval, client_sweep_interval "
        "> 0");
  }
  ASSIGN_OR_RETURN(ShmLayout layout,
                   ComputeLayout({options.slots, options.max_tokens, options.dim, options.top_k}));
  std::unique_ptr<ShmServer> server(
      new ShmServer(options, std::move(handler), layout, std::move(name)));
  RETURN_IF_ERROR(server->CreateSegment());
  for (int i = 0; i < options.serving_threads; ++i) {
    server->threads_.emplace_back([s = server.get(), i] { s->ServeLoop(i); });
  }
  server->threads_.emplace_back([s = server.get()] { s->HousekeepingLoop(); });
  return server;
}

ShmServer::ShmServer(const ShmServerOptions& options, ExpertHandler handler, ShmLayout layout,
                     std::string name)
    : options_(options), handler_(std::move(handler)), layout_(layout), name_(std::move(name)) {}

ShmServer::~ShmServer() { Stop(); }

SlotControl* ShmServer::slot(uint32_t i) const {
  return reinterpret_cast<SlotControl*>(slot_base(i));
}

uint8_t* ShmServer::slot_base(uint32_t i) const {
  return base_ + sizeof(SegmentHeader) + static_cast<uint64_t>(i) * layout_.slot_stride;
}

absl::Status ShmServer::CreateSegment() {
  ASSIGN_OR_RETURN(const int fd, CreateShmSegment(name_, {kShmMagic, "splitserve expert segment"},
                                                  options_.reclaim_stale));
  // From here on a failure must remove what we created.
  auto fail = [&](absl::string_view what, int err) {
    ::close(fd);
    ::shm_unlink(name_.c_str());
    return Errno(what, name_, err);
  };
  if (::ftruncate(fd, static_cast<off_t>(layout_.segment_bytes)) != 0) {
    return fail("ftruncate", errno);
  }
  // Reserve the pages now: tmpfs would otherwise SIGBUS on first touch when /dev/shm is full.
  if (const int err = ::posix_fallocate(fd, 0, static_cast<off_t>(layout_.segment_bytes));
      err != 0 && err != EOPNOTSUPP && err != EINVAL) {
    return fail(absl::StrCat("posix_fallocate (", layout_.segment_bytes, " bytes in /dev/shm)"),
                err);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) return fail("fstat", errno);
  inode_ = st.st_ino;
  dev_ = st.st_dev;
  void* p = ::mmap(nullptr, layout_.segment_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return fail("mmap", errno);
  ::close(fd);
  base_ = static_cast<uint8_t*>(p);

  SegmentHeader* h = header();
  // The owner first, so a crash during the rest still leaves a reclaimable segment.
  h->owner_pid = static_cast<int32_t>(::getpid());
  h->owner_start_time = internal::ProcessStartTime(h->owner_pid);
  h->protocol_version = kShmProtocolVersion;
  h->header_bytes = sizeof(SegmentHeader);
  h->slot_control_bytes = sizeof(SlotControl);
  h->slot_count = layout_.shape.slot_count;
  h->max_tokens = layout_.shape.max_tokens;
  h->dim = layout_.shape.dim;
  h->top_k = layout_.shape.top_k;
  h->slot_stride = layout_.slot_stride;
  h->x_offset = layout_.x_offset;
  h->ids_offset = layout_.ids_offset;
  h->weights_offset = layout_.weights_offset;
  h->out_offset = layout_.out_offset;
  h->segment_bytes = layout_.segment_bytes;
  h->pid_namespace = internal::PidNamespaceId();
  h->instance_id = std::random_device{}() | (static_cast<uint64_t>(std::random_device{}()) << 32);
  h->heartbeat_ns = MonotonicNowNs();
  h->server_state = static_cast<uint32_t>(ServerState::kReady);
  // Slots are zero from ftruncate: kIdle, no owner.
  Word(h->magic).store(kShmMagic, std::memory_order_release);
  spdlog::info("shm: serving {} ({} slots x {} tokens, dim {}, top_k {}, {:.1f} MiB, pid {})",
               name_, layout_.shape.slot_count, layout_.shape.max_tokens, layout_.shape.dim,
               layout_.shape.top_k, layout_.segment_bytes / 1048576.0, h->owner_pid);
  return absl::OkStatus();
}

void ShmServer::ServeLoop(int thread_index) {
  SegmentHeader* h = header();
  const uint32_t n = layout_.shape.slot_count;
  uint32_t cursor = static_cast<uint32_t>(thread_index) % n;
  const int64_t spin_ns = absl::ToInt64Nanoseconds(options_.spin);
  const int64_t idle_ns = absl::ToInt64Nanoseconds(options_.idle_wait);
  auto stopping = [this] { return Word(stop_word_).load(std::memory_order_acquire) != 0; };
  auto any_request = [&] {
    for (uint32_t i = 0; i < n; ++i) {
      if (Word(slot(i)->state).load(kSeqCst) == static_cast<uint32_t>(SlotState::kRequest)) {
        return true;
      }
    }
    return false;
  };
  while (!stopping()) {
    if (TryServeOne(&cursor)) continue;
    bool served = false;
    const int64_t spin_start = MonotonicNowNs();
    for (int64_t now = spin_start; !served && now < spin_start + spin_ns; now = MonotonicNowNs()) {
      SpinStep(now - spin_start);
      served = TryServeOne(&cursor);
    }
    if (served) continue;
    // Eventcount: read the bell, announce the sleep, re-check, sleep unless the bell moved.
    const uint32_t bell = Word(h->doorbell).load(kSeqCst);
    Word(h->server_waiters).fetch_add(1, kSeqCst);
    if (!stopping() && !any_request()) FutexWait(&h->doorbell, bell, idle_ns);
    Word(h->server_waiters).fetch_sub(1, kSeqCst);
  }
}

bool ShmServer::TryServeOne(uint32_t* cursor) {
  const uint32_t n = layout_.shape.slot_count;
  for (uint32_t k = 0; k < n; ++k) {
    const uint32_t i = (*cursor + k) % n;
    uint32_t expected = static_cast<uint32_t>(SlotState::kRequest);
    auto state = Word(slot(i)->state);
    if (state.load(std::memory_order_relaxed) == expected &&
        state.compare_exchange_strong(expected, static_cast<uint32_t>(SlotState::kProcessing),
                                      kSeqCst)) {
      *cursor = (i + 1) % n;
      Serve(i);
      return true;
    }
  }
  return false;
}

void ShmServer::Serve(uint32_t i) {
  SlotControl* c = slot(i);
  uint8_t* base = slot_base(i);
  calls_.fetch_add(1, std::memory_order_relaxed);
  // Copy every request field once: the sizes used below are the ones validated, whatever the
  // client's memory does meanwhile.
  ExpertRequestView v;
  v.protocol_version = c->protocol_version;
  v.sequence = c->request_sequence;
  const int64_t deadline_ns = c->deadline_ns;
  v.client_pid = Word(c->owner_pid).load(std::memory_order_relaxed);
  v.layer = c->layer;
  v.tokens = c->tokens;
  v.top_k = c->top_k;
  v.dim = c->dim;
  const ShmShape& s = layout_.shape;
  absl::Status status;
  if (v.protocol_version != kShmProtocolVersion) {
    status = absl::InvalidArgumentError(
        absl::StrCat("request protocol version ", v.protocol_version,
                     ", this expert worker speaks version ", kShmProtocolVersion));
  } else if (v.tokens < 1 || static_cast<uint32_t>(v.tokens) > s.max_tokens) {
    status = absl::InvalidArgumentError(
        absl::StrCat("request T = ", v.tokens, " not in [1, ", s.max_tokens, "]"));
  } else if (v.top_k < 1 || static_cast<uint32_t>(v.top_k) > s.top_k) {
    status = absl::InvalidArgumentError(
        absl::StrCat("request top_k = ", v.top_k, " not in [1, ", s.top_k, "]"));
  } else if (v.dim < 0 || static_cast<uint32_t>(v.dim) != s.dim) {
    status = absl::InvalidArgumentError(
        absl::StrCat("request dim = ", v.dim, ", the segment's dim is ", s.dim));
  } else if (MonotonicNowNs() >= deadline_ns) {
    status = absl::DeadlineExceededError("request expired before the expert worker took it");
  }
  if (!status.ok()) {
    rejected_.fetch_add(1, std::memory_order_relaxed);
  } else {
    v.deadline = internal::MonotonicNsToDeadline(deadline_ns);
    v.x_bf16 = reinterpret_cast<const uint16_t*>(base + layout_.x_offset);
    v.ids = reinterpret_cast<const int32_t*>(base + layout_.ids_offset);
    v.weights = reinterpret_cast<const float*>(base + layout_.weights_offset);
    const std::function<void()> almost_done = [c] { WakeClientIfWaiting(c); };
    v.almost_done = &almost_done;
    try {
      status = handler_(v, reinterpret_cast<float*>(base + layout_.out_offset));
    } catch (const std::exception& e) {
      status = absl::InternalError(absl::StrCat("expert handler threw: ", e.what()));
    } catch (...) {
      status = absl::InternalError("expert handler threw");
    }
    if (!status.ok()) handler_errors_.fetch_add(1, std::memory_order_relaxed);
  }
  WriteResponse(c, v.sequence, status);
  uint32_t expected = static_cast<uint32_t>(SlotState::kProcessing);
  if (Word(c->state).compare_exchange_strong(expected, static_cast<uint32_t>(SlotState::kResponse),
                                             kSeqCst)) {
    WakeClientIfWaiting(c);
    return;
  }
  // The client abandoned the call (deadline): the slot is ours to free.
  abandoned_.fetch_add(1, std::memory_order_relaxed);
  Word(c->state).store(static_cast<uint32_t>(SlotState::kIdle), kSeqCst);
  Word(c->owner_start_time).store(0, std::memory_order_relaxed);
  Word(c->owner_pid).store(0, std::memory_order_release);
}

void ShmServer::HousekeepingLoop() {
  SegmentHeader* h = header();
  const int64_t beat_ns = absl::ToInt64Nanoseconds(options_.heartbeat_interval);
  const int64_t sweep_ns = absl::ToInt64Nanoseconds(options_.client_sweep_interval);
  int64_t next_sweep = MonotonicNowNs() + sweep_ns;
  while (Word(stop_word_).load(std::memory_order_acquire) == 0) {
    const int64_t now = MonotonicNowNs();
    Word(h->heartbeat_ns).store(now, std::memory_order_release);
    Word(h->heartbeat_count).fetch_add(1, std::memory_order_release);
    if (now >= next_sweep) {
      SweepDeadClients();
      next_sweep = now + sweep_ns;
    }
    FutexWait(&stop_word_, 0, std::min(beat_ns, sweep_ns));
  }
}

void ShmServer::SweepDeadClients() {
  for (uint32_t i = 0; i < layout_.shape.slot_count; ++i) {
    SlotControl* c = slot(i);
    const int32_t pid = Word(c->owner_pid).load(std::memory_order_acquire);
    if (pid == 0) continue;
    const uint64_t start = Word(c->owner_start_time).load(std::memory_order_relaxed);
    if (internal::ProcessAlive(pid, start)) continue;
    uint32_t s = Word(c->state).load(kSeqCst);
    // kProcessing: the serving thread answers, the next sweep frees. kAbandoned: the serving
    // thread frees it.
    if (s == static_cast<uint32_t>(SlotState::kProcessing) ||
        s == static_cast<uint32_t>(SlotState::kAbandoned)) {
      continue;
    }
    if (!Word(c->state).compare_exchange_strong(s, static_cast<uint32_t>(SlotState::kIdle),
                                                kSeqCst)) {
      continue;  // a serving thread took the request meanwhile
    }
    Word(c->owner_start_time).store(0, std::memory_order_relaxed);
    int32_t expected_pid = pid;
    Word(c->owner_pid).compare_exchange_strong(expected_pid, 0, std::memory_order_acq_rel);
    clients_reaped_.fetch_add(1, std::memory_order_relaxed);
    spdlog::warn("shm: {} slot {} freed: client process {} died", name_, i, pid);
  }
}

void ShmServer::RequestStop() {
  if (Word(stop_word_).exchange(1, kSeqCst) != 0) return;
  if (base_ != nullptr) {
    SegmentHeader* h = header();
    Word(h->server_state).store(static_cast<uint32_t>(ServerState::kStopping), kSeqCst);
    Word(h->doorbell).fetch_add(1, kSeqCst);
    FutexWake(&h->doorbell, INT_MAX);
  }
  FutexWake(&stop_word_, INT_MAX);
  // Last: Wait() may unmap the header as soon as it sees this.
  Word(stop_signalled_).store(1, kSeqCst);
  FutexWake(&stop_signalled_, INT_MAX);
}

void ShmServer::Wait() {
  while (Word(stop_signalled_).load(kSeqCst) == 0) {
    FutexWait(&stop_signalled_, 0, 100'000'000);
  }
  absl::MutexLock lock(&shutdown_mu_);
  if (shut_down_) return;
  shut_down_ = true;
  Shutdown();
}

void ShmServer::Stop() {
  RequestStop();
  Wait();
}

void ShmServer::Shutdown() {
  for (std::thread& t : threads_) t.join();  // serving threads finish their current call
  threads_.clear();
  if (base_ == nullptr) return;
  SegmentHeader* h = header();
  for (uint32_t i = 0; i < layout_.shape.slot_count; ++i) {
    SlotControl* c = slot(i);
    uint32_t expected = static_cast<uint32_t>(SlotState::kRequest);
    if (Word(c->state).compare_exchange_strong(
            expected, static_cast<uint32_t>(SlotState::kProcessing), kSeqCst)) {
      WriteResponse(c, c->request_sequence,
                    absl::UnavailableError("expert worker is shutting down"));
      Word(c->state).store(static_cast<uint32_t>(SlotState::kResponse), kSeqCst);
    }
  }
  Word(h->server_state).store(static_cast<uint32_t>(ServerState::kStopped), kSeqCst);
  for (uint32_t i = 0; i < layout_.shape.slot_count; ++i) FutexWake(&slot(i)->state, INT_MAX);
  ::munmap(base_, layout_.segment_bytes);
  base_ = nullptr;
  // Unlink only the segment we created (a stale-segment reclaim elsewhere could have replaced
  // the name, though not while we were alive).
  const int fd = ::shm_open(name_.c_str(), O_RDONLY | O_CLOEXEC, 0);
  if (fd >= 0) {
    struct stat st;
    const bool ours = ::fstat(fd, &st) == 0 && static_cast<uint64_t>(st.st_ino) == inode_ &&
                      static_cast<uint64_t>(st.st_dev) == dev_;
    ::close(fd);
    if (ours) ::shm_unlink(name_.c_str());
  }
  spdlog::info("shm: stopped {} ({} calls)", name_, calls_.load());
}

ShmServer::Stats ShmServer::stats() const {
  Stats s;
  s.calls = calls_.load(std::memory_order_relaxed);
  s.handler_errors = handler_errors_.load(std::memory_order_relaxed);
  s.rejected = rejected_.load(std::memory_order_relaxed);
  s.abandoned = abandoned_.load(std::memory_order_relaxed);
  s.clients_reaped = clients_reaped_.load(std::memory_order_relaxed);
  return s;
}

}  // namespace ss::expert::shm
