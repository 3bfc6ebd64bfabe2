// The coordinator's side of the control plane (proto/cluster.proto, service Coordinator): GPU
// workers register under the id the cluster config gives their role, meet at the rendezvous
// (peer addresses, NCCL unique ids), and heartbeat. The service keeps the membership table that
// the ClusterEngine (cluster_engine.h) reads to connect to the workers and to notice dead ones.
//
// Membership. A worker is a member from its Register until it is declared dead: by the engine
// (its step stream broke) or by CheckHeartbeats() (silent for heartbeat_timeout_ms). A dead
// worker's heartbeats are answered member = false, and it should exit; the same id may register
// again (a restarted process), which starts a new generation of that member: the engine
// reconnects to it. Register refuses another protocol version (FAILED_PRECONDITION naming both),
// an id the config does not name (NOT_FOUND) and an id whose current registration is alive
// (ALREADY_EXISTS): its heartbeats are fresh and its GpuWorker service still answers a Status
// call within kLivenessProbe. So a second process cannot take over a live worker's id, while a
// registration whose process no longer answers (a killed worker that its supervisor restarted
// before its heartbeats went stale) is declared dead and the new one is accepted at once (the
// engine then drops the old generation's stream). The probe carries the cluster credential; a
// live process that answers anything but UNAVAILABLE or DEADLINE_EXCEEDED counts as alive.
//
// Authentication: every call must carry the cluster credential (proto/cluster_credential.h);
// one that does not is answered UNAUTHENTICATED before its request is read, and changes nothing.
//
// Backends: a worker registering with backend "cpu" for a role of TP size > 1 is refused
// (FAILED_PRECONDITION): the cpu backend runs TP 1 only.
//
// Progress: each heartbeat carries the worker's step progress; the member records when that value
// last changed (MemberInfo::last_progress), which the engine reads to tell a busy worker from a
// hung one (cluster_engine.h "Stalls").
//
// Rendezvous blocks until every GPU worker of the config has called Rendezvous since its latest
// registration (or the call's deadline, at most `rendezvous_timeout`), then returns every peer's
// address and every NCCL id published so far. A stage of TP size > 1 needs its group's id: its
// TP rank 0 publishes it (group TpGroupName(stage), kNcclUniqueIdBytes bytes; anything else is
// INVALID_ARGUMENT), and a rendezvous that completes without it fails for that stage's ranks
// (FAILED_PRECONDITION naming rank 0). The id of a group is forgotten when its rank 0 registers
// again, so no reply carries the id of an earlier process.
//
// TP groups share their fate (cluster.proto, 3a): declaring a member of a TP > 1 stage dead
// (DeclareDead, CheckHeartbeats) declares its stage's other live members dead too, and a
// Register of a member whose peers have completed a rendezvous since their own registration
// (they may hold a communicator with its previous process) declares those peers dead.
//
// Threads: gRPC's synchronous server runs each RPC on its own thread; Rendezvous blocks only its
// own. All methods are thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/cluster_config.h"
#include "proto/cluster.grpc.pb.h"
#include "proto/cluster_credential.h"

namespace ss::coord {

struct MemberInfo {
  std::string id;
  std::string address;  // its GpuWorker service
  std::string backend;
  int pid = 0;
  bool registered = false;
  bool dead = false;        // declared dead since its latest registration
  uint64_t generation = 0;  // bumped by every Register of this id
  absl::Time last_heartbeat = absl::InfinitePast();
  // The step progress of its latest heartbeat (HeartbeatRequest.progress) and when that value
  // last changed; a Register resets both (0, the registration's time).
  uint64_t progress = 0;
  absl::Time last_progress = absl::InfinitePast();
};

class ControlService final : public splitserve::v1::Coordinator::Service {
 public:
  // `credential`: what every call must carry; the ClusterEngine also presents it to the workers.
  ControlService(ClusterConfig config, ClusterCredential credential,
                 absl::Duration rendezvous_timeout = absl::Seconds(300));

  grpc::Status Register(grpc::ServerContext* context,
                        const splitserve::v1::RegisterRequest* request,
                        splitserve::v1::RegisterReply* reply) override;
  grpc::Status Rendezvous(grpc::ServerContext* context,
                          const splitserve::v1::RendezvousRequest* request,
                          splitserve::v1::RendezvousReply* reply) override;
  grpc::Status Heartbeat(grpc::ServerContext* context,
                         const splitserve::v1::HeartbeatRequest* request,
                         splitserve::v1::HeartbeatReply* reply) override;

  const ClusterConfig& config() const { return config_; }
  const ClusterCredential& credential() const { return credential_; }
  // Every GPU worker of the config, in GpuWorkerIds() order.
  std::vector<MemberInfo> Members() const;
  // True once every GPU worker is registered and none is dead; waits up to `timeout` for it.
  bool WaitAllAlive(absl::Duration timeout) const;
  // Marks the member dead (no-op for an unknown id or one already dead). `generation` guards
  // against killing a newer registration: only that generation is declared dead.
  void DeclareDead(const std::string& id, uint64_t generation);
  // Declares dead every registered member whose last heartbeat is older than the config's
  // heartbeat_timeout_ms; returns their ids.
  std::vector<std::string> CheckHeartbeats();
  // Wakes every blocked Rendezvous (they fail with UNAVAILABLE); later calls fail at once.
  void Shutdown();

 private:
  struct Member {
    MemberInfo info;
    bool met = false;     // called Rendezvous since its latest registration
    bool joined = false;  // a Rendezvous of it returned the peers since its latest registration
    // Declared dead: it must register and meet again.
    void Kill() {
      info.dead = true;
      met = false;
      joined = false;
    }
  };

  // True unless the GpuWorker service at `address` is unreachable or silent for kLivenessProbe.
  bool WorkerAnswers(const std::string& address) const;
  static constexpr std::chrono::milliseconds kLivenessProbe{500};

  // Marks `id` dead and its live fate peers (FatePeers: its TP group's ranks, or every GPU worker
  // under the nccl stage transport); appends the ids newly dead.
  void DeclareDeadLocked(const std::string& id, const std::string& why,
                         std::vector<std::string>* newly_dead) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ClusterConfig config_;
  const ClusterCredential credential_;
  const absl::Duration rendezvous_timeout_;
  mutable absl::Mutex mu_;
  mutable absl::CondVar cv_;
  std::map<std::string, Member> members_ ABSL_GUARDED_BY(mu_);        // every GPU worker id
  std::map<std::string, std::string> nccl_ids_ ABSL_GUARDED_BY(mu_);  // group -> id bytes
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace ss::coord
