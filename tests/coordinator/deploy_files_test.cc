// deploy/ stays in step with the code: the example cluster config parses, the systemd units pass
// only flags the binaries have, and the Grafana dashboard queries only series the processes
// export.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "common/model_config.h"
#include "coordinator/cluster_config.h"
#include "nlohmann/json.hpp"
#include "tests/test_util.h"
#include "tests/tools/test_configs.h"

namespace ss {
namespace {

using testing_util::ReadAll;

TEST(DeployFilesTest, ClusterExampleParses) {
  auto model = ParseModelConfig(testing_util::kFlashConfig, "Flash config.json");
  ASSERT_TRUE(model.ok()) << model.status();
  auto c = coord::ParseClusterConfig(ReadAll(SS_DEPLOY_DIR "/cluster.example.json"), *model);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_gpu_workers(), 4);
  EXPECT_EQ(c->expert_workers.size(), 4u);
  EXPECT_EQ(c->max_model_len, 131072);    // 128K: the workers keep ~2 GiB less workspace than at 1M
  EXPECT_EQ(c->stage_transport, "grpc");  // two hosts: stages fail alone (deploy/README.md)
}

// `--name=` flags of a unit's ExecStart must be flags of the binary (its --helpfull lists them),
// and every unit loads the cluster token.
TEST(DeployFilesTest, UnitFlagsExist) {
  const std::pair<const char*, const char*> units[] = {
      {"splitserve-coordinator.service", "splitserve-coordinator"},
      {"splitserve-gpu-worker@.service", "splitserve-gpu-worker"},
      {"splitserve-expert-worker@.service", "splitserve-expert-worker"}};
  int checked = 0;
  for (const auto& [unit, binary] : units) {
    const std::string text = ReadAll(std::string(SS_DEPLOY_DIR "/systemd/") + unit);
    // Every unit comes back after a failure; a GPU worker also after a clean exit (dropped from
    // membership), so that it rejoins.
    const char* restart = std::string(unit).find("gpu-worker") != std::string::npos
                              ? "Restart=always"
                              : "Restart=on-failure";
    EXPECT_NE(text.find(restart), std::string::npos) << unit;
    EXPECT_NE(text.find(std::string("ExecStart=/usr/local/bin/") + binary), std::string::npos);
    // Every unit carries the cluster token (deploy/README.md "Security"), from a credential.
    EXPECT_NE(text.find("LoadCredential=cluster-token:/etc/splitserve/cluster-token"),
              std::string::npos)
        << unit;
    EXPECT_NE(text.find("--cluster_token_file=%d/cluster-token"), std::string::npos) << unit;
    const std::string path = std::string(SS_BIN_DIR "/") + binary;
    std::FILE* f = popen((path + " --helpfull 2>&1").c_str(), "r");
    ASSERT_NE(f, nullptr);
    std::string help;
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) help.append(buf, n);
    const int rc = pclose(f);
    if (help.find("--model") == std::string::npos) {
      std::printf("%s not built here (rc %d): its unit's flags are not checked\n", binary, rc);
      continue;
    }
    ++checked;
    const std::regex flag("--([a-z0-9_]+)=");
    for (auto it = std::sregex_iterator(text.begin(), text.end(), flag);
         it != std::sregex_iterator(); ++it) {
      const std::string name = (*it)[1];
      EXPECT_NE(help.find("--" + name + " "), std::string::npos) << unit << ": --" << name;
    }
  }
  EXPECT_GE(checked, 1);
}

// Every series the dashboard queries is one the processes register (without _bucket/_sum/_count).
TEST(DeployFilesTest, DashboardUsesExportedSeries) {
  const std::set<std::string> exported = {
      // coordinator/gateway_metrics.h
      "time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds",
      "request_queue_time_seconds", "request_prefill_time_seconds", "request_decode_time_seconds",
      "request_inference_time_seconds", "request_time_per_output_token_seconds",
      "request_prompt_tokens", "request_generation_tokens", "request_params_n",
      "request_params_max_tokens", "prompt_tokens_total", "generation_tokens_total",
      "num_requests_running", "num_requests_waiting", "kv_cache_usage_perc",
      "num_preemptions_total", "request_success_total", "http_request_errors_total",
      "prefix_cache_queries_total", "prefix_cache_hits_total", "prefix_cache_blocks",
      // coordinator/coordinator_main.cc
      "iteration_tokens_total", "engine_step_seconds",
      // gpu_worker/stage_runner.cc
      "layer_latency_seconds", "gpu_worker_steps_total", "gpu_worker_step_errors_total",
      "gpu_worker_step_seconds", "gpu_worker_kv_usage_perc", "gpu_worker_kv_tokens_used",
      "gpu_worker_kv_tokens_capacity", "gpu_worker_sequences", "gpu_worker_expert_routed_total",
      "gpu_worker_routed_choices_total", "gpu_worker_expert_cpu_read_bytes_total",
      "gpu_worker_expert_rebalances_total", "gpu_worker_expert_rebalance_bytes_total",
      // cpu_expert_worker/expert_worker_main.cc
      "expert_achieved_gbps", "expert_worker_info", "expert_call_seconds", "expert_calls_total",
      "expert_call_errors_total", "expert_weight_bytes_total"};
  const auto dash =
      nlohmann::json::parse(ReadAll(SS_DEPLOY_DIR "/grafana/splitserve-dashboard.json"));
  const std::regex series("splitserve:([a-z0-9_]+)");
  int queries = 0;
  for (const auto& panel : dash["panels"]) {
    for (const auto& target : panel.value("targets", nlohmann::json::array())) {
      const std::string expr = target["expr"];
      ++queries;
      for (auto it = std::sregex_iterator(expr.begin(), expr.end(), series);
           it != std::sregex_iterator(); ++it) {
        std::string name = (*it)[1];
        for (const char* suffix : {"_bucket", "_sum", "_count"}) {
          if (name.ends_with(suffix) && !exported.contains(name)) {
            name.resize(name.size() - std::string(suffix).size());
          }
        }
        EXPECT_TRUE(exported.contains(name)) << name << " in " << expr;
      }
    }
  }
  EXPECT_GT(queries, 10);
}

}  // namespace
}  // namespace ss
