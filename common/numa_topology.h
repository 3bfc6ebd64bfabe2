// The machine's NUMA nodes and the physical cores of each that this process may use, from hwloc.
// The expert worker places its experts and threads by it (cpu_expert_worker/numa.h, ARCHITECTURE.md
// "Processes": one expert worker per NUMA node, one pinned thread per physical core), and
// `splitserve up` / `splitserve cpus` split the host's cores between the processes by it
// (coordinator/cluster_config.h LaunchCpus).
//
// What the process may use is what it is ALLOWED to use: the CPU set of sched_getaffinity
// (taskset, numactl, a container's cpuset) intersected with the hwloc topology. For each NUMA node,
// the physical cores that have at least one allowed hardware thread are listed once each, by their
// lowest allowed hardware thread, so a pool built from that list never puts two threads on the two
// hyperthreads of one core.
//
// Thread safety: a NumaTopology is immutable after Discover and may be read from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ss {

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
  // hwloc honours HWLOC_SYNTHETIC and HWLOC_XMLFILE in the environment (a described machine, or
  // another machine's `lstopo --of xml`). Such a topology is not this system's (this_system()),
  // so this process's affinity says nothing about it: all its CPUs are allowed, and `splitserve
  // cpus` prints the split for that machine.
  static absl::StatusOr<std::unique_ptr<NumaTopology>> Discover();
  // The machine of hwloc's synthetic `description` (hwloc_topology_set_synthetic: "pack:2 numa:1
  // core:32 pu:2", with "pu:2(indexes=2*64:1*2)" numbering the hyperthreads as Linux does),
  // restricted to `allowed_cpus` (OS CPUs; empty: all of them), for testing placement on
  // machines this one is not. Errors: InvalidArgument for a description hwloc refuses.
  static absl::StatusOr<std::unique_ptr<NumaTopology>> FromSynthetic(
      const std::string& description, const std::vector<int>& allowed_cpus = {});
  ~NumaTopology();
  NumaTopology(const NumaTopology&) = delete;
  NumaTopology& operator=(const NumaTopology&) = delete;

  // Every NUMA node hwloc reports (at least one, also on machines without NUMA), ascending
  // os_index.
  const std::vector<NumaNode>& nodes() const { return nodes_; }
  // The allowed OS CPUs, ascending.
  const std::vector<int>& allowed_cpus() const { return allowed_cpus_; }
  const NumaNode* FindNode(int os_index) const;

  // The node for an expert worker's --numa-node: `requested` >= 0 must be a node with allowed CPUs
  // (InvalidArgument naming it and listing the usable nodes otherwise); -1 ("auto") is the node
  // with the most allowed physical cores, the lowest os_index on a tie (a worker restricted to
  // one node's CPUs by its launcher therefore lands on that node).
  absl::StatusOr<int> ResolveNode(int requested) const;

  // "node 0: 2 cores (cpus 0,1; 2 PUs allowed), 23.4 GiB; ..." for the start-up log.
  std::string Describe() const;

  // The hwloc topology (hwloc_topology_t), for node-local memory (cpu_expert_worker/numa.h).
  void* hwloc() const { return topology_; }
  // Whether the topology is the machine this process runs on (hwloc_topology_is_thissystem):
  // false for synthetic and XML topologies, whose memory binding hwloc only pretends to do and
  // whose CPUs need not exist here.
  bool this_system() const;

 private:
  NumaTopology() = default;
  // Fills nodes_ and allowed_cpus_ from the loaded topology_ and the allowed OS CPUs.
  absl::Status Index(const std::vector<int>& allowed);
  void* topology_ = nullptr;
  std::vector<NumaNode> nodes_;
  std::vector<int> allowed_cpus_;
};

}  // namespace ss
