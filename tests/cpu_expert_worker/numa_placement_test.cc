// The expert worker's placement on machines this one is not (hwloc synthetic topologies,
// common/numa_topology.h FromSynthetic):
//  * 2 packages x 32 cores x 2 hyperthreads: --numa_node 1 pins the pool to node 1's 32 cores,
//    one thread a core (cpus 32-63, never their siblings 96-127); auto takes node 0; --threads
//    takes the node's first cores and is refused past them; a missing node is refused by flag;
//  * the worker started in node 1's cpuset (as `splitserve up` starts it) lands on node 1;
//  * 4 nodes: each node's 16 cores;
//  * node memory on a synthetic topology: hwloc's binding hooks there only pretend, so the
//    memory comes back unbound, the refusal is counted once, and the memory is usable.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "common/numa_topology.h"
#include "cpu_expert_worker/numa.h"
#include "tests/common/synthetic_topology.h"

namespace ss::expert {
namespace {

using ::ss::synthetic_topology::kTwoSockets;
using ::ss::synthetic_topology::Range;
using ::ss::synthetic_topology::Synthetic;

TEST(PlaceWorker, TwoSocketsOneThreadPerCoreOfTheNode) {
  const std::unique_ptr<NumaTopology> t = Synthetic(kTwoSockets);
  ASSERT_NE(t, nullptr);
  absl::StatusOr<WorkerPlacement> one = PlaceWorker(*t, 1, 0);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->node, 1);
  EXPECT_EQ(one->cpus, Range(32, 64));
  absl::StatusOr<WorkerPlacement> automatic = PlaceWorker(*t, -1, 0);
  ASSERT_TRUE(automatic.ok()) << automatic.status();
  EXPECT_EQ(automatic->node, 0);
  EXPECT_EQ(automatic->cpus, Range(0, 32));
  absl::StatusOr<WorkerPlacement> eight = PlaceWorker(*t, 1, 8);
  ASSERT_TRUE(eight.ok()) << eight.status();
  EXPECT_EQ(eight->cpus, Range(32, 40));

  const absl::Status too_many = PlaceWorker(*t, 1, 33).status();
  EXPECT_EQ(too_many.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(too_many.message().find("--threads 33 exceeds the 32 physical cores of NUMA node 1"),
            std::string::npos)
      << too_many;
  const absl::Status missing = PlaceWorker(*t, 2, 0).status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(missing.message().find("--numa_node: NUMA node 2 does not exist"), std::string::npos)
      << missing;
  EXPECT_EQ(PlaceWorker(*t, 0, -1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(PlaceWorker, InNodeOnesCpusetAutoIsNodeOne) {
  std::vector<int> node1 = Range(32, 64);
  for (int c = 96; c < 128; ++c) node1.push_back(c);
  const std::unique_ptr<NumaTopology> t = Synthetic(kTwoSockets, node1);
  ASSERT_NE(t, nullptr);
  absl::StatusOr<WorkerPlacement> p = PlaceWorker(*t, -1, 0);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->node, 1);
  EXPECT_EQ(p->cpus, Range(32, 64));
  // Asked for the node it may not run on: refused, naming the node it may use.
  const absl::Status zero = PlaceWorker(*t, 0, 0).status();
  EXPECT_NE(zero.message().find("nodes with allowed CPUs: 1"), std::string::npos) << zero;
  // A cpuset of the node's last 12 cores (a launcher keeping 20 for other processes).
  const std::unique_ptr<NumaTopology> part = Synthetic(kTwoSockets, Range(52, 64));
  ASSERT_NE(part, nullptr);
  p = PlaceWorker(*part, 1, 0);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->cpus, Range(52, 64));
}

TEST(PlaceWorker, FourNodes) {
  const std::unique_ptr<NumaTopology> t = Synthetic("pack:2 numa:2 core:16 pu:2");
  ASSERT_NE(t, nullptr);
  for (int node = 0; node < 4; ++node) {
    absl::StatusOr<WorkerPlacement> p = PlaceWorker(*t, node, 0);
    ASSERT_TRUE(p.ok()) << p.status();
    ASSERT_EQ(p->cpus.size(), 16u);
    for (int c = 0; c < 16; ++c) EXPECT_EQ(p->cpus[c], 32 * node + 2 * c);  // first siblings
  }
}

TEST(NodeMemory, ASyntheticTopologyIsNotBoundAndTheMemoryIsUsable) {
  const std::unique_ptr<NumaTopology> t = Synthetic(kTwoSockets);
  ASSERT_NE(t, nullptr);
  const int64_t before = RefusalCount(Refusal::kMemoryBinding);
  absl::StatusOr<NodeMemory> m = AllocateNodeMemory(t.get(), size_t{6} << 20, 1);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_FALSE(m->bound());  // hwloc's synthetic hooks report success without binding
  EXPECT_EQ(RefusalCount(Refusal::kMemoryBinding), before + 1);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(m->data()) % (size_t{2} << 20), 0u);
  std::memset(m->data(), 5, m->size());
  EXPECT_EQ(m->data()[m->size() - 1], 5);
  // No node asked: no binding, nothing refused.
  absl::StatusOr<NodeMemory> plain = AllocateNodeMemory(t.get(), 4096, -1);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(RefusalCount(Refusal::kMemoryBinding), before + 1);
}

}  // namespace
}  // namespace ss::expert
