// The flag table of splitserve-gpu-worker (worker_flags.h).
#include "gpu_worker/worker_flags.h"

#include <string>

#include "absl/flags/flag.h"
#include "gpu_worker/plan_command.h"
#include "gpu_worker/worker_config.h"

using ss::gpu::PlanFlags;
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
ABSL_FLAG(std::string, load_format, WorkerFlags{}.load_format,
          "how the weights are obtained (vLLM's --load-format): auto or safetensors read --model's "
          "safetensors; dummy generates them in memory (--model needs only config.json)");
ABSL_FLAG(std::string, hf_overrides, "",
          "a JSON object merged into config.json at start (vLLM's --hf-overrides), e.g. "
          "'{\"n_routed_experts\": 128}'; every structural check still applies");
ABSL_FLAG(double, dummy_router_skew, WorkerFlags{}.dummy_router_skew,
          "--load_format dummy only: S >= 0 adds -S*ln(1+rank) to each learned-routing layer's "
          "gate.bias, ranks from a fixed per-layer permutation (common/dummy_weights.h), so the "
          "router prefers a hot set of experts; hash-routed layers are unchanged; 0 = none");
ABSL_FLAG(std::string, load_progress_file, "",
          "a file the load's progress is written to (JSON, rewritten whole; common/"
          "load_progress.h), for a launcher to show; empty = none");
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
ABSL_FLAG(std::string, gpu_prefill_threshold, WorkerFlags{}.gpu_prefill_threshold,
          "--backend cuda only: when a step's routed experts are streamed to the GPU instead of "
          "computed by the CPU expert workers: auto (from the measured H2D bandwidth and CPU "
          "expert rate), off (never), or N (every step of at least N tokens)");
ABSL_FLAG(std::string, gpu_prefill_ring_mib, WorkerFlags{}.gpu_prefill_ring_mib,
          "--backend cuda only: auto | MIB, device memory of the streamed path's staging ring, "
          "set aside beside the KV pool with a streamed step's workspace, cut into slots of "
          "~256 MiB (at least 4); 0 = no streamed path; auto: 3072, 2048 or 1024 MiB, the largest "
          "that leaves the KV pool its tokens, 1024 where routed experts are resident or "
          "--kv_tokens is given (gpu_worker/ring_budget.h)");
ABSL_FLAG(int64_t, gpu_prefill_slot_kib, WorkerFlags{}.gpu_prefill_slot_kib,
          "--backend cuda only: the size each slot of the streamed path's ring aims at, KiB: at "
          "least 4 slots, as many as the ring holds (gpu_worker/streamed_prefill.h PlanRing)");
ABSL_FLAG(std::string, gpu_experts, WorkerFlags{}.gpu_experts,
          "--backend cuda only: routed experts kept resident on the GPU for decode "
          "(gpu_worker/cuda/resident_routed_experts.h): N experts over the stage's layers, a "
          "fraction in (0, 1) of them, or auto: as many as fit once the KV pool keeps room for "
          "--kv_tokens tokens (0: the longest sequence served, at least 8192) beside the "
          "compressor states, the step and resident workspaces, the streamed ring and the "
          "reserve (gpu_worker/resident_budget.h; --plan prints the figure); 0 = none");
ABSL_FLAG(std::string, gpu_experts_profile, "",
          "--gpu_experts: routing counts saved as JSON (gpu_worker/expert_placement.h) that pick "
          "the hottest experts; without one each layer keeps an equal share, ids spread evenly");
ABSL_FLAG(double, gpu_experts_rebalance_s, WorkerFlags{}.gpu_experts_rebalance_s,
          "--gpu_experts: every this many seconds, replace up to 8 resident experts of a layer by "
          "ones the recent routing chose more often (copied in the background, swapped between "
          "steps); 0 = the set stays as placed at start");
ABSL_FLAG(bool, plan, false,
          "print the device-memory plan (weights per GPU, KV capacity) of --plan_tp x --plan_pp "
          "GPUs of --plan_gib GiB for --model (with --hf_overrides), then exit: 0 when every GPU "
          "fits, 1 when one does not (it says why)");
ABSL_FLAG(int, plan_tp, PlanFlags{}.tp, "--plan: tensor-parallel size");
ABSL_FLAG(int, plan_pp, PlanFlags{}.pp, "--plan: pipeline stages (layers split evenly)");
ABSL_FLAG(double, plan_gib, PlanFlags{}.gib, "--plan: memory of each GPU in GiB");
ABSL_FLAG(int64_t, plan_sequences, PlanFlags{}.sequences,
          "--plan: sequences running at once whose compressor state (fp32, outside the KV pool) "
          "each GPU must hold besides the pool");
ABSL_FLAG(int64_t, plan_step_tokens, PlanFlags{}.step_tokens,
          "--plan: tokens of the largest step (the coordinator's max_batch_tokens), whose "
          "workspace each GPU keeps free beside the pool");
ABSL_FLAG(std::string, plan_stage_transport, PlanFlags{}.stage_transport,
          "--plan: grpc, or nccl to set aside the stage links' streams buffers (PP > 1)");
