#include "gpu_worker/worker_config.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/dummy_weights.h"
#include "common/layer_list.h"
#include "common/status.h"

namespace ss::gpu {
namespace {

absl::Status CheckHostPort(absl::string_view flag, absl::string_view value) {
  const size_t colon = value.rfind(':');
  int port = -1;
  if (colon == absl::string_view::npos || colon == 0 ||
      !absl::SimpleAtoi(value.substr(colon + 1), &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " '", value, "': expected HOST:PORT"));
  }
  return absl::OkStatus();
}

absl::Status CheckPositive(absl::string_view flag, int64_t v) {
  if (v > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("--", flag, " ", v, " must be > 0"));
}

}  // namespace

std::map<int64_t, ExpertLayerStores> ExpertStoresOf(const std::vector<LayerExpertsConfig>& layers) {
  std::map<int64_t, ExpertLayerStores> out;
  for (const LayerExpertsConfig& l : layers) {
    if (l.endpoints.empty() && l.slice_count == 0) continue;  // computed locally
    std::vector<const ExpertEndpointConfig*> eps;
    for (const ExpertEndpointConfig& e : l.endpoints) eps.push_back(&e);
    std::sort(eps.begin(), eps.end(),
              [](const ExpertEndpointConfig* a, const ExpertEndpointConfig* b) {
                return a->slice_index < b->slice_index;
              });
    ExpertLayerStores& s = out[l.layer];
    s.slice_count = l.slice_count > 0 ? l.slice_count : l.endpoints.front().slice_count;
    for (const ExpertEndpointConfig* e : eps) s.shm_names.push_back(e->shm_name);
  }
  return out;
}

absl::StatusOr<std::pair<int, int>> ParseLayerRange(absl::string_view spec) {
  ASSIGN_OR_RETURN(std::vector<int> layers, ParseLayerList(spec, "--layers"));
  for (size_t i = 1; i < layers.size(); ++i) {
    if (layers[i] != layers[i - 1] + 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--layers '", spec, "': a stage runs one ascending range of layers"));
    }
  }
  return std::make_pair(layers.front(), layers.back() + 1);
}

absl::StatusOr<std::vector<LayerExpertsConfig>> ParseExpertsSpec(absl::string_view spec) {
  std::vector<LayerExpertsConfig> out;
  if (absl::StripAsciiWhitespace(spec).empty()) return out;
  for (absl::string_view raw : absl::StrSplit(spec, ',')) {
    const absl::string_view item = absl::StripAsciiWhitespace(raw);
    const size_t eq = item.find('=');
    if (eq == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--experts item '", item, "': expected LAYERS=shm:NAME or LAYERS=grpc:ADDR"));
    }
    ASSIGN_OR_RETURN(
        std::vector<int> layers,
        ParseLayerList(item.substr(0, eq), absl::StrCat("--experts item '", item, "'")));
    std::vector<absl::string_view> eps = absl::StrSplit(item.substr(eq + 1), '+');
    std::vector<ExpertEndpointConfig> endpoints;
    for (size_t i = 0; i < eps.size(); ++i) {
      const absl::string_view ep = absl::StripAsciiWhitespace(eps[i]);
      ExpertEndpointConfig e;
      e.slice_index = static_cast<int>(i);
      e.slice_count = static_cast<int>(eps.size());
      if (absl::StartsWith(ep, "shm:") && ep.size() > 4) {
        e.shm_name = std::string(ep.substr(4));
      } else if (absl::StartsWith(ep, "grpc:") && ep.size() > 5) {
        e.grpc_address = std::string(ep.substr(5));
        RETURN_IF_ERROR(CheckHostPort("experts grpc endpoint", e.grpc_address));
      } else {
        return absl::InvalidArgumentError(absl::StrCat("--experts item '", item, "': endpoint '",
                                                       ep, "' is not shm:NAME or grpc:HOST:PORT"));
      }
      endpoints.push_back(std::move(e));
    }
    for (const int l : layers) {
      for (const LayerExpertsConfig& prev : out) {
        if (prev.layer == l) {
          return absl::InvalidArgumentError(
              absl::StrCat("--experts: layer ", l, " is given twice"));
        }
      }
      out.push_back({l, endpoints});
      RETURN_IF_ERROR(ValidateLayerExperts(out.back()));
    }
  }
  return out;
}

