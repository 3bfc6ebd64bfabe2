// The stage transport: how a pipeline stage's TP rank r hands each micro-batch's output streams
// to the next stage's TP rank r (cluster config "stage_transport", ARCHITECTURE.md "One step").
// StageLink is the one interface the stage runner (stage_runner.h) reaches both transports
// through; each object is one end of one link, sending or receiving.
//
//   nccl (NcclStageLink, nccl_stage_link.h): device to device over NCCL, as bf16 [rows, hc·dim]
//     (the cuda backend's streams are bf16 values: each HC post rounds to bf16), without host
//     copies or an RPC. memory() kDevice, paired() true.
//   grpc (GrpcStageInput / GrpcStageOutput, stage_transfer.h): the streams as fp32 [rows, width]
//     in host memory, pushed over the GpuWorker service into the receiver's StreamInbox.
//     memory() kHost, paired() false.
//
// Paired links (nccl). Both ends handle the coordinator's plans in the same order, and for every
// plan with chunks the sender sends exactly one message and the receiver receives exactly one,
// both sized from the plan (its tokens x hc·dim): the streams, or a failure when the sending
// stage failed the micro-batch. The receiver receives before it checks anything, so a
// micro-batch it then fails itself still consumes its message. A send or receive that does not
// complete by its deadline, or that NCCL reports failed, aborts the link's communicator: the link
// is broken for good, and both workers must be started anew (their coordinator declares the
// pipeline's GPU workers dead together: cluster.proto 3b).
//
// Unpaired links (grpc). Messages are keyed by micro-batch id; the receiver takes one once the
// plan has passed its checks, and Skip()s the ones it will not take. A failed send or receive is
// that step's error only: a stage that fails does not take its neighbours down (cluster.proto
// 3a).
//
// Threads: one thread at a time per link (the stage runner's).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ss::gpu {

// Where a link's streams live.
enum class StageMemory {
  kDevice,  // bf16 [rows, width] in device memory: the backend runs RunDevice
  kHost,    // fp32 [rows, width] in host memory: the backend runs Run
};

class StageLink {
 public:
  virtual ~StageLink() = default;

  virtual StageMemory memory() const = 0;
  // True for a paired link (see above).
  virtual bool paired() const = 0;

  // Sends micro-batch `micro_batch_id`'s streams: [rows, width] at `streams` in memory(), or,
  // with a non-empty `failure` (streams null), a message that says the sender failed the
  // micro-batch, and why. `rows` x `width` is the plan's. Returns once the message has left
  // `streams` (the caller may then overwrite it).
  virtual absl::Status Send(uint64_t micro_batch_id, int64_t rows, int64_t width,
                            const void* streams, std::string_view failure, absl::Time deadline) = 0;

  struct Received {
    int64_t rows = 0;
    int64_t width = 0;
    // [rows, width] in memory(): a paired link's buffer, valid until the next Receive, or (grpc)
    // `host`'s values, valid while this Received (or one it was moved into) lives.
    const void* streams = nullptr;
    bool failed = false;      // the sending stage failed the micro-batch
    std::string failure;      // why, where the transport carries it (grpc)
    std::vector<float> host;  // grpc: the streams' storage
  };
  // Receives micro-batch `micro_batch_id`'s message, which must have the plan's [rows, width]
  // streams (another shape is an error; on a paired link, so is another id, and it breaks the
  // link: the ends are out of step).
  virtual absl::StatusOr<Received> Receive(uint64_t micro_batch_id, int64_t rows, int64_t width,
                                           absl::Time deadline) = 0;

  // The receiver is done with `micro_batch_id` without receiving it (unpaired links drop its
  // message, now or when it arrives; a paired link never skips).
  virtual void Skip(uint64_t micro_batch_id) { (void)micro_batch_id; }

  // Aborts the link (idempotent; a no-op on an unpaired link).
  virtual void Abort() = 0;
};

}  // namespace ss::gpu
