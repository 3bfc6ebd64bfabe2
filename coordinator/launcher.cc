#include "coordinator/launcher.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/build_info.h"
#include "common/layer_list.h"
#include "common/logging.h"
#include "common/model_config.h"
#include "common/numa_topology.h"
#include "common/safetensors.h"
#include "common/stop_signals.h"
#include "common/tensor_parallel.h"
#include "common/weight_source.h"
#include "coordinator/cluster_config.h"
#include "coordinator/console.h"
#include "coordinator/load_display.h"
#include "coordinator/run_dir.h"
#include "coordinator/up_options.h"
#include "coordinator/up_plan.h"
#include "coordinator/up_supervision.h"
#include "proto/cluster_credential.h"

namespace ss {
namespace {

namespace fs = std::filesystem;

// --kv-tokens auto where the workers cannot each fill a GPU of their own.
constexpr int64_t kFallbackKvTokens = 65536;

fs::path SelfDir() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::current_path() : exe.parent_path();
}

int CountGpus() {
  int n = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/dev", ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() > 6 && name.rfind("nvidia", 0) == 0 &&
        name.find_first_not_of("0123456789", 6) == std::string::npos) {
      ++n;
    }
  }
  return n;
}

// "0-27,32-59" for the start-up line.
std::string CpuList(std::vector<int> cpus) {
  std::sort(cpus.begin(), cpus.end());
  return FormatIdList(cpus);
}

// Fills in the default --model and --tokenizer, then checks what `up` reads before it starts
// anything: the model's config, its checkpoint (dummy weights read none: refused here, once,
// rather than by every worker at each of its restarts), the tokenizer and the sibling binaries.
// nullopt after printing why (exit 1).
std::optional<ModelConfig> LoadInputs(const fs::path& bin, UpOptions& o) {
  if (o.model.empty()) {
    o.model = (bin.parent_path() / "share/splitserve/tiny").string();
    std::printf(
        "splitserve up: no --model: serving the bundled tiny model (%s; random weights, "
        "its text is noise)\n",
        o.model.c_str());
  }
  if (o.tokenizer.empty()) o.tokenizer = o.model + "/tokenizer.json";
  absl::StatusOr<ModelConfig> model = LoadModelConfig(WeightSource{
      .model_dir = o.model, .load_format = o.load_format, .hf_overrides = o.hf_overrides});
  if (!model.ok()) {
    std::fprintf(stderr, "splitserve up: %s\n", std::string(model.status().message()).c_str());
    return std::nullopt;
  }
  if (o.load_format != LoadFormat::kDummy) {
    if (absl::StatusOr<std::unique_ptr<Checkpoint>> c = Checkpoint::Open(o.model); !c.ok()) {
      std::fprintf(stderr,
                   "splitserve up: %s (--load-format dummy generates the weights instead)\n",
                   std::string(c.status().message()).c_str());
      return std::nullopt;
    }
  }
  if (!fs::exists(o.tokenizer)) {
    std::fprintf(stderr, "splitserve up: no tokenizer at %s (give --tokenizer FILE)\n",
                 o.tokenizer.c_str());
    return std::nullopt;
  }
  for (const char* b :
       {"splitserve-coordinator", "splitserve-gpu-worker", "splitserve-expert-worker"}) {
    if (!fs::exists(bin / b)) {
      std::fprintf(stderr, "splitserve up: %s is missing next to %s\n", b, bin.c_str());
      return std::nullopt;
    }
  }
  return *std::move(model);
}

// A fresh cluster token for this run (proto/cluster_credential.h): the children inherit it
// through the environment (readable only by this user), never through argv. False after printing
// why (exit 1).
bool SetClusterToken() {
  absl::StatusOr<std::string> token = GenerateClusterToken();
  if (!token.ok()) {
    std::fprintf(stderr, "splitserve up: %s\n", std::string(token.status().message()).c_str());
    return false;
  }
  setenv(kClusterTokenEnv, token->c_str(), 1);
  return true;
}