absl::StatusOr<WorkerConfig> ParseWorkerConfig(const WorkerFlags& f) {
  WorkerConfig c;
  if (f.model.empty()) return absl::InvalidArgumentError("--model DIR is required");
  c.source.model_dir = f.model;
  ASSIGN_OR_RETURN(c.source.load_format, ParseLoadFormat(f.load_format));
  RETURN_IF_ERROR(ValidateHfOverrides(f.hf_overrides));
  c.source.hf_overrides = f.hf_overrides;
  RETURN_IF_ERROR(ValidateDummyRouterSkew(f.dummy_router_skew));
  if (f.dummy_router_skew > 0 && !c.source.dummy()) {
    return absl::InvalidArgumentError("--dummy_router_skew needs --load_format dummy");
  }
  c.source.router_skew = f.dummy_router_skew;
  if (f.backend != "cpu" && f.backend != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("--backend '", f.backend, "': expected cpu or cuda"));
  }
#ifndef SS_HAVE_CUDA
  if (f.backend == "cuda") {
    return absl::UnimplementedError(
        "--backend cuda: this build has no CUDA (no nvcc at configure time); use --backend cpu");
  }
#endif
  c.backend = f.backend;
  if (f.cuda_device < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--cuda_device ", f.cuda_device, " < 0"));
  }
  c.cuda_device = f.cuda_device;
  ASSIGN_OR_RETURN(c.fp64_sums, ParseFp64Sums(f.fp64_sums));
  ASSIGN_OR_RETURN(c.gpu_prefill_threshold, ParseGpuPrefillThreshold(f.gpu_prefill_threshold));
  ASSIGN_OR_RETURN(const GpuPrefillRing ring,
                   ParseGpuPrefillRing(f.gpu_prefill_ring_mib, "--gpu_prefill_ring_mib"));
  if (f.gpu_prefill_slot_kib < 1 || f.gpu_prefill_slot_kib > (kMaxGpuPrefillRingMiB << 10)) {
    return absl::InvalidArgumentError(absl::StrCat("--gpu_prefill_slot_kib ",
                                                   f.gpu_prefill_slot_kib, ": expected 1 to ",
                                                   kMaxGpuPrefillRingMiB << 10, " KiB"));
  }
  c.gpu_prefill_slot_bytes = f.gpu_prefill_slot_kib << 10;
  if (c.gpu_prefill_threshold.mode != GpuPrefillThreshold::Mode::kOff) {
    c.gpu_prefill_ring_auto = ring.is_auto;
    c.gpu_prefill_ring_bytes = ring.is_auto ? kBaseGpuPrefillRingMiB << 20 : ring.mib << 20;
  }
  {
    double v = 0;
    const bool is_auto = f.gpu_experts == "auto";
    if (!is_auto && (!absl::SimpleAtod(f.gpu_experts, &v) || !(v >= 0) || !std::isfinite(v) ||
                     (v >= 1 && v != std::floor(v)))) {
      return absl::InvalidArgumentError(
          absl::StrCat("--gpu_experts ", f.gpu_experts,
                       ": expected auto, a number of experts (0 = none) or a fraction in (0, 1)"));
    }
    const bool any = is_auto || v > 0;
    if (any && f.backend != "cuda") {
      return absl::InvalidArgumentError("--gpu_experts needs --backend cuda");
    }
    c.gpu_experts_auto = is_auto;
    if (v >= 1) c.gpu_experts = static_cast<int64_t>(v);
    if (v > 0 && v < 1) c.gpu_experts_fraction = v;
    if (!f.gpu_experts_profile.empty() && !any) {
      return absl::InvalidArgumentError("--gpu_experts_profile needs --gpu_experts");
    }
    c.gpu_experts_profile = f.gpu_experts_profile;
    if (!(f.gpu_experts_rebalance_s >= 0) || f.gpu_experts_rebalance_s > 86400) {
      return absl::InvalidArgumentError(absl::StrCat("--gpu_experts_rebalance_s ",
                                                     f.gpu_experts_rebalance_s,
                                                     ": expected seconds in [0, 86400]"));
    }
    c.gpu_experts_rebalance_s = f.gpu_experts_rebalance_s;
  }
  RETURN_IF_ERROR(CheckHostPort("listen", f.listen));
  c.listen = f.listen;
  if (!f.advertise.empty()) RETURN_IF_ERROR(CheckHostPort("advertise", f.advertise));
  c.advertise = f.advertise;
  c.port_file = f.port_file;
  if (!f.metrics_listen.empty()) RETURN_IF_ERROR(CheckHostPort("metrics_listen", f.metrics_listen));
  c.metrics_listen = f.metrics_listen;
  c.load_progress_file = f.load_progress_file;
  // --backend cuda: 0 sizes the KV pool to the device's free memory (cuda_backend.h).
  if (!(f.backend == "cuda" && f.kv_tokens == 0)) {
    RETURN_IF_ERROR(CheckPositive("kv_tokens", f.kv_tokens));
  }
  if (f.layer_timing_every < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--layer_timing_every ", f.layer_timing_every,
                                                   ": expected N >= 0 (0: no step is timed)"));
  }
  c.layer_timing_every = f.layer_timing_every;
  RETURN_IF_ERROR(CheckPositive("expert_deadline_ms", f.expert_deadline_ms));
  RETURN_IF_ERROR(CheckPositive("expert_connect_timeout_ms", f.expert_connect_timeout_ms));
  RETURN_IF_ERROR(CheckPositive("stream_wait_ms", f.stream_wait_ms));
  RETURN_IF_ERROR(CheckPositive("coordinator_timeout_ms", f.coordinator_timeout_ms));
  RETURN_IF_ERROR(CheckPositive("collective_timeout_ms", f.collective_timeout_ms));
  c.collective_timeout_ms = f.collective_timeout_ms;
  c.kv_tokens = f.kv_tokens;
  c.expert_deadline_ms = f.expert_deadline_ms;
  c.expert_connect_timeout_ms = f.expert_connect_timeout_ms;
  c.stream_wait_ms = f.stream_wait_ms;
  c.coordinator_timeout_ms = f.coordinator_timeout_ms;
  if (f.insecure_cluster && !f.cluster_token_file.empty()) {
    return absl::InvalidArgumentError(
        "--insecure_cluster and --cluster_token_file exclude each other");
  }
  c.cluster_token_file = f.cluster_token_file;
  c.insecure_cluster = f.insecure_cluster;
  c.worker_id = f.worker_id;
  if (!f.coordinator.empty()) {
    RETURN_IF_ERROR(CheckHostPort("coordinator", f.coordinator));
    c.coordinator = f.coordinator;
    if (f.worker_id.empty()) {
      return absl::InvalidArgumentError("--worker_id is required with --coordinator");
    }
    if (f.stage != 0 || f.num_stages != 1 || !f.layers.empty() || !f.next_stage.empty() ||
        !f.experts.empty() || f.tp_rank != 0 || f.tp_size != 1 || !f.nccl_id_file.empty()) {
      return absl::InvalidArgumentError(
          "--stage, --num_stages, --layers, --next_stage, --experts, --tp_rank, --tp_size and "
          "--nccl_id_file are for standalone runs; with --coordinator the role comes from the "
          "cluster config");
    }
    return c;
  }
  if (f.num_stages < 1 || f.stage < 0 || f.stage >= f.num_stages) {
    return absl::InvalidArgumentError(absl::StrCat("--stage ", f.stage, " --num_stages ",
                                                   f.num_stages, ": need 0 <= stage < stages"));
  }
  c.stage = f.stage;
  c.num_stages = f.num_stages;
  if (f.tp_size < 1 || f.tp_size > 64 || f.tp_rank < 0 || f.tp_rank >= f.tp_size) {
    return absl::InvalidArgumentError(absl::StrCat("--tp_rank ", f.tp_rank, " --tp_size ",
                                                   f.tp_size, ": need 0 <= rank < size <= 64"));
  }
  if (f.tp_size > 1 && f.backend != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("--tp_size ", f.tp_size, ": the ", f.backend, " backend runs TP 1 only"));
  }
  if (f.tp_size > 1 && f.nccl_id_file.empty()) {
    return absl::InvalidArgumentError(
        "--nccl_id_file PATH is required with --tp_size > 1 (standalone: rank 0 writes the TP "
        "group's NCCL id there, the other ranks read it)");
  }
  c.tp_rank = f.tp_rank;
  c.tp_size = f.tp_size;
  c.nccl_id_file = f.nccl_id_file;
  if (!f.layers.empty()) {
    ASSIGN_OR_RETURN(std::tie(c.first_layer, c.end_layer), ParseLayerRange(f.layers));
  } else if (f.num_stages > 1) {
    return absl::InvalidArgumentError("--layers a-b is required with --num_stages > 1");
  }
  if (f.stage < f.num_stages - 1) {
    if (f.next_stage.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("--next_stage HOST:PORT is required: stage ",
                                                     f.stage, " is not the last stage"));
    }
    RETURN_IF_ERROR(CheckHostPort("next_stage", f.next_stage));
  }
  c.next_stage = f.next_stage;
  RETURN_IF_ERROR(CheckPositive("kv_block_tokens", f.kv_block_tokens));
  c.kv_block_tokens = f.kv_block_tokens;
  ASSIGN_OR_RETURN(c.experts, ParseExpertsSpec(f.experts));
  if (c.worker_id.empty()) c.worker_id = absl::StrCat("stage", c.stage);
  return c;
}

