#include "gpu_worker/stage_loader.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/dummy_weights.h"
#include "common/model/model.h"
#include "common/status.h"
#include "common/weight_source.h"
#include "gpu_worker/cpu_backend.h"
#include "gpu_worker/expert_placement.h"
#include "gpu_worker/memory_plan.h"
#ifdef SS_HAVE_CUDA
#include "gpu_worker/cuda/cuda_backend.h"
#include "gpu_worker/nccl_comm.h"
#include "gpu_worker/nccl_stage_link.h"
#else
namespace ss::gpu {
class NcclComm;  // only a pointer without CUDA: never set
}  // namespace ss::gpu
#endif
#include "spdlog/spdlog.h"

namespace ss::gpu {
namespace {

// How long the cuda backend's expert calls busy-poll for the answer: past a decode call's
// ~1-2 ms, so its answer is read at once instead of after a futex wake-up.
constexpr absl::Duration kCudaShmAnswerSpin = absl::Milliseconds(5);

// The tensors of the checkpoint this stage reads (dummy weights generate only these): its
// blocks, the embedding on stage 0, the head on the last stage (with the MTP blocks where the
// role holds them, as memory_plan.h counts them), and the routed experts of the layers computed
// in this process (those without expert-worker endpoints, routed_experts_client.h).
TensorFilter StageFilter(const ModelConfig& c, const StageRole& role) {
  std::vector<int> local;
  for (int l = role.first_layer; l < role.end_layer; ++l) {
    const bool remote = std::any_of(role.experts.begin(), role.experts.end(),
                                    [l](const LayerExpertsConfig& e) { return e.layer == l; });
    if (!remote) local.push_back(l);
  }
  const int n = role.end_layer - role.first_layer;
  const bool embed = role.stage == 0, head = role.last_stage();
  const bool mtp = head && role.runs_mtp;
  if (local.empty() || static_cast<int>(local.size()) == n) {
    return StageTensors(c, role.first_layer, role.end_layer, embed, head, mtp,
                        /*routed_experts=*/!local.empty());
  }
  // Some layers' experts are local, some remote: the stage's tensors plus the local layers'.
  std::vector<TensorFilter> parts = {
      StageTensors(c, role.first_layer, role.end_layer, embed, head, mtp, false)};
  for (const int l : local) {
    parts.push_back(StageTensors(c, l, l + 1, false, false, false, /*routed_experts=*/true));
  }
  return [parts = std::move(parts)](std::string_view name) {
    return std::any_of(parts.begin(), parts.end(),
                       [name](const TensorFilter& p) { return p(name); });
  };
}

}  // namespace

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

// The budget of an explicit --gpu_experts (a count or a fraction of the stage's experts); 0 for
// none or auto (the cuda backend computes auto's, resident_budget.h).
int64_t ExplicitResidentBudget(const WorkerConfig& c, const ModelConfig& config, int first_layer,
                               int end_layer) {
  const int64_t all = int64_t{end_layer - first_layer} * config.n_routed_experts;
  if (c.gpu_experts_auto || all <= 0) return 0;
  return c.gpu_experts > 0 ? std::min(c.gpu_experts, all)
                           : std::llround(c.gpu_experts_fraction * static_cast<double>(all));
}

// The stage's resident experts for `budget` experts over its layers: the budget's hottest by
// --gpu_experts_profile's counts, or an equal share of each layer with ids spread evenly.
// Empty: none.
absl::StatusOr<std::vector<std::vector<int32_t>>> ResidentSets(const WorkerConfig& c,
                                                               const ModelConfig& config,
                                                               int first_layer, int end_layer,
                                                               int64_t budget) {
  const int n = end_layer - first_layer, E = static_cast<int>(config.n_routed_experts);
  budget = std::min(budget, int64_t{n} * E);
  if (budget <= 0 || n <= 0) return std::vector<std::vector<int32_t>>{};
  if (!c.gpu_experts_profile.empty()) {
    std::ifstream in(c.gpu_experts_profile);
    if (!in) {
      return absl::NotFoundError(
          absl::StrCat("--gpu_experts_profile ", c.gpu_experts_profile, ": cannot open"));
    }
    std::stringstream text;
    text << in.rdbuf();
    ASSIGN_OR_RETURN(LayerCounts counts, HeatProfileFromJson(text.str(), first_layer, n, E));
    return PlaceByCounts(counts, budget).layers;
  }
  return SpreadEvenly(first_layer, n, E, budget).layers;
}

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
  ASSIGN_OR_RETURN(const ModelConfig config, LoadModelConfig(c.source));
  if (role.end_layer < 0) role.end_layer = static_cast<int>(config.n_layers);
  // The layout before any weight is read or generated (the backend checks kv_tokens).
  RETURN_IF_ERROR(CheckStageLayout(config, role.stage, role.num_stages, role.first_layer,
                                   role.end_layer, /*kv_tokens=*/1));
  spdlog::info("loading {} (--load_format {})", c.source.model_dir,
               LoadFormatName(c.source.load_format));
  ASSIGN_OR_RETURN(std::shared_ptr<const model::Model> model,
                   model::Model::Load(c.source, {}, StageFilter(config, role)));
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
  // The cuda backend calls the expert workers from its host call server's thread, which has
  // nothing else to do meanwhile; the cpu backend from the step's thread, which shares the cores.
  if (c.backend == "cuda") o.expert_client.shm_answer_spin = kCudaShmAnswerSpin;
  LoadedStage stage;
  stage.heat = std::make_shared<ExpertHeat>(role.first_layer, role.end_layer,
                                            static_cast<int>(config.n_routed_experts));
  o.expert_client.heat = stage.heat.get();
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
    // The streamed path: its threshold, its ring and this rank's expert stores (the backend
    // allocates the ring and a streamed step's workspace before it fits the KV pool).
    co.gpu_prefill_threshold = c.gpu_prefill_threshold;
    co.gpu_prefill_ring_auto = c.gpu_prefill_ring_auto;
    co.gpu_prefill_ring_bytes = c.gpu_prefill_ring_bytes;
    co.gpu_prefill_slot_bytes = c.gpu_prefill_slot_bytes;
    co.expert_stores = ExpertStoresOf(o.experts);
    ASSIGN_OR_RETURN(co.resident_experts,
                     ResidentSets(c, config, o.first_layer, o.end_layer,
                                  ExplicitResidentBudget(c, config, o.first_layer, o.end_layer)));
    if (c.gpu_experts_auto) {
      // The backend computes the budget from the device's free memory (resident_budget.h).
      co.place_resident = [c, config, first = o.first_layer, end = o.end_layer](int64_t budget) {
        return ResidentSets(c, config, first, end, budget);
      };
    }
    co.expert_heat = stage.heat;
    co.resident_rebalance.interval = absl::Seconds(c.gpu_experts_rebalance_s);
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
    ExportExpertHeat(*metrics, role.worker_id, stage.heat);
    stage.metrics->SetKv(stage.backend->kv_usage());
  }
  RunnerOptions ro;
  ro.stream_wait = absl::Milliseconds(c.stream_wait_ms);
  ro.layer_timing_every = c.layer_timing_every;
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

}  // namespace ss::gpu
