// The cluster config (coordinator/cluster_config.h): parsing and its errors, the roles it gives
// GPU workers (stages, TP ranks, expert slices, max_model_len, the stage transport), and the
// layout helpers of `splitserve up` (CUDA devices, CPU split, KV tokens, stage transport).
#include "coordinator/cluster_config.h"

#include <algorithm>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include "common/layer_list.h"
#include "common/model_config.h"
#include "common/numa_topology.h"
#include "gtest/gtest.h"
#include "proto/cluster.pb.h"
#include "tests/coordinator/cluster_test_util.h"
#include "tests/test_util.h"

namespace ss::coord {
namespace {

namespace pb = splitserve::v1;
using testing_util::kTwoStages;
using testing_util::TinyModel;

TEST(ClusterConfigTest, ParsesRolesAndRoundTrips) {
  const ModelConfig model = TinyModel();
  absl::StatusOr<ClusterConfig> c = ParseClusterConfig(kTwoStages, model);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->GpuWorkerIds(), (std::vector<std::string>{"gpu0", "gpu1"}));
  absl::StatusOr<pb::Role> r1 = RoleFor(*c, "gpu1");
  ASSERT_TRUE(r1.ok());
  EXPECT_EQ(r1->stage(), 1);
  EXPECT_EQ(r1->num_stages(), 2);
  EXPECT_EQ(r1->first_layer(), 4);
  EXPECT_EQ(r1->end_layer(), 7);
  ASSERT_EQ(r1->experts_size(), 3);
  EXPECT_EQ(r1->experts(0).layer(), 4);
  EXPECT_EQ(r1->experts(0).endpoints(0).grpc_address(), "127.0.0.1:1");
  absl::StatusOr<pb::Role> r0 = RoleFor(*c, "gpu0");
  ASSERT_TRUE(r0.ok());
  ASSERT_EQ(r0->experts_size(), 4);
  EXPECT_EQ(r0->experts(3).endpoints(0).shm_name(), "seg0");
  EXPECT_EQ(RoleFor(*c, "e0").status().code(), absl::StatusCode::kNotFound);

  absl::StatusOr<ClusterConfig> again = ParseClusterConfig(ClusterConfigToJson(*c), model);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(ClusterConfigToJson(*again), ClusterConfigToJson(*c));
}

// max_model_len: the model's positions by default, a shorter limit when given (every worker
// learns it with its role), never more than the model's.
TEST(ClusterConfigTest, MaxModelLenDefaultsToTheModelAndReachesTheRoles) {
  const ModelConfig model = TinyModel();
  const int64_t positions = model.max_position_embeddings;
  ASSERT_GT(positions, 100);
  absl::StatusOr<ClusterConfig> c =
      ParseClusterConfig(R"({"stages": [{"layers": "0-6", "workers": ["a"]}]})", model);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->max_model_len, positions);
  EXPECT_EQ(RoleFor(*c, "a")->max_model_len(), positions);
  c = ParseClusterConfig(
      R"({"max_model_len": 100, "stages": [{"layers": "0-6", "workers": ["a"]}]})", model);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->max_model_len, 100);
  EXPECT_EQ(MaxModelLen(*c, model), 100);
  EXPECT_EQ(RoleFor(*c, "a")->max_model_len(), 100);
  EXPECT_EQ(ClusterConfigToJson(*ParseClusterConfig(ClusterConfigToJson(*c), model)),
            ClusterConfigToJson(*c));
  const absl::Status too_long =
      ParseClusterConfig(absl::StrCat(R"({"max_model_len": )", positions + 1,
                                      R"(, "stages": [{"layers": "0-6", "workers": ["a"]}]})"),
                         model)
          .status();
  EXPECT_EQ(too_long.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(too_long.message().find("'max_model_len'"), std::string::npos) << too_long;
  ClusterConfig in_code;  // not parsed: 0 stands for the model's
  EXPECT_EQ(MaxModelLen(in_code, model), positions);
}