std::vector<std::string> WorkerConfig::Describe() const {
  std::vector<std::string> lines = {
      absl::StrCat("coordinator = ", coordinator.empty() ? "(standalone)" : coordinator),
      absl::StrCat("worker_id = ", worker_id),
      absl::StrCat("listen = ", listen),
      absl::StrCat("advertise = ", advertise.empty() ? "(from listen)" : advertise),
      absl::StrCat("backend = ", backend),
      absl::StrCat("fp64_sums = ", Fp64SumsName(fp64_sums)),
      absl::StrCat("gpu_prefill_threshold = ", gpu_prefill_threshold.ToString(),
                   backend == "cuda" ? "" : " (cuda backend only)"),
      absl::StrCat(
          "gpu_experts = ",
          gpu_experts_auto           ? std::string("auto (what the KV pool leaves)")
          : gpu_experts > 0          ? absl::StrCat(gpu_experts)
          : gpu_experts_fraction > 0 ? absl::StrCat(gpu_experts_fraction, " of the stage's")
                                     : std::string("(none)"),
          gpu_experts_profile.empty() ? "" : absl::StrCat(", placed by ", gpu_experts_profile),
          gpu_experts_auto || gpu_experts > 0 || gpu_experts_fraction > 0
              ? (gpu_experts_rebalance_s > 0
                     ? absl::StrCat(", rebalanced every ", gpu_experts_rebalance_s, " s")
                     : std::string(", never rebalanced"))
              : std::string()),
      absl::StrCat("gpu_prefill_ring = ",
                   gpu_prefill_ring_bytes > 0
                       ? absl::StrCat(gpu_prefill_ring_auto
                                          ? std::string("auto (sized at start)")
                                          : absl::StrCat(gpu_prefill_ring_bytes >> 20, " MiB"),
                                      " in slots of ~",
                                      gpu_prefill_slot_bytes % (1 << 20) == 0
                                          ? absl::StrCat(gpu_prefill_slot_bytes >> 20, " MiB")
                                          : absl::StrCat(gpu_prefill_slot_bytes >> 10, " KiB"))
                       : std::string("(none: no streamed path)"),
                   backend == "cuda" ? "" : " (cuda backend only)"),
      absl::StrCat("model = ", source.model_dir),
      absl::StrCat("load_format = ", std::string(LoadFormatName(source.load_format))),
      absl::StrCat("hf_overrides = ", source.hf_overrides.empty() ? "(none)" : source.hf_overrides),
      absl::StrCat("dummy_router_skew = ", source.router_skew),
      absl::StrCat("metrics_listen = ", metrics_listen.empty() ? "(off)" : metrics_listen),
      absl::StrCat("load_progress_file = ",
                   load_progress_file.empty() ? "(none)" : load_progress_file),
      absl::StrCat("kv_tokens = ", kv_tokens),
      absl::StrCat("layer_timing_every = ", layer_timing_every,
                   layer_timing_every == 0 ? " (no per-layer timing)" : ""),
      absl::StrCat("expert_deadline_ms = ", expert_deadline_ms),
      absl::StrCat("expert_connect_timeout_ms = ", expert_connect_timeout_ms),
      absl::StrCat("stream_wait_ms = ", stream_wait_ms),
      absl::StrCat("coordinator_timeout_ms = ", coordinator_timeout_ms),
      absl::StrCat("collective_timeout_ms = ", collective_timeout_ms),
  };
  std::string token = cluster_token_file.empty() ? "$SPLITSERVE_CLUSTER_TOKEN" : cluster_token_file;
  if (insecure_cluster) token = "(none: --insecure_cluster)";
  lines.push_back(absl::StrCat("cluster_token = ", token));
  if (coordinator.empty()) {
    lines.push_back(absl::StrCat("stage = ", stage, " of ", num_stages));
    lines.push_back(absl::StrCat("tp = rank ", tp_rank, " of ", tp_size));
    if (tp_size > 1) lines.push_back(absl::StrCat("nccl_id_file = ", nccl_id_file));
    lines.push_back(end_layer < 0 ? std::string("layers = all")
                                  : absl::StrCat("layers = [", first_layer, ", ", end_layer, ")"));
    lines.push_back(
        absl::StrCat("next_stage = ", next_stage.empty() ? "(last stage)" : next_stage));
    lines.push_back(absl::StrCat("kv_block_tokens = ", kv_block_tokens));
    std::string ex;
    for (const LayerExpertsConfig& l : experts) {
      absl::StrAppend(&ex, ex.empty() ? "" : ", ", l.layer, ":");
      for (const ExpertEndpointConfig& e : l.endpoints) absl::StrAppend(&ex, " ", e.Describe());
    }
    lines.push_back(absl::StrCat("experts = ", ex.empty() ? "(local)" : ex));
  }
  return lines;
}

}  // namespace ss::gpu
