// The expert worker's end of the shared-memory transport (wire format: shm_protocol.h).
//
// ShmServer::Create makes the segment (shm_open O_CREAT|O_EXCL, mode 0600), lays out the header
// and slots, and starts its threads:
//   * `serving_threads` serving threads. Each scans the slots for posted requests, spins for
//     `spin` when it finds none, then sleeps on the header doorbell (futex, with a timeout). A
//     request is validated against the layout first (protocol version, T, top_k, dim, deadline);
//     a bad one gets an error response and never reaches the handler. Otherwise the handler runs
//     on that serving thread, so with serving_threads > 1 it is called concurrently (on distinct
//     slots) and must be thread-safe.
//   * one housekeeping thread: bumps the heartbeat every `heartbeat_interval` and, every
//     `client_sweep_interval`, frees slots whose client process died (mid-call or not); a dead
//     client therefore costs at most one handler call and never wedges the server.
//
// Lifecycle and ownership. The server owns the segment: Stop() (or the destructor) refuses new
// calls, lets in-flight handler calls finish (a drain), answers requests still queued with
// Unavailable, marks the segment stopped so waiting clients return Unavailable at once, unmaps
// it and shm_unlinks the name. For SIGTERM/SIGINT the binary calls RequestStop() from its signal
// handler (it is async-signal-safe) and Wait() from a normal thread, which does the rest; this
// library installs no signal handlers.
//
// SIGKILL (or any crash): nothing runs, so the segment stays in /dev/shm. Clients notice within
// their liveness poll (the owner PID is gone or a zombie, or the heartbeat is stale) and return
// Unavailable; the next Create with the same name finds the segment, sees from its header that
// the owner process is dead (PID plus start time, so a reused PID does not fool it), unlinks it
// and creates a fresh one (reclaim_stale). A segment of a live owner is never taken
// (AlreadyExists, naming the PID); a file that is not a readable splitserve segment is left
// alone (FailedPrecondition naming its path). Until then `rm /dev/shm/NAME` removes it by hand.
//
// Threads: Create, Stop, Wait and the destructor from one controlling thread; RequestStop and
// stats() from any thread (RequestStop also from a signal handler).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cpu_expert_worker/transport/shm_protocol.h"

namespace ss::expert::shm {

struct ShmServerOptions {
  std::string name;           // segment name, see ShmObjectName (e.g. "splitserve-gpu0-numa1")
  uint32_t slots = 4;         // calls in flight at once
  uint32_t max_tokens = 256;  // largest T per call
  uint32_t dim = 4096;        // hidden size
  uint32_t top_k = 6;         // experts per token (requests may use fewer)
  int serving_threads = 1;    // threads that run the handler
  absl::Duration spin = absl::Microseconds(20);       // busy-poll before sleeping on the doorbell
  absl::Duration idle_wait = absl::Milliseconds(50);  // longest futex sleep (stop checks)
  absl::Duration heartbeat_interval = absl::Milliseconds(10);
  absl::Duration client_sweep_interval = absl::Milliseconds(50);
  bool reclaim_stale = true;  // replace a leftover segment whose owner process is dead
};

// Fills out[T, dim] (fp32, row-major) for the request; every element must be written (the slot
// is not cleared between calls). A non-OK status is sent to the client with its code and the
// first kShmMessageBytes - 1 bytes of its message; `out` is then ignored. The view's pointers
// and `out` are valid only during the call.
using ExpertHandler = std::function<absl::Status(const ExpertRequestView& request, float* out)>;

class ShmServer {
 public:
  struct Stats {
    uint64_t calls = 0;           // requests taken from slots
    uint64_t handler_errors = 0;  // handler returned non-OK (or threw)
    uint64_t rejected = 0;        // failed validation (or expired) before the handler
    uint64_t abandoned = 0;       // finished after the client had given up
    uint64_t clients_reaped = 0;  // slots freed because their client process died
  };

  // Creates the segment and starts serving. Errors: InvalidArgument (name, sizes),
  // AlreadyExists (a live server owns the name), FailedPrecondition (the name is taken by
  // something that is not a stale splitserve segment), Internal (a system call failed).
  static absl::StatusOr<std::unique_ptr<ShmServer>> Create(const ShmServerOptions& options,
                                                           ExpertHandler handler);

  ~ShmServer();  // Stop()
  ShmServer(const ShmServer&) = delete;
  ShmServer& operator=(const ShmServer&) = delete;

  // Begins shutdown without blocking: new calls are refused and the threads are told to exit.
  // Async-signal-safe (atomic stores and FUTEX_WAKE only); idempotent.
  void RequestStop();
  // Blocks until RequestStop() has been called, then drains, unmaps and unlinks (once).
  void Wait();
  // RequestStop() + Wait().
  void Stop();

  const std::string& name() const { return name_; }  // with the leading '/'
  const ShmLayout& layout() const { return layout_; }
  Stats stats() const;

 private:
  ShmServer(const ShmServerOptions& options, ExpertHandler handler, ShmLayout layout,
            std::string name);

  absl::Status CreateSegment();
  void ServeLoop(int thread_index);
  bool TryServeOne(uint32_t* cursor);
  void Serve(uint32_t slot_index);
  void HousekeepingLoop();
  void SweepDeadClients();
  void Shutdown();

  SegmentHeader* header() const { return reinterpret_cast<SegmentHeader*>(base_); }
  SlotControl* slot(uint32_t i) const;
  uint8_t* slot_base(uint32_t i) const;

  const ShmServerOptions options_;
  const ExpertHandler handler_;
  const ShmLayout layout_;
  const std::string name_;
  uint8_t* base_ = nullptr;  // the mapping, layout_.segment_bytes long
  uint64_t inode_ = 0;       // of our segment, so Shutdown never unlinks someone else's
  uint64_t dev_ = 0;

  // Futex words (through internal::Word): stop_word_ is 1 once RequestStop began (threads
  // exit), stop_signalled_ once it finished touching the header (Wait may proceed).
  uint32_t stop_word_ = 0;
  uint32_t stop_signalled_ = 0;
  std::vector<std::thread> threads_;
  absl::Mutex shutdown_mu_;
  bool shut_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;

  std::atomic<uint64_t> calls_{0}, handler_errors_{0}, rejected_{0}, abandoned_{0},
      clients_reaped_{0};
};

}  // namespace ss::expert::shm
