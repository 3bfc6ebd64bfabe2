// splitserve-gpu-worker: one pipeline stage (one TP rank) of the model's non-expert layers,
// serving the coordinator's step plans (ARCHITECTURE.md "Processes", proto/cluster.proto).
// Flags: worker_config.h.
//
// Start-up: parse and validate every flag and log them; start the GpuWorker service (not ready);
// with --coordinator: Register (the role: stage, TP rank and size, layers, expert slices),
// Rendezvous (the peers: the next stage's worker of this TP rank; TP > 1: the group's NCCL
// unique id, which this worker creates and publishes when it is the stage's rank 0; under the nccl
// stage transport its stage links' ids, the one to the next stage created here), heartbeat
// every heartbeat_interval_ms; standalone: the role from the flags (TP > 1: the id through
// --nccl_id_file). Then load the model, join the TP group (NcclComm, blocking until every rank
// has joined) and the stage links (NcclStageLink, the outgoing one first), connect this rank's
// expert-worker slices and build the backend: Status reports
// ready (or the start-up error, the worker staying up to report it). Runs until SIGTERM / SIGINT
// (exit 0), until the coordinator says this worker is no longer a member (exit 0; 1 for a TP > 1
// rank or a linked one, whose groups are formed again only by restarting every member:
// cluster.proto 3a, 3b), until a step leaves its TP group or a stage link out of step
// (stage_runner.h; it aborts the communicator, exit 1) or
// the coordinator has been unreachable for --coordinator_timeout_ms (exit 1); then it closes its
// streams and exits. A stop that cannot finish in kStopGrace (a thread blocked in an NCCL
// collective or in joining a group whose peer died) ends the process with _exit.
//
// Exit status: 0 clean stop, 1 a runtime failure (registration refused, coordinator lost, cannot
// listen, TP group or stage link broken), 2 a usage error.
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/cluster_protocol.h"
#include "common/file_write.h"
#include "common/metrics/metrics.h"
#include "common/model/model.h"
#include "common/status.h"
#include "gpu_worker/coordinator_client.h"
#include "gpu_worker/cpu_backend.h"
#ifdef SS_HAVE_CUDA
#include "gpu_worker/cuda/cuda_backend.h"
#include "gpu_worker/nccl_comm.h"
#include "gpu_worker/nccl_stage_link.h"
#endif
#include "gpu_worker/gpu_worker_service.h"
#include "gpu_worker/memory_plan.h"
#include "gpu_worker/worker_config.h"
#include "spdlog/spdlog.h"

using ss::gpu::WorkerFlags;

ABSL_FLAG(std::string, coordinator, "",
          "coordinator HOST:PORT to register with; empty = standalone (role from the flags below)");
ABSL_FLAG(std::string, worker_id, "",
          "this worker's name in the cluster config (standalone default: stage<S>)");
ABSL_FLAG(std::string, listen, WorkerFlags{}.listen,
          "HOST:PORT of the GpuWorker service (port 0 = any free port, logged)");
ABSL_FLAG(std::string, advertise, "",
          "HOST:PORT the coordinator and peers reach this worker at (default: --listen with the "
          "bound port; a wildcard host becomes the hostname)");
ABSL_FLAG(std::string, port_file, "", "write the bound port to this file once listening");
ABSL_FLAG(std::string, backend, WorkerFlags{}.backend, "cpu (the reference model) or cuda");
ABSL_FLAG(std::string, model, "", "checkpoint directory (config.json + model*.safetensors)");
ABSL_FLAG(std::string, metrics_listen, "",
          "HOST:PORT to serve Prometheus metrics on GET /metrics; empty = off");
ABSL_FLAG(int64_t, kv_tokens, WorkerFlags{}.kv_tokens,
          "KV capacity in tokens (reported as kv_tokens / kv_block_tokens blocks); --backend "
          "cuda: 0 sizes the pool to the device's free memory once the weights are loaded");
ABSL_FLAG(int, cuda_device, WorkerFlags{}.cuda_device,
          "--backend cuda: the CUDA device ordinal this worker uses");
ABSL_FLAG(std::string, fp64_sums, WorkerFlags{}.fp64_sums,
          "--backend cuda: the sums the reference forms in double (the compressors, the "
          "indexer's Hadamard) in double (on) or in fp32 (off: for GPUs with slow FP64, such as "
          "an RTX 3090); auto: on where the GPU runs FP64 at 1/4 of FP32 or better");
ABSL_FLAG(bool, plan, false,
          "print the device-memory plan (weights per GPU, KV capacity) of --plan_tp x --plan_pp "
          "GPUs of --plan_gib GiB for --model, then exit: 0 when every GPU fits, 1 when one "
          "does not (it says why)");
