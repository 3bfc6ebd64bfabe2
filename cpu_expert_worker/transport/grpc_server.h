// The expert worker's gRPC transport: splitserve.v1.ExpertService (proto/expert.proto) serving
// the same requests as the shared-memory transport (shm_server.h), for GPU workers on other
// machines. The handler is the same ExpertHandler the ShmServer calls.
//
//   ASSIGN_OR_RETURN(auto server, GrpcExpertServer::Start(options, handler));
//   ... server->port() ...;  server->Wait();   // until RequestStop() (e.g. from SIGTERM)
//
// Every call must carry the cluster credential (options.credential): Info and Compute answer one
// that does not with UNAUTHENTICATED and nothing else (it is not counted in stats()). Every
// Compute request is validated before the handler sees it: protocol version
// (FAILED_PRECONDITION naming both versions), tokens in [1, max_tokens], top_k in [1, top_k],
// dim == dim, and the byte sizes of x_bf16 / ids / weights against tokens, top_k and dim
// (INVALID_ARGUMENT naming the field, the expected and the received size). A payload that does
// not parse as an ExpertRequest at all is refused by gRPC itself (INTERNAL) — nothing crashes and
// the server keeps serving. Handler errors travel in the response body (status_code, message)
// with gRPC status OK, so a caller can tell an engine error from a transport one; the client
// maps both back to absl::Status.
//
// Threads. gRPC's synchronous server runs each RPC on one of its own threads (no callback
// reactors, so nothing here can block a reactor). Handler calls are serialised by a mutex (the
// engine serialises and parallelises each call over its pool anyway); a call that waits for
// the mutex past its gRPC deadline gives up with DEADLINE_EXCEEDED without running the handler.
// Payloads are copied into aligned per-server buffers under the same mutex.
//
// Lifecycle. Start binds and serves. RequestStop() is async-signal-safe (an atomic store and a
// sem_post); Wait() blocks until it is called, then shuts the gRPC server down, letting
// in-flight calls finish for at most `shutdown_grace` before cancelling them. Stop() =
// RequestStop() + Wait(); the destructor Stop()s. Start, Wait, Stop and the destructor from one
// controlling thread; RequestStop, port() and stats() from any thread.
#pragma once

#include <semaphore.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cpu_expert_worker/transport/shm_protocol.h"
#include "cpu_expert_worker/transport/shm_server.h"
#include "proto/cluster_credential.h"

namespace ss::expert::grpc_transport {

// The version of proto/expert.proto's semantics. Bump on any change of a field's meaning.
// 2: ids may hold model::kSkippedExpert (-1), a skipped choice.
inline constexpr uint32_t kGrpcProtocolVersion = 2;

struct GrpcServerOptions {
  // "host:port"; port 0 picks a free port (see port()). Plaintext: use loopback or a trusted
  // network (the transport has no TLS).
  std::string listen_address = "127.0.0.1:0";
  // What every call must carry (proto/cluster_credential.h); the default refuses every call.
  ClusterCredential credential;
  uint32_t max_tokens = 256;  // largest T per call
  uint32_t dim = 4096;        // hidden size every request must carry
  uint32_t top_k = 6;         // largest top_k a request may carry
  // Reported by Info only (the handler decides which layers it serves).
  std::vector<int> layers;
  int slice_index = 0;
  int slice_count = 1;
  absl::Duration shutdown_grace = absl::Seconds(2);
};

class GrpcExpertServer {
 public:
  struct Stats {
    uint64_t calls = 0;           // Compute RPCs received
    uint64_t handler_errors = 0;  // handler returned non-OK (or threw)
    uint64_t rejected = 0;        // failed validation, or expired before the handler
  };

  // Binds and starts serving. InvalidArgument for zero sizes or a bad slice; Unavailable when
  // the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<GrpcExpertServer>> Start(const GrpcServerOptions& options,
                                                                 shm::ExpertHandler handler);
  ~GrpcExpertServer();
  GrpcExpertServer(const GrpcExpertServer&) = delete;
  GrpcExpertServer& operator=(const GrpcExpertServer&) = delete;

  void RequestStop();  // async-signal-safe, idempotent
  void Wait();         // blocks until RequestStop(), then shuts down (once)
  void Stop();         // RequestStop() + Wait()

  int port() const;  // the bound port (the picked one when listen_address had port 0)
  Stats stats() const;

  class Impl;

 private:
  explicit GrpcExpertServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ss::expert::grpc_transport
