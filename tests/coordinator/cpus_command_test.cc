// `splitserve cpus` on a machine this one is not: hwloc's HWLOC_SYNTHETIC describes a dual-socket
// host of 2 x 32 cores x 2 hyperthreads (Linux numbering: core c has cpus c and c + 64), which
// NumaTopology::Discover takes with all of its CPUs allowed. The printed plan gives each node's
// expert worker that node's cores (both hyperthreads), the GPU workers and the coordinator whole
// cores of their own, two expert workers to a node when asked for four, and the drop-ins carry it.
#include <stdlib.h>
#include <sys/wait.h>

#include <cstdio>
#include <string>

#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ss {
namespace {

constexpr char kTwoSockets[] = "pack:2 numa:1 core:32 pu:2(indexes=2*64:1*2)";

// stdout of `splitserve cpus <args>` on the synthetic host; `status` gets the exit status.
std::string Cpus(const std::string& args, int* status) {
  const std::string cmd =
      std::string("HWLOC_SYNTHETIC='") + kTwoSockets + "' " SS_BIN_DIR "/splitserve cpus " + args;
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof(buf), p)) out.append(buf, n);
  const int st = pclose(p);
  *status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return out;
}

TEST(CpusCommandTest, TwoSocketsOneExpertWorkerPerNodeOnItsCores) {
  int status = -1;
  const std::string out = Cpus("--gpu-workers 2", &status);
  ASSERT_EQ(status, 0) << out;
  EXPECT_NE(out.find("node 1: 32 cores (cpus 32,33,"), std::string::npos) << out;
  // 5 cores (2 a GPU worker, 1 the coordinator) from the nodes' tops in turn, with siblings.
  EXPECT_NE(out.find("GPU workers and the coordinator: cpus 29-31,62-63,93-95,126-127\n"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("expert worker of NUMA node 0 (--numa_node=0): cpus 0-28,64-92\n"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("expert worker of NUMA node 1 (--numa_node=1): cpus 32-61,96-125\n"),
            std::string::npos)
      << out;
}

TEST(CpusCommandTest, FourExpertWorkersTwoToANode) {
  int status = -1;
  const std::string out = Cpus("--gpu-workers 4 --expert-workers 4", &status);
  ASSERT_EQ(status, 0) << out;
  EXPECT_NE(out.find("GPU workers and the coordinator: cpus 27-31,60-63,91-95,124-127\n"),
            std::string::npos)
      << out;
  for (const char* line :
       {"expert worker 0 of 4, NUMA node 0 (--numa_node=0): cpus 0-12,64-76\n",
        "expert worker 1 of 4, NUMA node 0 (--numa_node=0): cpus 13-26,77-90\n",
        "expert worker 2 of 4, NUMA node 1 (--numa_node=1): cpus 32-45,96-109\n",
        "expert worker 3 of 4, NUMA node 1 (--numa_node=1): cpus 46-59,110-123\n"}) {
    EXPECT_NE(out.find(line), std::string::npos) << line << out;
  }
}

TEST(CpusCommandTest, DropInsCarryTheSplit) {
  testing_util::TempDir dir("ss_cpus_synthetic");
  int status = -1;
  const std::string out = Cpus("--gpu-workers 2 --write-dropins " + dir.path(), &status);
  ASSERT_EQ(status, 0) << out;
  EXPECT_NE(testing_util::ReadAll(dir / "splitserve-gpu-worker@.service.d/50-splitserve-cpus.conf")
                .find("CPUAffinity=29-31,62-63,93-95,126-127\n"),
            std::string::npos);
  EXPECT_NE(
      testing_util::ReadAll(dir / "splitserve-expert-worker@.service.d/50-splitserve-cpus.conf")
          .find("CPUAffinity=0-28,32-61,64-92,96-125\n"),
      std::string::npos);
}

}  // namespace
}  // namespace ss
