#include "gpu_worker/nccl_stage_link.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status.h"
#include "gpu_worker/cuda_status.h"

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
// The header's room at the front of a message: the streams behind it stay 256-byte aligned.
constexpr size_t kHeaderBytes = 256;
constexpr uint32_t kMagic = 0x53534c4b;  // "SSLK"
// Streams of more than this are refused as a corrupt header (an 8K-token Flash chunk is 256 MiB).
constexpr int64_t kMaxStreamsBytes = int64_t{16} << 30;
// The micro-batch id of Create's first exchange (the coordinator's ids count up from 1).
constexpr uint64_t kConnectId = ~uint64_t{0};

}  // namespace

absl::StatusOr<std::unique_ptr<NcclStageLink>> NcclStageLink::Create(
    std::string_view unique_id, bool sender, int device, std::string what, size_t reserve_bytes,
    absl::Duration timeout, const std::atomic<bool>* cancel) {
  absl::StatusOr<std::unique_ptr<NcclComm>> comm =
      NcclComm::Create(unique_id, sender ? 0 : 1, 2, device);
  if (!comm.ok()) {
    return absl::Status(comm.status().code(),
                        absl::StrCat(what, ": ", comm.status().message(),
                                     " (a link's two workers must be on different GPUs)"));
  }
  (*comm)->set_cancel(cancel);
  std::unique_ptr<NcclStageLink> link(new NcclStageLink(std::move(*comm), sender, std::move(what)));
  RETURN_IF_ERROR(link->Init(reserve_bytes));
  const absl::Time deadline = absl::Now() + timeout;
  if (sender) {
    RETURN_IF_ERROR(link->Send(kConnectId, 0, 0, nullptr, "connect", deadline));
    RETURN_IF_ERROR(link->Flush(deadline));
  } else {
    absl::StatusOr<Received> r = link->Receive(kConnectId, 0, 0, deadline);
    if (!r.ok()) return r.status();
  }
  return link;
}

NcclStageLink::NcclStageLink(std::unique_ptr<NcclComm> comm, bool sender, std::string what)
    : comm_(std::move(comm)), sender_(sender), what_(std::move(what)) {}

absl::Status NcclStageLink::Init(size_t reserve_bytes) {
  RETURN_IF_ERROR(CudaCheck(cudaSetDevice(comm_->device()), "cudaSetDevice"));
  RETURN_IF_ERROR(CudaCheck(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                            "cudaStreamCreateWithFlags"));
  RETURN_IF_ERROR(CudaCheck(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking),
                            "cudaStreamCreateWithFlags"));
  for (size_t i = 0; i < (sender_ ? slots_.size() : 1); ++i) {
    Slot& s = slots_[i];
    RETURN_IF_ERROR(
        CudaCheck(cudaMallocHost(&s.header_host, sizeof(Header)), "cudaMallocHost(header)"));
    for (cudaEvent_t* e : {&s.copied, &s.sent}) {
      RETURN_IF_ERROR(CudaCheck(cudaEventCreateWithFlags(e, cudaEventDisableTiming),
                                "cudaEventCreateWithFlags"));
    }
    RETURN_IF_ERROR(Fit(s, kHeaderBytes + reserve_bytes));
  }
  return absl::OkStatus();
}

NcclStageLink::~NcclStageLink() {
  cudaSetDevice(comm_->device());
  comm_->Abort();  // releases a transfer still waiting for a peer before the streams are drained
  for (cudaStream_t s : {stream_, copy_stream_}) {
    if (s == nullptr) continue;
    cudaStreamSynchronize(s);
    cudaStreamDestroy(s);
  }
  for (Slot& s : slots_) {
    if (s.header_host != nullptr) cudaFreeHost(s.header_host);
    if (s.message != nullptr) cudaFree(s.message);
    for (cudaEvent_t e : {s.copied, s.sent}) {
      if (e != nullptr) cudaEventDestroy(e);
    }
  }
}

void NcclStageLink::Abort() { comm_->Abort(); }

