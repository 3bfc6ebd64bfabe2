// NUMA topology and node-local memory for the expert worker (ARCHITECTURE.md "Processes": one
// expert worker per NUMA node, its experts in that node's RAM, one pinned thread per physical
// core).
//
// What the worker may use is what the process is ALLOWED to use: the CPU set of
// sched_getaffinity (taskset, numactl, a container's cpuset) intersected with the hwloc
// topology. For each NUMA node, the physical cores that have at least one allowed hardware
// thread are listed once each, by their lowest allowed hardware thread, so a pool built from
// that list never puts two threads on the two hyperthreads of one core.
//
// Refusals are not errors. Containers commonly refuse mbind (no CAP_SYS_NICE) and sometimes
// thread pinning; the worker then logs ONE warning per kind per process (WarnOnce here, the
// pool's own for pinning: common/thread_pool.h) and carries on unbound or unpinned: slower and
// noisier, never stuck.
//
// Thread safety: a NumaTopology is immutable after Discover and may be read from any thread.
// NodeMemory is a move-only owner; AllocateNodeMemory may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ss::expert {

struct NumaNode {
  int os_index = 0;  // the kernel's node number (numactl's, /sys/devices/system/node/nodeN)
  // One OS CPU per physical core of this node with an allowed hardware thread: the core's lowest
  // allowed PU, in ascending order. Empty for a node without allowed CPUs (memory-only nodes,
  // nodes outside the process's cpuset).
  std::vector<int> core_cpus;
  // Every allowed hardware thread of each of those cores (core_pus[i] holds core_cpus[i] first,
  // then its allowed siblings), ascending within a core.
  std::vector<std::vector<int>> core_pus;
  int allowed_pus = 0;       // allowed hardware threads in the node (>= core_cpus.size())
  int64_t memory_bytes = 0;  // local memory as hwloc reports it; 0 when unknown
};

class NumaTopology {
 public:
  // Loads the hwloc topology and restricts it to the calling thread's allowed CPU set. Call it
  // once at start, BEFORE pinning any thread (a pinned caller would see one CPU). Errors:
  // Internal when hwloc cannot load a topology or sched_getaffinity fails.
  static absl::StatusOr<std::unique_ptr<NumaTopology>> Discover();
  ~NumaTopology();
  NumaTopology(const NumaTopology&) = delete;
  NumaTopology& operator=(const NumaTopology&) = delete;

  // Every NUMA node hwloc reports (at least one, also on machines without NUMA), ascending
  // os_index.
  const std::vector<NumaNode>& nodes() const { return nodes_; }
  // The allowed OS CPUs, ascending.
  const std::vector<int>& allowed_cpus() const { return allowed_cpus_; }
  const NumaNode* FindNode(int os_index) const;

  // The node for --numa-node: `requested` >= 0 must be a node with allowed CPUs
  // (InvalidArgument naming it and listing the usable nodes otherwise); -1 ("auto") is the node
  // with the most allowed physical cores, the lowest os_index on a tie (a worker restricted to
  // one node's CPUs by its launcher therefore lands on that node).
  absl::StatusOr<int> ResolveNode(int requested) const;

  // "node 0: 2 cores (cpus 0,1; 2 PUs allowed), 23.4 GiB; ..." for the start-up log.
  std::string Describe() const;

  // The hwloc topology (hwloc_topology_t), for numa.cc.
  void* hwloc() const { return topology_; }

 private:
  NumaTopology() = default;
  void* topology_ = nullptr;
  std::vector<NumaNode> nodes_;
  std::vector<int> allowed_cpus_;
};

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
