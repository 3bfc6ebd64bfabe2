// The `nccl` stage transport (stage_link.h): a two-rank NCCL communicator per link, the sending
// stage's worker rank 0, the receiving stage's rank 1. Each message is a 32-byte header
// (micro-batch id, rows, width, failed) followed, unless failed, by the bf16 streams; both travel
// on the link's own stream.
//
// Sending does not wait for the receiver: Send copies the streams into one of two staging buffers
// (device to device, on a stream of its own) and returns once they are copied, leaving the
// transfer in flight, so the sending stage runs its next micro-batch while the next stage is still
// busy with the previous one (as the gRPC transport's inbox allows). A Send that finds both
// buffers in flight waits for the older transfer, with its deadline. The receiver keeps one buffer
// for the streams. The buffers are allocated at Create for `reserve_bytes` of streams (the largest
// micro-batch's: 64 MiB for 2048 Flash tokens; the sender holds two) and grow if a message needs
// more.
//
// Setup: the sending worker makes the id (NcclComm::NewUniqueId) and publishes it at the
// coordinator's rendezvous as group PpLinkName(stage, tp_rank); both ends then call Create, which
// blocks until the other has joined, allocates the buffers, and exchanges one message so that
// NCCL's own connection buffers are allocated then too: before the backend sizes its KV pool from
// the device's free memory.
//
// NCCL refuses a communicator whose two ranks share a GPU. Workers of different processes that
// share a GPU would also time-slice it with a receiver's waiting NCCL kernel, so the nccl transport
// wants a GPU per worker (coordinator/cluster_config.h AssignCudaDevices).
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <memory>
#include <string>
#include <string_view>

#include "gpu_worker/nccl_comm.h"
#include "gpu_worker/stage_link.h"

namespace ss::gpu {

class NcclStageLink : public StageLink {
 public:
  // `sender`: this worker's end sends (rank 0). `what` names the link in errors, e.g.
  // "the link to stage 1, TP rank 0". `reserve_bytes`: the streams buffers to allocate now.
  // `timeout` bounds the first exchange. `cancel`: NcclComm::set_cancel (the worker's stop flag).
  static absl::StatusOr<std::unique_ptr<NcclStageLink>> Create(
      std::string_view unique_id, bool sender, int device, std::string what,
      size_t reserve_bytes = 0, absl::Duration timeout = absl::Seconds(120),
      const std::atomic<bool>* cancel = nullptr);
  ~NcclStageLink() override;

  StageMemory memory() const override { return StageMemory::kDevice; }
  bool paired() const override { return true; }
  absl::Status Send(uint64_t micro_batch_id, int64_t rows, int64_t width, const void* streams,
                    std::string_view failure, absl::Time deadline) override;
  absl::StatusOr<Received> Receive(uint64_t micro_batch_id, int64_t rows, int64_t width,
                                   absl::Time deadline) override;
  void Abort() override;

  // Sender: waits until every transfer in flight has reached the receiver.
  absl::Status Flush(absl::Time deadline);

 private:
  // A buffer for one message (the header, then the streams), the header in pinned host memory,
  // and the events marking the streams' copy and the transfer done.
  struct Slot {
    char* message = nullptr;
    size_t capacity = 0;  // bytes of `message`
    void* header_host = nullptr;
    cudaEvent_t copied = nullptr, sent = nullptr;
    bool in_flight = false;
    uint64_t micro_batch_id = 0;
  };

  NcclStageLink(std::unique_ptr<NcclComm> comm, bool sender, std::string what);
  absl::Status Init(size_t reserve_bytes);
  absl::Status Wait(absl::Time deadline, std::string_view what);
  absl::Status WaitSent(Slot& slot, absl::Time deadline);
  absl::Status Broken(absl::Status why);
  // `slot.message` holds at least `bytes` (a new allocation when it must grow).
  absl::Status Fit(Slot& slot, size_t bytes);

  std::unique_ptr<NcclComm> comm_;
  const bool sender_;
  const std::string what_;
  cudaStream_t stream_ = nullptr;       // the NCCL transfers (and the receiver's header copy)
  cudaStream_t copy_stream_ = nullptr;  // the sender's staging copies
  std::array<Slot, 2> slots_;           // slots_[0] alone on the receiver
  size_t next_ = 0;                     // the sender's next slot
};

}  // namespace ss::gpu
