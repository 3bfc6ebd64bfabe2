// The GPU worker's end of the shared-memory transport (wire format: shm_protocol.h).
//
//   ASSIGN_OR_RETURN(auto client, ShmClient::Connect("splitserve-gpu0-numa1"));
//   RETURN_IF_ERROR(client->Call(input, out, absl::Now() + absl::Milliseconds(50)));
//
// Connect maps an existing segment and checks it before anything else: magic, protocol version
// (a mismatch names both versions), the layout recorded in the header against the one this
// build computes from the same sizes (a mismatch names the field and both values), the sizes the
// caller expects (dim, top_k, max_tokens), the PID namespace, and that the server is ready and
// alive.
//
// Every call has a deadline (an infinite one is refused). Waiting for the answer spins for
// `spin`, then sleeps on the slot's state word (futex) in slices of at most `liveness_poll`
// (woken early by the server, it spins again for `spin_after_wake`);
// between slices it checks the server: stopped → Unavailable at once; process gone or a zombie,
// or heartbeat older than `heartbeat_stale_after` → Unavailable. So a dead server costs a caller
// at most one liveness poll, never a hang. At the deadline a request no server thread has taken
// is withdrawn; one being processed is abandoned (the server frees that slot when its handler
// returns, so the late answer is never read); both return DeadlineExceeded. Responses carry the
// request's sequence number and are checked.
//
// Two ways to call:
//   * Call(): copies the caller's arrays into a free slot and the partial sums out of it.
//   * AcquireSlot(): leases one slot; the caller writes x/ids/weights straight into it (e.g. a
//     GPU copy into the segment registered as pinned memory), Invoke()s it any number of times
//     and reads out() in place. Invoke() does not check the sizes it sends (the server does:
//     InvalidArgument for T, top_k, dim or a protocol version it does not serve).
//
// Threads: a ShmClient may be used from any number of threads at once (each call uses its own
// slot; with all slots leased a call waits for one until its deadline). A Slot is used by one
// thread at a time and must not outlive its client. A ShmClient belongs to the process that
// connected: in a forked child, connect again (calls from a child are refused).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cpu_expert_worker/transport/shm_protocol.h"

namespace ss::expert::shm {

struct ShmClientOptions {
  absl::Duration spin = absl::Microseconds(20);          // busy-poll for the answer before sleeping
  absl::Duration liveness_poll = absl::Milliseconds(5);  // server check interval while waiting
  // After an early wake (shm_protocol.h, "Doorbells"): how long to spin for the answer before
  // sleeping again.
  absl::Duration spin_after_wake = absl::Milliseconds(1);
  absl::Duration heartbeat_stale_after = absl::Seconds(2);
  // What the caller needs from the segment; 0 accepts whatever the server laid out.
  uint32_t expect_dim = 0;
  uint32_t expect_top_k = 0;
  uint32_t min_max_tokens = 0;
};

// One call's inputs, borrowed for the call: x [T, dim] bf16 bits, ids and weights [T, top_k].
struct ExpertCallInput {
  int32_t layer = 0;
  int32_t tokens = 0;
  int32_t top_k = 0;
  int32_t dim = 0;
  const uint16_t* x_bf16 = nullptr;
  const int32_t* ids = nullptr;
  const float* weights = nullptr;
};

class ShmClient {
 public:
  class Slot;

  // Errors: InvalidArgument (name), NotFound (no such segment), PermissionDenied,
  // FailedPrecondition (not a splitserve segment, another protocol version or layout, sizes the
  // caller does not accept, another PID namespace), Unavailable (server not ready, stopped or
  // dead), Internal (a system call failed).
  static absl::StatusOr<std::unique_ptr<ShmClient>> Connect(std::string_view name,
                                                            const ShmClientOptions& options = {});
  ~ShmClient();  // unmaps the segment; every Slot must be gone
  ShmClient(const ShmClient&) = delete;
  ShmClient& operator=(const ShmClient&) = delete;

  // Leases a free slot, waiting for one until `deadline` (DeadlineExceeded), or Unavailable.
  absl::StatusOr<Slot> AcquireSlot(absl::Time deadline);

  // One call through a temporary slot: writes out[T, dim] (fp32) on success. Errors: the
  // handler's status (code and message, prefixed with the segment name), InvalidArgument for
  // inputs that do not fit the layout (checked here) or that the server rejects,
  // DeadlineExceeded, Unavailable (server stopped, dead or stale).
  absl::Status Call(const ExpertCallInput& input, float* out, absl::Time deadline);

  // OK while the server is ready (or, with `in_flight`, still draining), its heartbeat is fresh
  // and its process alive (kill(pid, 0) and /proc: not a zombie, not a reused PID).
  absl::Status CheckServer(bool in_flight = false) const;
  // The same without the process probe: two loads and a clock read (the per-call check).
  absl::Status CheckServerState(bool in_flight = false) const;

  const std::string& name() const { return name_; }
  const ShmLayout& layout() const { return layout_; }
  int server_pid() const { return server_pid_; }
  // Early wakes seen so far: wake-ups before the futex timeout with the call still in progress.
  uint64_t early_wakes() const { return early_wakes_.load(std::memory_order_relaxed); }

 private:
  ShmClient(std::string name, const ShmClientOptions& options, uint8_t* base, size_t bytes,
            const ShmLayout& layout);

  SegmentHeader* header() const { return reinterpret_cast<SegmentHeader*>(base_); }
  SlotControl* slot(uint32_t i) const;
  uint8_t* slot_base(uint32_t i) const;
  absl::Status Invoke(uint32_t index, const ExpertRequestHeader& request, absl::Time deadline,
                      bool* lost);
  absl::Status Withdraw(uint32_t index, uint64_t sequence, int64_t start_ns, bool* lost);
  absl::Status ReadResponse(uint32_t index, uint64_t sequence, bool* lost);
  void Release(uint32_t index);

  const std::string name_;
  const ShmClientOptions options_;
  uint8_t* const base_;
  const size_t bytes_;
  const ShmLayout layout_;
  int server_pid_ = 0;
  uint64_t server_start_time_ = 0;
  int pid_ = 0;  // this process
  uint64_t start_time_ = 0;
  std::atomic<uint32_t> next_slot_{0};  // where the next AcquireSlot starts looking
  std::atomic<uint64_t> early_wakes_{0};
};

// A leased request slot. Move-only; releases the slot when destroyed.
class ShmClient::Slot {
 public:
  Slot() = default;
  Slot(Slot&& other) noexcept;
  Slot& operator=(Slot&& other) noexcept;
  ~Slot() { Release(); }

  // False once released, or after a call that cost the lease (a deadline while the server was
  // processing, a dead server).
  bool valid() const { return client_ != nullptr; }
  uint32_t index() const { return index_; }

  // The request areas, sized for the layout's max_tokens × dim / top_k; fill [T, dim] and
  // [T, top_k] from the start.
  uint16_t* x_bf16() const;
  int32_t* ids() const;
  float* weights() const;
  // [T, dim] fp32 of the last successful Invoke, valid until the next Invoke or Release.
  const float* out() const;

  // Sends the request in the slot and waits for the answer (see ShmClient::Call for errors).
  absl::Status Invoke(const ExpertRequestHeader& request, absl::Time deadline);
  void Release();

 private:
  friend class ShmClient;
  Slot(ShmClient* client, uint32_t index) : client_(client), index_(index) {}
  ShmClient* client_ = nullptr;
  uint32_t index_ = 0;
};

}  // namespace ss::expert::shm
