// The GPU worker's side of the coordinator's control plane (proto/cluster.proto, service
// Coordinator): Register -> Role, Rendezvous -> peers and NCCL ids, Heartbeat -> still a member.
//
// Retries: Register and Rendezvous retry while the coordinator is unreachable (UNAVAILABLE, or
// DEADLINE_EXCEEDED of one attempt) until `until` or until `*stop` becomes true (Cancelled);
// any other answer (a refusal: unknown worker id, duplicate, protocol version) is returned at
// once with the coordinator's message. Heartbeat makes one attempt.
//
// Every call carries the cluster credential given at construction (proto/cluster_credential.h);
// a coordinator that refuses it answers UNAUTHENTICATED, which is returned at once.
//
// Threads: one client may be used from several threads (gRPC stubs are thread-safe).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gpu_worker/worker_config.h"
#include "proto/cluster_credential.h"

namespace splitserve::v1 {
class Role;
}  // namespace splitserve::v1

namespace ss::gpu {

struct DeviceDescription {
  std::string name = "cpu";
  int64_t memory_bytes = 0;
  int compute_capability = 0;
  std::string host;
};

struct PeerWorker {
  std::string worker_id;
  std::string address;
  int stage = 0;
  int tp_rank = 0;
};

// What the rendezvous hands out: every GPU worker, and every NCCL group's unique id by group
// name (common/cluster_protocol.h TpGroupName).
struct RendezvousResult {
  std::vector<PeerWorker> peers;
  std::map<std::string, std::string> nccl_ids;
};

// The role as this worker runs it (next_stage_address is filled from the peers later).
StageRole RoleFromProto(const ::splitserve::v1::Role& role, const std::string& worker_id);

class CoordinatorClient {
 public:
  CoordinatorClient(const std::string& address, const ClusterCredential& credential);
  ~CoordinatorClient();

  absl::StatusOr<StageRole> Register(const std::string& worker_id, const std::string& address,
                                     const std::string& backend, const DeviceDescription& device,
                                     absl::Time until, const std::atomic<bool>* stop);
  // `publish`: the NCCL groups this worker is rank 0 of, group name -> unique id bytes.
  absl::StatusOr<RendezvousResult> Rendezvous(const std::string& worker_id,
                                              const std::map<std::string, std::string>& publish,
                                              absl::Time until, const std::atomic<bool>* stop);
  // True while the coordinator counts this worker as a member. `progress`: the worker's step
  // progress (step_progress.h).
  absl::StatusOr<bool> Heartbeat(const std::string& worker_id, uint64_t progress,
                                 absl::Duration timeout);

  const std::string& address() const { return address_; }

  class Impl;

 private:
  const std::string address_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ss::gpu