TEST(ClusterConfigTest, SlicesGoToTpRanks) {
  const ModelConfig model = TinyModel();
  // tiny-a's experts are 128 wide: one slice only. Use TP 2 with whole experts on both ranks'
  // view: slice 0/1 goes to rank 0, none to rank 1.
  absl::StatusOr<ClusterConfig> c = ParseClusterConfig(R"({
    "stages": [{"layers": "0-6", "workers": ["a", "b"]}],
    "expert_workers": [{"id": "e", "layers": "0-6", "slice": "0/1", "shm": "s"}]})",
                                                       model);
  ASSERT_TRUE(c.ok()) << c.status();
  // Rank 1 still learns that the layers are served remotely (slice_count 1, no endpoints of its
  // own): it adds zero for them instead of computing a share of the experts itself.
  const pb::Role a = *RoleFor(*c, "a"), b = *RoleFor(*c, "b");
  ASSERT_EQ(a.experts_size(), 7);
  ASSERT_EQ(b.experts_size(), 7);
  EXPECT_EQ(a.experts(2).endpoints_size(), 1);
  EXPECT_EQ(a.experts(2).slice_count(), 1);
  EXPECT_EQ(b.experts(2).endpoints_size(), 0);
  EXPECT_EQ(b.experts(2).slice_count(), 1);
  EXPECT_EQ(b.tp_rank(), 1);
  EXPECT_EQ(b.tp_size(), 2);
  EXPECT_EQ(TpPeers(*c, "a"), std::vector<std::string>{"b"});
  EXPECT_EQ(StageOf(*c, "b"), 0);
  EXPECT_EQ(StageOf(*c, "e"), -1);
}

TEST(ClusterConfigTest, FourSlicesOverTwoRanksGoIByIModTwo) {
  ModelConfig model = TinyModel();
  model.moe_inter_dim = 512;  // four slices of 128
  absl::StatusOr<ClusterConfig> c = ParseClusterConfig(R"({
    "stages": [{"layers": "0-6", "workers": ["a", "b"]}],
    "expert_workers": [{"id": "e0", "layers": "0-6", "slice": "0/4", "shm": "s0"},
                       {"id": "e1", "layers": "0-6", "slice": "1/4", "shm": "s1"},
                       {"id": "e2", "layers": "0-6", "slice": "2/4", "shm": "s2"},
                       {"id": "e3", "layers": "0-6", "slice": "3/4", "grpc": "h:1"}]})",
                                                       model);
  ASSERT_TRUE(c.ok()) << c.status();
  for (const auto& [id, want] :
       std::vector<std::pair<std::string, std::vector<int>>>{{"a", {0, 2}}, {"b", {1, 3}}}) {
    const pb::Role r = *RoleFor(*c, id);
    ASSERT_EQ(r.experts_size(), 7);
    for (const pb::LayerExperts& le : r.experts()) {
      EXPECT_EQ(le.slice_count(), 4);
      std::vector<int> got;
      for (const pb::ExpertEndpoint& e : le.endpoints()) got.push_back(e.slice_index());
      EXPECT_EQ(got, want) << id << " layer " << le.layer();
    }
  }
}

TEST(ClusterConfigTest, CudaDevicesOfStagesAndRanks) {
  EXPECT_EQ(*AssignCudaDevices(2, 2, 2), (std::vector<int>{0, 1, 0, 1}));  // TP 2 x PP 2 on 2
  EXPECT_EQ(*AssignCudaDevices(2, 2, 4), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(*AssignCudaDevices(3, 1, 2), (std::vector<int>{0, 1, 0}));
  EXPECT_EQ(*AssignCudaDevices(3, 2, 3), (std::vector<int>{0, 1, 2, 0, 1, 2}));
  const absl::Status st = AssignCudaDevices(1, 2, 1).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("distinct GPUs"), std::string::npos) << st;
  EXPECT_FALSE(AssignCudaDevices(0, 1, 1).ok());
}