// Where the children run: resolved from the options, the model and this machine.
struct Layout {
  std::string backend;       // "cpu" or "cuda"
  std::vector<int> devices;  // per GPU worker, stage by stage in TP rank order (cuda)
  int64_t kv_tokens = 0;     // per GPU worker; 0: each fills its GPU's free memory
  coord::LaunchNodes nodes;  // none when the topology cannot be read
  int experts = 0;           // expert workers
  coord::LaunchCpus cpus;
};

// The backend (auto: cuda where GPUs are present and the build has CUDA), the checks of --tp,
// --stage-transport, --backend and --max-model-len against it and the model, the stage count
// (without --stages: one stage per TP group of GPUs) and transport, and each GPU worker's GPU.
// Sets o.stages and o.stage_transport. False after printing why (exit 2).
bool ResolveBackend(const ModelConfig& model, UpOptions& o, Layout* layout) {
  const int gpus = CountGpus();
#ifdef SS_HAVE_CUDA
  constexpr bool kCudaBuilt = true;
#else
  constexpr bool kCudaBuilt = false;
#endif
  std::string& backend = layout->backend;
  backend = o.backend;
  if (backend == "auto") {
    backend = gpus > 0 && kCudaBuilt ? "cuda" : "cpu";
    if (gpus > 0 && !kCudaBuilt) {
      std::printf(
          "splitserve up: %d GPU device(s) found, but this build has no CUDA: using the "
          "cpu backend\n",
          gpus);
    }
  }
  if (o.tp > 1 && backend != "cuda") {
    std::fprintf(stderr,
                 "splitserve up: --tp %d needs the cuda backend (the cpu backend runs TP 1 only)\n",
                 o.tp);
    return false;
  }
  if ((o.gpu_experts != "0" || !o.gpu_experts_profile.empty()) && backend != "cuda") {
    std::fprintf(stderr, "splitserve up: --gpu-experts needs the cuda backend\n");
    return false;
  }
  if (o.gpu_experts_rebalance_s.has_value() && o.gpu_experts == "0") {
    std::fprintf(stderr,
                 "splitserve up: --gpu-experts-rebalance-s needs --gpu-experts (no expert is "
                 "resident to rebalance)\n");
    return false;
  }
  // The streamed path is the cuda backend's: a ring size or a row threshold asks for it (auto, 0
  // and off are what every other backend does anyway).
  if (backend != "cuda" &&
      ((o.gpu_prefill_ring_mib != "auto" && o.gpu_prefill_ring_mib != "0") ||
       (o.gpu_prefill_threshold != "auto" && o.gpu_prefill_threshold != "off"))) {
    std::fprintf(stderr,
                 "splitserve up: --gpu-prefill-ring-mib %s / --gpu-prefill-threshold %s: streaming "
                 "routed experts to the GPU needs the cuda backend (this one is %s)\n",
                 o.gpu_prefill_ring_mib.c_str(), o.gpu_prefill_threshold.c_str(), backend.c_str());
    return false;
  }
  if (o.stage_transport == "nccl" && backend != "cuda") {
    std::fprintf(stderr, "splitserve up: --stage-transport nccl needs the cuda backend\n");
    return false;
  }
  if (backend == "cuda" && (!kCudaBuilt || gpus == 0)) {
    std::fprintf(stderr, "splitserve up: --backend cuda needs a CUDA build and a GPU (%d found)\n",
                 gpus);
    return false;
  }
  if (o.max_model_len > model.max_position_embeddings) {
    std::fprintf(stderr, "splitserve up: --max-model-len %lld exceeds the model's %lld positions\n",
                 static_cast<long long>(o.max_model_len),
                 static_cast<long long>(model.max_position_embeddings));
    return false;
  }
  if (absl::Status split = CheckTensorParallelSplit(model, o.tp); !split.ok()) {
    std::fprintf(stderr, "splitserve up: --tp %d: %s\n", o.tp,
                 std::string(split.message()).c_str());
    return false;
  }
  if (backend == "cuda" && !o.stages_given) {
    o.stages = std::max(1, std::min<int>(gpus / o.tp, model.n_layers));
  }
#ifdef SS_HAVE_NCCL
  constexpr bool kNcclBuilt = true;
#else
  constexpr bool kNcclBuilt = false;
#endif
  o.stage_transport = coord::LaunchStageTransport(o.stage_transport, backend == "cuda", kNcclBuilt,
                                                  o.stages, o.tp, gpus);
  if (backend == "cuda") {
    absl::StatusOr<std::vector<int>> d =
        coord::AssignCudaDevices(o.stages, o.tp, gpus, o.stage_transport == "nccl");
    if (!d.ok()) {
      std::fprintf(stderr, "splitserve up: %s\n", std::string(d.status().message()).c_str());
      return false;
    }
    layout->devices = *d;
    // auto fills the free memory a worker sees at its start: GPU workers that share a GPU would
    // each take what the others left, in start order.
    std::vector<int> sorted = *d;
    std::sort(sorted.begin(), sorted.end());
    if (o.gpu_experts == "auto" &&
        std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
      std::fprintf(stderr,
                   "splitserve up: --gpu-experts auto needs one GPU worker per GPU (these %d "
                   "stages x TP %d share %d GPU(s)); give N or a fraction\n",
                   o.stages, o.tp, gpus);
      return false;
    }
  }
  if (o.stages > model.n_layers) {
    std::fprintf(stderr, "splitserve up: --stages %d exceeds the model's %lld layers\n", o.stages,
                 static_cast<long long>(model.n_layers));
    return false;
  }
  return true;
}