ABSL_FLAG(int64_t, plan_context, PlanFlags{}.context,
          "--plan: the longest context the step workspace must serve (0: the model's "
          "max_position_embeddings)");
ABSL_FLAG(std::string, plan_gpu_prefill_ring_mib, PlanFlags{}.gpu_prefill_ring_mib,
          "--plan: auto | MIB, the streamed-prefill staging ring of each GPU "
          "(--gpu_prefill_ring_mib; auto as a worker without resident experts sizes it), counted "
          "with the streamed step's workspace; 0 = no streamed path");
ABSL_FLAG(int64_t, plan_resident_kv_tokens, PlanFlags{}.resident_kv_tokens,
          "--plan: the KV tokens each GPU keeps with --gpu_experts auto (the worker's "
          "--kv_tokens; 0: --plan_context, i.e. the model's max_position_embeddings when that is "
          "0 too); the rest of the memory the plan leaves is counted as resident experts");
ABSL_FLAG(int, layer_timing_every, WorkerFlags{}.layer_timing_every,
          "the per-layer latency metrics (layer_latency_seconds) time every Nth step and every "
          "step with a chunk of 64 or more tokens: 1 every step, 0 none (with the cuda backend a "
          "timed step's "
          "graph carries event nodes between "
          "the layers, which idle the GPU between them)");
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
ABSL_FLAG(bool, insecure_cluster, WorkerFlags{}.insecure_cluster,
          "serve the GpuWorker service without a cluster token: any process that can reach it may "
          "drive its steps (trusted single-user machines only)");
ABSL_FLAG(int, stage, WorkerFlags{}.stage, "standalone: this worker's pipeline stage");
ABSL_FLAG(int, tp_rank, WorkerFlags{}.tp_rank, "standalone: this worker's tensor-parallel rank");
ABSL_FLAG(int, tp_size, WorkerFlags{}.tp_size,
          "standalone: tensor-parallel ranks of the stage (cuda backend)");
ABSL_FLAG(std::string, nccl_id_file, "",
          "standalone TP > 1: rank 0 writes the TP group's NCCL unique id to this file, the other "
          "ranks wait for it there");
ABSL_FLAG(int, num_stages, WorkerFlags{}.num_stages, "standalone: pipeline stages");
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
WorkerFlags ReadWorkerFlags() {
  WorkerFlags f;
  f.coordinator = absl::GetFlag(FLAGS_coordinator);
  f.worker_id = absl::GetFlag(FLAGS_worker_id);
  f.listen = absl::GetFlag(FLAGS_listen);
  f.advertise = absl::GetFlag(FLAGS_advertise);
  f.port_file = absl::GetFlag(FLAGS_port_file);
  f.backend = absl::GetFlag(FLAGS_backend);
  f.model = absl::GetFlag(FLAGS_model);
  f.load_format = absl::GetFlag(FLAGS_load_format);
  f.hf_overrides = absl::GetFlag(FLAGS_hf_overrides);
  f.dummy_router_skew = absl::GetFlag(FLAGS_dummy_router_skew);
  f.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  f.load_progress_file = absl::GetFlag(FLAGS_load_progress_file);
  f.kv_tokens = absl::GetFlag(FLAGS_kv_tokens);
  f.cuda_device = absl::GetFlag(FLAGS_cuda_device);
  f.fp64_sums = absl::GetFlag(FLAGS_fp64_sums);
  f.gpu_prefill_threshold = absl::GetFlag(FLAGS_gpu_prefill_threshold);
  f.gpu_prefill_ring_mib = absl::GetFlag(FLAGS_gpu_prefill_ring_mib);
  f.gpu_prefill_slot_kib = absl::GetFlag(FLAGS_gpu_prefill_slot_kib);
  f.gpu_experts = absl::GetFlag(FLAGS_gpu_experts);
  f.gpu_experts_profile = absl::GetFlag(FLAGS_gpu_experts_profile);
  f.gpu_experts_rebalance_s = absl::GetFlag(FLAGS_gpu_experts_rebalance_s);
  f.layer_timing_every = absl::GetFlag(FLAGS_layer_timing_every);
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
  return f;
}

bool PlanRequested() { return absl::GetFlag(FLAGS_plan); }

PlanFlags ReadPlanFlags() {
  PlanFlags p;
  p.model = absl::GetFlag(FLAGS_model);
  p.hf_overrides = absl::GetFlag(FLAGS_hf_overrides);
  p.tp = absl::GetFlag(FLAGS_plan_tp);
  p.pp = absl::GetFlag(FLAGS_plan_pp);
  p.gib = absl::GetFlag(FLAGS_plan_gib);
  p.sequences = absl::GetFlag(FLAGS_plan_sequences);
  p.step_tokens = absl::GetFlag(FLAGS_plan_step_tokens);
  p.context = absl::GetFlag(FLAGS_plan_context);
  p.stage_transport = absl::GetFlag(FLAGS_plan_stage_transport);
  p.gpu_prefill_ring_mib = absl::GetFlag(FLAGS_plan_gpu_prefill_ring_mib);
  p.resident_kv_tokens = absl::GetFlag(FLAGS_plan_resident_kv_tokens);
  return p;
}

}  // namespace ss::gpu
