// The expert worker's command line, parsed once into a validated WorkerConfig (STYLE.md "One
// configuration table"). expert_worker_main.cc declares the flags (absl) and hands their raw
// values here, so every rule is testable without a process.
//
//   --model DIR           checkpoint directory (required)
//   --load_format auto|safetensors|dummy  how the experts are obtained (vLLM's --load-format;
//                         dummy: generated in place, DIR needs only config.json)
//   --hf_overrides JSON   a JSON object merged into config.json (vLLM's --hf-overrides;
//                         common/weight_source.h)
//   --layers LIST         "0-42,43": ids and inclusive ranges, comma-separated; "all" = every
//                         block and MTP block of the model (default)
//   --slice i/n           which part of every expert's intermediate dimension (default 0/1)
//   --numa_node k|auto    the node whose cores and memory the worker uses (default auto)
//   --threads N           pool size; 0 = the node's physical cores in the allowed CPU set
//   --isa auto|scalar|avx2|avx512|amx   expert kernels (auto: the best the CPU and OS run;
//                         amx = avx512 with AMX-INT8 tiles for calls of 8+ rows an expert)
//   --shm_name NAME, --grpc_listen ADDR   serve expert calls over shared memory and/or gRPC
//   --store_memory auto|anonymous|shared   where the expert store lives: this process's
//                         anonymous memory, or the shared-memory segment "<NAME>-store"
//                         (common/expert_store_format.h) that a GPU worker on the host maps to
//                         stream experts from; auto = shared with --shm_name (anonymous, with a
//                         warning, when /dev/shm has not the room), else anonymous. shared needs
//                         --shm_name.
//   --cluster_token_file PATH   with --grpc_listen: the cluster token every gRPC call must carry
//                         (env mirror SPLITSERVE_CLUSTER_TOKEN; proto/cluster_credential.h)
//   --insecure_cluster    with --grpc_listen: accept gRPC calls without a token (exclusive with
//                         a token; without either a gRPC-serving worker refuses to start). The
//                         shared-memory segment is guarded by its 0600 mode instead.
//   --max_tokens T        largest T per call (sizes the engine's preallocated memory)
//   --spin_us US          how long idle pool threads (and the shm serving thread) spin before
//                         sleeping
//   --split_target U, --min_split_cols W   how the engine cuts a call (expert_engine.h)
//   --engine_passes 1|2   the engine's gate_up and down units in one parallel pass (default) or
//                         two (ExpertEngineOptions::passes; bit-identical)
//   --weight_layout tiled|rows   expert weights in RAM: in the kernel's reading order (default;
//                         ExpertSliceView::tile_rows) or the checkpoint's row-major rows
//   --selftest N          load, run N random requests through the engine, print the rates
//   --selftest_tokens T   tokens per self-test request
// Flag names may be written with dashes (--numa-node) or underscores (--numa_node).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/layer_list.h"
#include "common/weight_source.h"

namespace ss::expert {

// Layer lists and slices: common/layer_list.h.
using ss::ParseLayerList;
using ss::ParseSlice;

// "auto" -> -1, "k" -> k >= 0.
absl::StatusOr<int> ParseNumaNode(absl::string_view spec);

// The flags' raw values, as the command line gave them.
struct WorkerFlags {
  std::string model;
  std::string load_format = "auto";
  std::string hf_overrides;
  std::string layers = "all";
  std::string slice = "0/1";
  std::string numa_node = "auto";
  int threads = 0;
  std::string isa = "auto";
  std::string shm_name;
  std::string grpc_listen;
  std::string store_memory = "auto";
  int64_t max_tokens = 256;
  int spin_us = 200;
  int64_t split_target = 128;
  int64_t min_split_cols = 128;
  int engine_passes = 1;
  std::string weight_layout = "tiled";
  int64_t selftest = -1;  // -1: not requested
  int64_t selftest_tokens = 1;
  std::string cluster_token_file;
  bool insecure_cluster = false;
  std::string metrics_listen;  // HOST:PORT; empty = no metrics
  std::string load_progress_file;
};

struct WorkerConfig {
  WeightSource source;      // --model, --load_format, --hf_overrides
  bool all_layers = true;   // --layers all (resolved against the model's config at load)
  std::vector<int> layers;  // when !all_layers
  int slice_index = 0, slice_count = 1;
  int numa_node = -1;  // -1 = auto
  int threads = 0;     // 0 = every physical core of the node
  std::string isa;     // validated name; dispatch.h's ParseIsa gives the Isa
  std::string shm_name, grpc_listen;
  // The store's shared-memory segment (ExpertStoreSegmentName(shm_name)), or "" for anonymous
  // memory (--store_memory resolved).
  std::string store_segment;
  bool store_segment_optional = false;  // --store_memory auto: anonymous when /dev/shm is too small
  int64_t max_tokens = WorkerFlags{}.max_tokens;
  int spin_us = WorkerFlags{}.spin_us;
  int64_t split_target = WorkerFlags{}.split_target;
  int64_t min_split_cols = WorkerFlags{}.min_split_cols;
  int engine_passes = WorkerFlags{}.engine_passes;
  bool tiled_weights = true;  // --weight_layout tiled
  int64_t selftest = WorkerFlags{}.selftest;
  int64_t selftest_tokens = WorkerFlags{}.selftest_tokens;
  // The credential's source, for ClusterCredential::Load (which reads the file or environment).
  std::string cluster_token_file;
  bool insecure_cluster = false;
  std::string metrics_listen;      // HOST:PORT; empty = no metrics
  std::string load_progress_file;  // SetLoadProgressFile's path; empty = none
};

// Validates every flag (InvalidArgument naming the flag and its value).
absl::StatusOr<WorkerConfig> ParseWorkerConfig(const WorkerFlags& flags);

using ss::NormalizeFlagDashes;  // common/layer_list.h

}  // namespace ss::expert
