// Node-local memory and threads for the expert worker (ARCHITECTURE.md "Processes": one expert
// worker per NUMA node, its experts in that node's RAM, one pinned thread per physical core), on
// the topology of common/numa_topology.h.
//
// Refusals are not errors. Containers commonly refuse mbind (no CAP_SYS_NICE) and sometimes
// thread pinning; the worker then logs ONE warning per kind per process (WarnOnce here, the
// pool's own for pinning: common/thread_pool.h) and carries on unbound or unpinned: slower and
// noisier, never stuck.
//
// Thread safety: NodeMemory is a move-only owner; AllocateNodeMemory may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/numa_topology.h"
#include "common/shm_segment.h"

namespace ss::expert {

// Where an expert worker runs: its node and the OS CPUs its pool's threads are pinned to, one
// per physical core (thread i on cpus[i]; common/thread_pool.h).
struct WorkerPlacement {
  int node = -1;          // the NUMA node's OS index
  std::vector<int> cpus;  // the node's allowed cores' representatives (NumaNode::core_cpus)
};
// The placement for --numa_node `numa_node` (-1: auto, NumaTopology::ResolveNode) and --threads
// `threads` (0: one per allowed physical core of the node, else the node's first `threads`
// cores). Errors: InvalidArgument naming the flag (a node without allowed CPUs, more threads
// than the node has allowed cores), FailedPrecondition when no node has an allowed CPU.
absl::StatusOr<WorkerPlacement> PlaceWorker(const NumaTopology& topology, int numa_node,
                                            int threads);

struct NodeMemoryOptions;

// Page-aligned memory with transparent huge pages requested, optionally bound to one NUMA node:
// anonymous and private, or a POSIX shared-memory segment (NodeMemoryOptions::shm_name) that other
// processes of the host may map. Pages are not touched here (but for the segment's first 24
// bytes, below): whoever writes a page first places it (the kernel's first-touch rule), which is
// why callers fill it from that node's threads.
class NodeMemory {
 public:
  NodeMemory() = default;
  ~NodeMemory();  // unmaps; a segment is also unlinked, if the name is still ours
  NodeMemory(NodeMemory&& o) noexcept;
  NodeMemory& operator=(NodeMemory&& o) noexcept;
  NodeMemory(const NodeMemory&) = delete;
  NodeMemory& operator=(const NodeMemory&) = delete;

  uint8_t* data() const { return static_cast<uint8_t*>(data_); }
  size_t size() const { return size_; }
  // Whether the kernel accepted the binding to the requested node (false when none was asked).
  bool bound() const { return bound_; }
  // The segment's POSIX name (leading '/'), or "" for anonymous memory.
  const std::string& shm_name() const { return shm_name_; }
  // Bytes of this range that huge pages back now (AnonHugePages + ShmemPmdMapped of its
  // mappings in /proc/self/smaps; reading that file walks every mapping's page tables, so call
  // it after filling and then seldom, not on a hot path); -1 if unreadable.
  int64_t HugePageBytes() const;

 private:
  friend absl::StatusOr<NodeMemory> AllocateNodeMemory(size_t, const NodeMemoryOptions&);
  void Release();
  void* data_ = nullptr;
  size_t size_ = 0;
  bool bound_ = false;
  std::string shm_name_;
  uint64_t shm_dev_ = 0, shm_ino_ = 0;  // of our segment, so Release never unlinks another's
};

struct NodeMemoryOptions {
  // With a topology and node >= 0 the range is bound to that node (MPOL_BIND through hwloc,
  // strict); when the kernel refuses, one warning per process is logged and the memory is
  // returned unbound (first touch then decides placement). A topology that is not this
  // machine's (NumaTopology::this_system: hwloc's synthetic and XML topologies, whose binding
  // hooks report success and do nothing) is refused the same way, without asking the kernel.
  const NumaTopology* topology = nullptr;
  int node = -1;
  // Empty: anonymous private memory. Otherwise a POSIX shared-memory segment of that name
  // (leading '/'), created exclusively with mode 0600 (CreateShmSegment with `shm_kind`, which
  // reclaims a dead owner's leftover, common/shm_segment.h), sized to the rounded length, mapped
  // shared read-write. Its first 24 bytes are a ShmOwnerPrefix with this process as the owner
  // (written at once) and magic 0: the caller lays out the rest and writes the magic last.
  std::string shm_name;
  ShmSegmentKind shm_kind;
};

// `bytes` (> 0) of NodeMemory, rounded up to the page (to 2 MiB from 4 MiB on). Errors:
// InvalidArgument for bytes == 0; ResourceExhausted when mmap fails or /dev/shm has not the
// room; CreateShmSegment's errors for a segment.
absl::StatusOr<NodeMemory> AllocateNodeMemory(size_t bytes, const NodeMemoryOptions& options);
// Anonymous memory: AllocateNodeMemory(bytes, {topology, node}).
absl::StatusOr<NodeMemory> AllocateNodeMemory(const NumaTopology* topology, size_t bytes, int node);

// Logs `message` as a spdlog warning the first time a given `kind` is reported in this process;
// later reports of that kind are counted only. Returns true when it logged.
enum class Refusal : int { kMemoryBinding = 0 };
bool WarnOnce(Refusal kind, const std::string& message);
// How many refusals of `kind` were reported in this process (for tests and the start-up log).
int64_t RefusalCount(Refusal kind);

// The kernel setting that decides whether transparent huge pages may back NodeMemory of one
// kind (its large ranges are madvise(MADV_HUGEPAGE)d), read when asked.
struct HugePagePolicy {
  // "transparent_hugepage/enabled=madvise", "/dev/shm huge=never", "shmem_enabled=force", or
  // "unknown".
  std::string setting;
  bool allows = false;  // huge pages may back madvised memory under it (false when unknown)
  std::string remedy;   // where !allows, the command a deployer runs to allow them
};
// Anonymous memory: /sys/kernel/mm/transparent_hugepage/enabled; always and madvise allow.
HugePagePolicy AnonymousHugePagePolicy();
// POSIX shared memory (segments in /dev/shm, a tmpfs mount): the mount's huge= option (never
// where absent, the default; always, within_size and advise allow), unless /sys/kernel/mm/
// transparent_hugepage/shmem_enabled says deny or force, which override every mount. Its other
// words govern only the kernel's internal mount (SysV shm, memfd, shared anonymous mappings),
// not /dev/shm.
HugePagePolicy SharedHugePagePolicy();
// The same from the files' texts (`enabled`, `shmem_enabled`: the sysfs files; `mounts`:
// /proc/self/mounts, whose last /dev/shm line is the visible mount).
HugePagePolicy AnonymousHugePagePolicyOf(const std::string& enabled);
HugePagePolicy SharedHugePagePolicyOf(const std::string& shmem_enabled, const std::string& mounts);

// The process's resident set (VmRSS of /proc/self/statm) in bytes; 0 if unreadable.
int64_t ResidentBytes();

}  // namespace ss::expert
