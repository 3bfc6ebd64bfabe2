#include "gpu_worker/stage_transfer.h"

#include <grpcpp/grpcpp.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/bf16.h"
#include "common/cluster_protocol.h"
#include "common/status.h"
#include "proto/cluster.grpc.pb.h"

namespace ss::gpu {

namespace pb = ::splitserve::v1;

namespace {
constexpr size_t kFinishedKept = 4096;
}  // namespace

absl::Status StreamInbox::Put(uint64_t id, StageStreamsData data) {
  absl::MutexLock lock(&mu_);
  if (finished_.count(id)) return absl::OkStatus();  // the runner is past it
  if (pending_.count(id)) {
    return absl::AlreadyExistsError(
        absl::StrCat("streams of micro-batch ", id, " already received"));
  }
  if (pending_.size() >= capacity_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "stream inbox full (", capacity_, " micro-batches waiting); micro-batch ", id, " refused"));
  }
  pending_.emplace(id, std::move(data));
  return absl::OkStatus();
}

absl::StatusOr<StageStreamsData> StreamInbox::Take(uint64_t id, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return shutdown_ || pending_.count(id) != 0;
  };
  mu_.AwaitWithDeadline(absl::Condition(&ready), deadline);
  MarkFinished(id);
  if (shutdown_) return absl::CancelledError("the worker is shutting down");
  auto it = pending_.find(id);
  if (it == pending_.end()) {
    return absl::DeadlineExceededError(absl::StrCat("the previous stage's streams of micro-batch ",
                                                    id, " did not arrive in time"));
  }
  StageStreamsData d = std::move(it->second);
  pending_.erase(it);
  return d;
}

void StreamInbox::Finish(uint64_t id) {
  absl::MutexLock lock(&mu_);
  pending_.erase(id);
  MarkFinished(id);
}

void StreamInbox::MarkFinished(uint64_t id) {
  if (!finished_.insert(id).second) return;
  finished_order_.push_back(id);
  if (finished_order_.size() > kFinishedKept) {
    finished_.erase(finished_order_.front());
    finished_order_.pop_front();
  }
}

void StreamInbox::Shutdown() {
  absl::MutexLock lock(&mu_);
  shutdown_ = true;
}

void StreamInbox::Clear() {
  absl::MutexLock lock(&mu_);
  pending_.clear();
}

size_t StreamInbox::waiting() const {
  absl::MutexLock lock(&mu_);
  return pending_.size();
}

class StreamSender::Impl {
 public:
  Impl(const std::string& address, const ClusterCredential& credential) {
    ::grpc::ChannelArguments args;
    args.SetMaxSendMessageSize(-1);
    args.SetMaxReceiveMessageSize(-1);
    channel_ = credential.CreateChannel(address, args);
    stub_ = pb::GpuWorker::NewStub(channel_);
  }
  std::shared_ptr<::grpc::Channel> channel_;
  std::unique_ptr<pb::GpuWorker::Stub> stub_;
};

StreamSender::StreamSender(std::string address, const ClusterCredential& credential)
    : address_(std::move(address)), impl_(std::make_unique<Impl>(address_, credential)) {}

StreamSender::~StreamSender() = default;

bool PackBf16(std::span<const float> streams, std::string* out) {
  out->resize(streams.size() * sizeof(uint16_t));
  char* dst = out->data();
  uint32_t low = 0;  // the OR of every value's lower 16 bits: 0 when all are bf16-exact
  for (size_t i = 0; i < streams.size(); ++i) {
    uint32_t u;
    std::memcpy(&u, &streams[i], sizeof(u));
    low |= u & 0xffffu;
    const uint16_t hi = static_cast<uint16_t>(u >> 16);
    std::memcpy(dst + i * sizeof(hi), &hi, sizeof(hi));
  }
  if (low == 0) return true;
  out->clear();
  return false;
}

void UnpackBf16(std::string_view packed, float* out) {
  for (size_t i = 0; i < packed.size() / sizeof(uint16_t); ++i) {
    uint16_t hi;
    std::memcpy(&hi, packed.data() + i * sizeof(hi), sizeof(hi));
    out[i] = Bf16ToFloat(hi);
  }
}

absl::Status StreamSender::Push(uint64_t id, const StageStreamsData& data, absl::Time deadline) {
  return Push(id, data.rows, data.width, data.streams, data.error, deadline);
}

absl::Status StreamSender::Push(uint64_t id, int64_t rows, int64_t width,
                                std::span<const float> streams, std::string_view error,
                                absl::Time deadline) {
  pb::StageStreams msg;
  msg.set_protocol_version(kClusterProtocolVersion);
  msg.set_micro_batch_id(id);
  msg.set_rows(static_cast<int32_t>(rows));
  msg.set_width(static_cast<int32_t>(width));
  if (!error.empty()) {
    msg.set_error(std::string(error));
  } else if (!PackBf16(streams, msg.mutable_streams())) {
    msg.set_streams(reinterpret_cast<const char*>(streams.data()), streams.size() * sizeof(float));
  } else {
    msg.set_bf16(true);
  }
  ::grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(deadline));
  ctx.set_wait_for_ready(true);
  pb::PushReply reply;
  const ::grpc::Status st = impl_->stub_->PushStreams(&ctx, msg, &reply);
  if (st.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(st.error_code()),
                      absl::StrCat("pushing micro-batch ", id, "'s streams to the next stage at ",
                                   address_, ": ", st.error_message()));
}

absl::Status GrpcStageInput::Send(uint64_t, int64_t, int64_t, const void*, std::string_view,
                                  absl::Time) {
  return absl::FailedPreconditionError("the grpc stage transport's receiving end cannot send");
}

absl::StatusOr<StageLink::Received> GrpcStageInput::Receive(uint64_t id, int64_t rows,
                                                            int64_t width, absl::Time deadline) {
  ASSIGN_OR_RETURN(StageStreamsData d, inbox_->Take(id, deadline));
  Received r;
  if (!d.error.empty()) {
    r.failed = true;
    r.failure = std::move(d.error);
    return r;
  }
  if (d.rows != rows || d.width != width ||
      static_cast<int64_t>(d.streams.size()) != rows * width) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the previous stage's streams of micro-batch ", id, " are [", d.rows, ", ", d.width,
        "] with ", d.streams.size(), " values; the plan needs [", rows, ", ", width, "]"));
  }
  r.rows = d.rows;
  r.width = d.width;
  r.host = std::move(d.streams);
  r.streams = r.host.data();
  return r;
}

absl::Status GrpcStageOutput::Send(uint64_t id, int64_t rows, int64_t width, const void* streams,
                                   std::string_view failure, absl::Time deadline) {
  if (!failure.empty()) return sender_->Push(id, 0, 0, {}, failure, deadline);
  const auto* values = static_cast<const float*>(streams);
  return sender_->Push(id, rows, width,
                       std::span<const float>(values, static_cast<size_t>(rows * width)), {},
                       deadline);
}

absl::StatusOr<StageLink::Received> GrpcStageOutput::Receive(uint64_t, int64_t, int64_t,
                                                             absl::Time) {
  return absl::FailedPreconditionError("the grpc stage transport's sending end cannot receive");
}

}  // namespace ss::gpu
