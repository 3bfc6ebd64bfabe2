// What every splitserve POSIX shared-memory segment shares: the owner prefix of its header, the
// owner-liveness test, and exclusive creation that reclaims a dead owner's leftover. Used by the
// expert-call transport (cpu_expert_worker/transport/shm_protocol.h) and the expert store
// (common/expert_store_format.h); each names its own magic.
//
// Liveness. A segment records its owner's PID and start time (/proc/<pid>/stat field 22), so a
// zombie or a process that reused the PID counts as dead. Both sides must run in the same PID
// namespace.
//
// Creation. CreateShmSegment opens NAME with O_CREAT|O_EXCL, mode 0600. When the name is taken
// and `reclaim_stale` is set, the leftover is examined through its owner prefix: a segment whose
// magic is the caller's (or 0: its creator died before finishing) and whose owner is dead is
// unlinked and creation retried; a live owner's segment is refused (AlreadyExists, naming the
// PID); anything else (a foreign file, no owner recorded) is left alone (FailedPrecondition
// naming its /dev/shm path). The creator must write the owner fields first and the magic last.
//
// Threads: every function may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace ss {

// The first 24 bytes of every splitserve segment, identical offsets in every format version.
struct ShmOwnerPrefix {
  uint64_t magic;             // the segment kind's magic, written last at creation (release)
  uint32_t version;           // the kind's format version
  int32_t owner_pid;          // the creating process
  uint64_t owner_start_time;  // its start time (ProcessStartTime), against PID reuse
};
static_assert(sizeof(ShmOwnerPrefix) == 24);
static_assert(offsetof(ShmOwnerPrefix, magic) == 0);
static_assert(offsetof(ShmOwnerPrefix, version) == 8);
static_assert(offsetof(ShmOwnerPrefix, owner_pid) == 12);
static_assert(offsetof(ShmOwnerPrefix, owner_start_time) == 16);

// Start time of a process in clock ticks since boot (/proc/<pid>/stat field 22); 0 if unknown.
uint64_t ProcessStartTime(int pid);
// False when `pid` is gone, a zombie, or (start_time != 0) a different process reusing the PID.
bool ProcessAlive(int pid, uint64_t start_time);
// Inode of /proc/self/ns/pid, 0 if unknown.
uint64_t PidNamespaceId();

// A kind of segment: its magic and how messages call it ("splitserve expert segment").
struct ShmSegmentKind {
  uint64_t magic = 0;
  const char* what = "";
};

// Creates the segment `name` (POSIX form, leading '/') exclusively, mode 0600, and returns its
// O_RDWR descriptor (close-on-exec; the caller closes it). See the header comment for the
// reclaim rule. Errors: AlreadyExists, FailedPrecondition, Internal (a system call failed).
absl::StatusOr<int> CreateShmSegment(const std::string& name, const ShmSegmentKind& kind,
                                     bool reclaim_stale);

}  // namespace ss
