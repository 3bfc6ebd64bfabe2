// What `splitserve up` (launcher.h) starts every child from: the LaunchPlan, fixed once the layout
// and the cluster config are known, and the command line of each kind of child made from it.
//
// The children find each other through the plan: the coordinator writes its ports to
// `ports_file` and reads `cluster_path`; each GPU worker registers with the coordinator's control
// port; each expert worker serves shared-memory segment shm_names[e], which the GPU workers open.
// Metrics ports follow --port (child i, GPU workers first, on port + 1 + i; none fixed when --port
// is 0). Secrets never go on a command line (argv is public): the cluster token is in the
// environment (proto/cluster_credential.h) and API keys are passed as --api-keys-file's path.
//
// Ownership: a LaunchPlan refers to the UpOptions it was made from, which outlive it. The
// functions are pure.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "coordinator/cluster_config.h"
#include "coordinator/up_options.h"

namespace ss {

struct LaunchPlan {
  const UpOptions& o;
  std::filesystem::path bin;  // the directory of the splitserve-* binaries
  std::string backend;        // "cpu" or "cuda"
  int n_layers = 0, experts = 0;
  std::vector<int> node_ids;  // the usable NUMA nodes (coord::LaunchNodes::ids)
  coord::LaunchCpus cpus;
  std::vector<std::string> shm_names, gpu_ids;  // per expert worker; the GPU workers' ids
  std::string cluster_path, ports_file;
  std::vector<int> devices;  // per GPU worker (cuda)
  int64_t kv_tokens = 0;
  // (child, its --load-progress-file): GPU workers first, then expert workers (LoadDisplay).
  std::vector<std::pair<std::string, std::string>> load_files;
};

// Expert worker `e` (slice e of every layer's experts).
std::vector<std::string> ExpertArgs(const LaunchPlan& p, int e);

// The coordinator on `http_port`: 0 is any free port (the first start without --port); a
// restarted coordinator gets the port its predecessor had, so clients find it again.
std::vector<std::string> CoordinatorArgs(const LaunchPlan& p, int http_port);

// GPU worker `i` (p.gpu_ids[i]), registering with the coordinator's `control_port`.
std::vector<std::string> GpuWorkerArgs(const LaunchPlan& p, size_t i, int control_port);

}  // namespace ss
