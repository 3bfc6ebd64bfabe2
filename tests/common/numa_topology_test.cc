// NumaTopology on machines this one is not, from hwloc's synthetic topologies:
//  * 2 packages x 32 cores x 2 hyperthreads (a dual-socket host, siblings numbered as Linux does:
//    core c has cpus c and c + 64): two nodes of 32 cores, one CPU a core, never two siblings;
//  * the same host in a cpuset of node 1's CPUs (the launcher's pinning of a node's worker):
//    auto resolves to node 1, node 0 is refused by name;
//  * a cpuset of half a core (one sibling) and of a node's odd cores;
//  * 4 nodes (2 packages x 2 sub-NUMA clusters), numbered without interleaving;
//  * Discover honours HWLOC_SYNTHETIC: another machine's topology, all its CPUs allowed;
//  * a description hwloc refuses is InvalidArgument.
#include "common/numa_topology.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <set>
#include <string>
#include <vector>

#include "tests/common/synthetic_topology.h"

namespace ss {
namespace {

using ::ss::synthetic_topology::kTwoSockets;
using ::ss::synthetic_topology::Range;
using ::ss::synthetic_topology::Synthetic;

TEST(NumaTopologySynthetic, TwoSocketsGiveTwoNodesOfThirtyTwoCoresOneCpuACore) {
  const std::unique_ptr<NumaTopology> t = Synthetic(kTwoSockets);
  ASSERT_NE(t, nullptr);
  EXPECT_FALSE(t->this_system());
  EXPECT_EQ(t->allowed_cpus(), Range(0, 128));
  ASSERT_EQ(t->nodes().size(), 2u);
  std::set<int> cpus;
  for (int i = 0; i < 2; ++i) {
    const NumaNode& n = t->nodes()[i];
    EXPECT_EQ(n.os_index, i);
    EXPECT_EQ(n.core_cpus, Range(32 * i, 32 * (i + 1))) << "node " << i;  // the first sibling
    EXPECT_EQ(n.allowed_pus, 64);
    ASSERT_EQ(n.core_pus.size(), 32u);
    for (int c = 0; c < 32; ++c) {
      const int core = 32 * i + c;
      EXPECT_EQ(n.core_pus[c], (std::vector<int>{core, core + 64})) << "core " << core;
    }
    for (const std::vector<int>& pus : n.core_pus) {
      for (int pu : pus) EXPECT_TRUE(cpus.insert(pu).second) << "cpu " << pu << " listed twice";
    }
    EXPECT_GT(n.memory_bytes, 0);
  }
  EXPECT_EQ(cpus.size(), 128u);
  // Auto: the node with most allowed cores, the lowest on a tie.
  EXPECT_EQ(*t->ResolveNode(-1), 0);
  EXPECT_EQ(*t->ResolveNode(1), 1);
  EXPECT_EQ(t->ResolveNode(2).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(t->Describe().find("node 1: 32 cores (cpus 32,33,"), std::string::npos)
      << t->Describe();
  EXPECT_NE(t->Describe().find("; 64 PUs allowed)"), std::string::npos) << t->Describe();
}

TEST(NumaTopologySynthetic, ACpusetOfNodeOneResolvesAutoToNodeOne) {
  std::vector<int> node1 = Range(32, 64);
  for (int c = 96; c < 128; ++c) node1.push_back(c);
  const std::unique_ptr<NumaTopology> t = Synthetic(kTwoSockets, node1);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->allowed_cpus(), node1);
  ASSERT_EQ(t->nodes().size(), 2u);  // every node is listed, node 0 without allowed cores
  EXPECT_TRUE(t->nodes()[0].core_cpus.empty());
  EXPECT_EQ(t->nodes()[0].allowed_pus, 0);
  EXPECT_EQ(t->nodes()[1].core_cpus, Range(32, 64));
  EXPECT_EQ(*t->ResolveNode(-1), 1);
  EXPECT_EQ(*t->ResolveNode(1), 1);
  const absl::Status zero = t->ResolveNode(0).status();
  EXPECT_EQ(zero.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(zero.message().find("NUMA node 0 has no allowed CPU; nodes with allowed CPUs: 1"),
            std::string::npos)
      << zero;
}

TEST(NumaTopologySynthetic, PartialCpusetsKeepOneCpuPerCoreAndTheMajorityNode) {
  // Only the second hyperthread of cores 0-3, and all of core 40: a core is represented by its
  // lowest ALLOWED thread; auto takes node 0 (4 cores against 1).
  const std::unique_ptr<NumaTopology> t = Synthetic(kTwoSockets, {64, 65, 66, 67, 40, 104});
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->nodes()[0].core_cpus, (std::vector<int>{64, 65, 66, 67}));
  EXPECT_EQ(t->nodes()[0].allowed_pus, 4);
  EXPECT_EQ(t->nodes()[1].core_cpus, (std::vector<int>{40}));
  EXPECT_EQ(t->nodes()[1].core_pus, (std::vector<std::vector<int>>{{40, 104}}));
  EXPECT_EQ(*t->ResolveNode(-1), 0);
  // CPUs the topology lacks are dropped; none left is FailedPrecondition.
  const std::unique_ptr<NumaTopology> none = Synthetic(kTwoSockets, {500, 501});
  ASSERT_NE(none, nullptr);
  EXPECT_TRUE(none->allowed_cpus().empty());
  EXPECT_EQ(none->ResolveNode(-1).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(NumaTopologySynthetic, FourNodesOfSixteenCores) {
  // Sub-NUMA clustering: 2 packages of 2 nodes; hwloc's default numbering puts siblings side by
  // side (core c has cpus 2c and 2c + 1).
  const std::unique_ptr<NumaTopology> t = Synthetic("pack:2 numa:2 core:16 pu:2");
  ASSERT_NE(t, nullptr);
  ASSERT_EQ(t->nodes().size(), 4u);
  for (int i = 0; i < 4; ++i) {
    const NumaNode& n = t->nodes()[i];
    EXPECT_EQ(n.os_index, i);
    ASSERT_EQ(n.core_cpus.size(), 16u);
    for (int c = 0; c < 16; ++c) {
      EXPECT_EQ(n.core_pus[c], (std::vector<int>{32 * i + 2 * c, 32 * i + 2 * c + 1}));
    }
    EXPECT_EQ(*t->ResolveNode(i), i);
  }
  // Nodes 2 and 3 only (a container on the second package): auto is node 2.
  const std::unique_ptr<NumaTopology> second =
      Synthetic("pack:2 numa:2 core:16 pu:2", Range(64, 128));
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(*second->ResolveNode(-1), 2);
  EXPECT_FALSE(second->ResolveNode(1).ok());
}

TEST(NumaTopologySynthetic, DiscoverHonoursHwlocSynthetic) {
  ASSERT_EQ(::setenv("HWLOC_SYNTHETIC", kTwoSockets, 1), 0);
  absl::StatusOr<std::unique_ptr<NumaTopology>> t = NumaTopology::Discover();
  ::unsetenv("HWLOC_SYNTHETIC");
  ASSERT_TRUE(t.ok()) << t.status();
  // Not this machine: its CPUs are all allowed, whatever this process's affinity.
  EXPECT_FALSE((*t)->this_system());
  EXPECT_EQ((*t)->allowed_cpus().size(), 128u);
  ASSERT_EQ((*t)->nodes().size(), 2u);
  EXPECT_EQ((*t)->nodes()[1].core_cpus, Range(32, 64));
  // Without it: this machine.
  absl::StatusOr<std::unique_ptr<NumaTopology>> real = NumaTopology::Discover();
  ASSERT_TRUE(real.ok()) << real.status();
  EXPECT_TRUE((*real)->this_system());
}

TEST(NumaTopologySynthetic, ABadDescriptionIsInvalidArgument) {
  const absl::StatusOr<std::unique_ptr<NumaTopology>> t =
      NumaTopology::FromSynthetic("pack:2 bogus:3");
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("pack:2 bogus:3"), std::string::npos) << t.status();
}

}  // namespace
}  // namespace ss
