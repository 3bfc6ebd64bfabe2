#include "cpu_expert_worker/transport/shm_client.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status.h"

namespace ss::expert::shm {
namespace {

using internal::FutexWait;
using internal::FutexWake;
using internal::MonotonicNowNs;
using internal::Word;

constexpr auto kSeqCst = std::memory_order_seq_cst;
constexpr uint32_t kIdle = static_cast<uint32_t>(SlotState::kIdle);
constexpr uint32_t kRequest = static_cast<uint32_t>(SlotState::kRequest);
constexpr uint32_t kProcessing = static_cast<uint32_t>(SlotState::kProcessing);
constexpr uint32_t kResponse = static_cast<uint32_t>(SlotState::kResponse);
constexpr uint32_t kAbandoned = static_cast<uint32_t>(SlotState::kAbandoned);

// The header checks of Connect, on a mapping of `bytes` bytes.
absl::Status CheckHeader(const std::string& name, const SegmentHeader& h, size_t bytes,
                         const ShmClientOptions& o, ShmLayout* layout) {
  const uint64_t magic = Word(const_cast<uint64_t&>(h.magic)).load(std::memory_order_acquire);
  if (magic == 0) {
    return absl::UnavailableError(absl::StrCat("shm segment ", name, " is still being created"));
  }
  if (magic != kShmMagic) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "shm segment %s is not a splitserve expert segment (magic 0x%016x, expected 0x%016x)", name,
        magic, kShmMagic));
  }
  if (h.protocol_version != kShmProtocolVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("shm segment ", name, " speaks protocol version ", h.protocol_version,
                     "; this client speaks version ", kShmProtocolVersion, " (rebuild one side)"));
  }
  auto mismatch = [&](absl::string_view field, uint64_t segment, uint64_t client) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shm segment ", name, " (protocol version ", kShmProtocolVersion, "): layout field ", field,
        " is ", segment, " in the segment, ", client, " in this client"));
  };
  if (h.header_bytes != sizeof(SegmentHeader)) {
    return mismatch("header_bytes", h.header_bytes, sizeof(SegmentHeader));
  }
  if (h.slot_control_bytes != sizeof(SlotControl)) {
    return mismatch("slot_control_bytes", h.slot_control_bytes, sizeof(SlotControl));
  }
  auto computed = ComputeLayout({h.slot_count, h.max_tokens, h.dim, h.top_k});
  if (!computed.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("shm segment ", name, ": bad layout: ", computed.status().message()));
  }
  const ShmLayout& l = *computed;
  if (h.slot_stride != l.slot_stride) return mismatch("slot_stride", h.slot_stride, l.slot_stride);
  if (h.x_offset != l.x_offset) return mismatch("x_offset", h.x_offset, l.x_offset);
  if (h.ids_offset != l.ids_offset) return mismatch("ids_offset", h.ids_offset, l.ids_offset);
  if (h.weights_offset != l.weights_offset) {
    return mismatch("weights_offset", h.weights_offset, l.weights_offset);
  }
  if (h.out_offset != l.out_offset) return mismatch("out_offset", h.out_offset, l.out_offset);
  if (h.segment_bytes != l.segment_bytes) {
    return mismatch("segment_bytes", h.segment_bytes, l.segment_bytes);
  }
  if (bytes < l.segment_bytes) return mismatch("file size", bytes, l.segment_bytes);
  if (o.expect_dim != 0 && h.dim != o.expect_dim) return mismatch("dim", h.dim, o.expect_dim);
  if (o.expect_top_k != 0 && h.top_k != o.expect_top_k) {
    return mismatch("top_k", h.top_k, o.expect_top_k);
  }
  if (h.max_tokens < o.min_max_tokens) {
    return mismatch("max_tokens (at least)", h.max_tokens, o.min_max_tokens);
  }
  const uint64_t ns = internal::PidNamespaceId();
  if (h.pid_namespace != 0 && ns != 0 && h.pid_namespace != ns) {
    return absl::FailedPreconditionError(
        absl::StrCat("shm segment ", name,
                     " belongs to a server in another PID namespace; liveness checks "
                     "need both sides in one (share the PID namespace between the containers)"));
  }
  *layout = l;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShmClient>> ShmClient::Connect(std::string_view name_in,
                                                              const ShmClientOptions& options) {
  ASSIGN_OR_RETURN(std::string name, ShmObjectName(name_in));
  if (options.spin < absl::ZeroDuration() || options.spin_after_wake < absl::ZeroDuration() ||
      options.liveness_poll <= absl::ZeroDuration() ||
      options.heartbeat_stale_after <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "ShmClient: spin and spin_after_wake must be >= 0, liveness_poll and "
        "heartbeat_stale_after > 0");
  }
  const int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) {
      return absl::NotFoundError(
          absl::StrCat("no shm segment ", name, " (is the expert worker running?)"));
    }
    if (err == EACCES) {
      return absl::PermissionDeniedError(
          absl::StrCat("shm segment ", name, ": ", std::strerror(err),
                       " (the expert worker must run as the same user)"));
    }
    return absl::InternalError(absl::StrCat("shm_open ", name, ": ", std::strerror(err)));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || st.st_size < static_cast<off_t>(sizeof(SegmentHeader))) {
    ::close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat("shm segment ", name, " is too small to be a splitserve expert segment"));
  }
  const size_t bytes = static_cast<size_t>(st.st_size);
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int map_err = errno;
  ::close(fd);
  if (p == MAP_FAILED) {
    return absl::InternalError(absl::StrCat("mmap ", name, ": ", std::strerror(map_err)));
  }
  ShmLayout layout;
  if (absl::Status s = CheckHeader(name, *static_cast<SegmentHeader*>(p), bytes, options, &layout);
      !s.ok()) {
    ::munmap(p, bytes);
    return s;
  }
  std::unique_ptr<ShmClient> client(
      new ShmClient(std::move(name), options, static_cast<uint8_t*>(p), bytes, layout));
  RETURN_IF_ERROR(client->CheckServer());
  return client;
}