absl::Status NcclStageLink::Fit(Slot& slot, size_t bytes) {
  if (bytes <= slot.capacity) return absl::OkStatus();
  if (slot.message != nullptr) cudaFree(slot.message);
  slot.message = nullptr;
  slot.capacity = 0;
  RETURN_IF_ERROR(CudaCheck(cudaMalloc(reinterpret_cast<void**>(&slot.message), bytes),
                            "cudaMalloc(stage link message)"));
  slot.capacity = bytes;
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

absl::Status NcclStageLink::WaitSent(Slot& slot, absl::Time deadline) {
  if (!slot.in_flight) return absl::OkStatus();
  const absl::Duration left = std::max(deadline - absl::Now(), absl::ZeroDuration());
  absl::Status s = comm_->WaitEvent(
      slot.sent, left, absl::StrCat("sending micro-batch ", slot.micro_batch_id, "'s streams"));
  if (!s.ok()) return Broken(std::move(s));
  slot.in_flight = false;
  return absl::OkStatus();
}

absl::Status NcclStageLink::Flush(absl::Time deadline) {
  for (Slot& s : slots_) RETURN_IF_ERROR(WaitSent(s, deadline));
  return absl::OkStatus();
}

absl::Status NcclStageLink::Send(uint64_t micro_batch_id, int64_t rows, int64_t width,
                                 const void* streams, std::string_view failure,
                                 absl::Time deadline) {
  const bool failed = !failure.empty();  // the message carries the flag, not the reason
  if (!sender_) return absl::FailedPreconditionError(absl::StrCat(what_, ": the receiving end"));
  if (comm_->aborted()) return absl::FailedPreconditionError(absl::StrCat(what_, " is broken"));
  if (rows < 0 || width < 0 || rows * width * 2 > kMaxStreamsBytes ||
      (!failed && (rows < 1 || width < 1 || streams == nullptr))) {
    return absl::InvalidArgumentError(
        absl::StrCat(what_, ": streams [", rows, ", ", width, "] to send"));
  }
  const size_t bytes = static_cast<size_t>(rows * width) * 2;
  RETURN_IF_ERROR(CudaCheck(cudaSetDevice(comm_->device()), "cudaSetDevice"));
  Slot& slot = slots_[next_];
  RETURN_IF_ERROR(WaitSent(slot, deadline));  // its previous message has left
  next_ = (next_ + 1) % slots_.size();
  RETURN_IF_ERROR(Fit(slot, kHeaderBytes + bytes));
  // The caller's streams into the slot (the caller's stream has finished writing them) on the
  // copy stream, then the header and the send behind the link's earlier sends.
  absl::Status s = absl::OkStatus();
  if (!failed) {
    s = CudaCheck(cudaMemcpyAsync(slot.message + kHeaderBytes, streams, bytes,
                                  cudaMemcpyDeviceToDevice, copy_stream_),
                  "cudaMemcpyAsync(streams)");
    if (s.ok()) s = CudaCheck(cudaEventRecord(slot.copied, copy_stream_), "cudaEventRecord");
    if (s.ok()) s = CudaCheck(cudaStreamWaitEvent(stream_, slot.copied, 0), "cudaStreamWaitEvent");
  }
  const Header h{micro_batch_id, rows, width, failed ? 1u : 0u, kMagic};
  std::memcpy(slot.header_host, &h, sizeof(h));
  if (s.ok()) {
    s = CudaCheck(
        cudaMemcpyAsync(slot.message, slot.header_host, sizeof(h), cudaMemcpyHostToDevice, stream_),
        "cudaMemcpyAsync(header)");
  }
  if (s.ok()) s = comm_->Send(slot.message, kHeaderBytes + bytes, 1, stream_);
  if (s.ok()) s = CudaCheck(cudaEventRecord(slot.sent, stream_), "cudaEventRecord");
  if (!s.ok()) return Broken(std::move(s));
  slot.in_flight = true;
  slot.micro_batch_id = micro_batch_id;
  if (failed) return absl::OkStatus();
  // The streams have left the caller's buffer once the copy is done (microseconds: the copy
  // stream waits on nothing else).
  const absl::Duration left = std::max(deadline - absl::Now(), absl::ZeroDuration());
  s = comm_->WaitEvent(slot.copied, left, "copying the streams to send");
  return s.ok() ? s : Broken(std::move(s));
}

absl::StatusOr<StageLink::Received> NcclStageLink::Receive(uint64_t micro_batch_id, int64_t rows,
                                                           int64_t width, absl::Time deadline) {
  if (sender_) return absl::FailedPreconditionError(absl::StrCat(what_, ": the sending end"));
  if (comm_->aborted()) return absl::FailedPreconditionError(absl::StrCat(what_, " is broken"));
  if (rows < 0 || width < 0 || rows * width * 2 > kMaxStreamsBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(what_, ": streams [", rows, ", ", width, "] to receive"));
  }
  const size_t bytes = static_cast<size_t>(rows * width) * 2;
  RETURN_IF_ERROR(CudaCheck(cudaSetDevice(comm_->device()), "cudaSetDevice"));
  Slot& in = slots_[0];
  // Where the buffer cannot grow, the sender's message is on its way and nothing can take it: the
  // ends are out of step.
  if (absl::Status e = Fit(in, kHeaderBytes + bytes); !e.ok()) return Broken(std::move(e));
  absl::Status s = comm_->Recv(in.message, kHeaderBytes + bytes, 0, stream_);
  if (s.ok()) {
    s = CudaCheck(cudaMemcpyAsync(in.header_host, in.message, sizeof(Header),
                                  cudaMemcpyDeviceToHost, stream_),
                  "cudaMemcpyAsync(header)");
  }
  if (!s.ok()) return Broken(std::move(s));
  RETURN_IF_ERROR(
      Wait(deadline, absl::StrCat("receiving micro-batch ", micro_batch_id, "'s streams")));
  Header h;
  std::memcpy(&h, in.header_host, sizeof(h));
  if (h.magic != kMagic || h.micro_batch_id != micro_batch_id || h.rows != rows ||
      h.width != width) {
    return Broken(absl::DataLossError(absl::StrCat(
        "expected micro-batch ", micro_batch_id, "'s streams [", rows, ", ", width,
        "], got a message for ",
        h.magic == kMagic
            ? absl::StrCat("micro-batch ", h.micro_batch_id, " [", h.rows, ", ", h.width, "]")
            : std::string("nothing this transport sends"),
        ": the two ends are out of step")));
  }
  Received r;
  r.rows = rows;
  r.width = width;
  r.failed = h.failed != 0;
  r.streams = r.failed ? nullptr : in.message + kHeaderBytes;
  return r;
}

}  // namespace ss::gpu
