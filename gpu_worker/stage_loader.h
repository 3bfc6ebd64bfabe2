// Start-up of splitserve-gpu-worker's stage: the standalone NCCL id exchange and the loading of
// the model into a stage (TP group, stage links, backend, stream sender, runner, metrics). Called
// from the worker's main thread before the service reports ready; each may block for long (model
// load, NCCL joins) and honours `stop`.
#pragma once

#include <atomic>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/metrics/metrics.h"
#include "gpu_worker/gpu_worker_service.h"
#include "gpu_worker/stage_transfer.h"
#include "gpu_worker/worker_config.h"
#include "proto/cluster_credential.h"

namespace ss::gpu {

// Standalone TP > 1: rank 0 creates the group's id and writes it to --nccl_id_file (whole, by
// rename); the other ranks wait for the file until `until` or `stop`.
absl::StatusOr<std::string> StandaloneNcclId(const WorkerConfig& c, absl::Time until,
                                             const std::atomic<bool>* stop);

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
                                      std::function<void(const std::string&)> on_group_broken);

}  // namespace ss::gpu