ABSL_FLAG(int, plan_tp, 1, "--plan: tensor-parallel size");
ABSL_FLAG(int, plan_pp, 1, "--plan: pipeline stages (layers split evenly)");
ABSL_FLAG(double, plan_gib, 24.0, "--plan: memory of each GPU in GiB");
ABSL_FLAG(int64_t, plan_sequences, ss::gpu::MemoryPlanOptions{}.sequences,
          "--plan: sequences running at once whose compressor state (fp32, outside the KV pool) "
          "each GPU must hold besides the pool");
ABSL_FLAG(int64_t, plan_step_tokens, ss::gpu::MemoryPlanOptions{}.step_tokens,
          "--plan: tokens of the largest step (the coordinator's max_batch_tokens), whose "
          "workspace each GPU keeps free beside the pool");
ABSL_FLAG(std::string, plan_stage_transport, "grpc",
          "--plan: grpc, or nccl to set aside the stage links' streams buffers (PP > 1)");
ABSL_FLAG(int64_t, plan_context, 0,
          "--plan: the longest context the step workspace must serve (0: the model's "
          "max_position_embeddings)");
ABSL_FLAG(int64_t, expert_deadline_ms, WorkerFlags{}.expert_deadline_ms,
          "deadline of one expert-worker call");
ABSL_FLAG(int64_t, expert_connect_timeout_ms, WorkerFlags{}.expert_connect_timeout_ms,
          "how long to wait at start for expert workers that are still loading");
ABSL_FLAG(int64_t, stream_wait_ms, WorkerFlags{}.stream_wait_ms,
          "how long a stage > 0 waits for the previous stage's streams of a micro-batch");
ABSL_FLAG(int64_t, coordinator_timeout_ms, WorkerFlags{}.coordinator_timeout_ms,
          "how long registration retries, and how long the coordinator may stay unreachable "
          "before the worker exits");
ABSL_FLAG(int64_t, collective_timeout_ms, WorkerFlags{}.collective_timeout_ms,
          "TP > 1: deadline of each wait for an NCCL collective (a peer that stopped is an error "
          "after this long, never a hang)");
ABSL_FLAG(std::string, cluster_token_file, "",
          "file holding the cluster token every gRPC call in and out carries (0600; "
          "proto/cluster_credential.h). Environment mirror: SPLITSERVE_CLUSTER_TOKEN");
ABSL_FLAG(bool, insecure_cluster, false,
          "serve the GpuWorker service without a cluster token: any process that can reach it may "
          "drive its steps (trusted single-user machines only)");
ABSL_FLAG(int, stage, 0, "standalone: this worker's pipeline stage");
ABSL_FLAG(int, tp_rank, 0, "standalone: this worker's tensor-parallel rank");
ABSL_FLAG(int, tp_size, 1, "standalone: tensor-parallel ranks of the stage (cuda backend)");
ABSL_FLAG(std::string, nccl_id_file, "",
          "standalone TP > 1: rank 0 writes the TP group's NCCL unique id to this file, the other "
          "ranks wait for it there");
ABSL_FLAG(int, num_stages, 1, "standalone: pipeline stages");
ABSL_FLAG(std::string, layers, "",
          "standalone: the stage's layers a-b (inclusive); empty = every layer");
ABSL_FLAG(std::string, next_stage, "",
          "standalone: HOST:PORT of the next stage's worker (every stage but the last)");
ABSL_FLAG(int, kv_block_tokens, WorkerFlags{}.kv_block_tokens,
          "standalone: tokens per KV block in Status");
ABSL_FLAG(std::string, experts, "",
          "standalone: where routed experts are served, \"a-b=shm:NAME[+grpc:HOST:PORT...],...\" "
          "(the i-th endpoint of a range is slice i); layers not listed run locally");

namespace ss::gpu {
namespace {

constexpr char kName[] = "splitserve-gpu-worker";
// How long a stop may take before the process ends with _exit (worker_main's header).
constexpr absl::Duration kStopGrace = absl::Seconds(15);

// Why and how the process stops; the first Trigger wins.
class StopEvent {
 public:
  void Trigger(int exit_code, const std::string& reason) {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_.load()) return;
    exit_code_ = exit_code;
    reason_ = reason;
    stopped_.store(true);
    cv_.notify_all();
  }
  // True once triggered (waits at most `d`).
  bool WaitFor(absl::Duration d) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, absl::ToChronoMilliseconds(d), [&] { return stopped_.load(); });
  }
  void Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return stopped_.load(); });
  }
  const std::atomic<bool>* flag() const { return &stopped_; }
  int exit_code() const { return exit_code_; }
  const std::string& reason() const { return reason_; }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<bool> stopped_{false};
  int exit_code_ = 0;
  std::string reason_;
};

std::string Hostname() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "localhost";
  return buf;
}