// KV tokens per GPU worker (coord::LaunchKvTokens), said when --kv-tokens auto chose them.
void ResolveKvTokens(const UpOptions& o, Layout* layout) {
  const bool cuda = layout->backend == "cuda";
  layout->kv_tokens = coord::LaunchKvTokens(o.kv_tokens, cuda, layout->devices, kFallbackKvTokens);
  if (o.kv_tokens == 0 && layout->kv_tokens == 0) {
    std::printf("splitserve up: KV cache: each GPU worker fills its GPU's free memory\n");
  } else if (o.kv_tokens == 0 && cuda) {
    std::printf(
        "splitserve up: KV cache: %lld tokens per GPU worker (workers share GPUs; "
        "--kv-tokens N to choose)\n",
        static_cast<long long>(layout->kv_tokens));
  }
}

// The NUMA nodes, the expert-worker count, and the CPUs of each process: the coordinator and the
// GPU workers on cores of their own (cluster_config.h LaunchCpus); prints the split, or why the
// cuda backend runs without one.
void ResolveCpus(const ModelConfig& model, const UpOptions& o, Layout* layout) {
  if (absl::StatusOr<std::unique_ptr<NumaTopology>> topo = NumaTopology::Discover(); topo.ok()) {
    layout->nodes = coord::LaunchNodesOf((*topo)->nodes());
  }
  const std::vector<std::vector<std::vector<int>>>& node_cores = layout->nodes.cores;
  const bool cuda = layout->backend == "cuda";
  const int experts = coord::LaunchExpertWorkers(
      o.expert_workers == "auto" ? 0 : std::atoi(o.expert_workers.c_str()),
      std::max(1, static_cast<int>(layout->nodes.ids.size())), o.tp, cuda, model.moe_inter_dim);
  layout->experts = experts;
  layout->cpus = coord::PlanLaunchCpusFor(node_cores, experts, o.stages * o.tp, true, cuda);
  const coord::LaunchCpus& cpus = layout->cpus;
  if (cuda && !cpus.split() && !node_cores.empty()) {
    std::printf(
        "splitserve up: warning: too few CPU cores to keep %d for the GPU workers and the "
        "coordinator beside the expert workers; every process shares every core, and expert "
        "calls wait on the GPU workers' spinning threads\n",
        o.stages * o.tp + 1);
  }
  if (cpus.split()) {
    std::printf("splitserve up: CPUs: coordinator and GPU workers on %s",
                CpuList(cpus.serving).c_str());
    for (int e = 0; e < experts; ++e) {
      std::printf("; expert%d on %s", e, CpuList(cpus.experts[e]).c_str());
    }
    std::printf("\n");
  }
}

// The layout, in the order its lines print. False after printing why (exit 2).
bool ResolveLayout(const ModelConfig& model, UpOptions& o, Layout* layout) {
  if (!ResolveBackend(model, o, layout)) return false;
  ResolveKvTokens(o, layout);
  ResolveCpus(model, o, layout);
  return true;
}

