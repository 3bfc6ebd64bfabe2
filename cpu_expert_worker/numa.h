// Node-local memory for the expert worker (ARCHITECTURE.md "Processes": one expert worker per
// NUMA node, its experts in that node's RAM), on the topology of common/numa_topology.h.
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

#include "absl/status/statusor.h"
#include "common/numa_topology.h"

namespace ss::expert {

// Anonymous, page-aligned memory (mmap) with transparent huge pages requested, optionally bound
// to one NUMA node. Pages are not touched here: whoever writes a page first places it (the
// kernel's first-touch rule), which is why callers fill it from that node's threads.
class NodeMemory {
 public:
  NodeMemory() = default;
  ~NodeMemory();
  NodeMemory(NodeMemory&& o) noexcept;
  NodeMemory& operator=(NodeMemory&& o) noexcept;
  NodeMemory(const NodeMemory&) = delete;
  NodeMemory& operator=(const NodeMemory&) = delete;

  uint8_t* data() const { return static_cast<uint8_t*>(data_); }
  size_t size() const { return size_; }
  // Whether the kernel accepted the binding to the requested node (false when none was asked).
  bool bound() const { return bound_; }

 private:
  friend absl::StatusOr<NodeMemory> AllocateNodeMemory(const NumaTopology*, size_t, int);
  void Release();
  void* data_ = nullptr;
  size_t size_ = 0;
  bool bound_ = false;
};

// `bytes` (> 0) of NodeMemory. With a topology and node >= 0 the range is bound to that node
// (MPOL_BIND through hwloc, strict); when the kernel refuses, one warning per process is logged
// and the memory is returned unbound (first touch then decides placement). Errors:
// ResourceExhausted when mmap fails, InvalidArgument for bytes == 0.
absl::StatusOr<NodeMemory> AllocateNodeMemory(const NumaTopology* topology, size_t bytes, int node);

// Logs `message` as a spdlog warning the first time a given `kind` is reported in this process;
// later reports of that kind are counted only. Returns true when it logged.
enum class Refusal : int { kMemoryBinding = 0 };
bool WarnOnce(Refusal kind, const std::string& message);
// How many refusals of `kind` were reported in this process (for tests and the start-up log).
int64_t RefusalCount(Refusal kind);

// The process's resident set (VmRSS of /proc/self/statm) in bytes; 0 if unreadable.
int64_t ResidentBytes();

}  // namespace ss::expert