ShmClient::ShmClient(std::string name, const ShmClientOptions& options, uint8_t* base, size_t bytes,
                     const ShmLayout& layout)
    : name_(std::move(name)), options_(options), base_(base), bytes_(bytes), layout_(layout) {
  server_pid_ = header()->owner_pid;
  server_start_time_ = header()->owner_start_time;
  pid_ = static_cast<int>(::getpid());
  start_time_ = internal::ProcessStartTime(pid_);
}

ShmClient::~ShmClient() { ::munmap(base_, bytes_); }

SlotControl* ShmClient::slot(uint32_t i) const {
  return reinterpret_cast<SlotControl*>(slot_base(i));
}

uint8_t* ShmClient::slot_base(uint32_t i) const {
  return base_ + sizeof(SegmentHeader) + static_cast<uint64_t>(i) * layout_.slot_stride;
}

absl::Status ShmClient::CheckServer(bool in_flight) const {
  RETURN_IF_ERROR(CheckServerState(in_flight));
  if (!internal::ProcessAlive(server_pid_, server_start_time_)) {
    return absl::UnavailableError(
        absl::StrCat("expert worker ", name_, ": server process ", server_pid_, " is gone"));
  }
  return absl::OkStatus();
}

absl::Status ShmClient::CheckServerState(bool in_flight) const {
  SegmentHeader* h = header();
  const auto state = static_cast<ServerState>(Word(h->server_state).load(kSeqCst));
  if (state == ServerState::kStopped || (state != ServerState::kReady && !in_flight)) {
    return absl::UnavailableError(
        absl::StrCat("expert worker ", name_, " (pid ", server_pid_, ") is ",
                     state == ServerState::kStopped ? "stopped" : "stopping"));
  }
  const int64_t age = MonotonicNowNs() - Word(h->heartbeat_ns).load(std::memory_order_acquire);
  if (age > absl::ToInt64Nanoseconds(options_.heartbeat_stale_after)) {
    return absl::UnavailableError(absl::StrCat("expert worker ", name_, " (pid ", server_pid_,
                                               "): heartbeat stale for ", age / 1000000, " ms"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ShmClient::Slot> ShmClient::AcquireSlot(absl::Time deadline) {
  if (deadline == absl::InfiniteFuture()) {
    return absl::InvalidArgumentError("shm expert call: a finite deadline is required");
  }
  if (static_cast<int>(::getpid()) != pid_) {
    return absl::FailedPreconditionError(
        absl::StrCat("ShmClient for ", name_, " used in a forked child; connect again"));
  }
  const int64_t deadline_ns = internal::DeadlineToMonotonicNs(deadline);
  const int64_t poll_ns = absl::ToInt64Nanoseconds(options_.liveness_poll);
  const uint32_t n = layout_.shape.slot_count;
  int64_t next_check = 0;
  int64_t nap_ns = 1000;
  for (int round = 0;; ++round) {
    // Cheap checks every round; the /proc-based liveness check every liveness_poll.
    if (Word(header()->server_state).load(std::memory_order_acquire) !=
        static_cast<uint32_t>(ServerState::kReady)) {
      return CheckServer();
    }
    const uint32_t first = next_slot_.fetch_add(1, std::memory_order_relaxed);
    for (uint32_t k = 0; k < n; ++k) {
      SlotControl* c = slot((first + k) % n);
      int32_t expected = 0;
      if (Word(c->owner_pid).load(std::memory_order_relaxed) == 0 &&
          Word(c->owner_pid).compare_exchange_strong(expected, pid_, std::memory_order_acq_rel)) {
        Word(c->owner_start_time).store(start_time_, std::memory_order_release);
        return Slot(this, (first + k) % n);
      }
    }
    const int64_t now = MonotonicNowNs();
    if (now >= deadline_ns) {
      return absl::DeadlineExceededError(absl::StrCat("shm expert call: all ", n, " slots of ",
                                                      name_, " stayed busy until the deadline"));
    }
    if (now >= next_check) {
      if (round > 0) RETURN_IF_ERROR(CheckServer());
      next_check = now + poll_ns;
    }
    if (round < 64) {
      internal::SpinStep(0);
      continue;
    }
    const int64_t nap = std::min(nap_ns, deadline_ns - now);
    const timespec ts{0, static_cast<long>(nap)};
    ::nanosleep(&ts, nullptr);
    nap_ns = std::min<int64_t>(nap_ns * 2, 1000000);
  }
}

absl::Status ShmClient::Call(const ExpertCallInput& in, float* out, absl::Time deadline) {
  const ShmShape& s = layout_.shape;
  if (in.tokens < 1 || static_cast<uint32_t>(in.tokens) > s.max_tokens || in.top_k < 1 ||
      static_cast<uint32_t>(in.top_k) > s.top_k || in.dim < 0 ||
      static_cast<uint32_t>(in.dim) != s.dim) {
    return absl::InvalidArgumentError(
        absl::StrCat("shm expert call: T = ", in.tokens, ", top_k = ", in.top_k, ", dim = ", in.dim,
                     " do not fit segment ", name_, " (T <= ", s.max_tokens, ", top_k <= ", s.top_k,
                     ", dim = ", s.dim, ")"));
  }
  if (in.x_bf16 == nullptr || in.ids == nullptr || in.weights == nullptr || out == nullptr) {
    return absl::InvalidArgumentError("shm expert call: null input or output pointer");
  }
  ASSIGN_OR_RETURN(Slot lease, AcquireSlot(deadline));
  const size_t rows = static_cast<size_t>(in.tokens);
  std::memcpy(lease.x_bf16(), in.x_bf16, rows * s.dim * sizeof(uint16_t));
  std::memcpy(lease.ids(), in.ids, rows * in.top_k * sizeof(int32_t));
  std::memcpy(lease.weights(), in.weights, rows * in.top_k * sizeof(float));
  ExpertRequestHeader req;
  req.layer = in.layer;
  req.tokens = in.tokens;
  req.top_k = in.top_k;
  req.dim = in.dim;
  RETURN_IF_ERROR(lease.Invoke(req, deadline));
  std::memcpy(out, lease.out(), rows * s.dim * sizeof(float));
  return absl::OkStatus();
}

absl::Status ShmClient::Invoke(uint32_t index, const ExpertRequestHeader& r, absl::Time deadline,
                               bool* lost) {
  if (deadline == absl::InfiniteFuture()) {
    return absl::InvalidArgumentError("shm expert call: a finite deadline is required");
  }
  SlotControl* c = slot(index);
  auto state = Word(c->state);
  if (state.load(std::memory_order_acquire) != kIdle) {
    return absl::FailedPreconditionError("shm expert call: slot has a call in flight");
  }
  RETURN_IF_ERROR(CheckServerState());  // loads only; the process probe runs while waiting
  const int64_t deadline_ns = internal::DeadlineToMonotonicNs(deadline);
  const uint64_t sequence = c->request_sequence + 1;
  c->request_sequence = sequence;
  c->deadline_ns = deadline_ns;
  c->protocol_version = r.protocol_version;
  c->layer = r.layer;
  c->tokens = r.tokens;
  c->top_k = r.top_k;
  c->dim = r.dim;
  SegmentHeader* h = header();
  state.store(kRequest, kSeqCst);
  Word(h->doorbell).fetch_add(1, kSeqCst);
  if (Word(h->server_waiters).load(kSeqCst) != 0) FutexWake(&h->doorbell, 1);

  const int64_t start = MonotonicNowNs();
  int64_t spin_from = start, spin_end = start + absl::ToInt64Nanoseconds(options_.spin);
  const int64_t poll_ns = absl::ToInt64Nanoseconds(options_.liveness_poll);
  int64_t next_check = start + poll_ns;
  for (;;) {
    uint32_t s = state.load(std::memory_order_acquire);
    if (s == kResponse) break;
    if (s != kRequest && s != kProcessing) {
      *lost = true;
      return absl::InternalError(
          absl::StrCat("shm expert call: slot ", index, " of ", name_, " left state ", s));
    }
    const int64_t now = MonotonicNowNs();
    if (now >= deadline_ns) {
      Word(c->client_waiting).store(0, std::memory_order_relaxed);
      return Withdraw(index, sequence, start, lost);
    }
    if (now < spin_end) {
      internal::SpinStep(now - spin_from);
      continue;
    }
    if (now >= next_check) {
      if (absl::Status st = CheckServer(/*in_flight=*/true); !st.ok()) {
        *lost = true;  // the slot stays with the dead or stopped server's segment
        return st;
      }
      next_check = now + poll_ns;
    }
    Word(c->client_waiting).store(1, kSeqCst);
    s = state.load(kSeqCst);
    if (s == kRequest || s == kProcessing) {
      const int64_t wait_ns = std::max<int64_t>(std::min(deadline_ns, next_check) - now, 1000);
      const bool woken = FutexWait(&c->state, s, wait_ns);
      // Woken with the call still in progress (whether or not the server took it after this
      // client fell asleep): the server's early wake (or, rarely, a spurious one). Spin for the
      // answer rather than sleep through its wake-up.
      const uint32_t now_s = state.load(kSeqCst);
      if (woken && (now_s == kRequest || now_s == kProcessing)) {
        const int64_t after = MonotonicNowNs();
        // Spinning, so the answer needs no FUTEX_WAKE; the flag is set again before a sleep.
        Word(c->client_waiting).store(0, std::memory_order_relaxed);
        early_wakes_.fetch_add(1, std::memory_order_relaxed);
        spin_from = after;
        spin_end = after + absl::ToInt64Nanoseconds(options_.spin_after_wake);
      }
    }
  }
  Word(c->client_waiting).store(0, std::memory_order_relaxed);
  return ReadResponse(index, sequence, lost);
}

absl::Status ShmClient::Withdraw(uint32_t index, uint64_t sequence, int64_t start_ns, bool* lost) {
  auto state = Word(slot(index)->state);
  const std::string waited =
      absl::StrCat(" (waited ", (MonotonicNowNs() - start_ns) / 1000, " us on ", name_, ")");
  for (;;) {
    uint32_t s = state.load(kSeqCst);
    if (s == kRequest) {
      if (state.compare_exchange_strong(s, kIdle, kSeqCst)) {
        return absl::DeadlineExceededError(
            absl::StrCat("shm expert call: no expert worker thread took the call", waited));
      }
    } else if (s == kProcessing) {
      if (state.compare_exchange_strong(s, kAbandoned, kSeqCst)) {
        *lost = true;  // the server frees the slot when its handler returns
        return absl::DeadlineExceededError(
            absl::StrCat("shm expert call: the expert worker did not answer in time", waited));
      }
    } else if (s == kResponse) {
      return ReadResponse(index, sequence, lost);  // arrived just at the deadline
    } else {
      *lost = true;
      return absl::InternalError(
          absl::StrCat("shm expert call: slot ", index, " of ", name_, " left state ", s));
    }
  }
}

absl::Status ShmClient::ReadResponse(uint32_t index, uint64_t sequence, bool* lost) {
  SlotControl* c = slot(index);
  const uint64_t got = c->response_sequence;
  const int32_t code = c->status_code;
  const size_t len = std::min<size_t>(c->message_len, kShmMessageBytes - 1);
  std::string message(c->message, len);
  if (got != sequence) {
    *lost = true;
    return absl::InternalError(absl::StrCat("shm expert call: response sequence ", got,
                                            " does not answer request ", sequence, " on slot ",
                                            index, " of ", name_));
  }
  Word(c->state).store(kIdle, std::memory_order_release);
  if (code == 0) return absl::OkStatus();
  if (code < 0 || code > static_cast<int32_t>(absl::StatusCode::kUnauthenticated)) {
    return absl::InternalError(
        absl::StrCat("expert worker ", name_, ": bad status code ", code, ": ", message));
  }
  return absl::Status(static_cast<absl::StatusCode>(code),
                      absl::StrCat("expert worker ", name_, ": ", message));
}

void ShmClient::Release(uint32_t index) {
  SlotControl* c = slot(index);
  Word(c->owner_start_time).store(0, std::memory_order_relaxed);
  Word(c->owner_pid).store(0, std::memory_order_release);
}

// --- Slot ---

ShmClient::Slot::Slot(Slot&& other) noexcept : client_(other.client_), index_(other.index_) {
  other.client_ = nullptr;
}

ShmClient::Slot& ShmClient::Slot::operator=(Slot&& other) noexcept {
  if (this != &other) {
    Release();
    client_ = other.client_;
    index_ = other.index_;
    other.client_ = nullptr;
  }
  return *this;
}

uint16_t* ShmClient::Slot::x_bf16() const {
  return reinterpret_cast<uint16_t*>(client_->slot_base(index_) + client_->layout_.x_offset);
}

int32_t* ShmClient::Slot::ids() const {
  return reinterpret_cast<int32_t*>(client_->slot_base(index_) + client_->layout_.ids_offset);
}

float* ShmClient::Slot::weights() const {
  return reinterpret_cast<float*>(client_->slot_base(index_) + client_->layout_.weights_offset);
}

const float* ShmClient::Slot::out() const {
  return reinterpret_cast<const float*>(client_->slot_base(index_) + client_->layout_.out_offset);
}

absl::Status ShmClient::Slot::Invoke(const ExpertRequestHeader& request, absl::Time deadline) {
  if (client_ == nullptr) {
    return absl::FailedPreconditionError("shm expert call on a released or lost slot");
  }
  bool lost = false;
  absl::Status status = client_->Invoke(index_, request, deadline, &lost);
  if (lost) client_ = nullptr;  // not ours any more: never release it
  return status;
}

void ShmClient::Slot::Release() {
  if (client_ == nullptr) return;
  client_->Release(index_);
  client_ = nullptr;
}

}  // namespace ss::expert::shm