TEST(ClusterConfigTest, NcclStageLinksGetGpusOfTheirOwnAndShareOneFate) {
  // Linked workers need a GPU each (a link's two ranks may not share one, nor may processes
  // with a waiting receive kernel).
  EXPECT_EQ(*AssignCudaDevices(2, 1, 2, true), (std::vector<int>{0, 1}));
  EXPECT_EQ(*AssignCudaDevices(2, 2, 4, true), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(*AssignCudaDevices(1, 2, 2, true), (std::vector<int>{0, 1}));  // no link
  const absl::Status shared = AssignCudaDevices(2, 2, 2, true).status();
  EXPECT_EQ(shared.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(shared.message().find("a GPU per GPU worker"), std::string::npos) << shared;
  EXPECT_FALSE(AssignCudaDevices(3, 1, 2, true).ok());
  // `up` takes the links wherever they can run.
  EXPECT_EQ(LaunchStageTransport("auto", true, true, 2, 1, 2), "nccl");
  EXPECT_EQ(LaunchStageTransport("auto", true, true, 2, 2, 2), "grpc");   // GPUs shared
  EXPECT_EQ(LaunchStageTransport("auto", true, true, 1, 2, 2), "grpc");   // one stage
  EXPECT_EQ(LaunchStageTransport("auto", true, false, 2, 1, 2), "grpc");  // no NCCL
  EXPECT_EQ(LaunchStageTransport("auto", false, true, 2, 1, 2), "grpc");  // cpu backend
  EXPECT_EQ(LaunchStageTransport("grpc", true, true, 2, 1, 2), "grpc");
  EXPECT_EQ(LaunchStageTransport("nccl", true, true, 2, 2, 2), "nccl");  // refused later

  const ModelConfig model = TinyModel();
  const std::string text = R"({"stage_transport": "nccl",
    "stages": [{"layers": "0-3", "workers": ["a", "b"]}, {"layers": "4-6", "workers": ["c", "d"]}]})";
  absl::StatusOr<ClusterConfig> c = ParseClusterConfig(text, model);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->stage_transport, "nccl");
  EXPECT_EQ(RoleFor(*c, "c")->stage_transport(), "nccl");
  EXPECT_EQ(FatePeers(*c, "c"), (std::vector<std::string>{"a", "b", "d"}));
  EXPECT_EQ(TpPeers(*c, "c"), (std::vector<std::string>{"d"}));
  absl::StatusOr<ClusterConfig> back = ParseClusterConfig(ClusterConfigToJson(*c), model);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->stage_transport, "nccl");
  // The default, gRPC: stages keep their own fates.
  absl::StatusOr<ClusterConfig> g = ParseClusterConfig(R"({
    "stages": [{"layers": "0-3", "workers": ["a", "b"]}, {"layers": "4-6", "workers": ["c", "d"]}]})",
                                                       model);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->stage_transport, "grpc");
  EXPECT_EQ(RoleFor(*g, "a")->stage_transport(), "grpc");
  EXPECT_EQ(FatePeers(*g, "c"), (std::vector<std::string>{"d"}));
  const absl::Status bad =
      ParseClusterConfig(
          R"({"stage_transport": "rdma", "stages": [{"layers": "0-6", "workers": ["a"]}]})", model)
          .status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  // Prefix caching: on unless the config says false; anything but a boolean is refused.
  EXPECT_TRUE(g->enable_prefix_caching);
  absl::StatusOr<ClusterConfig> off = ParseClusterConfig(
      R"({"enable_prefix_caching": false, "stages": [{"layers": "0-6", "workers": ["a"]}]})",
      model);
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_FALSE(off->enable_prefix_caching);
  EXPECT_FALSE(ParseClusterConfig(ClusterConfigToJson(*off), model)->enable_prefix_caching);
  EXPECT_EQ(
      ParseClusterConfig(
          R"({"enable_prefix_caching": 0, "stages": [{"layers": "0-6", "workers": ["a"]}]})", model)
          .status()
          .code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("'stage_transport'"), std::string::npos) << bad;
}

// `nodes` NUMA nodes of `cores` cores, each core `smt` hardware threads numbered as Linux does
// on such machines: core c of the machine has cpus c, c + total cores, ...
std::vector<std::vector<std::vector<int>>> Machine(int nodes, int cores, int smt) {
  std::vector<std::vector<std::vector<int>>> m(nodes);
  for (int n = 0; n < nodes; ++n) {
    for (int c = 0; c < cores; ++c) {
      std::vector<int> pus;
      for (int t = 0; t < smt; ++t) pus.push_back(n * cores + c + t * nodes * cores);
      m[n].push_back(pus);
    }
  }
  return m;
}

