// The cluster config: which GPU workers form which pipeline stage and TP rank, which layers each
// stage runs, and where every layer's routed experts are served (ARCHITECTURE.md "Processes",
// "The MoE call"). The coordinator reads it once at start and hands every registering GPU worker
// its Role (proto/cluster.proto) from it; `splitserve up` writes one for the machine it runs on,
// and multi-machine deployments write it by hand (deploy/cluster.example.json).
//
//   {
//     "model_name": "deepseek-v4-flash",       // optional: the name /v1/models reports
//     "kv_block_tokens": 128,                  // optional: tokens per KV block
//     "max_batch_tokens": 2048,                // optional: tokens per micro-batch
//     "max_running": 64,                       // optional: sequences holding KV at once
//     "max_waiting": 1024,                     // optional: queued requests before 503
//     "max_model_len": 131072,                 // optional: longest prompt + output (default
//                                              // and most: the model's max_position_embeddings)
//     "heartbeat_interval_ms": 1000,           // optional
//     "heartbeat_timeout_ms": 10000,           // optional: a silent worker is declared dead
//     "stage_transport": "grpc",               // optional: how streams travel between stages,
//                                              // "grpc" (default) or "nccl" (cuda backend: a
//                                              // two-rank NCCL link per TP rank, on GPUs of
//                                              // their own; every GPU worker then shares one
//                                              // fate, proto/cluster.proto 3b)
//     "stages": [                              // in pipeline order, covering every layer once
//       {"layers": "0-20", "workers": ["gpu0", "gpu1"]},   // TP size = number of workers
//       {"layers": "21-42", "workers": ["gpu2", "gpu3"]}
//     ],
//     "expert_workers": [                      // optional: none = experts computed on the GPU
//       {"id": "exp0", "layers": "0-42", "slice": "0/2", "shm": "splitserve-exp0"},
//       {"id": "exp1", "layers": "0-42", "slice": "1/2", "grpc": "10.0.0.2:50071"}
//     ]
//   }
//
// Layer lists use the expert worker's syntax ("0-3,7"). For every layer, the expert workers that
// hold it must be the complete set of slices 0..n-1 of one n (or there are none: that layer's
// experts run where its attention runs). Slice i of a layer is served to the stage's TP rank
// i mod tp (its partial sum joins that rank's MoE all-reduce); a rank with no slice of a layer
// (fewer slices than ranks) adds zero for it (proto LayerExperts.slice_count). Every error names
// the field.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/cluster_defaults.h"
#include "common/model_config.h"
#include "common/numa_topology.h"

namespace splitserve::v1 {
class Role;
}  // namespace splitserve::v1

namespace ss::coord {

struct StageSpec {
  int first_layer = 0;  // [first_layer, end_layer)
  int end_layer = 0;
  std::vector<std::string> workers;  // TP rank order
};

struct ExpertWorkerSpec {
  std::string id;
  std::vector<int> layers;
  int slice_index = 0;
  int slice_count = 1;
  std::string shm_name;  // exactly one of shm_name / grpc_address
  std::string grpc_address;
};

struct ClusterConfig {
  std::string model_name = "deepseek-v4";
  int kv_block_tokens = kDefaultKvBlockTokens;
  int max_batch_tokens = 2048;
  int max_running = 64;
  int max_waiting = 1024;
  // Longest sequence (prompt + max_tokens) the gateway admits; after parsing, the model's
  // max_position_embeddings where the file names none. GPU workers size their step workspace for
  // it (the indexer's scores grow with the context: gpu_worker/step_workspace.h).
  int max_model_len = 0;
  int heartbeat_interval_ms = kDefaultHeartbeatIntervalMs;
  int heartbeat_timeout_ms = 10000;
  std::string stage_transport = "grpc";  // "grpc" | "nccl"
  // Automatic prefix caching (coordinator/kv_accounting.h); vLLM's --enable-prefix-caching.
  bool enable_prefix_caching = true;
  std::vector<StageSpec> stages;
  std::vector<ExpertWorkerSpec> expert_workers;

