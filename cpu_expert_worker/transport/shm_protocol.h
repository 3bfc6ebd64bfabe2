// The shared-memory wire format of expert calls between a GPU worker rank and an expert worker
// on the same host (ARCHITECTURE.md "The MoE call"; STYLE.md "Wire formats are versioned").
//
// One POSIX shared-memory segment per (gpu-worker rank, expert-worker) pair, created by the
// expert worker (ShmServer, shm_server.h) with mode 0600 and O_EXCL, opened by the GPU worker
// (ShmClient, shm_client.h). Both sides must run as the same user in the same PID namespace
// (liveness checks use PIDs; connect refuses a server in another PID namespace) and share
// CLOCK_MONOTONIC (deadlines and the heartbeat are monotonic timestamps; no time namespaces).
//
// Segment layout (all offsets in bytes from the start of the mapping; little-endian x86-64):
//
//   [0, 4096)                       SegmentHeader: magic, version, layout sizes, owner, doorbell
//   [4096 + i·slot_stride, ...)     slot i, i in [0, slot_count):
//       +0                          SlotControl (4096 bytes): state word, owner, request and
//                                   response fields, status message
//       +x_offset                   x       bf16 bits [T, dim]      (row-major, contiguous)
//       +ids_offset                 ids     int32     [T, top_k]
//       +weights_offset             weights fp32      [T, top_k]
//       +out_offset                 out     fp32      [T, dim]      (the response)
//
// Every payload area starts on a 4096-byte boundary and is padded to one, and the mapping
// itself is page-aligned, so the whole segment (or one slot's payload areas) can later be
// registered as CUDA pinned memory (cudaHostRegister) and the GPU can copy rows straight into
// a request slot and read the partial sums straight out of it. Areas are sized for max_tokens
// and the layout's top_k; a request with fewer tokens or a smaller top_k packs its arrays
// [T, top_k] from the start of each area.
//
// Slot state machine (the 32-bit `state` word, also the futex the client sleeps on):
//
//   kIdle       → kRequest      the owning client posts a request
//   kRequest    → kProcessing   a serving thread takes it (CAS; one winner)
//   kRequest    → kIdle         the client withdraws it at its deadline (keeps the slot)
//   kProcessing → kResponse     the server answers (FUTEX_WAKE if `client_waiting`)
//   kProcessing → kAbandoned    the client gives up at its deadline (loses the slot)
//   kAbandoned  → kIdle         the server, when its handler returns; it also frees the owner
//   kResponse   → kIdle         the client, after reading the response
//   other       → kIdle         the server's housekeeping, when the owner process is dead
//                               (never from kProcessing or kAbandoned)
//
// Ownership of a slot is the separate `owner_pid` word: a client claims a free slot with a CAS
// 0 → its pid, keeps it across calls (a lease), and releases it by setting state kIdle and then
// owner_pid 0. An abandoned slot belongs to the server, which frees it when its handler returns,
// so a late response can never be read as the answer to a later call; clients additionally check
// that the response's sequence number equals the request's. The server's housekeeping thread
// frees slots whose owner process has died (kill(pid, 0), /proc state and start time, so a zombie
// or a reused PID counts as dead).
//
// Doorbells. Client → server: the header's `doorbell` counter (an eventcount: the client bumps it
// after posting and issues FUTEX_WAKE only when `server_waiters` is non-zero). Server → client:
// the slot's `state` word (FUTEX_WAKE only when `client_waiting` is set). Both sides spin on the
// word for a bounded time first (pause instructions, then sched_yield), then FUTEX_WAIT with a
// timeout; no wait is ever unbounded. The early wake: while the handler runs, the server may
// wake the client once more without changing the state (ExpertRequestView::almost_done); a
// client woken by a FUTEX_WAKE with the call still in progress spins again for a bounded time
// (ShmClientOptions::spin_after_wake) before it sleeps. Either side without it only sees a
// spurious wake-up, so this needs no protocol version.
//
// Versioning. The first 24 bytes (magic, protocol_version, owner_pid, owner_start_time) keep
// their offsets in every version, so any build can tell a foreign, an incompatible and a stale
// segment apart. Any change to the layout below, or to a field's meaning, bumps
// kShmProtocolVersion. 2: ids may hold model::kSkippedExpert (-1), a skipped choice.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/shm_segment.h"

