#include "gpu_worker/nccl_stage_link.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status.h"

namespace ss::gpu {

namespace {

struct Header {
  uint64_t micro_batch_id;
  int64_t rows;
  int64_t width;
  uint32_t failed;
  uint32_t magic;
};
static_assert(sizeof(Header) == 32);
constexpr uint32_t kMagic = 0x53534c4b;  // "SSLK"
// Streams of more than this are refused as a corrupt header (an 8K-token Flash chunk is 256 MiB).
constexpr int64_t kMaxStreamsBytes = int64_t{16} << 30;
// The micro-batch id of Create's first exchange (the coordinator's ids count up from 1).
constexpr uint64_t kConnectId = ~uint64_t{0};

absl::Status Cuda(cudaError_t e, const char* what) {
  return e == cudaSuccess
             ? absl::OkStatus()
             : absl::InternalError(absl::StrCat("CUDA: ", what, ": ", cudaGetErrorString(e)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<NcclStageLink>> NcclStageLink::Create(std::string_view unique_id,
                                                                     bool sender, int device,
                                                                     std::string what,
                                                                     size_t reserve_bytes,
                                                                     absl::Duration timeout) {
  absl::StatusOr<std::unique_ptr<NcclComm>> comm =
      NcclComm::Create(unique_id, sender ? 0 : 1, 2, device);
  if (!comm.ok()) {
    return absl::Status(comm.status().code(),
                        absl::StrCat(what, ": ", comm.status().message(),
                                     " (NCCL refuses a link whose two workers share a GPU)"));
  }
  std::unique_ptr<NcclStageLink> link(new NcclStageLink(std::move(*comm), sender, std::move(what)));
  if (absl::Status s = Cuda(cudaStreamCreateWithFlags(&link->stream_, cudaStreamNonBlocking),
                            "cudaStreamCreateWithFlags");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = Cuda(cudaMalloc(&link->header_dev_, sizeof(Header)), "cudaMalloc(header)");
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          Cuda(cudaMallocHost(&link->header_host_, sizeof(Header)), "cudaMallocHost(header)");
      !s.ok()) {
    return s;
  }
  if (!sender) {
    if (absl::Status s = link->Reserve(reserve_bytes); !s.ok()) return s;
  }
  const absl::Time deadline = absl::Now() + timeout;
  if (sender) {
    if (absl::Status s = link->Send(kConnectId, 0, 0, nullptr, true, deadline); !s.ok()) return s;
  } else {
    absl::StatusOr<Received> r = link->Receive(kConnectId, deadline);
    if (!r.ok()) return r.status();
  }
  return link;
}

NcclStageLink::NcclStageLink(std::unique_ptr<NcclComm> comm, bool sender, std::string what)
    : comm_(std::move(comm)), sender_(sender), what_(std::move(what)) {}

NcclStageLink::~NcclStageLink() {
  cudaSetDevice(comm_->device());
  comm_->Abort();  // releases a transfer still waiting for a peer before the stream is drained
  if (stream_ != nullptr) {
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
  if (header_dev_ != nullptr) cudaFree(header_dev_);
  if (header_host_ != nullptr) cudaFreeHost(header_host_);
  if (buffer_ != nullptr) cudaFree(buffer_);
}

void NcclStageLink::Abort() { comm_->Abort(); }

absl::Status NcclStageLink::Reserve(size_t bytes) {
  if (bytes <= buffer_bytes_) return absl::OkStatus();
  if (buffer_ != nullptr) cudaFree(buffer_);
  buffer_ = nullptr;
  buffer_bytes_ = 0;
  RETURN_IF_ERROR(Cuda(cudaMalloc(&buffer_, bytes), "cudaMalloc(stage link streams)"));
  buffer_bytes_ = bytes;
  return absl::OkStatus();
}

absl::Status NcclStageLink::Broken(absl::Status why) {
  comm_->Abort();
  return absl::Status(why.code(), absl::StrCat(what_, " (NCCL) is broken: ", why.message()));
}

absl::Status NcclStageLink::Wait(absl::Time deadline, std::string_view what) {
  const absl::Duration left = std::max(deadline - absl::Now(), absl::ZeroDuration());
  absl::Status s = comm_->Synchronize(stream_, left, what);
  return s.ok() ? s : Broken(std::move(s));
}

absl::Status NcclStageLink::Send(uint64_t micro_batch_id, int64_t rows, int64_t width,
                                 const void* streams, bool failed, absl::Time deadline) {
  if (!sender_) return absl::FailedPreconditionError(absl::StrCat(what_, ": the receiving end"));
  if (comm_->aborted()) return absl::FailedPreconditionError(absl::StrCat(what_, " is broken"));
  const size_t bytes = failed ? 0 : static_cast<size_t>(rows * width) * 2;
  if (!failed && (rows < 1 || width < 1 || streams == nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what_, ": streams [", rows, ", ", width, "] to send"));
  }
  if (absl::Status s = Cuda(cudaSetDevice(comm_->device()), "cudaSetDevice"); !s.ok()) return s;
  const Header h{micro_batch_id, failed ? 0 : rows, failed ? 0 : width, failed ? 1u : 0u, kMagic};
  std::memcpy(header_host_, &h, sizeof(h));
  absl::Status s =
      Cuda(cudaMemcpyAsync(header_dev_, header_host_, sizeof(h), cudaMemcpyHostToDevice, stream_),
           "cudaMemcpyAsync(header)");
  if (s.ok()) s = comm_->Send(header_dev_, sizeof(h), 1, stream_);
  if (s.ok() && bytes > 0) s = comm_->Send(streams, bytes, 1, stream_);
  if (!s.ok()) return Broken(std::move(s));
  return Wait(deadline, absl::StrCat("sending micro-batch ", micro_batch_id, "'s streams"));
}

absl::StatusOr<StageLink::Received> NcclStageLink::Receive(uint64_t micro_batch_id,
                                                           absl::Time deadline) {
  if (sender_) return absl::FailedPreconditionError(absl::StrCat(what_, ": the sending end"));
  if (comm_->aborted()) return absl::FailedPreconditionError(absl::StrCat(what_, " is broken"));
  if (absl::Status s = Cuda(cudaSetDevice(comm_->device()), "cudaSetDevice"); !s.ok()) return s;
  absl::Status s = comm_->Recv(header_dev_, sizeof(Header), 0, stream_);
  if (s.ok()) {
    s = Cuda(
        cudaMemcpyAsync(header_host_, header_dev_, sizeof(Header), cudaMemcpyDeviceToHost, stream_),
        "cudaMemcpyAsync(header)");
  }
  if (!s.ok()) return Broken(std::move(s));
  if (absl::Status w =
          Wait(deadline, absl::StrCat("receiving micro-batch ", micro_batch_id, "'s streams"));
      !w.ok()) {
    return w;
  }
  Header h;
  std::memcpy(&h, header_host_, sizeof(h));
  if (h.magic != kMagic || h.micro_batch_id != micro_batch_id) {
    return Broken(absl::DataLossError(
        absl::StrCat("expected micro-batch ", micro_batch_id, "'s streams, got a message for ",
                     h.magic == kMagic ? absl::StrCat("micro-batch ", h.micro_batch_id)
                                       : std::string("nothing this transport sends"),
                     ": the two ends are out of step")));
  }
  Received r;
  if (h.failed != 0) {
    r.failed = true;
    return r;
  }
  if (h.rows < 1 || h.width < 1 || h.rows > kMaxStreamsBytes / 2 / h.width) {
    return Broken(absl::DataLossError(
        absl::StrCat("micro-batch ", micro_batch_id, ": streams [", h.rows, ", ", h.width, "]")));
  }
  const size_t bytes = static_cast<size_t>(h.rows * h.width) * 2;
  // Where it cannot grow, the sender's data is on its way and nothing can take it: the ends are
  // out of step.
  if (absl::Status e = Reserve(bytes); !e.ok()) return Broken(std::move(e));
  if (absl::Status e = comm_->Recv(buffer_, bytes, 0, stream_); !e.ok()) return Broken(e);
  if (absl::Status w =
          Wait(deadline, absl::StrCat("receiving micro-batch ", micro_batch_id, "'s streams"));
      !w.ok()) {
    return w;
  }
  r.rows = h.rows;
  r.width = h.width;
  r.streams = buffer_;
  return r;
}

}  // namespace ss::gpu
