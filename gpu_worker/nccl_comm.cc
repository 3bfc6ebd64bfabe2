#include "gpu_worker/nccl_comm.h"

#include <chrono>
#include <cstring>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"

#if SS_HAVE_NCCL
#include <nccl.h>
#endif

namespace ss::gpu {

#if SS_HAVE_NCCL

struct NcclComm::Handle {
  ncclComm_t comm = nullptr;
};

namespace {

absl::Status NcclError(ncclResult_t r, const char* what, int rank) {
  return absl::InternalError(
      absl::StrCat("NCCL: ", what, " (rank ", rank, "): ", ncclGetErrorString(r)));
}

#define NCCL_RETURN_IF_ERROR(expr, rank)                                      \
  do {                                                                        \
    const ncclResult_t ss_nccl_r_ = (expr);                                   \
    if (ss_nccl_r_ != ncclSuccess) return NcclError(ss_nccl_r_, #expr, rank); \
  } while (0)

#define CUDA_RETURN_IF_ERROR_RANK(expr, rank)                                                     \
  do {                                                                                            \
    const cudaError_t ss_cuda_e_ = (expr);                                                        \
    if (ss_cuda_e_ != cudaSuccess) {                                                              \
      return absl::InternalError(                                                                 \
          absl::StrCat("CUDA: ", #expr, " (rank ", rank, "): ", cudaGetErrorString(ss_cuda_e_))); \
    }                                                                                             \
  } while (0)

}  // namespace

bool NcclComm::Available() { return true; }

absl::StatusOr<std::string> NcclComm::NewUniqueId() {
  static_assert(sizeof(ncclUniqueId) == kUniqueIdBytes);
  ncclUniqueId id;
  NCCL_RETURN_IF_ERROR(ncclGetUniqueId(&id), -1);
  return std::string(reinterpret_cast<const char*>(&id), sizeof(id));
}

absl::StatusOr<std::unique_ptr<NcclComm>> NcclComm::Create(std::string_view unique_id, int rank,
                                                           int size, int device) {
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("NCCL communicator: rank ", rank, " outside a group of ", size));
  }
  if (unique_id.size() != kUniqueIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat("NCCL unique id of ", unique_id.size(),
                                                   " bytes (expected ", kUniqueIdBytes, ")"));
  }
  ncclUniqueId id;
  std::memcpy(&id, unique_id.data(), sizeof(id));
  CUDA_RETURN_IF_ERROR_RANK(cudaSetDevice(device), rank);
  auto h = std::make_unique<Handle>();
  NCCL_RETURN_IF_ERROR(ncclCommInitRank(&h->comm, size, id, rank), rank);
  return std::unique_ptr<NcclComm>(new NcclComm(std::move(h), rank, size, device));
}

absl::StatusOr<std::vector<std::unique_ptr<NcclComm>>> NcclComm::CreateGroup(
    std::span<const int> devices) {
  const int n = static_cast<int>(devices.size());
  if (n < 1) return absl::InvalidArgumentError("NCCL group of no devices");
  ncclUniqueId id;
  NCCL_RETURN_IF_ERROR(ncclGetUniqueId(&id), -1);
  std::vector<std::unique_ptr<Handle>> handles;
  // One thread initialises every rank: the calls join inside one group (NCCL's "management of
  // multiple GPUs from one thread"), so none blocks waiting for the others.
  NCCL_RETURN_IF_ERROR(ncclGroupStart(), -1);
  for (int r = 0; r < n; ++r) {
    handles.push_back(std::make_unique<Handle>());
    const cudaError_t e = cudaSetDevice(devices[r]);
    const ncclResult_t nr =
        e == cudaSuccess ? ncclCommInitRank(&handles.back()->comm, n, id, r) : ncclSuccess;
    if (e != cudaSuccess || nr != ncclSuccess) {
      ncclGroupEnd();
      if (e != cudaSuccess) {
        return absl::InternalError(absl::StrCat("CUDA: cudaSetDevice(", devices[r], ") (rank ", r,
                                                "): ", cudaGetErrorString(e)));
      }
      return NcclError(nr, "ncclCommInitRank", r);
    }
  }
  NCCL_RETURN_IF_ERROR(ncclGroupEnd(), -1);
  std::vector<std::unique_ptr<NcclComm>> comms;
  for (int r = 0; r < n; ++r) {
    comms.push_back(
        std::unique_ptr<NcclComm>(new NcclComm(std::move(handles[r]), r, n, devices[r])));
  }
  return comms;
}

NcclComm::NcclComm(std::unique_ptr<Handle> h, int rank, int size, int device)
    : h_(std::move(h)), rank_(rank), size_(size), device_(device) {}

// Destruction is ncclCommAbort, after the caller has drained its streams: it is local, where
// ncclCommDestroy is an intra-node collective that would hang for ranks destroyed one after
// another from one thread, or when a peer is already gone.
NcclComm::~NcclComm() { Abort(); }

void NcclComm::Abort() {
  if (h_ == nullptr || h_->comm == nullptr) return;
  cudaSetDevice(device_);
  ncclCommAbort(h_->comm);
  h_->comm = nullptr;
  aborted_ = true;
}

absl::Status NcclComm::AllReduceSum(float* data, int64_t n, cudaStream_t stream) {
  if (aborted_) return absl::FailedPreconditionError("NCCL communicator aborted");
  NCCL_RETURN_IF_ERROR(
      ncclAllReduce(data, data, static_cast<size_t>(n), ncclFloat32, ncclSum, h_->comm, stream),
      rank_);
  return absl::OkStatus();
}

absl::Status NcclComm::AllGather(const float* send, int64_t n, float* recv, cudaStream_t stream) {
  if (aborted_) return absl::FailedPreconditionError("NCCL communicator aborted");
  NCCL_RETURN_IF_ERROR(
      ncclAllGather(send, recv, static_cast<size_t>(n), ncclFloat32, h_->comm, stream), rank_);
  return absl::OkStatus();
}

absl::Status NcclComm::Send(const void* data, size_t bytes, int peer, cudaStream_t stream) {
  if (aborted_) return absl::FailedPreconditionError("NCCL communicator aborted");
  NCCL_RETURN_IF_ERROR(ncclSend(data, bytes, ncclUint8, peer, h_->comm, stream), rank_);
  return absl::OkStatus();
}

absl::Status NcclComm::Recv(void* data, size_t bytes, int peer, cudaStream_t stream) {
  if (aborted_) return absl::FailedPreconditionError("NCCL communicator aborted");
  NCCL_RETURN_IF_ERROR(ncclRecv(data, bytes, ncclUint8, peer, h_->comm, stream), rank_);
  return absl::OkStatus();
}

namespace {

// Polls `query` (cudaStreamQuery) until it reports completion, an error, an
// asynchronous NCCL error or the deadline: a short spin first (decode steps wait microseconds),
// then sleeps of 50 µs.
template <typename Query>
absl::Status Wait(Query query, ncclComm_t comm, int rank, absl::Duration timeout,
                  std::string_view what, const std::atomic<bool>* cancel) {
  const auto deadline = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(timeout);
  for (int i = 0;; ++i) {
    const cudaError_t e = query();
    if (e == cudaSuccess) return absl::OkStatus();
    if (e != cudaErrorNotReady) {
      return absl::InternalError(
          absl::StrCat("CUDA: ", std::string(what), " (rank ", rank, "): ", cudaGetErrorString(e)));
    }
    ncclResult_t async = ncclSuccess;
    if (ncclCommGetAsyncError(comm, &async) == ncclSuccess && async != ncclSuccess &&
        async != ncclInProgress) {
      return NcclError(async, "asynchronous error", rank);
    }
    if (cancel != nullptr && cancel->load()) {
      return absl::CancelledError(
          absl::StrCat("rank ", rank, ": ", std::string(what), ": the worker is stopping"));
    }
    if (std::chrono::steady_clock::now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat("rank ", rank, ": ", std::string(what),
                                                      " did not complete within ",
                                                      absl::FormatDuration(timeout)));
    }
    if (i < 2000) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
}

}  // namespace

absl::Status NcclComm::Synchronize(cudaStream_t stream, absl::Duration timeout,
                                   std::string_view what) {
  if (aborted_) return absl::FailedPreconditionError("NCCL communicator aborted");
  absl::Status s =
      Wait([stream] { return cudaStreamQuery(stream); }, h_->comm, rank_, timeout, what, cancel_);
  if (!s.ok()) Abort();
  return s;
}

absl::Status NcclComm::WaitEvent(cudaEvent_t event, absl::Duration timeout, std::string_view what) {
  if (aborted_) return absl::FailedPreconditionError("NCCL communicator aborted");
  absl::Status s =
      Wait([event] { return cudaEventQuery(event); }, h_->comm, rank_, timeout, what, cancel_);
  if (!s.ok()) Abort();
  return s;
}

#else  // !SS_HAVE_NCCL

struct NcclComm::Handle {};

namespace {
absl::Status NoNccl() {
  return absl::UnimplementedError(
      "tensor parallelism and NCCL stage links need NCCL, and this build has none "
      "(cmake/nccl.cmake found no nccl.h "
      "and libnccl; set NCCL_ROOT and reconfigure)");
}
}  // namespace

bool NcclComm::Available() { return false; }
absl::StatusOr<std::string> NcclComm::NewUniqueId() { return NoNccl(); }
absl::StatusOr<std::unique_ptr<NcclComm>> NcclComm::Create(std::string_view, int, int, int) {
  return NoNccl();
}
absl::StatusOr<std::vector<std::unique_ptr<NcclComm>>> NcclComm::CreateGroup(std::span<const int>) {
  return NoNccl();
}
NcclComm::NcclComm(std::unique_ptr<Handle> h, int rank, int size, int device)
    : h_(std::move(h)), rank_(rank), size_(size), device_(device) {}
NcclComm::~NcclComm() = default;
void NcclComm::Abort() { aborted_ = true; }
absl::Status NcclComm::AllReduceSum(float*, int64_t, cudaStream_t) { return NoNccl(); }
absl::Status NcclComm::AllGather(const float*, int64_t, float*, cudaStream_t) { return NoNccl(); }
absl::Status NcclComm::Send(const void*, size_t, int, cudaStream_t) { return NoNccl(); }
absl::Status NcclComm::Recv(void*, size_t, int, cudaStream_t) { return NoNccl(); }
absl::Status NcclComm::Synchronize(cudaStream_t, absl::Duration, std::string_view) {
  return NoNccl();
}
absl::Status NcclComm::WaitEvent(cudaEvent_t, absl::Duration, std::string_view) { return NoNccl(); }

#endif  // SS_HAVE_NCCL

}  // namespace ss::gpu
