// The `nccl` stage transport (stage_link.h): a two-rank NCCL communicator per link, the sending
// stage's worker rank 0, the receiving stage's rank 1. Each message is a 32-byte header
// (micro-batch id, rows, width, failed) followed, unless failed, by the bf16 streams; both travel
// on the link's own stream. The receiver keeps one device buffer for the streams, grown to the
// largest message (an 8K-token Flash prefill chunk's streams: 256 MiB).
//
// Setup: the sending worker makes the id (NcclComm::NewUniqueId) and publishes it at the
// coordinator's rendezvous as group PpLinkName(stage, tp_rank); both ends then call Create, which
// blocks until the other has joined, allocates the receiver's buffer for `reserve_bytes` of
// streams, and exchanges one message so that NCCL's own connection buffers are allocated then too:
// before the backend sizes its KV pool from the device's free memory. NCCL refuses a communicator
// whose two ranks share a GPU, so linked workers need GPUs of their own
// (coordinator/cluster_config.h AssignCudaDevices).
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <string_view>

#include "gpu_worker/nccl_comm.h"
#include "gpu_worker/stage_link.h"

namespace ss::gpu {

class NcclStageLink : public StageLink {
 public:
  // `sender`: this worker's end sends (rank 0). `what` names the link in errors, e.g.
  // "the link to stage 1, TP rank 0". `reserve_bytes`: the receiver's streams buffer to allocate
  // now (the largest micro-batch's bf16 streams); it grows later if a message needs more.
  static absl::StatusOr<std::unique_ptr<NcclStageLink>> Create(
      std::string_view unique_id, bool sender, int device, std::string what,
      size_t reserve_bytes = 0, absl::Duration timeout = absl::Seconds(120));
  ~NcclStageLink() override;

  absl::Status Send(uint64_t micro_batch_id, int64_t rows, int64_t width, const void* streams,
                    bool failed, absl::Time deadline) override;
  absl::StatusOr<Received> Receive(uint64_t micro_batch_id, absl::Time deadline) override;
  void Abort() override;

 private:
  NcclStageLink(std::unique_ptr<NcclComm> comm, bool sender, std::string what);
  absl::Status Wait(absl::Time deadline, std::string_view what);
  absl::Status Broken(absl::Status why);
  absl::Status Reserve(size_t bytes);

  std::unique_ptr<NcclComm> comm_;
  const bool sender_;
  const std::string what_;
  cudaStream_t stream_ = nullptr;
  void* header_dev_ = nullptr;   // 32 bytes
  void* header_host_ = nullptr;  // 32 bytes, pinned
  void* buffer_ = nullptr;       // the receiver's streams
  size_t buffer_bytes_ = 0;
};

}  // namespace ss::gpu
