// The `grpc` stage transport (stage_link.h), for both backends: stage s's TP rank r pushes each
// micro-batch's output streams (proto StageStreams, GpuWorker.PushStreams) to stage s + 1's TP
// rank r (the streams after a stage are the same bits on every rank, so each rank of the next
// stage gets its own copy and no rank waits on another), which holds them in its StreamInbox until
// its runner takes them for that micro-batch. The streams travel as bf16 (2 bytes a value; they
// are bf16 values, spec §3), or as fp32 if a stage's are not all bf16-exact. A stage that fails
// does not take its neighbours down (cluster.proto 3a). bench/RESULTS.md "Pipeline stages" has
// what it costs beside the nccl transport.
//
// The stage runner reaches it only through StageLink: GrpcStageInput over the StreamInbox,
// GrpcStageOutput over a StreamSender.
//
// A sending stage pushes exactly one StageStreams for every micro-batch that has chunks: the
// streams, or `error` when it failed the micro-batch, so the receiving stage fails it at once
// instead of waiting out its deadline.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gpu_worker/stage_link.h"
#include "proto/cluster_credential.h"

namespace grpc {
class Channel;
}  // namespace grpc

namespace ss::gpu {

struct StageStreamsData {
  int64_t rows = 0;
  int64_t width = 0;
  std::vector<float> streams;  // [rows, width]
  std::string error;           // the previous stage failed the micro-batch
};

// Streams received for micro-batches this worker has not run yet.
//
// Threads: Put from gRPC handler threads, Take / Finish from the runner thread, Shutdown from
// any. Memory is bounded: at most `capacity` micro-batches wait (the coordinator keeps at most
// `stages` in flight); a Put beyond that is refused with ResourceExhausted. Streams for a
// micro-batch the runner has already finished (e.g. it failed before waiting) are dropped.
class StreamInbox {
 public:
  explicit StreamInbox(size_t capacity = 64) : capacity_(capacity) {}

  absl::Status Put(uint64_t micro_batch_id, StageStreamsData data);
  // Waits for the micro-batch's streams until `deadline` (DeadlineExceeded) or Shutdown
  // (Cancelled). Marks it finished.
  absl::StatusOr<StageStreamsData> Take(uint64_t micro_batch_id, absl::Time deadline);
  // The runner is done with the micro-batch without taking its streams: drop them, now or when
  // they arrive.
  void Finish(uint64_t micro_batch_id);
  void Shutdown();
  // Drops every pending (pushed, not taken) micro-batch: a new step stream starts clean.
  void Clear();
  size_t waiting() const;

 private:
  void MarkFinished(uint64_t micro_batch_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const size_t capacity_;
  mutable absl::Mutex mu_;
  std::map<uint64_t, StageStreamsData> pending_ ABSL_GUARDED_BY(mu_);
  std::set<uint64_t> finished_ ABSL_GUARDED_BY(mu_);  // the last kFinishedKept finished ids
  std::deque<uint64_t> finished_order_ ABSL_GUARDED_BY(mu_);
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
};

// The streams' wire form (StageStreams.bf16): `out` = the upper 16 bits of every value and true
// when every value is bf16-exact (the stage outputs are: each HC post rounds to bf16); otherwise
// `out` is left empty and false (the sender sends fp32). UnpackBf16 is the inverse (`out` holds
// packed.size() / 2 floats). Both are exact: the receiver gets the sender's bits.
bool PackBf16(std::span<const float> streams, std::string* out);
void UnpackBf16(std::string_view packed, float* out);

// Sends StageStreams to the next stage over one gRPC channel, waiting for a peer that is still
// starting (wait-for-ready) until the push's deadline. Every push carries `credential`. From
// one thread at a time.
class StreamSender {
 public:
  StreamSender(std::string address, const ClusterCredential& credential);
  ~StreamSender();

  // Errors name the address: the RPC's status (DeadlineExceeded, Unavailable, the receiver's
  // refusal).
  absl::Status Push(uint64_t micro_batch_id, const StageStreamsData& data, absl::Time deadline);
  // The same for [rows, width] `streams`, or, with a non-empty `error`, the failure (no copy of
  // the streams is made).
  absl::Status Push(uint64_t micro_batch_id, int64_t rows, int64_t width,
                    std::span<const float> streams, std::string_view error, absl::Time deadline);
  const std::string& address() const { return address_; }

  class Impl;

 private:
  const std::string address_;
  std::unique_ptr<Impl> impl_;
};

// The receiving end of the grpc transport: Receive takes the micro-batch's streams from the
// inbox (DeadlineExceeded, Cancelled as Take; InvalidArgument when they are not the plan's
// [rows, width]); a failure the sender pushed is a Received with `failed` and its reason.
// `inbox` is borrowed and outlives this.
class GrpcStageInput : public StageLink {
 public:
  explicit GrpcStageInput(StreamInbox* inbox) : inbox_(inbox) {}
  StageMemory memory() const override { return StageMemory::kHost; }
  bool paired() const override { return false; }
  absl::Status Send(uint64_t micro_batch_id, int64_t rows, int64_t width, const void* streams,
                    std::string_view failure, absl::Time deadline) override;
  absl::StatusOr<Received> Receive(uint64_t micro_batch_id, int64_t rows, int64_t width,
                                   absl::Time deadline) override;
  void Skip(uint64_t micro_batch_id) override { inbox_->Finish(micro_batch_id); }
  void Abort() override {}

 private:
  StreamInbox* inbox_;
};

// The sending end of the grpc transport: Send pushes through `sender` (borrowed, outlives this).
class GrpcStageOutput : public StageLink {
 public:
  explicit GrpcStageOutput(StreamSender* sender) : sender_(sender) {}
  StageMemory memory() const override { return StageMemory::kHost; }
  bool paired() const override { return false; }
  absl::Status Send(uint64_t micro_batch_id, int64_t rows, int64_t width, const void* streams,
                    std::string_view failure, absl::Time deadline) override;
  absl::StatusOr<Received> Receive(uint64_t micro_batch_id, int64_t rows, int64_t width,
                                   absl::Time deadline) override;
  void Abort() override {}

 private:
  StreamSender* sender_;
};

}  // namespace ss::gpu