TEST(ClusterConfigTest, LaunchCpusGiveTheServingProcessesWholeCoresOfTheirOwn) {
  // Two nodes of 16 two-thread cores, 8 GPU workers + the coordinator: 9 cores taken from the
  // nodes' tops in turn (5 from node 0, 4 from node 1), hyperthreads together.
  const LaunchCpus p = PlanLaunchCpus(Machine(2, 16, 2), 2, 9, true);
  ASSERT_TRUE(p.split());
  ASSERT_EQ(p.experts.size(), 2u);
  EXPECT_EQ(p.serving.size(), 18u);
  EXPECT_EQ(p.experts[0].size(), 2u * 11);
  EXPECT_EQ(p.experts[1].size(), 2u * 12);
  std::set<int> seen;
  for (int c : p.serving) EXPECT_TRUE(seen.insert(c).second) << c;
  for (const auto& e : p.experts) {
    for (int c : e) EXPECT_TRUE(seen.insert(c).second) << "cpu " << c << " given twice";
  }
  EXPECT_EQ(seen.size(), 64u);
  for (int c : {15, 47, 11, 43, 31, 63, 28, 60}) {  // the nodes' top cores and their siblings
    EXPECT_NE(std::find(p.serving.begin(), p.serving.end(), c), p.serving.end()) << c;
  }
  for (int c : {0, 32, 10, 42}) {
    EXPECT_NE(std::find(p.experts[0].begin(), p.experts[0].end(), c), p.experts[0].end()) << c;
  }
  for (int c : p.experts[1]) EXPECT_TRUE((c >= 16 && c < 28) || (c >= 48 && c < 60)) << c;

  // One node of 32 cores, one GPU worker + the coordinator: the top two cores.
  const LaunchCpus one = PlanLaunchCpus(Machine(1, 32, 1), 1, 2, true);
  EXPECT_EQ(one.serving, (std::vector<int>{30, 31}));
  ASSERT_EQ(one.experts.size(), 1u);
  EXPECT_EQ(one.experts[0].size(), 30u);
  EXPECT_EQ(one.experts[0].back(), 29);

  // More expert workers than nodes: the remaining cores shared out evenly.
  const LaunchCpus three = PlanLaunchCpus(Machine(1, 11, 1), 3, 2, true);
  ASSERT_EQ(three.experts.size(), 3u);
  EXPECT_EQ(three.experts[0], (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(three.experts[1], (std::vector<int>{3, 4, 5}));
  EXPECT_EQ(three.experts[2], (std::vector<int>{6, 7, 8}));
}

TEST(ClusterConfigTest, LaunchCpusForTakeOneCoreAGpuWorkerWhereTwoDoNotFit) {
  // 16 cores, 2 GPU workers + the coordinator: two cores each (5).
  EXPECT_EQ(PlanLaunchCpusFor(Machine(1, 16, 1), 1, 2, true, true).serving.size(), 5u);
  // 8 cores: 5 would leave the experts 3, so one each (3).
  EXPECT_EQ(PlanLaunchCpusFor(Machine(1, 8, 1), 1, 2, true, true).serving,
            (std::vector<int>{5, 6, 7}));
  // Without the coordinator on this host: 2 GPU workers on 8 cores take 4.
  EXPECT_EQ(PlanLaunchCpusFor(Machine(1, 8, 1), 1, 2, false, true).serving.size(), 4u);
  // 4 cores cannot give 3 away; nor does the cpu backend split.
  EXPECT_FALSE(PlanLaunchCpusFor(Machine(1, 4, 1), 1, 2, true, true).split());
  EXPECT_FALSE(PlanLaunchCpusFor(Machine(1, 64, 2), 1, 2, true, false).split());
}

// `splitserve cpus --write-dropins`: the serving cores on the GPU workers' and the coordinator's
// units, all the expert cores on the expert workers' template unit (each worker narrows them to
// its node), none for the experts unless each has a node of its own, nothing without a split.
TEST(ClusterConfigTest, CpuDropInsPutTheSplitOnTheUnits) {
  const LaunchCpus plan = PlanLaunchCpusFor(Machine(2, 16, 2), 2, 2, true, true);
  ASSERT_TRUE(plan.split());
  std::vector<int> serving = plan.serving, experts;
  for (const std::vector<int>& e : plan.experts) experts.insert(experts.end(), e.begin(), e.end());
  std::sort(serving.begin(), serving.end());
  std::sort(experts.begin(), experts.end());
  const auto files = CpuDropIns(plan, true, true, "splitserve cpus --gpu-workers 2");
  ASSERT_EQ(files.size(), 3u);
  EXPECT_EQ(files[0].first, "splitserve-gpu-worker@.service.d/50-splitserve-cpus.conf");
  EXPECT_EQ(files[1].first, "splitserve-coordinator.service.d/50-splitserve-cpus.conf");
  EXPECT_EQ(files[2].first, "splitserve-expert-worker@.service.d/50-splitserve-cpus.conf");
  for (size_t i = 0; i < files.size(); ++i) {
    const std::string& text = files[i].second;
    EXPECT_EQ(text.rfind("# Written by `splitserve cpus --gpu-workers 2`", 0), 0u) << text;
    EXPECT_NE(
        text.find("\n[Service]\nCPUAffinity=" + FormatIdList(i < 2 ? serving : experts) + "\n"),
        std::string::npos)
        << text;
  }
  // No CPU on both sides.
  std::vector<int> both;
  std::set_intersection(serving.begin(), serving.end(), experts.begin(), experts.end(),
                        std::back_inserter(both));
  EXPECT_TRUE(both.empty());
  EXPECT_EQ(CpuDropIns(plan, false, false, "c").size(), 1u);  // the GPU workers' only
  EXPECT_TRUE(
      CpuDropIns(PlanLaunchCpusFor(Machine(1, 4, 1), 1, 2, true, true), true, true, "c").empty());

  ss::testing_util::TempDir dir("ss_dropins");
  const absl::StatusOr<std::vector<std::string>> written = WriteFiles(dir.path(), files);
  ASSERT_TRUE(written.ok()) << written.status();
  ASSERT_EQ(written->size(), 3u);
  for (size_t i = 0; i < files.size(); ++i) {
    EXPECT_EQ(ss::testing_util::ReadAll((*written)[i]), files[i].second);
  }
  // A directory that cannot be made (a file in its place): an error naming it, nothing thrown.
  const absl::StatusOr<std::vector<std::string>> bad =
      WriteFiles(dir / "splitserve-gpu-worker@.service.d/50-splitserve-cpus.conf", files);
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("cannot"), std::string::npos) << bad.status();
}

TEST(ClusterConfigTest, LaunchCpusAreNotSplitWhereSplittingWouldHurt) {
  // The cpu backend computes on the experts' cores between calls.
  EXPECT_FALSE(PlanLaunchCpus(Machine(1, 32, 2), 1, 2, false).split());
  // A small machine (CI's two cores, a laptop): fewer cores than twice the serving processes.
  EXPECT_FALSE(PlanLaunchCpus(Machine(1, 2, 1), 1, 2, true).split());
  EXPECT_FALSE(PlanLaunchCpus(Machine(1, 5, 2), 1, 3, true).split());
  // A node is never emptied: 2 nodes of 1 core cannot give up one.
  EXPECT_FALSE(PlanLaunchCpus(Machine(4, 1, 1), 4, 2, true).split());
  // More expert workers than the cores left.
  EXPECT_FALSE(PlanLaunchCpus(Machine(1, 4, 1), 3, 2, true).split());
  const LaunchCpus none = PlanLaunchCpus(Machine(1, 2, 1), 1, 2, true);
  EXPECT_TRUE(none.serving.empty());
  EXPECT_TRUE(none.experts.empty());
}

// `splitserve up` on machines this one is not: the real topology code on hwloc's synthetic
// topologies (NumaTopology::FromSynthetic), through LaunchNodesOf, LaunchExpertWorkers,
// PlanLaunchCpusFor and LaunchExpertNode, then each expert worker's view of the topology in the
// cpuset it is started in (what its --numa-node resolves to, and the cores it pins).
constexpr char kTwoSockets[] = "pack:2 numa:1 core:32 pu:2(indexes=2*64:1*2)";  // Linux numbering

// The node of each of `cpus` in `t`, or -1 for a CPU no node has.
std::set<int> NodesOf(const NumaTopology& t, const std::vector<int>& cpus) {
  std::set<int> nodes;
  for (int c : cpus) {
    int node = -1;
    for (const NumaNode& n : t.nodes()) {
      for (const std::vector<int>& pus : n.core_pus) {
        if (std::find(pus.begin(), pus.end(), c) != pus.end()) node = n.os_index;
      }
    }
    nodes.insert(node);
  }
  return nodes;
}

// Checks a launch plan on synthetic `description` in the cpuset `allowed` (empty: all): every CPU
// given at most once, each expert worker within the one node LaunchExpertNode names (both
// hyperthreads of its cores), and that worker, started in its cpuset, resolving its --numa-node to
// that node and pinning one thread to each of its cores. Returns the plan.
LaunchCpus CheckLaunch(const std::string& description, int tp, int expect_experts,
                       const std::vector<int>& allowed = {}) {
  absl::StatusOr<std::unique_ptr<NumaTopology>> t =
      NumaTopology::FromSynthetic(description, allowed);
  EXPECT_TRUE(t.ok()) << t.status();
  if (!t.ok()) return {};
  const LaunchNodes nodes = LaunchNodesOf((*t)->nodes());
  const int experts = LaunchExpertWorkers(0, static_cast<int>(nodes.ids.size()), tp, true, 2048);
  EXPECT_EQ(experts, expect_experts) << description << " tp " << tp;
  const LaunchCpus plan = PlanLaunchCpusFor(nodes.cores, experts, tp, true, true);
  EXPECT_TRUE(plan.split()) << description << " tp " << tp;
  EXPECT_EQ(plan.experts.size(), static_cast<size_t>(experts));
  std::set<int> given(plan.serving.begin(), plan.serving.end());
  EXPECT_EQ(given.size(), plan.serving.size());
  for (size_t e = 0; e < plan.experts.size(); ++e) {
    const std::vector<int>& cpus = plan.experts[e];
    for (int c : cpus) EXPECT_TRUE(given.insert(c).second) << "cpu " << c << " given twice";
    const int node = LaunchExpertNode(static_cast<int>(e), experts, nodes.ids);
    EXPECT_EQ(NodesOf(**t, cpus), std::set<int>{node})
        << "expert worker " << e << " of " << experts << " straddles nodes";
    // The worker in its cpuset: --numa-node (or auto) gives that node, its cores one a thread.
    absl::StatusOr<std::unique_ptr<NumaTopology>> own =
        NumaTopology::FromSynthetic(description, cpus);
    EXPECT_TRUE(own.ok()) << own.status();
    if (!own.ok()) continue;
    EXPECT_EQ((*own)->ResolveNode(-1).value_or(-2), node);
    EXPECT_EQ((*own)->ResolveNode(node).value_or(-2), node) << "worker " << e;
    if (!(*own)->ResolveNode(node).ok()) continue;
    const std::vector<std::vector<int>>& cores = (*own)->FindNode(node)->core_pus;
    EXPECT_EQ(cores.size() * 2, cpus.size()) << "a core of worker " << e << " lost a sibling";
  }
  EXPECT_EQ(given.size(), (*t)->allowed_cpus().size());  // no CPU left idle
  return plan;
}

TEST(ClusterConfigTest, LaunchOnTwoSocketsGivesEachNodeItsExpertWorker) {
  // One GPU worker: one expert worker per node, on all of its node's cores but the serving
  // ones (2 for the GPU worker + 1 for the coordinator, taken from the nodes' tops in turn).
  const LaunchCpus one = CheckLaunch(kTwoSockets, 1, 2);
  ASSERT_EQ(one.experts.size(), 2u);
  EXPECT_EQ(one.serving, (std::vector<int>{30, 31, 63, 94, 95, 127}));
  EXPECT_EQ(one.experts[0].size(), 2u * 30);
  EXPECT_EQ(one.experts[1].size(), 2u * 31);
  EXPECT_EQ(one.experts[1].front(), 32);
  // TP 2 and TP 4 with 2 GPU workers per node's worth of ranks: 2 expert workers, then 4 (two
  // to a node, each on half of its node's remaining cores).
  CheckLaunch(kTwoSockets, 2, 2);
  const LaunchCpus four = CheckLaunch(kTwoSockets, 4, 4);
  ASSERT_EQ(four.experts.size(), 4u);
  for (const std::vector<int>& e : four.experts) EXPECT_GE(e.size(), 2u * 13);
  CheckLaunch(kTwoSockets, 8, 8);
  // Uneven nodes (a cpuset of 10 cores of node 0 and 30 of node 1): still two workers to a node.
  std::vector<int> uneven;
  for (int first : {0, 64}) {
    for (int c = 0; c < 10; ++c) uneven.push_back(first + c);
    for (int c = 32; c < 62; ++c) uneven.push_back(first + c);
  }
  const LaunchCpus skewed = CheckLaunch(kTwoSockets, 4, 4, uneven);
  ASSERT_EQ(skewed.experts.size(), 4u);
  EXPECT_EQ(skewed.experts[0].size() + skewed.experts[1].size(), 2u * 5);   // 5 serve
  EXPECT_EQ(skewed.experts[2].size() + skewed.experts[3].size(), 2u * 26);  // 4 serve
}

TEST(ClusterConfigTest, LaunchOnFourNodesAndOnASecondSocketCpuset) {
  CheckLaunch("pack:2 numa:2 core:16 pu:2", 1, 4);
  CheckLaunch("pack:2 numa:2 core:16 pu:2", 8, 8);
  // A container on the second package only: its nodes are 2 and 3, and so are the workers'.
  std::vector<int> second;
  for (int c = 64; c < 128; ++c) second.push_back(c);
  absl::StatusOr<std::unique_ptr<NumaTopology>> t =
      NumaTopology::FromSynthetic("pack:2 numa:2 core:16 pu:2", second);
  ASSERT_TRUE(t.ok()) << t.status();
  const LaunchNodes nodes = LaunchNodesOf((*t)->nodes());
  EXPECT_EQ(nodes.ids, (std::vector<int>{2, 3}));
  EXPECT_EQ(LaunchExpertNode(0, 2, nodes.ids), 2);
  EXPECT_EQ(LaunchExpertNode(1, 2, nodes.ids), 3);
  EXPECT_EQ(LaunchExpertNode(3, 4, nodes.ids), 3);
  EXPECT_EQ(LaunchExpertNode(0, 3, nodes.ids), -1);  // not a multiple: auto
  EXPECT_EQ(LaunchExpertNode(0, 1, {0}), -1);        // one node: auto
}

TEST(ClusterConfigTest, LaunchKvTokensFillsGpusOnlyWhereEachWorkerHasItsOwn) {
  EXPECT_EQ(LaunchKvTokens(4096, true, {0, 1}, 65536), 4096);  // asked for: as asked
  EXPECT_EQ(LaunchKvTokens(0, true, {0, 1, 2, 3}, 65536), 0);  // TP 2 x PP 2 on 4: fill
  EXPECT_EQ(LaunchKvTokens(0, true, {0}, 65536), 0);
  EXPECT_EQ(LaunchKvTokens(0, true, {0, 1, 0, 1}, 65536), 65536);  // TP 2 x PP 2 on 2: shared
  EXPECT_EQ(LaunchKvTokens(0, true, {0, 0}, 65536), 65536);
  EXPECT_EQ(LaunchKvTokens(0, false, {}, 65536), 65536);  // cpu backend
}

TEST(ClusterConfigTest, LaunchExpertWorkersGivesEveryTpRankItsSlice) {
  EXPECT_EQ(LaunchExpertWorkers(0, 1, 1, true, 2048), 1);   // one node, one rank
  EXPECT_EQ(LaunchExpertWorkers(0, 2, 1, true, 2048), 2);   // one per node
  EXPECT_EQ(LaunchExpertWorkers(0, 1, 4, true, 2048), 4);   // TP 4 on one node: one per rank
  EXPECT_EQ(LaunchExpertWorkers(0, 2, 4, true, 2048), 4);   // two per node
  EXPECT_EQ(LaunchExpertWorkers(0, 2, 3, true, 2048), 2);   // tp not a multiple of the nodes
  EXPECT_EQ(LaunchExpertWorkers(0, 1, 4, false, 2048), 1);  // cpu backend: no TP ranks
  EXPECT_EQ(LaunchExpertWorkers(0, 1, 4, true, 256), 2);    // slices of 128 rows at least
  EXPECT_EQ(LaunchExpertWorkers(3, 1, 4, true, 2048), 2);   // --expert-workers 3: 2048/3 no
  EXPECT_EQ(LaunchExpertWorkers(1, 1, 4, true, 2048), 1);   // --expert-workers 1: as asked
}

TEST(ClusterConfigTest, LaunchMaxBatchTokensIsLargerWhereChunksMayStream) {
  EXPECT_EQ(LaunchMaxBatchTokens(0, false), 2048);    // cpu backend, or streaming off
  EXPECT_EQ(LaunchMaxBatchTokens(0, true), 8192);     // at any context: the scores are sliced
  EXPECT_EQ(LaunchMaxBatchTokens(4096, true), 4096);  // --max-num-batched-tokens: as asked
  EXPECT_EQ(LaunchMaxBatchTokens(16384, false), 16384);
}

TEST(ClusterConfigTest, RejectsBadConfigsNamingTheField) {
  const ModelConfig model = TinyModel();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"[]", "not a JSON object"},
      {"{\"stages\": []}", "'stages'"},
      {R"({"stages": [{"layers": "0-3", "workers": ["a"]}]})", "the model has 7"},
      {R"({"stages": [{"layers": "0-3", "workers": ["a"]}, {"layers": "5-6", "workers": ["b"]}]})",
       "expected layer 4"},
      {R"({"stages": [{"layers": "0-6", "workers": ["a", "a"]}]})", "appears twice"},
      {R"({"stages": [{"layers": "0-9", "workers": ["a"]}]})", "outside the model"},
      {R"({"stages": [{"layers": "0-6", "workers": ["a", "b", "c"]}]})",
       "does not divide the model's num_attention_heads = 4"},
      // TP 4 divides tiny-a's 4 heads but not its 2 output groups: the cuda backend refuses it.
      {R"({"stages": [{"layers": "0-6", "workers": ["a", "b", "c", "d"]}]})", "o_groups = 2"},
      {R"({"kv_block_tokens": 100, "stages": [{"layers": "0-6", "workers": ["a"]}]})",
       "multiple of every compress ratio"},
      {R"({"bogus": 1, "stages": [{"layers": "0-6", "workers": ["a"]}]})", "unknown key 'bogus'"},
      {R"({"stages": [{"layers": "0-6", "workers": ["a"]}],
           "expert_workers": [{"id": "e", "layers": "0-6", "slice": "0/2", "shm": "s"}]})",
       "does not split"},
      {R"({"stages": [{"layers": "0-6", "workers": ["a"]}],
           "expert_workers": [{"id": "e", "layers": "0-6", "slice": "0/1"}]})",
       "exactly one of 'shm' and 'grpc'"},
      {R"({"stages": [{"layers": "0-6", "workers": ["a"]}],
           "expert_workers": [{"id": "e", "layers": "0-6", "slice": "0/1", "shm": "s"},
                              {"id": "f", "layers": "3", "slice": "0/1", "shm": "t"}]})",
       "layer 3"},
      {R"({"max_batch_tokens": 4, "max_running": 8, "stages": [{"layers": "0-6", "workers": ["a"]}]})",
       "max_batch_tokens"},
  };
  for (const auto& [text, want] : cases) {
    absl::StatusOr<ClusterConfig> c = ParseClusterConfig(text, model);
    ASSERT_FALSE(c.ok()) << text;
    EXPECT_NE(c.status().message().find(want), std::string::npos)
        << text << " -> " << c.status().message();
  }
}

}  // namespace
}  // namespace ss::coord