  int num_gpu_workers() const;
  // Every GPU worker id, stage by stage in TP rank order.
  std::vector<std::string> GpuWorkerIds() const;
};

// Parses and validates against the model (layer ranges, block size vs compress ratios).
absl::StatusOr<ClusterConfig> ParseClusterConfig(const std::string& json_text,
                                                 const ModelConfig& model);
absl::StatusOr<ClusterConfig> LoadClusterConfig(const std::string& path, const ModelConfig& model);
// The JSON text of a config (what `splitserve up` writes; parses back to the same config).
std::string ClusterConfigToJson(const ClusterConfig& config);

// The role of GPU worker `worker_id` (NotFound for an id the config does not name): its stage,
// TP rank (its index in the stage's `workers`) and size, and, for every layer of the stage that
// expert workers serve, the endpoints of this rank's slices (proto LayerExperts).
absl::StatusOr<splitserve::v1::Role> RoleFor(const ClusterConfig& config,
                                             const std::string& worker_id);

// The CUDA device of every GPU worker of `stages` pipeline stages of `tp` ranks on one machine of
// `gpus` GPUs, in GpuWorkerIds() order: stage s, rank r on (s·tp + r) mod gpus. Stages may share
// GPUs (several processes on one GPU), but NCCL forbids two ranks of one communicator on one
// GPU, so a stage's ranks must land on distinct GPUs: tp > gpus is InvalidArgument, saying so.
// With `links` (the nccl stage transport, more than one stage) every worker needs a GPU of its
// own: NCCL refuses a link whose two ranks share a GPU, and a worker waiting in a link's receive
// keeps an NCCL kernel on its GPU beside another process's work there, which slows both (bench/
// RESULTS.md, "Streams over NCCL stage links"); fewer GPUs is InvalidArgument.
absl::StatusOr<std::vector<int>> AssignCudaDevices(int stages, int tp, int gpus,
                                                   bool links = false);

// `splitserve up`'s stage transport for `requested` ("grpc", "nccl" or "auto"): auto is "nccl"
// where the cuda backend (`cuda`) runs more than one stage, NCCL is built (`nccl`) and every GPU
// worker has a GPU of its own (stages·tp <= gpus), else "grpc". (Under `up` the linked workers'
// shared fate costs nothing: the launcher stops every process when one exits.)
std::string LaunchStageTransport(const std::string& requested, bool cuda, bool nccl, int stages,
                                 int tp, int gpus);

// The longest sequence the cluster serves: c.max_model_len, or the model's
// max_position_embeddings where it is 0 (a config built in code rather than parsed).
int64_t MaxModelLen(const ClusterConfig& c, const ModelConfig& model);

// The KV capacity a launcher passes its GPU workers (--kv_tokens): `requested` when > 0; for 0
// (auto), 0 again where the cuda backend runs every worker on a GPU of its own (`devices`, one
// per worker: each worker then fills its GPU's free memory, gpu_worker/cuda/cuda_backend.h), else
// `fallback` (the cpu backend, or workers sharing a GPU, where one would take the others' memory).
int64_t LaunchKvTokens(int64_t requested, bool cuda, const std::vector<int>& devices,
                       int64_t fallback);

// `splitserve up`'s expert workers: `requested` (> 0, --expert-workers N) or, for 0 (auto), one
// per NUMA node (`nodes`), or one per TP rank where the cuda backend runs TP over more ranks
// than there are nodes and tp is a multiple of them (the node's cores split between them): a
// rank then holds its own slice of every expert, so its expert calls run beside the other
// ranks' and a streamed prefill's copies divide across the GPUs (each rank streams its slices).
// Then lowered until the slices split moe_inter_dim into multiples of 128.
int LaunchExpertWorkers(int requested, int nodes, int tp, bool cuda, int64_t moe_inter_dim);

// `splitserve up`'s tokens per step (the cluster config's max_batch_tokens, vLLM's
// --max-num-batched-tokens: the scheduler's budget per step and its largest prefill chunk):
// `requested` when > 0. For 0, kLaunchStreamedStepTokens where the cuda backend may stream a
// prefill chunk's routed experts to the GPU (`may_stream`: the cuda backend, a non-zero staging
// ring and a threshold other than off; a streamed chunk reads every expert's weights once however
// many tokens it carries), at any context: a step's indexer scores go in row slices
// (gpu_worker/step_workspace.h IndexerScoreRows), so its workspace is what the memory plan fits
// on 24 GiB at every layout. Else kLaunchStepTokens (the CPU expert path gains nothing from
// larger chunks beyond the expert workers' call size).
inline constexpr int64_t kLaunchStepTokens = 2048;
inline constexpr int64_t kLaunchStreamedStepTokens = 8192;
int64_t LaunchMaxBatchTokens(int64_t requested, bool may_stream);

// The NUMA nodes `splitserve up` and `splitserve cpus` place processes on: those of `nodes`
// (NumaTopology::nodes()) with allowed CPUs, in their order.
struct LaunchNodes {
  std::vector<int> ids;                              // each node's OS index
  std::vector<std::vector<std::vector<int>>> cores;  // each node's NumaNode::core_pus
};
LaunchNodes LaunchNodesOf(const std::vector<NumaNode>& nodes);

// The --numa-node of expert worker `e` of `experts` on the nodes `node_ids` (LaunchNodes::ids):
// where there are several nodes and `experts` is a multiple of them, k = experts / nodes workers
// to a node, worker e on node node_ids[e / k] (the node PlanLaunchCpus takes its cores from);
// else -1, "auto" (the worker takes the node with most of its allowed cores).
int LaunchExpertNode(int e, int experts, const std::vector<int>& node_ids);

// The CPUs `splitserve up` gives its processes on one machine. `node_cores`: per NUMA node with
// allowed CPUs, in the launcher's node order, its physical cores, each as its allowed hardware
// threads (common/numa_topology.h NumaNode::core_pus). An expert worker pins one thread to
// every physical core it may use, and with the cuda backend the GPU workers and the coordinator
// spin while they wait (on the GPU, on expert calls): an expert thread whose core is shared with
// a spinning thread waits out the scheduler's time slices, and the whole call with it (bench/
// RESULTS.md, "CPUs of `splitserve up`").
// So with `cuda` the coordinator and the GPU workers get `serving` whole cores to share, the
// highest cores of each node taken in turn, and the expert workers the rest:
// where the expert workers are k to a node (a multiple of the nodes), worker i gets an equal
// share (the (i mod k)-th of k) of node i / k's remaining cores, so no worker straddles two nodes
// (k = 1: all of them); else an equal share of all the remaining cores. No split (every list empty:
// everyone keeps the launcher's CPUs) for the cpu backend, whose GPU workers compute on the
// experts' cores between calls, or where the split would leave the expert workers fewer cores than
// it reserves, a node none, or a worker none.
struct LaunchCpus {
  std::vector<int> serving;               // the coordinator's and GPU workers' CPUs
  std::vector<std::vector<int>> experts;  // expert worker i's CPUs
  bool split() const { return !serving.empty(); }
};
LaunchCpus PlanLaunchCpus(const std::vector<std::vector<std::vector<int>>>& node_cores, int experts,
                          int serving, bool cuda);
// What `splitserve up` and `splitserve cpus` use: two cores a GPU worker (the step's wait on the
// GPU and the expert call's wait for the reply both spin) and one for the coordinator when
// `coordinator`; one core a GPU worker where two do not fit (bench/RESULTS.md, "CPUs of
// `splitserve up`", compares the splits).
LaunchCpus PlanLaunchCpusFor(const std::vector<std::vector<std::vector<int>>>& node_cores,
                             int experts, int gpu_workers, bool coordinator, bool cuda);

// `splitserve cpus --write-dropins`: systemd drop-ins that put `plan` on this host's units
// (deploy/systemd), as (path under the unit directory, file text), each setting [Service]
// CPUAffinity=. The GPU workers' template unit, and the coordinator's when `coordinator`, get
// the serving CPUs. The expert workers' template unit gets all the expert workers' CPUs
// together, which each worker narrows to its own node's (--numa_node pins its pool to the node's
// allowed cores): only where every expert worker has a node of its own (`one_per_node`), else no
// drop-in for them. None without a split. `command` is named in each file's header comment.
std::vector<std::pair<std::string, std::string>> CpuDropIns(const LaunchCpus& plan,
                                                            bool coordinator, bool one_per_node,
                                                            const std::string& command);

// Writes each (path under `dir`, text) of `files` (CpuDropIns'), creating the directories, each
// whole (WriteFileAtomically). Returns the paths written; the first failure as an error naming
// the file.
absl::StatusOr<std::vector<std::string>> WriteFiles(
    const std::string& dir, const std::vector<std::pair<std::string, std::string>>& files);

// The stage of GPU worker `worker_id`; -1 for an id the config does not name.
int StageOf(const ClusterConfig& config, const std::string& worker_id);
// The other workers of `worker_id`'s stage (its TP group); empty for TP 1 or an unknown id.
std::vector<std::string> TpPeers(const ClusterConfig& config, const std::string& worker_id);
// The GPU workers that share `worker_id`'s fate (proto/cluster.proto 3a, 3b): its TP peers, or,
// under the nccl stage transport with more than one stage, every other GPU worker.
std::vector<std::string> FatePeers(const ClusterConfig& config, const std::string& worker_id);

}  // namespace ss::coord
