// The GPU worker's command line, parsed once into a validated WorkerConfig (STYLE.md "One
// configuration table"), and the StageRole it runs (from the coordinator's Role, or from the
// standalone flags when no --coordinator is given).
//
// Flags (dashes or underscores; gpu_worker_main.cc declares them):
//   --coordinator HOST:PORT   register with this coordinator (else: standalone)
//   --worker_id ID            the role's name in the cluster config (standalone default stage<S>)
//   --listen HOST:PORT        the GpuWorker service (port 0 = any free port; logged)
//   --advertise HOST:PORT     the address peers and the coordinator use (default: --listen with
//                             the bound port; a wildcard host becomes this machine's hostname)
//   --port_file PATH          write the bound port there once listening (for launchers, tests)
//   --backend cpu|cuda        cuda needs a build with CUDA (TP > 1: with NCCL); cpu runs TP 1
//   --model DIR               checkpoint directory (required)
//   --load_format auto|safetensors|dummy  how the weights are obtained (vLLM's --load-format;
//                             dummy: generated in memory, DIR needs only config.json)
//   --hf_overrides JSON       a JSON object merged into config.json at start (vLLM's
//                             --hf-overrides; common/weight_source.h)
//   --dummy_router_skew S     --load_format dummy only: the router skew of common/dummy_weights.h
//                             on the learned-routing layers' gate.bias (0 = none; S >= 0)
//   --metrics_listen HOST:PORT  Prometheus /metrics (empty = off)
//   --load_progress_file PATH the load's progress as JSON (common/load_progress.h), for launchers
//   --kv_tokens N             KV capacity in tokens (cpu backend: sum of live positions); with
//                             --backend cuda 0 sizes the pool to the GPU's free memory
//   --cuda_device N           --backend cuda: the CUDA device ordinal (default 0)
//   --fp64_sums auto|on|off   --backend cuda: the reference's double sums in double or fp32
//                             (fp64_sums.h; auto: double where the GPU's FP64 is fast)
//   --gpu_prefill_threshold auto|off|N  --backend cuda: the steps whose routed experts are
//                             streamed to the GPU (streamed_prefill.h): auto by the measured
//                             rates, off never, N every step of at least N rows
//   --gpu_prefill_ring_mib auto|MIB  --backend cuda: the streamed path's staging ring (0: no
//                             streamed path; off also leaves the ring unallocated; auto:
//                             ring_budget.h)
//   --gpu_prefill_slot_kib KIB  --backend cuda: the size the ring's slots aim at (at least 4
//                             slots, as many as the ring holds; streamed_prefill.h PlanRing)
//   --gpu_experts auto|N|FRACTION  --backend cuda: routed experts resident on the GPU over the
//                             stage's layers (0: none); auto: as many as the device holds once
//                             the KV pool keeps room for --kv_tokens tokens (0: the longest
//                             sequence served), resident_budget.h
//   --gpu_experts_profile PATH  routing counts that place them (needs --gpu_experts, auto too)
//   --layer_timing_every N    the per-layer latency metrics time every Nth step and every step
//                             with a chunk of 64 or more tokens (default 16; 1: every step;
//                             0: none), StageRunner
//   --expert_deadline_ms MS   deadline of one expert call
//   --expert_connect_timeout_ms MS  how long to wait for expert workers that are loading
//   --stream_wait_ms MS       how long a stage > 0 waits for the previous stage's streams
//   --coordinator_timeout_ms MS  registration retries / heartbeat silence before giving up
//   --collective_timeout_ms MS   TP > 1: deadline of each wait for an NCCL collective
//   --cluster_token_file PATH    the cluster token every gRPC call in and out carries
//                             (env mirror SPLITSERVE_CLUSTER_TOKEN; proto/cluster_credential.h)
//   --insecure_cluster        no token: the GpuWorker service accepts any caller (exclusive with
//                             a token; without either the worker refuses to start)
//   standalone only: --stage S, --num_stages N, --layers a-b (inclusive), --next_stage ADDR (the
//   next stage's worker of this TP rank), --kv_block_tokens N, --experts "a-b=EP[+EP...],..."
//   with EP = shm:NAME | grpc:HOST:PORT, the i-th EP of a range being slice i of n (a TP rank
//   keeps the slices i with i mod tp_size == tp_rank), --tp_rank R --tp_size N (cuda) with
//   --nccl_id_file PATH: rank 0 writes its TP group's NCCL unique id there (whole, by rename),
//   the other ranks wait for it (up to --coordinator_timeout_ms) -- one file per group and run,
//   removed by whoever starts the ranks.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/cluster_defaults.h"
#include "common/fp64_sums.h"
#include "common/gpu_prefill_flags.h"
#include "common/layer_list.h"
#include "common/weight_source.h"
#include "gpu_worker/expert_store_map.h"
#include "gpu_worker/routed_experts_client.h"

