// The worker's flag table (worker_config.h) and the splitserve-expert-worker binary: every flag
// is validated with a message naming it, the unbuilt transports are refused honestly (exit 2),
// and --selftest runs requests through a loaded store on tiny-a and the I = 256 checkpoint.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <string>
#include <vector>

#include "cpu_expert_worker/worker_config.h"
#include "tests/cpu_expert_worker/expert_test_util.h"

namespace ss::expert {
namespace {

using testing_util::I256Checkpoint;
using testing_util::kTinyA;

TEST(WorkerConfig, LayerLists) {
  EXPECT_EQ(*ParseLayerList("0-3,7"), (std::vector<int>{0, 1, 2, 3, 7}));
  EXPECT_EQ(*ParseLayerList(" 43 , 0 - 1 "), (std::vector<int>{43, 0, 1}));
  EXPECT_EQ(*ParseLayerList("5"), (std::vector<int>{5}));
  EXPECT_EQ(FormatIdList({0, 1, 2, 3, 7}), "0-3,7");
  EXPECT_EQ(FormatIdList({43, 0, 1}), "43,0-1");
  EXPECT_EQ(FormatIdList({}), "");
  for (const char* spec : {"0-42,43", "5", "3,1,5-7"}) {
    EXPECT_EQ(*ParseLayerList(FormatIdList(*ParseLayerList(spec))), *ParseLayerList(spec)) << spec;
  }
  for (const char* bad : {"", "1,,2", "a", "3-1", "-1", "1-", "0-2,2", "1.5", "0-x"}) {
    const auto r = ParseLayerList(bad);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find("--layers"), std::string::npos) << r.status();
  }
  EXPECT_NE(ParseLayerList("0-2,2").status().message().find("layer 2 is listed twice"),
            std::string::npos);
  // Ids are bounded, so a huge range is refused at once instead of expanding (found by the
  // config fuzz target: "0-11011111" took seconds, "0-2000000000" would exhaust memory).
  EXPECT_EQ(ParseLayerList("0-4095").value().size(), 4096u);
  for (const char* huge : {"0-4096", "0-2000000000", "4096"}) {
    const auto r = ParseLayerList(huge);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << huge;
    EXPECT_NE(r.status().message().find("largest layer id 4095"), std::string::npos) << r.status();
  }
}

TEST(WorkerConfig, SliceAndNode) {
  EXPECT_EQ(*ParseSlice("1/4"), std::make_pair(1, 4));
  for (const char* bad : {"1", "2/2", "0/0", "-1/2", "a/b", "1/2/3", ""})
    EXPECT_FALSE(ParseSlice(bad).ok()) << bad;
  EXPECT_EQ(*ParseNumaNode("auto"), -1);
  EXPECT_EQ(*ParseNumaNode("3"), 3);
  EXPECT_FALSE(ParseNumaNode("-1").ok());
  EXPECT_FALSE(ParseNumaNode("one").ok());
}

TEST(WorkerConfig, EveryFlagIsValidated) {
  WorkerFlags f;
  EXPECT_NE(ParseWorkerConfig(f).status().message().find("--model"), std::string::npos);
  f.model = "m";
  auto c = ParseWorkerConfig(f);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->all_layers);
  EXPECT_EQ(c->numa_node, -1);
  auto bad = [&](auto edit, const char* flag) {
    WorkerFlags g = f;
    edit(g);
    const auto r = ParseWorkerConfig(g);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << flag;
    EXPECT_NE(r.status().message().find(flag), std::string::npos) << r.status();
  };
  bad([](WorkerFlags& g) { g.layers = "0-"; }, "--layers");
  bad([](WorkerFlags& g) { g.slice = "3/2"; }, "--slice");
  bad([](WorkerFlags& g) { g.numa_node = "x"; }, "--numa_node");
  bad([](WorkerFlags& g) { g.threads = -2; }, "--threads");
  bad([](WorkerFlags& g) { g.isa = "sse9"; }, "--isa");
  bad([](WorkerFlags& g) { g.max_tokens = 0; }, "--max_tokens");
  bad([](WorkerFlags& g) { g.spin_us = -5; }, "--spin_us");
  bad([](WorkerFlags& g) { g.selftest = -3; }, "--selftest");
  bad([](WorkerFlags& g) { g.selftest_tokens = 300; }, "--selftest_tokens");
  bad([](WorkerFlags& g) { g.weight_layout = "columns"; }, "--weight_layout");
  bad([](WorkerFlags& g) { g.engine_passes = 3; }, "--engine_passes");
  EXPECT_EQ(c->engine_passes, 1);
  bad([](WorkerFlags& g) { g.load_format = "pt"; }, "--load-format 'pt'");
  bad([](WorkerFlags& g) { g.hf_overrides = "{\"n_routed_experts\": "; }, "--hf-overrides");
  bad([](WorkerFlags& g) { g.hf_overrides = "[128]"; }, "--hf-overrides");
  bad(
      [](WorkerFlags& g) {
        g.insecure_cluster = true;
        g.cluster_token_file = "token";
      },
      "--insecure_cluster");
  bad([](WorkerFlags& g) { g.store_memory = "huge"; }, "--store_memory");
  bad([](WorkerFlags& g) { g.store_memory = "shared"; }, "--store_memory shared needs --shm_name");
  EXPECT_EQ(c->store_segment, "");  // auto without --shm_name: anonymous
  WorkerFlags served = f;
  served.shm_name = "seg";
  EXPECT_EQ(ParseWorkerConfig(served)->store_segment, "seg-store");  // auto: shared
  EXPECT_TRUE(ParseWorkerConfig(served)->store_segment_optional);    // ... where /dev/shm has room
  served.store_memory = "anonymous";
  EXPECT_EQ(ParseWorkerConfig(served)->store_segment, "");
  served.store_memory = "shared";
  EXPECT_EQ(ParseWorkerConfig(served)->store_segment, "seg-store");
  EXPECT_FALSE(ParseWorkerConfig(served)->store_segment_optional);
  EXPECT_TRUE(c->tiled_weights);
  WorkerFlags rows = f;
  rows.weight_layout = "rows";
  EXPECT_FALSE(ParseWorkerConfig(rows)->tiled_weights);
  EXPECT_EQ(c->source.model_dir, "m");
  EXPECT_EQ(c->source.load_format, LoadFormat::kAuto);
  WorkerFlags dummy = f;
  dummy.load_format = "dummy";
  dummy.hf_overrides = R"({"n_routed_experts": 8})";
  auto d = ParseWorkerConfig(dummy);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_TRUE(d->source.dummy());
  EXPECT_EQ(d->source.hf_overrides, dummy.hf_overrides);
}