std::string AdvertiseAddress(const WorkerConfig& c, int port) {
  if (!c.advertise.empty()) return c.advertise;
  std::string host = c.listen.substr(0, c.listen.rfind(':'));
  if (host == "0.0.0.0" || host == "[::]" || host == "::" || host.empty()) host = Hostname();
  return absl::StrCat(host, ":", port);
}

// Standalone TP > 1: rank 0 creates the group's id and writes it to `path` (whole, by rename);
// the other ranks wait for the file until `until`.
absl::StatusOr<std::string> StandaloneNcclId(const WorkerConfig& c, absl::Time until,
                                             const std::atomic<bool>* stop) {
#ifdef SS_HAVE_CUDA
  if (c.tp_rank == 0) {
    ASSIGN_OR_RETURN(std::string id, NcclComm::NewUniqueId());
    const std::string tmp = absl::StrCat(c.nccl_id_file, ".tmp.", getpid());
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      out.write(id.data(), static_cast<std::streamsize>(id.size()));
      if (!out) return absl::UnavailableError(absl::StrCat("--nccl_id_file: cannot write ", tmp));
    }
    if (std::rename(tmp.c_str(), c.nccl_id_file.c_str()) != 0) {
      return absl::UnavailableError(
          absl::StrCat("--nccl_id_file: cannot rename ", tmp, " to ", c.nccl_id_file));
    }
    return id;
  }
  while (true) {
    std::ifstream in(c.nccl_id_file, std::ios::binary);
    if (in) {
      std::string id((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      if (id.size() != NcclComm::kUniqueIdBytes) {
        return absl::InvalidArgumentError(absl::StrCat("--nccl_id_file ", c.nccl_id_file, ": ",
                                                       id.size(), " bytes, expected ",
                                                       NcclComm::kUniqueIdBytes));
      }
      return id;
    }
    if (stop->load()) return absl::CancelledError("stopped");
    if (absl::Now() >= until) {
      return absl::DeadlineExceededError(
          absl::StrCat("--nccl_id_file ", c.nccl_id_file, ": TP rank 0 wrote no id in time"));
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
#else
  (void)until;
  (void)stop;
  return absl::UnimplementedError(
      absl::StrCat("--tp_size ", c.tp_size, ": this build has no CUDA"));
#endif
}

// The NCCL ids a worker joins: its TP group's (TP > 1) and, under the nccl stage transport, its
// links' to the previous and the next stage.
struct NcclIds {
  std::string tp;
  std::string link_in, link_out;
};

// Loads the model and builds the stage (TP group, stage links, backend, sender, runner, metrics).
// `on_group_broken`: see RunnerOptions (also called when a stage link breaks).
absl::StatusOr<LoadedStage> LoadStage(const WorkerConfig& c, const ClusterCredential& credential,
                                      StageRole role, const NcclIds& ids, metrics::Metrics* metrics,
                                      StreamInbox* inbox, const std::atomic<bool>* stop,
                                      std::function<void(const std::string&)> on_group_broken) {
  if (role.tp_size < 1 || role.tp_rank < 0 || role.tp_rank >= role.tp_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("the role's TP rank ", role.tp_rank, " of ", role.tp_size));
  }
  if (role.links() && c.backend != "cuda") {
    return absl::UnimplementedError(absl::StrCat(
        "stage_transport nccl needs the cuda backend (this worker runs the ", c.backend, " one)"));
  }
  if (role.tp_size > 1 && c.backend != "cuda") {
    return absl::UnimplementedError(absl::StrCat("the ", c.backend,
                                                 " backend runs TP 1 only; the role is TP rank ",
                                                 role.tp_rank, " of ", role.tp_size));
  }
  if (role.kv_block_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("the role's kv_block_tokens ", role.kv_block_tokens, " < 1"));
  }
  spdlog::info("loading {}", c.model_dir);
  ASSIGN_OR_RETURN(std::shared_ptr<const model::Model> model, model::Model::Load(c.model_dir));
  if (role.end_layer < 0) role.end_layer = static_cast<int>(model->config().n_layers);
  CpuBackendOptions o;
  o.stage = role.stage;
  o.num_stages = role.num_stages;
  o.first_layer = role.first_layer;
  o.end_layer = role.end_layer;
  o.kv_tokens = c.kv_tokens;
  for (const LayerExpertsConfig& l : role.experts) {
    if (l.layer >= role.first_layer && l.layer < role.end_layer) o.experts.push_back(l);
  }
  o.expert_client.call_deadline = absl::Milliseconds(c.expert_deadline_ms);
  o.expert_client.connect_timeout = absl::Milliseconds(c.expert_connect_timeout_ms);
  o.expert_client.cancel = stop;
  o.expert_client.tp_rank = role.tp_rank;
  o.expert_client.tp_size = role.tp_size;
  o.expert_client.credential = credential;
  LoadedStage stage;
  NcclComm* comm_ptr = nullptr;
  if (c.backend == "cuda") {
#ifdef SS_HAVE_CUDA
    if (role.tp_size > 1) {
      // Blocks until every rank of the group has joined (a peer that never comes: kStopGrace).
      spdlog::info("joining stage {}'s TP group as rank {} of {} on CUDA device {}", role.stage,
                   role.tp_rank, role.tp_size, c.cuda_device);
      ASSIGN_OR_RETURN(std::unique_ptr<NcclComm> comm,
                       NcclComm::Create(ids.tp, role.tp_rank, role.tp_size, c.cuda_device));
      comm->set_cancel(stop);  // a stopping worker does not wait out a collective's deadline
      comm_ptr = comm.get();
      stage.borrowed = std::shared_ptr<NcclComm>(std::move(comm));
    }
    // The stage links (stage_link.h): the outgoing one first, so that the chain of joins
    // completes from the last stage back without a cycle. Their buffers hold the largest
    // micro-batch's streams and are allocated before the KV pool takes the free memory.
    const size_t reserve = static_cast<size_t>(std::max(0, role.max_batch_tokens)) *
                           static_cast<size_t>(model->config().hc_mult * model->config().dim) * 2;
    const absl::Duration join_timeout = absl::Milliseconds(c.stream_wait_ms);
    if (role.links() && !role.last_stage()) {
      spdlog::info("joining the NCCL link to stage {}, TP rank {}", role.stage + 1, role.tp_rank);
      ASSIGN_OR_RETURN(stage.link_out,
                       NcclStageLink::Create(ids.link_out, /*sender=*/true, c.cuda_device,
                                             absl::StrCat("the link to stage ", role.stage + 1,
                                                          ", TP rank ", role.tp_rank),
                                             reserve, join_timeout, stop));
    }
    if (role.links() && role.stage > 0) {
      spdlog::info("joining the NCCL link from stage {}, TP rank {}", role.stage - 1, role.tp_rank);
      ASSIGN_OR_RETURN(stage.link_in,
                       NcclStageLink::Create(ids.link_in, /*sender=*/false, c.cuda_device,
                                             absl::StrCat("the link from stage ", role.stage - 1,
                                                          ", TP rank ", role.tp_rank),
                                             reserve, join_timeout, stop));
    }
    // The expert-worker client (this rank's slices), kept alive by the backend's provider.
    ASSIGN_OR_RETURN(std::shared_ptr<RoutedExpertsClient> client,
                     RoutedExpertsClient::Connect(*model, o.experts, o.expert_client));
    CudaBackendOptions co;
    co.stage = o.stage;
    co.num_stages = o.num_stages;
    co.first_layer = o.first_layer;
    co.end_layer = o.end_layer;
    co.kv_tokens = o.kv_tokens;  // 0: what the device's free memory holds
    if (role.max_running > 0) co.kv_sequences = role.max_running;
    if (role.max_batch_tokens > 0) co.max_step_tokens = role.max_batch_tokens;
    co.max_context = role.max_model_len;
    co.kv_block_tokens = role.kv_block_tokens;
    co.device = c.cuda_device;
    co.fp64_sums = c.fp64_sums;
    co.experts = [client](int64_t layer) -> const model::RoutedExperts* {
      return client->remote(layer) ? client.get() : nullptr;
    };
    co.tp_rank = role.tp_rank;
    co.tp_size = role.tp_size;
    co.comm = comm_ptr;
    co.collective_timeout = absl::Milliseconds(c.collective_timeout_ms);
    ASSIGN_OR_RETURN(std::unique_ptr<CudaBackend> cuda, CudaBackend::Create(model, co));
    spdlog::info("CUDA device {} KV pool: {}", c.cuda_device, cuda->kv_fit());
    spdlog::info("CUDA device {}: the reference's double sums run in {} (--fp64_sums {})",
                 c.cuda_device, cuda->fp64_sums() ? "double" : "fp32",
                 ss::gpu::Fp64SumsName(c.fp64_sums));
    stage.backend = std::move(cuda);
#else
    return absl::UnimplementedError("--backend cuda: this build has no CUDA");
#endif
  } else {
    ASSIGN_OR_RETURN(stage.backend, CpuBackend::Create(model, o));
  }
  stage.kv_block_tokens = role.kv_block_tokens;
  if (!role.last_stage() && !role.links()) {
    if (role.next_stage_address.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("stage ", role.stage, " has no address for stage ", role.stage + 1));
    }
    stage.sender = std::make_unique<StreamSender>(role.next_stage_address, credential);
  }
  if (metrics != nullptr) {
    stage.metrics =
        std::make_unique<WorkerMetrics>(*metrics, role.worker_id, role.first_layer, role.end_layer);
    stage.metrics->SetKv(stage.backend->kv_usage());
  }
  RunnerOptions ro;
  ro.stream_wait = absl::Milliseconds(c.stream_wait_ms);
  ro.process_seed = (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
#ifdef SS_HAVE_CUDA
  if (comm_ptr != nullptr) {
    // On the runner's thread, the only one using the communicator.
    ro.on_group_broken = [comm_ptr, on_group_broken](const std::string& why) {
      comm_ptr->Abort();
      if (on_group_broken) on_group_broken(why);
    };
  }
  if (role.links()) {
    ro.on_link_broken = [on_group_broken](const std::string& why) {
      if (on_group_broken) on_group_broken(why);
    };
  }
#else
  (void)comm_ptr;
  (void)on_group_broken;
#endif
  stage.runner = std::make_unique<StageRunner>(
      stage.backend.get(), role, inbox, stage.sender.get(), stage.metrics.get(), ro,
      StageLinks{stage.link_in.get(), stage.link_out.get()});
  const BackendInfo info = stage.backend->info();
  spdlog::info(
      "stage {} of {}, TP rank {} of {}: layers [{}, {}), {} expert layer(s) remote, weights "
      "{:.1f} MB, KV {} tokens = {} blocks of {} ({:.1f} MB)",
      role.stage, role.num_stages, role.tp_rank, role.tp_size, role.first_layer, role.end_layer,
      o.experts.size(), info.weight_bytes / 1e6, info.kv_tokens,
      info.kv_tokens / role.kv_block_tokens, role.kv_block_tokens, info.kv_bytes / 1e6);
  return stage;
}

// --plan: the memory plan of every GPU of a TP x PP layout (gpu_worker/memory_plan.h).
int PrintPlan() {
  const std::string model_dir = absl::GetFlag(FLAGS_model);
  const int tp = absl::GetFlag(FLAGS_plan_tp), pp = absl::GetFlag(FLAGS_plan_pp);
  const double gib = absl::GetFlag(FLAGS_plan_gib);
  MemoryPlanOptions options;
  options.sequences = absl::GetFlag(FLAGS_plan_sequences);
  options.step_tokens = absl::GetFlag(FLAGS_plan_step_tokens);
  options.context = absl::GetFlag(FLAGS_plan_context);
  const std::string transport = absl::GetFlag(FLAGS_plan_stage_transport);
  options.stage_links = transport == "nccl";
  if (model_dir.empty() || tp < 1 || pp < 1 || gib <= 0 || options.sequences < 1 ||
      options.step_tokens < 1 || options.context < 0 ||
      (transport != "grpc" && transport != "nccl")) {
    std::fprintf(stderr,
                 "%s: --plan needs --model DIR, --plan_tp >= 1, --plan_pp >= 1, "
                 "--plan_gib > 0, --plan_sequences >= 1, --plan_step_tokens >= 1, "
                 "--plan_context >= 0 and --plan_stage_transport grpc or nccl\n",
                 kName);
    return 2;
  }
  absl::StatusOr<ModelConfig> model = LoadModelConfig(model_dir);
  if (!model.ok()) {
    std::fprintf(stderr, "%s: %s\n", kName, std::string(model.status().message()).c_str());
    return 1;
  }
  const int n = static_cast<int>(model->n_layers);
  if (pp > n) {
    std::fprintf(stderr, "%s: --plan_pp %d exceeds the model's %d layers\n", kName, pp, n);
    return 2;
  }
  const int64_t device_bytes = static_cast<int64_t>(gib * 1073741824.0);
  std::printf(
      "%s x TP %d x PP %d on %.1f GiB GPUs (routed experts on CPU expert workers), "
      "compressor state of %lld sequences:\n",
      model_dir.c_str(), tp, pp, gib, static_cast<long long>(options.sequences));
  int failures = 0;
  // The pipeline holds its smallest pool's blocks, and a sequence needs the most window blocks
  // of any stage (common/kv_cost_model.h, KvCostModel::Pipeline).
  int64_t min_blocks = -1, max_fixed = 0, block_tokens = 0;
  for (int s = 0; s < pp; ++s) {
    StageLayout l{n * s / pp, n * (s + 1) / pp, tp, s == 0, s == pp - 1, false};
    absl::StatusOr<MemoryPlan> plan = PlanStageMemory(*model, l, device_bytes, options);
    if (!plan.ok()) {
      ++failures;
      std::printf("  stage %d (layers %d-%d), each of %d GPU(s): DOES NOT FIT: %s\n", s,
                  l.first_layer, l.end_layer - 1, tp, std::string(plan.status().message()).c_str());
      continue;
    }
    min_blocks = min_blocks < 0 ? plan->kv_blocks : std::min(min_blocks, plan->kv_blocks);
    max_fixed = std::max(max_fixed, plan->kv_cost.fixed_blocks);
    block_tokens = plan->kv_cost.block_tokens;
    std::printf("  stage %d (layers %d-%d), each of %d GPU(s): %s\n", s, l.first_layer,
                l.end_layer - 1, tp, plan->Describe().c_str());
  }
  if (failures > 0) {
    std::printf("refused: %d stage(s) do not fit\n", failures);
    return 1;
  }
  std::printf(
      "fits: the pipeline holds %lld tokens of KV (its smallest stage pool, less the most window "
      "blocks a stage needs per sequence)\n",
      static_cast<long long>(std::max<int64_t>(0, min_blocks - max_fixed) * block_tokens));
  return 0;
}

int Main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "splitserve-gpu-worker --model DIR [--coordinator HOST:PORT --worker-id ID] "
      "[--listen HOST:PORT] [--backend cpu|cuda] [--kv-tokens N] [--metrics-listen HOST:PORT] | "
      "standalone: [--stage S --num-stages N --layers a-b --next-stage HOST:PORT] "
      "[--experts a-b=shm:NAME|grpc:HOST:PORT,...]");
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view file) {
    return absl::StrContains(file, "gpu_worker_main");
  };
  usage.contains_helpshort_flags = usage.contains_help_flags;
  absl::SetFlagsUsageConfig(usage);
  NormalizeFlagDashes(argc, argv);
  const std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (rest.size() > 1) {
    std::fprintf(stderr, "%s: unexpected argument '%s'\n", kName, rest[1]);
    return 2;
  }
  if (absl::GetFlag(FLAGS_plan)) return PrintPlan();
  WorkerFlags f;
  f.coordinator = absl::GetFlag(FLAGS_coordinator);
  f.worker_id = absl::GetFlag(FLAGS_worker_id);
  f.listen = absl::GetFlag(FLAGS_listen);
  f.advertise = absl::GetFlag(FLAGS_advertise);
  f.port_file = absl::GetFlag(FLAGS_port_file);
  f.backend = absl::GetFlag(FLAGS_backend);
  f.model = absl::GetFlag(FLAGS_model);
  f.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  f.kv_tokens = absl::GetFlag(FLAGS_kv_tokens);
  f.cuda_device = absl::GetFlag(FLAGS_cuda_device);
  f.fp64_sums = absl::GetFlag(FLAGS_fp64_sums);
  f.expert_deadline_ms = absl::GetFlag(FLAGS_expert_deadline_ms);
  f.expert_connect_timeout_ms = absl::GetFlag(FLAGS_expert_connect_timeout_ms);
  f.stream_wait_ms = absl::GetFlag(FLAGS_stream_wait_ms);
  f.coordinator_timeout_ms = absl::GetFlag(FLAGS_coordinator_timeout_ms);
  f.collective_timeout_ms = absl::GetFlag(FLAGS_collective_timeout_ms);
  f.tp_rank = absl::GetFlag(FLAGS_tp_rank);
  f.tp_size = absl::GetFlag(FLAGS_tp_size);
  f.nccl_id_file = absl::GetFlag(FLAGS_nccl_id_file);
  f.stage = absl::GetFlag(FLAGS_stage);
  f.num_stages = absl::GetFlag(FLAGS_num_stages);
  f.layers = absl::GetFlag(FLAGS_layers);
  f.next_stage = absl::GetFlag(FLAGS_next_stage);
  f.kv_block_tokens = absl::GetFlag(FLAGS_kv_block_tokens);
  f.experts = absl::GetFlag(FLAGS_experts);
  f.cluster_token_file = absl::GetFlag(FLAGS_cluster_token_file);
  f.insecure_cluster = absl::GetFlag(FLAGS_insecure_cluster);
  auto parsed = ParseWorkerConfig(f);
  if (!parsed.ok()) {
    std::fprintf(stderr, "%s: %s\n", kName, std::string(parsed.status().message()).c_str());
    return 2;
  }
  const WorkerConfig& c = *parsed;
  absl::StatusOr<ClusterCredential> credential =
      ClusterCredential::Load(c.cluster_token_file, c.insecure_cluster);
  if (!credential.ok()) {
    std::fprintf(stderr, "%s: %s\n", kName, std::string(credential.status().message()).c_str());
    return 2;
  }
  spdlog::info("{} (cluster protocol version {})", kName, kClusterProtocolVersion);
  for (const std::string& line : c.Describe()) spdlog::info("  {}", line);
  if (credential->insecure()) {
    spdlog::warn("--insecure_cluster: the GpuWorker service accepts unauthenticated calls");
  }

  // Stop signals are taken by one thread (sigwait); every other thread, gRPC's included, is
  // started after this mask and inherits it.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);
  StopEvent stop;
  std::thread signal_thread([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    stop.Trigger(0, sig == SIGINT ? "SIGINT" : "SIGTERM");
  });
  // A stop that cannot finish (a thread blocked in a collective or in joining a TP group whose
  // peer died) must not keep the process: after kStopGrace it ends with _exit.
  std::mutex done_mu;
  std::condition_variable done_cv;
  bool done = false;
  std::thread watchdog([&] {
    stop.Wait();
    std::unique_lock<std::mutex> lock(done_mu);
    if (!done_cv.wait_for(lock, absl::ToChronoMilliseconds(kStopGrace), [&] { return done; })) {
      spdlog::error("stopping ({}) did not finish in {}: exiting now", stop.reason(),
                    absl::FormatDuration(kStopGrace));
      spdlog::default_logger()->flush();
      _exit(stop.exit_code());
    }
  });
  int exit_code = 0;
  {
    std::unique_ptr<metrics::Metrics> metrics;
    if (!c.metrics_listen.empty()) {
      metrics = std::make_unique<metrics::Metrics>();
      if (absl::Status st = metrics->Listen(c.metrics_listen); !st.ok()) {
        spdlog::error("--metrics_listen: {}", std::string(st.message()));
        stop.Trigger(1, "cannot serve metrics");
      } else {
        spdlog::info("serving metrics on {} (port {})", c.metrics_listen, metrics->port());
      }
    }
    std::unique_ptr<GpuWorkerServer> server;
    if (!stop.flag()->load()) {
      auto s = GpuWorkerServer::Start(c.listen, c.worker_id, *credential);
      if (!s.ok()) {
        spdlog::error("{}", std::string(s.status().message()));
        stop.Trigger(1, "cannot listen");
      } else {
        server = std::move(*s);
        spdlog::info("serving GpuWorker on {} (port {})", c.listen, server->port());
        if (!c.port_file.empty()) {  // written whole: readers never see a part
          const absl::Status w =
              WriteFileAtomically(c.port_file, absl::StrCat(server->port(), "\n"));
          if (!w.ok()) spdlog::warn("--port_file: {}", std::string(w.message()));
        }
      }
    }
    std::unique_ptr<CoordinatorClient> coordinator;
    std::thread heartbeat;
    StageRole role;
    NcclIds nccl_ids;
    bool have_role = false;
    if (server != nullptr && !c.coordinator.empty()) {
      coordinator = std::make_unique<CoordinatorClient>(c.coordinator, *credential);
      const std::string address = AdvertiseAddress(c, server->port());
      DeviceDescription device;
      device.host = Hostname();
      const absl::Time until = absl::Now() + absl::Milliseconds(c.coordinator_timeout_ms);
      auto r = coordinator->Register(c.worker_id, address, c.backend, device, until, stop.flag());
      if (!r.ok()) {
        spdlog::error("{}", std::string(r.status().message()));
        stop.Trigger(1, "registration failed");
      } else {
        role = *r;
        spdlog::info("registered as '{}' at {}: stage {} of {}, TP rank {} of {}, layers [{}, {})",
                     c.worker_id, address, role.stage, role.num_stages, role.tp_rank, role.tp_size,
                     role.first_layer, role.end_layer);
        const int interval_ms = std::max(50, role.heartbeat_interval_ms);
        heartbeat = std::thread([&, interval_ms] {
          absl::Time last_ok = absl::Now();
          while (!stop.WaitFor(absl::Milliseconds(interval_ms))) {
            auto hb = coordinator->Heartbeat(c.worker_id,
                                             absl::Milliseconds(std::max(1000, interval_ms)));
            if (hb.ok() && !*hb) {
              // A TP rank (or a linked worker) exits 1 so that its supervisor restarts it: its
              // group is formed again only by every member's new process.
              const bool grouped = role.tp_size > 1 || role.links();
              stop.Trigger(grouped ? 1 : 0,
                           grouped ? "the coordinator no longer counts this worker (or a peer of "
                                     "its TP group or stage links) as a member: the groups must "
                                     "be formed anew"
                                   : "the coordinator no longer counts this worker as a member");
            } else if (hb.ok()) {
              last_ok = absl::Now();
            } else if (absl::Now() - last_ok > absl::Milliseconds(c.coordinator_timeout_ms)) {
              stop.Trigger(1,
                           absl::StrCat("the coordinator has been unreachable for ",
                                        c.coordinator_timeout_ms, " ms: ", hb.status().message()));
            }
          }
        });
        // TP rank 0 of a TP > 1 stage creates the group's id (cluster.proto, step 3).
        std::map<std::string, std::string> publish;
        absl::Status setup = absl::OkStatus();
        if (role.tp_size > 1 && role.tp_rank == 0) {
#ifdef SS_HAVE_CUDA
          if (c.backend == "cuda") {
            absl::StatusOr<std::string> id = NcclComm::NewUniqueId();
            if (id.ok()) {
              publish[TpGroupName(role.stage)] = *id;
            } else {
              setup = id.status();
            }
          }
#endif
        }
        // Under the nccl stage transport each sending worker creates its link's id (3b).
        if (role.links() && !role.last_stage() && setup.ok()) {
#ifdef SS_HAVE_CUDA
          absl::StatusOr<std::string> id = NcclComm::NewUniqueId();
          if (id.ok()) {
            publish[PpLinkName(role.stage, role.tp_rank)] = *id;
          } else {
            setup = id.status();
          }
#else
          setup = absl::UnimplementedError("stage_transport nccl: this build has no CUDA");
#endif
        }
        absl::StatusOr<RendezvousResult> met =
            setup.ok() ? coordinator->Rendezvous(
                             c.worker_id, publish,
                             until + absl::Milliseconds(c.coordinator_timeout_ms), stop.flag())
                       : absl::StatusOr<RendezvousResult>(setup);
        if (met.ok() && role.tp_size > 1) {
          auto it = met->nccl_ids.find(TpGroupName(role.stage));
          if (it == met->nccl_ids.end()) {
            met = absl::FailedPreconditionError(absl::StrCat("rendezvous: no NCCL id for stage ",
                                                             role.stage, "'s TP group '",
                                                             TpGroupName(role.stage), "'"));
          } else {
            nccl_ids.tp = it->second;
          }
        }
        if (met.ok() && role.links()) {
          for (auto [stage, to] : {std::pair{role.stage, &nccl_ids.link_out},
                                   std::pair{role.stage - 1, &nccl_ids.link_in}}) {
            if (stage < 0 || stage + 1 >= role.num_stages) continue;
            auto it = met->nccl_ids.find(PpLinkName(stage, role.tp_rank));
            if (it == met->nccl_ids.end()) {
              met = absl::FailedPreconditionError(
                  absl::StrCat("rendezvous: no NCCL id for the stage link '",
                               PpLinkName(stage, role.tp_rank), "'"));
              break;
            }
            *to = it->second;
          }
        }
        if (!met.ok()) {
          server->SetError(std::string(met.status().message()));
          spdlog::error("{}", std::string(met.status().message()));
        } else {
          for (const PeerWorker& p : met->peers) {
            if (p.stage == role.stage + 1 && p.tp_rank == role.tp_rank) {
              role.next_stage_address = p.address;
            }
          }
          have_role = true;
        }
      }
    } else if (server != nullptr) {
      role.worker_id = c.worker_id;
      role.stage = c.stage;
      role.num_stages = c.num_stages;
      role.first_layer = c.first_layer;
      role.end_layer = c.end_layer;
      role.tp_rank = c.tp_rank;
      role.tp_size = c.tp_size;
      role.experts = ExpertSlicesForRank(c.experts, c.tp_rank, c.tp_size);
      role.kv_block_tokens = c.kv_block_tokens;
      role.next_stage_address = c.next_stage;
      have_role = true;
      if (c.tp_size > 1) {
        absl::StatusOr<std::string> id = StandaloneNcclId(
            c, absl::Now() + absl::Milliseconds(c.coordinator_timeout_ms), stop.flag());
        if (id.ok()) {
          nccl_ids.tp = *id;
        } else {
          server->SetError(std::string(id.status().message()));
          spdlog::error("{}", std::string(id.status().message()));
          have_role = false;
        }
      }
    }
    if (have_role && !stop.flag()->load()) {
      auto on_group_broken = [&stop](const std::string& why) {
        stop.Trigger(1, absl::StrCat("a step may have left the TP group or a stage link out of "
                                     "step (",
                                     why, "): communicator aborted, it must be formed anew"));
      };
      auto stage = LoadStage(c, *credential, role, nccl_ids, metrics.get(), &server->inbox(),
                             stop.flag(), on_group_broken);
      if (!stage.ok()) {
        spdlog::error("start-up failed: {}", std::string(stage.status().message()));
        server->SetError(std::string(stage.status().message()));
      } else {
        server->SetStage(std::move(*stage));
        spdlog::info("ready");
      }
    }
    stop.Wait();
    exit_code = stop.exit_code();
    spdlog::info("stopping: {}", stop.reason());
    // Open Steps streams are cancelled at once; the grace is for unary calls in flight (gRPC
    // also waits it out while a client keeps an idle channel open).
    if (server != nullptr) server->Shutdown(absl::Milliseconds(500));
    if (heartbeat.joinable()) heartbeat.join();
  }
  {
    std::lock_guard<std::mutex> lock(done_mu);
    done = true;
  }
  done_cv.notify_all();
  watchdog.join();
  // Wake the signal thread if it is still waiting (the stop came from elsewhere).
  pthread_kill(signal_thread.native_handle(), SIGTERM);
  signal_thread.join();
  spdlog::info("stopped");
  return exit_code;
}

}  // namespace
}  // namespace ss::gpu

int main(int argc, char** argv) { return ss::gpu::Main(argc, argv); }
