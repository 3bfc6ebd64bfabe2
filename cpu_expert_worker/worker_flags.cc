// The flag table of splitserve-expert-worker (worker_flags.h).
#include "cpu_expert_worker/worker_flags.h"

#include <cstdint>
#include <string>

#include "absl/flags/flag.h"

using ss::expert::WorkerFlags;

ABSL_FLAG(std::string, model, "", "checkpoint directory (config.json + model*.safetensors)");
ABSL_FLAG(std::string, load_format, WorkerFlags{}.load_format,
          "how the experts are obtained (vLLM's --load-format): auto or safetensors read --model's "
          "safetensors; dummy generates them in place (--model needs only config.json)");
ABSL_FLAG(std::string, hf_overrides, "",
          "a JSON object merged into config.json at start (vLLM's --hf-overrides), e.g. "
          "'{\"n_routed_experts\": 128}'; every structural check still applies");
ABSL_FLAG(std::string, layers, WorkerFlags{}.layers,
          "layer ids to hold: ids and inclusive ranges, e.g. 0-42,43 (MTP blocks are "
          "n_layers + k); 'all' = every block and MTP block");
ABSL_FLAG(std::string, slice, WorkerFlags{}.slice,
          "i/n: hold rows [i*I/n, (i+1)*I/n) of every expert's w1/w3 and those columns of w2");
ABSL_FLAG(std::string, numa_node, WorkerFlags{}.numa_node,
          "NUMA node (OS number) whose cores and memory to use; auto = the node with the most "
          "allowed physical cores");
ABSL_FLAG(int, threads, WorkerFlags{}.threads,
          "pool threads; 0 = every physical core of the node in the allowed set");
ABSL_FLAG(std::string, isa, WorkerFlags{}.isa,
          "expert kernels: auto (CPUID), scalar, avx2 or avx512");
ABSL_FLAG(std::string, shm_name, "", "shared-memory segment to serve expert calls on");
ABSL_FLAG(std::string, store_memory, WorkerFlags{}.store_memory,
          "where the expert store lives: anonymous (this process's memory) or shared (the "
          "shared-memory segment <shm_name>-store, which a GPU worker on the host maps to stream "
          "experts from); auto = shared when --shm_name is set, else anonymous");
ABSL_FLAG(std::string, grpc_listen, "", "gRPC address (host:port) to serve expert calls on");
ABSL_FLAG(std::string, cluster_token_file, "",
          "with --grpc_listen: file holding the cluster token every gRPC call must carry (0600; "
          "proto/cluster_credential.h). Environment mirror: SPLITSERVE_CLUSTER_TOKEN");
ABSL_FLAG(bool, insecure_cluster, WorkerFlags{}.insecure_cluster,
          "with --grpc_listen: accept gRPC calls without a cluster token (trusted single-user "
          "machines only)");
ABSL_FLAG(std::string, load_progress_file, "",
          "a file the load's progress is written to (JSON, rewritten whole; common/"
          "load_progress.h), for a launcher to show; empty = none");
ABSL_FLAG(std::string, metrics_listen, "",
          "address (host:port) to serve Prometheus metrics on GET /metrics; empty = off");
ABSL_FLAG(int64_t, max_tokens, WorkerFlags{}.max_tokens, "largest number of tokens per call");
ABSL_FLAG(int, spin_us, WorkerFlags{}.spin_us,
          "microseconds an idle pool thread, and the shared-memory serving thread, spins before "
          "it sleeps");
ABSL_FLAG(int64_t, split_target, WorkerFlags{}.split_target,
          "engine: work units a call aims for (more: finer parallelism, more re-quantisation)");
ABSL_FLAG(int64_t, min_split_cols, WorkerFlags{}.min_split_cols,
          "engine: narrowest sub-range of the slice's intermediate dimension per unit "
          "(a multiple of 128)");
ABSL_FLAG(int, engine_passes, WorkerFlags{}.engine_passes,
          "engine: 1 = one parallel pass, each down unit adding an expert once its gate_up units "
          "are done; 2 = gate_up units, a barrier, then down units (same bits)");
ABSL_FLAG(std::string, weight_layout, WorkerFlags{}.weight_layout,
          "expert weights in RAM: tiled (the order the ISA's kernel reads them; one sequential "
          "stream a call) or rows (the checkpoint's row-major rows)");
ABSL_FLAG(int64_t, selftest, WorkerFlags{}.selftest,
          "load, run N random requests through the engine and print tokens/s and GB/s "
          "(0 = load only)");
ABSL_FLAG(int64_t, selftest_tokens, WorkerFlags{}.selftest_tokens, "tokens per self-test request");

namespace ss::expert {

WorkerFlags ReadWorkerFlags() {
  WorkerFlags f;
  f.model = absl::GetFlag(FLAGS_model);
  f.load_format = absl::GetFlag(FLAGS_load_format);
  f.hf_overrides = absl::GetFlag(FLAGS_hf_overrides);
  f.layers = absl::GetFlag(FLAGS_layers);
  f.slice = absl::GetFlag(FLAGS_slice);
  f.numa_node = absl::GetFlag(FLAGS_numa_node);
  f.threads = absl::GetFlag(FLAGS_threads);
  f.isa = absl::GetFlag(FLAGS_isa);
  f.shm_name = absl::GetFlag(FLAGS_shm_name);
  f.grpc_listen = absl::GetFlag(FLAGS_grpc_listen);
  f.store_memory = absl::GetFlag(FLAGS_store_memory);
  f.max_tokens = absl::GetFlag(FLAGS_max_tokens);
  f.spin_us = absl::GetFlag(FLAGS_spin_us);
  f.split_target = absl::GetFlag(FLAGS_split_target);
  f.min_split_cols = absl::GetFlag(FLAGS_min_split_cols);
  f.engine_passes = absl::GetFlag(FLAGS_engine_passes);
  f.weight_layout = absl::GetFlag(FLAGS_weight_layout);
  f.selftest = absl::GetFlag(FLAGS_selftest);
  f.selftest_tokens = absl::GetFlag(FLAGS_selftest_tokens);
  f.cluster_token_file = absl::GetFlag(FLAGS_cluster_token_file);
  f.insecure_cluster = absl::GetFlag(FLAGS_insecure_cluster);
  f.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  f.load_progress_file = absl::GetFlag(FLAGS_load_progress_file);
  return f;
}

}  // namespace ss::expert
