// One rank's NCCL communicator: of a tensor-parallel group (the cuda backend's two all-reduces per
// block, after attention's wo_b and after the MoE, and the LM head's vocabulary gather:
// ARCHITECTURE.md "One step", cuda_backend.h "Tensor parallelism"), or of a two-rank link between
// adjacent pipeline stages (point-to-point Send / Recv: nccl_stage_link.h).
//
// Setup. One rank (in a cluster: the coordinator, which hands NCCL unique ids to the workers at
// registration) makes an id with NewUniqueId(); every rank of the group then calls
// Create(id, rank, size, device) on its own device, all of them concurrently: ncclCommInitRank
// returns only once the whole group has joined. CreateGroup() makes every rank of a group inside
// one process (one thread, one ncclCommInitRank per device inside ncclGroupStart/End), for the
// tests and splitserve-golden --tp.
//
// Transport. NCCL chooses it and reads its NCCL_* environment variables itself; nothing here sets
// or overrides one. PCIe GPUs without peer-to-peer access (RTX 3090s on consumer boards) run with
// NCCL_P2P_DISABLE=1, which routes the collectives through host memory (NCCL's SHM transport);
// machines whose GPUs must not use NVLink multicast keep NCCL_NVLS_ENABLE=0.
//
// Collectives are enqueued on the caller's stream, which belongs to this rank's device (the
// caller has made it current), and every rank must make the same calls in the same order with the
// same sizes. Threads: one thread at a time per communicator; each rank of an in-process group on
// its own thread (a rank blocks in Synchronize until its peers have made the matching call).
//
// Failure. A rank that stops making calls (an error on its side, a dead process) leaves its peers
// waiting inside a collective. Synchronize waits with a deadline and polls the communicator's
// asynchronous error; on either it aborts the communicator (ncclCommAbort) and returns an error
// naming the rank. An aborted communicator fails every later call: the group must be rebuilt.
//
// Builds without NCCL (SS_HAVE_NCCL unset, see cmake/nccl.cmake): Available() is false and every
// factory returns Unimplemented, so TP > 1 is a clear error at start and TP = 1 needs none of
// this.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ss::gpu {

class NcclComm {
 public:
  // Bytes of an NCCL unique id (ncclUniqueId, NCCL_UNIQUE_ID_BYTES).
  static constexpr size_t kUniqueIdBytes = 128;

  // Whether this build links NCCL.
  static bool Available();

  // A new unique id (kUniqueIdBytes opaque bytes, for the other ranks).
  static absl::StatusOr<std::string> NewUniqueId();

  // This rank's communicator of a group of `size` ranks on CUDA device `device`. Blocks until all
  // ranks have called it with the same id. InvalidArgument for a rank outside [0, size) or an id
  // of the wrong length; Internal naming the NCCL error otherwise.
  static absl::StatusOr<std::unique_ptr<NcclComm>> Create(std::string_view unique_id, int rank,
                                                          int size, int device);

  // Every rank of a group in this process: rank i on devices[i] (distinct devices).
  static absl::StatusOr<std::vector<std::unique_ptr<NcclComm>>> CreateGroup(
      std::span<const int> devices);

  ~NcclComm();
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int device() const { return device_; }
  bool aborted() const { return aborted_; }

  // data[0, n) = the sum over the ranks of their data[0, n), fp32, in place. Every rank receives
  // the same bits (NCCL reduces each element once and broadcasts it).
  absl::Status AllReduceSum(float* data, int64_t n, cudaStream_t stream);
  // recv[r·n, (r + 1)·n) = rank r's send[0, n), for every rank r.
  absl::Status AllGather(const float* send, int64_t n, float* recv, cudaStream_t stream);
  // Point to point: `bytes` bytes to / from rank `peer`. Messages between two ranks are matched
  // in the order each side enqueues them, and a message's two sides must give the same size.
  absl::Status Send(const void* data, size_t bytes, int peer, cudaStream_t stream);
  absl::Status Recv(void* data, size_t bytes, int peer, cudaStream_t stream);

  // Waits for the stream with a deadline; see "Failure" above. Callers wait here right after
  // enqueueing a collective, so no later plain wait of theirs can block on a stopped peer.
  // `what` names the wait in the deadline's error.
  absl::Status Synchronize(cudaStream_t stream, absl::Duration timeout,
                           std::string_view what =
                               "stream synchronisation (a peer of the group "
                               "stopped: the group must be rebuilt)");

  // Waits (Synchronize, WaitEvent) also end, with Cancelled, once `*cancel` is true (the
  // worker's stop flag: a stopping worker does not wait out a deadline). Borrowed; null: never.
  void set_cancel(const std::atomic<bool>* cancel) { cancel_ = cancel; }

  // As Synchronize, for the work before `event` (recorded on a stream of this device).
  absl::Status WaitEvent(cudaEvent_t event, absl::Duration timeout, std::string_view what);

  // Aborts the communicator (idempotent): peers blocked in a collective with it are released
  // only by their own deadline.
  void Abort();

  struct Handle;  // the ncclComm_t (nccl_comm.cc)

 private:
  NcclComm(std::unique_ptr<Handle> h, int rank, int size, int device);

  std::unique_ptr<Handle> h_;
  const int rank_, size_, device_;
  bool aborted_ = false;
  const std::atomic<bool>* cancel_ = nullptr;
};

}  // namespace ss::gpu