namespace ss::gpu {

// The flags' raw values, as the command line gave them.
struct WorkerFlags {
  std::string coordinator;
  std::string worker_id;
  std::string listen = "127.0.0.1:0";
  std::string advertise;
  std::string port_file;
  std::string backend = "cpu";
  std::string model;
  std::string load_format = "auto";
  std::string hf_overrides;
  double dummy_router_skew = 0.0;
  std::string metrics_listen;
  std::string load_progress_file;
  int64_t kv_tokens = 16384;
  int cuda_device = 0;  // --backend cuda: the CUDA device ordinal
  std::string fp64_sums = "auto";
  std::string gpu_prefill_threshold = "auto";
  std::string gpu_prefill_ring_mib = "auto";
  int64_t gpu_prefill_slot_kib = kGpuPrefillSlotBytes >> 10;
  std::string gpu_experts = "0";
  std::string gpu_experts_profile;
  double gpu_experts_rebalance_s = 10;
  int layer_timing_every = 16;
  int64_t expert_deadline_ms = 30000;
  int64_t expert_connect_timeout_ms = 60000;
  int64_t stream_wait_ms = 120000;
  int64_t coordinator_timeout_ms = 60000;
  int64_t collective_timeout_ms = 300000;
  int tp_rank = 0;
  int tp_size = 1;
  std::string nccl_id_file;
  int stage = 0;
  int num_stages = 1;
  std::string layers;  // standalone: "a-b"; empty = every layer (one stage)
  std::string next_stage;
  int kv_block_tokens = kDefaultKvBlockTokens;
  std::string experts;
  std::string cluster_token_file;
  bool insecure_cluster = false;
};

struct WorkerConfig {
  std::string coordinator;  // empty: standalone
  std::string worker_id;
  std::string listen, advertise, port_file;
  std::string backend;
  WeightSource source;  // --model, --load_format, --hf_overrides, --dummy_router_skew
  std::string metrics_listen;
  std::string load_progress_file;  // SetLoadProgressFile's path; empty = none
  int64_t kv_tokens = 0;
  int cuda_device = 0;
  Fp64Sums fp64_sums = Fp64Sums::kAuto;
  // The streamed path (cuda backend only): the threshold and the ring, auto (sized by the cuda
  // backend at start, ring_budget.h) or its bytes, 0 when the path is off (ring 0, or threshold
  // off; auto is then false).
  GpuPrefillThreshold gpu_prefill_threshold;
  bool gpu_prefill_ring_auto = false;
  int64_t gpu_prefill_ring_bytes = 0;
  int64_t gpu_prefill_slot_bytes = kGpuPrefillSlotBytes;
  // Resident experts (cuda backend only): a count over the stage's layers, a fraction of them, or
  // auto (at most one of the three is set; auto: the budget the cuda backend computes from the
  // device's free memory, resident_budget.h), and the profile that places them (empty: an even
  // spread).
  int64_t gpu_experts = 0;
  double gpu_experts_fraction = 0;
  bool gpu_experts_auto = false;
  std::string gpu_experts_profile;
  double gpu_experts_rebalance_s = 10;  // 0: the resident set stays as placed at start
  int layer_timing_every = 1;           // RunnerOptions::layer_timing_every
  int64_t expert_deadline_ms = 0, expert_connect_timeout_ms = 0;
  int64_t stream_wait_ms = 0, coordinator_timeout_ms = 0;
  int64_t collective_timeout_ms = 0;
  // Standalone role (validated against the model when it is loaded).
  int stage = 0, num_stages = 1;
  int tp_rank = 0, tp_size = 1;
  std::string nccl_id_file;             // standalone TP > 1
  int first_layer = 0, end_layer = -1;  // end -1: the model's n_layers
  std::string next_stage;
  int kv_block_tokens = kDefaultKvBlockTokens;
  std::vector<LayerExpertsConfig> experts;
  // The credential's source, for ClusterCredential::Load (which reads the file or environment).
  std::string cluster_token_file;
  bool insecure_cluster = false;

  // One "name = value" line per flag, for the start-up log.
  std::vector<std::string> Describe() const;
};

// Validates every flag (InvalidArgument naming the flag and its value). Standalone flags given
// together with --coordinator are refused (the coordinator's role would silently win).
absl::StatusOr<WorkerConfig> ParseWorkerConfig(const WorkerFlags& flags);

// The expert stores of a rank's remote layers (its role's experts: this rank's slices) as the
// cuda backend's streamed path opens them (CudaBackendOptions::expert_stores): per layer with
// endpoints or a slice count, the shared-memory names of its slices in slice order ("" for a
// slice served over gRPC) and the layer's slice count over the TP group. Layers computed locally
// (no endpoints, slice count 0) have no entry.
std::map<int64_t, ExpertLayerStores> ExpertStoresOf(const std::vector<LayerExpertsConfig>& layers);

// "a-b" (inclusive) or "a" -> [a, b + 1).
absl::StatusOr<std::pair<int, int>> ParseLayerRange(absl::string_view spec);

// The --experts syntax above -> one LayerExpertsConfig per layer, validated.
absl::StatusOr<std::vector<LayerExpertsConfig>> ParseExpertsSpec(absl::string_view spec);

// What a worker runs.
struct StageRole {
  std::string worker_id;
  int stage = 0, num_stages = 1;
  int tp_rank = 0, tp_size = 1;
  int first_layer = 0, end_layer = 0;  // [first_layer, end_layer)
  bool runs_mtp = false;
  std::vector<LayerExpertsConfig> experts;  // this TP rank's slices (routed_experts_client.h)
  int kv_block_tokens = kDefaultKvBlockTokens;
  int max_batch_tokens = 0;
  int max_running = 0;
  int max_model_len = 0;  // the coordinator's; 0: the model's max_position_embeddings
  int heartbeat_interval_ms = kDefaultHeartbeatIntervalMs;
  std::string model_name;
  std::string next_stage_address;        // non-last stage: stage + 1's worker of the same TP rank
  std::string stage_transport = "grpc";  // "grpc" | "nccl" (stage_link.h)

  // The nccl stage transport's links of a run with more than one stage.
  bool links() const { return stage_transport == "nccl" && num_stages > 1; }

  bool last_stage() const { return stage == num_stages - 1; }
};

using ss::NormalizeFlagDashes;  // common/layer_list.h

}  // namespace ss::gpu