TEST(WorkerConfig, DashesBecomeUnderscoresInFlagNamesOnly) {
  std::vector<std::string> args = {"w",  "--numa-node=auto", "--shm-name", "my-seg", "-x-y",
                                   "--", "--not-a-flag"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  NormalizeFlagDashes(static_cast<int>(argv.size()), argv.data());
  EXPECT_EQ(args[1], "--numa_node=auto");
  EXPECT_EQ(args[2], "--shm_name");
  EXPECT_EQ(args[3], "my-seg");
  EXPECT_EQ(args[4], "-x-y");
  EXPECT_EQ(args[6], "--not-a-flag");
}

// ---------------------------------------------------------------------------------------------
// The binary.

struct Outcome {
  int status = -1;
  std::string output;
};

Outcome Worker(const std::string& args) {
  Outcome r;
  const std::string cmd = std::string(SS_BIN_DIR) + "/splitserve-expert-worker " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof(buf), p)) r.output.append(buf, n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return r;
}

void ExpectError(const std::string& args, int status, const std::string& needle) {
  const Outcome r = Worker(args);
  EXPECT_EQ(r.status, status) << args << "\n" << r.output;
  EXPECT_NE(r.output.find(needle), std::string::npos) << args << "\n" << r.output;
}

TEST(ExpertWorkerBinary, UsageErrors) {
  unsetenv("SPLITSERVE_CLUSTER_TOKEN");
  const std::string m = std::string("--model ") + kTinyA;
  ExpectError("", 2, "--model DIR is required");
  // Serving gRPC needs the cluster token (or the explicit opt-out); shared memory alone does not.
  ExpectError(m + " --grpc-listen 127.0.0.1:0 --selftest 0", 2, "no cluster token");
  ExpectError(m + " --grpc-listen 127.0.0.1:0 --selftest 0 --cluster-token-file /nonexistent", 2,
              "/nonexistent");
  ExpectError(m + " --grpc-listen 127.0.0.1:0 --selftest 0 --insecure-cluster --cluster-token-file "
                  "/nonexistent",
              2, "exclude each other");
  setenv("SPLITSERVE_CLUSTER_TOKEN", "short", 1);
  ExpectError(m + " --grpc-listen 127.0.0.1:0 --selftest 0", 2, "at least 32");
  unsetenv("SPLITSERVE_CLUSTER_TOKEN");
  ExpectError(m + " --grpc-listen 256.0.0.1:1 --selftest 0 --insecure-cluster", 1,
              "cannot listen on");
  ExpectError(m, 2, "nothing to do");
  ExpectError(m + " --slice 2/2 --selftest 1", 2, "--slice 2/2");
  ExpectError(m + " --isa sse9 --selftest 1", 2, "sse9");
  ExpectError(m + " --numa-node 63 --selftest 1", 2, "NUMA node 63");
  ExpectError(m + " --threads 4096 --selftest 1", 2, "--threads 4096 exceeds");
  ExpectError(m + " --layers 0-3,3 --selftest 1", 2, "layer 3 is listed twice");
  ExpectError(m + " stray --selftest 1", 2, "unexpected argument 'stray'");
}

TEST(ExpertWorkerBinary, LoadErrors) {
  const std::string m = std::string("--model ") + kTinyA;
  ExpectError(m + " --slice 0/2 --selftest 1", 1, "moe_intermediate_size 128 / 2 = 64");
  ExpectError(m + " --layers 0-8 --selftest 1", 1, "layer 8 is out of range");
  ExpectError("--model /nonexistent --selftest 1", 1, "/nonexistent");
}

TEST(ExpertWorkerBinary, SelfTestOnTinyAAndASlice) {
  Outcome r = Worker(std::string("--model ") + kTinyA + " --selftest 20 --selftest-tokens 3");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("tokens_per_s="), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("expert kernels: "), std::string::npos) << r.output;
  std::printf("%s", r.output.c_str());
  r = Worker("--model " + I256Checkpoint() +
             " --layers 0-2,5 --slice 1/2 --isa scalar --threads 1 --selftest 5");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("slice 1/2, isa scalar"), std::string::npos) << r.output;
  r = Worker("--model " + I256Checkpoint() + " --threads 2 --engine-passes 2 --selftest 5");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("passes 2"), std::string::npos) << r.output;
  r = Worker("--model " + I256Checkpoint() + " --selftest 0");
  EXPECT_EQ(r.status, 0) << r.output;
}

}  // namespace
}  // namespace ss::expert