// The cluster config `up` writes: o.stages equal stages of o.tp GPU workers each, and the expert
// workers, slice i of every layer's experts each on shared-memory segment
// "splitserve-<pid>-expert<i>". Prints the step size it chose.
coord::ClusterConfig BuildClusterConfig(const ModelConfig& model, const UpOptions& o,
                                        const Layout& layout) {
  coord::ClusterConfig cluster;
  cluster.model_name = fs::path(o.model).filename().string();
  if (cluster.model_name.empty()) cluster.model_name = "model";
  int64_t max_ratio = 1;
  for (int64_t r : model.compress_ratios) max_ratio = std::max(max_ratio, r);
  cluster.kv_block_tokens = static_cast<int>(std::max<int64_t>(128, max_ratio));
  // A streamed prefill chunk reads every expert's weights once whatever its tokens: larger chunks
  // where the cuda backend may stream (the GPU workers size their KV pools beside the larger
  // step's workspace and the ring).
  const bool cuda = layout.backend == "cuda";
  const bool may_stream = cuda && o.gpu_prefill_ring_mib != "0" && o.gpu_prefill_threshold != "off";
  cluster.max_batch_tokens =
      static_cast<int>(coord::LaunchMaxBatchTokens(o.max_num_batched_tokens, may_stream));
  cluster.max_running = static_cast<int>(kUpMaxRunning);
  std::printf(
      "splitserve up: steps of up to %d tokens (prefill chunks too; --max-num-batched-tokens)%s\n",
      cluster.max_batch_tokens,
      !cuda ? ""
      : may_stream
          ? absl::StrCat("; large prefill steps stream their routed experts to the GPUs "
                         "(--gpu-prefill-threshold ",
                         o.gpu_prefill_threshold, ", ring ",
                         o.gpu_prefill_ring_mib == "auto"
                             ? std::string("sized by each GPU worker (--gpu-prefill-ring-mib auto)")
                             : absl::StrCat(o.gpu_prefill_ring_mib, " MiB"),
                         ")")
                .c_str()
          : "; routed experts always on the expert workers");
  cluster.max_model_len = static_cast<int>(o.max_model_len);
  cluster.stage_transport = o.stage_transport;
  cluster.enable_prefix_caching = o.prefix_caching;
  const int n_layers = static_cast<int>(model.n_layers);
  for (int s = 0; s < o.stages; ++s) {
    coord::StageSpec st;
    st.first_layer = n_layers * s / o.stages;
    st.end_layer = n_layers * (s + 1) / o.stages;
    for (int r = 0; r < o.tp; ++r) {
      st.workers.push_back(o.tp == 1 ? absl::StrCat("gpu", s) : absl::StrCat("gpu", s, "-", r));
    }
    cluster.stages.push_back(st);
  }
  for (int e = 0; e < layout.experts; ++e) {
    coord::ExpertWorkerSpec w;
    w.id = absl::StrCat("expert", e);
    for (int l = 0; l < n_layers; ++l) w.layers.push_back(l);
    w.slice_index = e;
    w.slice_count = layout.experts;
    w.shm_name = absl::StrCat("splitserve-", getpid(), "-expert", e);
    cluster.expert_workers.push_back(w);
  }
  return cluster;
}

// The plan of every child (up_plan.h), its files in `run_dir`.
LaunchPlan MakePlan(const UpOptions& o, const fs::path& bin, const ModelConfig& model,
                    const Layout& layout, const coord::ClusterConfig& cluster,
                    const RunDir& run_dir) {
  std::vector<std::string> shm_names;
  for (const coord::ExpertWorkerSpec& w : cluster.expert_workers) shm_names.push_back(w.shm_name);
  std::vector<std::string> gpu_ids = cluster.GpuWorkerIds();
  std::vector<std::pair<std::string, std::string>> load_files;  // GPU workers, then experts
  for (const std::string& id : gpu_ids) {
    load_files.emplace_back(id, run_dir.File(absl::StrCat(id, ".load.json")));
  }
  for (const coord::ExpertWorkerSpec& w : cluster.expert_workers) {
    load_files.emplace_back(w.id, run_dir.File(absl::StrCat(w.id, ".load.json")));
  }
  return LaunchPlan{.o = o,
                    .bin = bin,
                    .backend = layout.backend,
                    .n_layers = static_cast<int>(model.n_layers),
                    .experts = layout.experts,
                    .node_ids = layout.nodes.ids,
                    .cpus = layout.cpus,
                    .shm_names = std::move(shm_names),
                    .gpu_ids = std::move(gpu_ids),
                    .cluster_path = run_dir.File("cluster.json"),
                    .ports_file = run_dir.File("ports.json"),
                    .devices = layout.devices,
                    .kv_tokens = layout.kv_tokens,
                    .load_files = std::move(load_files)};
}

