// A device-to-device link between adjacent pipeline stages: the `nccl` stage transport (cluster
// config "stage_transport", ARCHITECTURE.md "One step"). Stage s's TP rank r sends every
// micro-batch's output streams to stage s + 1's TP rank r straight from device memory, as bf16
// [rows, hc·dim] (the cuda backend's streams are bf16 values: each HC post rounds to bf16), without
// the host copies and the RPC of the gRPC transport (stage_transfer.h).
//
// Pairing. Both ends handle the coordinator's plans in the same order, and for every plan with
// chunks the sender sends exactly one message and the receiver receives exactly one, both sized
// from the plan (its tokens x hc·dim): the streams, or `failed` when the sending stage failed the
// micro-batch. The receiver receives before it checks anything, so a micro-batch it then fails
// itself still consumes its message.
//
// Failure. A send or receive that does not complete by its deadline, or that NCCL reports failed,
// aborts the link's communicator: the link is broken for good, and both workers must be started
// anew (their coordinator declares the pipeline's GPU workers dead together: cluster.proto 3b).
//
// Threads: one thread at a time per link (the stage runner's).
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ss::gpu {

class StageLink {
 public:
  virtual ~StageLink() = default;

  // Sends micro-batch `micro_batch_id`'s streams: bf16 [rows, width] at `streams` in the sender's
  // device memory, or, with `failed` (streams null), a message of the same size that says so.
  // `rows` x `width` is the plan's. Returns once the message has left `streams` (the caller may
  // then overwrite it).
  virtual absl::Status Send(uint64_t micro_batch_id, int64_t rows, int64_t width,
                            const void* streams, bool failed, absl::Time deadline) = 0;

  struct Received {
    int64_t rows = 0;
    int64_t width = 0;
    const void* streams = nullptr;  // bf16 [rows, width] in device memory, until the next Receive
    bool failed = false;            // the sending stage failed the micro-batch
  };
  // Receives the next message, which must be micro-batch `micro_batch_id`'s with streams of the
  // plan's [rows, width] (another id or shape is an error that breaks the link: the ends are out
  // of step).
  virtual absl::StatusOr<Received> Receive(uint64_t micro_batch_id, int64_t rows, int64_t width,
                                           absl::Time deadline) = 0;

  // Aborts the link (idempotent).
  virtual void Abort() = 0;
};

}  // namespace ss::gpu
