#include "coordinator/up_plan.h"

#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/weight_source.h"

namespace ss {
namespace {

// Expert workers' idle spin (--spin_us). When the GPU workers run the cpu backend on the same
// cores, an idle expert thread polls only briefly, so it does not take a core from a decode step
// while the step runs. Otherwise the expert workers have cores of their own (up splits them): a
// decode step calls them once a layer, a few hundred microseconds apart, and a spin that outlasts
// the gap (and the gap between two tokens) saves the pool's and the serving thread's futex
// wake-up on every call (bench/RESULTS.md, "Session 27").
constexpr int kSharedCoresSpinUs = 20;
constexpr int kOwnCoresSpinUs = 5000;

// Metrics port of child `i` (GPU workers first, then expert workers): the ones after --port.
std::string MetricsAddr(const LaunchPlan& p, int i) {
  return absl::StrCat("127.0.0.1:", p.o.port == 0 ? 0 : p.o.port + 1 + i);
}

// The weight source's flags every worker gets (the coordinator only the overrides: it reads no
// weights).
void AddWeightSourceArgs(const UpOptions& o, bool load_format, std::vector<std::string>* args) {
  if (load_format) {
    args->push_back("--load-format");
    args->push_back(std::string(LoadFormatName(o.load_format)));
  }
  if (!o.hf_overrides.empty()) {
    args->push_back("--hf-overrides");
    args->push_back(o.hf_overrides);
  }
}

// --log-level / --log-format as given to `up`, for every child.
void AddLogArgs(const UpOptions& o, std::vector<std::string>* args) {
  if (!o.log_level.empty()) args->insert(args->end(), {"--log-level", o.log_level});
  if (!o.log_format.empty()) args->insert(args->end(), {"--log-format", o.log_format});
}

// Tokens of one expert-worker call (--max-tokens): the CPU path's step size, so that at the
// default 2048-token steps a prefill chunk's layer is one call (every expert's weights read once
// for all the chunk's tokens routed to it). With larger steps (coord::LaunchMaxBatchTokens) the
// GPU worker's client cuts a CPU-path call into calls of this many rows
// (gpu_worker/routed_experts_client.h), and the streamed path does not call the expert workers.
constexpr int64_t kExpertCallTokens = 2048;

}  // namespace

std::vector<std::string> ExpertArgs(const LaunchPlan& p, int e) {
  std::vector<std::string> args = {(p.bin / "splitserve-expert-worker").string(),
                                   "--model",
                                   p.o.model,
                                   "--layers",
                                   absl::StrCat("0-", p.n_layers - 1),
                                   "--slice",
                                   absl::StrCat(e, "/", p.experts),
                                   "--isa",
                                   p.o.isa,
                                   "--shm-name",
                                   p.shm_names[e],
                                   "--metrics-listen",
                                   MetricsAddr(p, static_cast<int>(p.gpu_ids.size()) + e),
                                   "--max-tokens",
                                   absl::StrCat(kExpertCallTokens),
                                   "--load-progress-file",
                                   p.load_files[p.gpu_ids.size() + e].second};
  AddWeightSourceArgs(p.o, /*load_format=*/true, &args);
  AddLogArgs(p.o, &args);
  if (const int node = coord::LaunchExpertNode(e, p.experts, p.node_ids); node >= 0) {
    args.push_back("--numa-node");
    args.push_back(absl::StrCat(node));
  }
  args.push_back("--spin_us");
  args.push_back(absl::StrCat(p.backend == "cpu" ? kSharedCoresSpinUs : kOwnCoresSpinUs));
  return args;
}

std::vector<std::string> CoordinatorArgs(const LaunchPlan& p, int http_port) {
  const UpOptions& o = p.o;
  std::vector<std::string> cargs = {(p.bin / "splitserve-coordinator").string(),
                                    "--model",
                                    o.model,
                                    "--tokenizer",
                                    o.tokenizer,
                                    "--cluster",
                                    p.cluster_path,
                                    "--host",
                                    o.host,
                                    "--port",
                                    absl::StrCat(http_port),
                                    "--control-listen",
                                    "127.0.0.1:0",
                                    "--ports-file",
                                    p.ports_file};
  AddWeightSourceArgs(o, /*load_format=*/false, &cargs);
  AddLogArgs(o, &cargs);
  if (!o.api_keys_file.empty()) {  // the path, never the keys (argv is public); or the env
    cargs.push_back("--api-keys-file");
    cargs.push_back(o.api_keys_file);
  }
  if (!o.allowed_origins.empty()) {
    cargs.push_back("--allowed-origins");
    cargs.push_back(o.allowed_origins);
  }
  return cargs;
}

std::vector<std::string> GpuWorkerArgs(const LaunchPlan& p, size_t i, int control_port) {
  std::vector<std::string> args = {(p.bin / "splitserve-gpu-worker").string(),
                                   "--coordinator",
                                   absl::StrCat("127.0.0.1:", control_port),
                                   "--worker-id",
                                   p.gpu_ids[i],
                                   "--listen",
                                   "127.0.0.1:0",
                                   "--backend",
                                   p.backend,
                                   "--model",
                                   p.o.model,
                                   "--kv-tokens",
                                   absl::StrCat(p.kv_tokens),
                                   "--metrics-listen",
                                   MetricsAddr(p, static_cast<int>(i)),
                                   "--load-progress-file",
                                   p.load_files[i].second};
  AddWeightSourceArgs(p.o, /*load_format=*/true, &args);
  if (p.o.dummy_router_skew > 0) {  // only the GPU workers run the router
    args.push_back("--dummy-router-skew");
    args.push_back(absl::StrCat(p.o.dummy_router_skew));
  }
  AddLogArgs(p.o, &args);
  if (p.o.layer_timing_every.has_value()) {
    args.push_back("--layer-timing-every");
    args.push_back(absl::StrCat(*p.o.layer_timing_every));
  }
  if (p.backend == "cuda") {
    args.push_back("--cuda-device");
    args.push_back(absl::StrCat(p.devices[i]));
    args.push_back("--fp64-sums");
    args.push_back(p.o.fp64_sums);
    args.push_back("--gpu-prefill-threshold");
    args.push_back(p.o.gpu_prefill_threshold);
    args.push_back("--gpu-prefill-ring-mib");
    args.push_back(p.o.gpu_prefill_ring_mib);
    args.push_back("--gpu-experts");
    args.push_back(p.o.gpu_experts);
    if (!p.o.gpu_experts_profile.empty()) {
      args.push_back("--gpu-experts-profile");
      args.push_back(std::filesystem::absolute(p.o.gpu_experts_profile).string());
    }
    if (p.o.gpu_experts_rebalance_s.has_value()) {
      args.push_back("--gpu-experts-rebalance-s");
      args.push_back(absl::StrCat(*p.o.gpu_experts_rebalance_s));
    }
  }
  return args;
}

}  // namespace ss