// Writes cluster.json into the run directory and loads it back as the coordinator will. False
// after printing why (exit 1).
bool WriteClusterConfig(const RunDir& run_dir, const coord::ClusterConfig& cluster,
                        const ModelConfig& model, const LaunchPlan& plan) {
  if (absl::Status st =
          run_dir.WriteNew("cluster.json", coord::ClusterConfigToJson(cluster) + "\n");
      !st.ok()) {
    std::fprintf(stderr, "splitserve up: %s\n", std::string(st.message()).c_str());
    return false;
  }
  if (absl::StatusOr<coord::ClusterConfig> check =
          coord::LoadClusterConfig(plan.cluster_path, model);
      !check.ok()) {
    std::fprintf(stderr, "splitserve up: internal: %s\n",
                 std::string(check.status().message()).c_str());
    return false;
  }
  return true;
}

}  // namespace

int RunUpCommand(int argc, char** argv) {
  absl::StatusOr<UpOptions> parsed = ParseUpOptions(argc, argv);
  if (!parsed.ok()) {
    std::fprintf(stderr, "splitserve up: %s (see --help)\n",
                 std::string(parsed.status().message()).c_str());
    return 2;
  }
  UpOptions& o = *parsed;
  if (o.help) {
    std::fputs(UpUsage().c_str(), stdout);
    return 0;
  }
  if (o.version) {
    std::printf("%s\n", VersionLine("splitserve").c_str());
    return 0;
  }
  ConfigureLogging("splitserve", o.log_level.empty() ? "info" : o.log_level,
                   o.log_format.empty() ? "text" : o.log_format)
      .IgnoreError();  // validated by ParseUpOptions
  const fs::path bin = SelfDir();
  const std::optional<ModelConfig> model = LoadInputs(bin, o);
  if (!model.has_value() || !SetClusterToken()) return 1;
  Layout layout;
  if (!ResolveLayout(*model, o, &layout)) return 2;

  absl::StatusOr<RunDir> run_dir = RunDir::Create();
  if (!run_dir.ok()) {
    std::fprintf(stderr, "splitserve up: %s\n", std::string(run_dir.status().message()).c_str());
    return 1;
  }
  if (!o.log_dir.empty()) fs::create_directories(o.log_dir);
  const coord::ClusterConfig cluster = BuildClusterConfig(*model, o, layout);
  const LaunchPlan plan = MakePlan(o, bin, *model, layout, cluster, *run_dir);
  if (!WriteClusterConfig(*run_dir, cluster, *model, plan)) return 1;

  // Stop signals: taken with WaitForStopSignal in UpSupervision::Run.
  BlockStopSignals(Sigpipe::kDefault);

  // On a terminal: the load bar below the children's output, which passes through `console`
  // (unless it goes to --log-dir). Declaration order matters twice: the Console is created after
  // the mask above, so its relay thread inherits it; and it is declared before `supervision`,
  // whose Supervisor is therefore destroyed (stopping every child) before the Console, whose relay
  // reads until every child has closed the pipe.
  std::unique_ptr<Console> console;
  if (isatty(fileno(stdout)) != 0) {
    absl::StatusOr<std::unique_ptr<Console>> c = Console::Create(stdout, o.log_dir.empty());
    if (!c.ok()) {
      std::fprintf(stderr, "splitserve up: %s\n", std::string(c.status().message()).c_str());
      return 1;
    }
    console = *std::move(c);
  }
  LoadDisplay load_display(plan.load_files, stdout, console.get());
  UpSupervision supervision(plan, cluster.model_name, console.get(), &load_display);
  return supervision.Run();
}

}  // namespace ss