namespace ss::expert::shm {

inline constexpr uint64_t kShmMagic = 0x4d48535850455353ull;  // "SSEXPSHM" little-endian
inline constexpr uint32_t kShmProtocolVersion = 2;
inline constexpr size_t kShmPageBytes = 4096;    // alignment of header, slots and payloads
inline constexpr size_t kShmMessageBytes = 256;  // status message capacity, incl. the NUL
inline constexpr uint32_t kShmMaxSlots = 1024;
inline constexpr uint64_t kShmMaxSegmentBytes = 1ull << 40;

// The slot state word.
enum class SlotState : uint32_t {
  kIdle = 0,        // no call in flight (free, or leased by a client between calls)
  kRequest = 1,     // request written; a server thread may take it
  kProcessing = 2,  // a server thread runs the handler
  kResponse = 3,    // response written; the owning client reads it
  kAbandoned = 4,   // the client gave up (deadline); the server frees the slot when done
};

// The server's lifecycle, in SegmentHeader::server_state.
enum class ServerState : uint32_t {
  kInitializing = 0,
  kReady = 1,     // accepting calls
  kStopping = 2,  // draining: in-flight calls finish, new calls are refused
  kStopped = 3,   // gone; every waiting client returns Unavailable
};

// Page 0 of the segment. Written by the server at creation; afterwards only the atomic words
// (accessed through std::atomic_ref) change.
struct SegmentHeader {
  // --- stable prefix: identical offsets in every protocol version ---
  uint64_t magic;             // kShmMagic, written last at creation (release)
  uint32_t protocol_version;  // kShmProtocolVersion of the server
  int32_t owner_pid;          // the server process
  uint64_t owner_start_time;  // its start time (/proc/<pid>/stat field 22), against PID reuse
  // --- layout (version 1) ---
  uint32_t header_bytes;        // sizeof(SegmentHeader)
  uint32_t slot_control_bytes;  // sizeof(SlotControl)
  uint32_t slot_count;
  uint32_t max_tokens;   // max T per call
  uint32_t dim;          // hidden size every request must carry
  uint32_t top_k;        // max experts per token
  uint64_t slot_stride;  // bytes between slot starts
  uint64_t x_offset;     // payload offsets from the slot start
  uint64_t ids_offset;
  uint64_t weights_offset;
  uint64_t out_offset;
  uint64_t segment_bytes;  // total mapping size
  uint64_t pid_namespace;  // inode of the server's /proc/self/ns/pid (0 if unknown)
  uint64_t instance_id;    // random per server start (a generation id for logs)
  uint8_t reserved0[128 - 112];
  // --- shared words, one cache line each ---
  uint32_t server_state;  // ServerState
  uint8_t reserved1[64 - 4];
  uint32_t doorbell;        // eventcount: bumped by clients after posting (futex)
  uint32_t server_waiters;  // server threads about to sleep on `doorbell`
  uint8_t reserved2[64 - 8];
  uint64_t heartbeat_count;  // bumped by the server's housekeeping thread
  int64_t heartbeat_ns;      // CLOCK_MONOTONIC of the last beat
  uint8_t reserved3[kShmPageBytes - 272];
};
static_assert(sizeof(SegmentHeader) == kShmPageBytes);
static_assert(offsetof(SegmentHeader, magic) == 0);
static_assert(offsetof(SegmentHeader, protocol_version) == 8);
static_assert(offsetof(SegmentHeader, owner_pid) == 12);
static_assert(offsetof(SegmentHeader, owner_start_time) == 16);
static_assert(sizeof(ShmOwnerPrefix) <= sizeof(SegmentHeader));  // the shared prefix
static_assert(offsetof(SegmentHeader, header_bytes) == 24);
static_assert(offsetof(SegmentHeader, slot_count) == 32);
static_assert(offsetof(SegmentHeader, top_k) == 44);
static_assert(offsetof(SegmentHeader, slot_stride) == 48);
static_assert(offsetof(SegmentHeader, out_offset) == 80);
static_assert(offsetof(SegmentHeader, segment_bytes) == 88);
static_assert(offsetof(SegmentHeader, instance_id) == 104);
static_assert(offsetof(SegmentHeader, server_state) == 128);
static_assert(offsetof(SegmentHeader, doorbell) == 192);
static_assert(offsetof(SegmentHeader, server_waiters) == 196);
static_assert(offsetof(SegmentHeader, heartbeat_count) == 256);
static_assert(offsetof(SegmentHeader, heartbeat_ns) == 264);

// The first page of every slot. Line 0 is shared by both sides, line 1 is written by the client
// (before posting), lines 2+ by the server (before answering).
struct SlotControl {
  // --- line 0: state and ownership ---
  uint32_t state;           // SlotState; the futex the client sleeps on
  uint32_t client_waiting;  // 1 while the owning client may sleep on `state`
  int32_t owner_pid;        // 0 = free; else the client process that leased the slot
  uint32_t reserved0;
  uint64_t owner_start_time;  // the owner's start time; 0 while being claimed/released
  uint8_t reserved1[64 - 24];
  // --- line 1: request (client-written) ---
  uint64_t request_sequence;  // new for every call on this slot
  int64_t deadline_ns;        // CLOCK_MONOTONIC deadline of the call
  uint32_t protocol_version;  // the version the request is encoded in
  int32_t layer;
  int32_t tokens;  // T
  int32_t top_k;
  int32_t dim;
  uint8_t reserved2[64 - 36];
  // --- line 2+: response (server-written) ---
  uint64_t response_sequence;  // == request_sequence of the request it answers
  int32_t status_code;         // absl::StatusCode
  uint32_t message_len;        // bytes of `message` before the NUL, < kShmMessageBytes
  uint8_t reserved3[64 - 16];
  char message[kShmMessageBytes];
  uint8_t reserved4[kShmPageBytes - 192 - kShmMessageBytes];
};
static_assert(sizeof(SlotControl) == kShmPageBytes);
static_assert(offsetof(SlotControl, state) == 0);
static_assert(offsetof(SlotControl, client_waiting) == 4);
static_assert(offsetof(SlotControl, owner_pid) == 8);
static_assert(offsetof(SlotControl, owner_start_time) == 16);
static_assert(offsetof(SlotControl, request_sequence) == 64);
static_assert(offsetof(SlotControl, deadline_ns) == 72);
static_assert(offsetof(SlotControl, protocol_version) == 80);
static_assert(offsetof(SlotControl, layer) == 84);
static_assert(offsetof(SlotControl, tokens) == 88);
static_assert(offsetof(SlotControl, top_k) == 92);
static_assert(offsetof(SlotControl, dim) == 96);
static_assert(offsetof(SlotControl, response_sequence) == 128);
static_assert(offsetof(SlotControl, status_code) == 136);
static_assert(offsetof(SlotControl, message_len) == 140);
static_assert(offsetof(SlotControl, message) == 192);
static_assert(std::atomic_ref<uint32_t>::is_always_lock_free);
static_assert(std::atomic_ref<uint64_t>::is_always_lock_free);

// The sizes that determine a segment's layout.
struct ShmShape {
  uint32_t slot_count = 0;
  uint32_t max_tokens = 0;
  uint32_t dim = 0;
  uint32_t top_k = 0;
};

// Byte offsets derived from a shape (the values the header records).
struct ShmLayout {
  ShmShape shape;
  uint64_t slot_stride = 0;
  uint64_t x_offset = 0;
  uint64_t ids_offset = 0;
  uint64_t weights_offset = 0;
  uint64_t out_offset = 0;
  uint64_t segment_bytes = 0;
};

// The layout of a shape. InvalidArgument for a zero size, more than kShmMaxSlots slots or a
// segment over kShmMaxSegmentBytes.
absl::StatusOr<ShmLayout> ComputeLayout(const ShmShape& shape);

// The POSIX name ("/" + name) for a segment name given with or without the leading '/'.
// InvalidArgument unless the rest is 1-200 characters of [A-Za-z0-9._-], not "." or "..".
absl::StatusOr<std::string> ShmObjectName(std::string_view name);

// The protocol fields and sizes of one call, as the client sends them.
struct ExpertRequestHeader {
  uint32_t protocol_version = kShmProtocolVersion;  // leave the default outside tests
  int32_t layer = 0;
  int32_t tokens = 0;  // T, in [1, max_tokens]
  int32_t top_k = 0;   // in [1, the layout's top_k]
  int32_t dim = 0;     // must equal the layout's dim
};

// What the server's handler sees: validated sizes and pointers into the request slot, valid for
// the duration of the handler call. The layer and the contents of ids/weights are passed through
// unchecked: the handler knows which layers and experts it holds.
struct ExpertRequestView {
  uint32_t protocol_version = 0;
  uint64_t sequence = 0;
  absl::Time deadline;  // the client's deadline; a handler may give up past it
  int32_t client_pid = 0;
  int32_t layer = 0;
  int32_t tokens = 0;  // T
  int32_t top_k = 0;
  int32_t dim = 0;
  const uint16_t* x_bf16 = nullptr;  // [T, dim]
  const int32_t* ids = nullptr;      // [T, top_k]
  const float* weights = nullptr;    // [T, top_k]
  // Shared memory only (null over gRPC): the early wake. A handler calls it once when its answer
  // is near (the expert engine: when its last units are under way); a client asleep on the slot
  // is woken then and spins for the answer, so the answer's own wake-up is off the critical path.
  const std::function<void()>* almost_done = nullptr;
};

// Internals shared by server, client and tests.
namespace internal {

// CLOCK_MONOTONIC in nanoseconds (shared by all processes of the host).
int64_t MonotonicNowNs();
// `deadline` as a CLOCK_MONOTONIC timestamp (INT64_MAX for the infinite future).
int64_t DeadlineToMonotonicNs(absl::Time deadline);
absl::Time MonotonicNsToDeadline(int64_t mono_ns);

// FUTEX_WAIT on a 32-bit word shared between processes, for at most `timeout_ns` (> 0).
// Returns when woken, on timeout, on a signal, or at once if *word != expected: true when woken
// (by a FUTEX_WAKE or, rarely, spuriously), false otherwise.
bool FutexWait(uint32_t* word, uint32_t expected, int64_t timeout_ns);
// FUTEX_WAKE up to `count` waiters of `word`. Async-signal-safe.
void FutexWake(uint32_t* word, int count);
// One step of a spin-wait that has run for `spun_ns`: a pause instruction for the first 2 us,
// then sched_yield(), so a peer that the scheduler put on this same CPU (wake-affine
// placement on a busy machine) gets to run instead of waiting out the whole spin.
void SpinStep(int64_t spun_ns);

// Owner liveness, shared with every splitserve segment (common/shm_segment.h).
using ::ss::PidNamespaceId;
using ::ss::ProcessAlive;
using ::ss::ProcessStartTime;

inline std::atomic_ref<uint32_t> Word(uint32_t& w) { return std::atomic_ref<uint32_t>(w); }
inline std::atomic_ref<int32_t> Word(int32_t& w) { return std::atomic_ref<int32_t>(w); }
inline std::atomic_ref<uint64_t> Word(uint64_t& w) { return std::atomic_ref<uint64_t>(w); }
inline std::atomic_ref<int64_t> Word(int64_t& w) { return std::atomic_ref<int64_t>(w); }

}  // namespace internal
}  // namespace ss::expert::shm
