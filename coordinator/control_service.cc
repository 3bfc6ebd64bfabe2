#include "coordinator/control_service.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/cluster_protocol.h"
#include "grpcpp/grpcpp.h"
#include "spdlog/spdlog.h"

namespace ss::coord {
namespace {

grpc::Status CheckVersion(uint32_t version) {
  if (version == kClusterProtocolVersion) return grpc::Status::OK;
  return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                      absl::StrCat("cluster protocol version ", version,
                                   " is not the coordinator's version ", kClusterProtocolVersion));
}

}  // namespace

bool ControlService::WorkerAnswers(const std::string& address) const {
  auto stub = splitserve::v1::GpuWorker::NewStub(credential_.CreateChannel(address));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + kLivenessProbe);
  splitserve::v1::StatusRequest req;
  req.set_protocol_version(kClusterProtocolVersion);
  splitserve::v1::WorkerStatus st;
  const grpc::Status rpc = stub->Status(&ctx, req, &st);
  return rpc.error_code() != grpc::StatusCode::UNAVAILABLE &&
         rpc.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED;
}

ControlService::ControlService(ClusterConfig config, ClusterCredential credential,
                               absl::Duration rendezvous_timeout)
    : config_(std::move(config)),
      credential_(std::move(credential)),
      rendezvous_timeout_(rendezvous_timeout) {
  for (const std::string& id : config_.GpuWorkerIds()) members_[id].info.id = id;
}

grpc::Status ControlService::Register(grpc::ServerContext* context,
                                      const splitserve::v1::RegisterRequest* request,
                                      splitserve::v1::RegisterReply* reply) {
  if (grpc::Status st = credential_.Check(*context, "Coordinator.Register"); !st.ok()) return st;
  if (grpc::Status st = CheckVersion(request->protocol_version()); !st.ok()) return st;
  absl::StatusOr<splitserve::v1::Role> role = RoleFor(config_, request->worker_id());
  if (!role.ok()) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND, std::string(role.status().message()));
  }
  if (request->address().empty()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "register: 'address' is empty");
  }
  if (request->backend() == "cpu" && role->stage_transport() == "nccl" && role->num_stages() > 1) {
    return grpc::Status(
        grpc::StatusCode::FAILED_PRECONDITION,
        absl::StrCat("worker '", request->worker_id(), "': the cluster config's stage_transport ",
                     "\"nccl\" needs the cuda backend (the cpu backend's streams are on the ",
                     "host); use stage_transport \"grpc\""));
  }
  if (request->backend() == "cpu" && role->tp_size() > 1) {
    return grpc::Status(
        grpc::StatusCode::FAILED_PRECONDITION,
        absl::StrCat("worker '", request->worker_id(), "': the cpu backend runs TP 1 only, and ",
                     "the cluster config gives stage ", role->stage(), " ", role->tp_size(),
                     " workers (TP size); use the cuda backend or one worker per stage"));
  }
  absl::MutexLock lock(&mu_);
  Member& m = members_.at(request->worker_id());
  if (m.info.registered && !m.info.dead &&
      absl::Now() - m.info.last_heartbeat < absl::Milliseconds(config_.heartbeat_timeout_ms)) {
    // Its heartbeats are fresh, but a restarted process comes back before they go stale: the
    // registration is alive only while its process still answers.
    const std::string old_address = m.info.address;
    const uint64_t old_generation = m.info.generation;
    mu_.Unlock();
    const bool answers = WorkerAnswers(old_address);
    mu_.Lock();
    if (answers && m.info.generation == old_generation && !m.info.dead) {
      return grpc::Status(
          grpc::StatusCode::ALREADY_EXISTS,
          absl::StrCat("worker id '", request->worker_id(), "' is already registered by pid ",
                       m.info.pid, " at ", m.info.address, " and alive"));
    }
    if (!answers && m.info.generation == old_generation && !m.info.dead) {
      std::vector<std::string> dead;
      DeclareDeadLocked(request->worker_id(),
                        absl::StrCat("its process at ", old_address, " no longer answers"), &dead);
    }
  }
  m.info.address = request->address();
  m.info.backend = request->backend();
  m.info.pid = request->pid();
  m.info.registered = true;
  m.info.dead = false;
  m.info.last_heartbeat = absl::Now();
  m.info.progress = 0;
  m.info.last_progress = m.info.last_heartbeat;
  ++m.info.generation;
  m.met = false;
  m.joined = false;
  // Peers that formed a group (or a stage link) with this id's previous process must form a new
  // one (3a, 3b).
  for (const std::string& peer : FatePeers(config_, request->worker_id())) {
    Member& p = members_.at(peer);
    if (p.joined && p.info.registered && !p.info.dead) {
      p.Kill();
      spdlog::warn(
          "worker {} declared dead: {} registered again, so the NCCL groups it formed with it "
          "must be formed anew",
          peer, request->worker_id());
    }
  }
  if (role->tp_size() > 1 && role->tp_rank() == 0) nccl_ids_.erase(TpGroupName(role->stage()));
  nccl_ids_.erase(PpLinkName(role->stage(), role->tp_rank()));
  spdlog::info("worker {} registered: {} backend {} pid {} (stage {}, tp rank {})",
               request->worker_id(), request->address(), request->backend(), request->pid(),
               role->stage(), role->tp_rank());
  reply->set_protocol_version(kClusterProtocolVersion);
  *reply->mutable_role() = std::move(*role);
  cv_.SignalAll();
  return grpc::Status::OK;
}

grpc::Status ControlService::Rendezvous(grpc::ServerContext* context,
                                        const splitserve::v1::RendezvousRequest* request,
                                        splitserve::v1::RendezvousReply* reply) {
  if (grpc::Status st = credential_.Check(*context, "Coordinator.Rendezvous"); !st.ok()) return st;
  if (grpc::Status st = CheckVersion(request->protocol_version()); !st.ok()) return st;
  absl::MutexLock lock(&mu_);
  auto it = members_.find(request->worker_id());
  if (it == members_.end() || !it->second.info.registered || it->second.info.dead) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        absl::StrCat("rendezvous: worker '", request->worker_id(),
                                     "' is not registered (register first)"));
  }
  const int stage = StageOf(config_, request->worker_id());
  const StageSpec& spec = config_.stages[stage];
  const bool rank0 = spec.workers.front() == request->worker_id();
  const bool links = config_.stage_transport == "nccl";
  const int rank =
      static_cast<int>(std::find(spec.workers.begin(), spec.workers.end(), request->worker_id()) -
                       spec.workers.begin());
  const bool sends = links && stage + 1 < static_cast<int>(config_.stages.size());
  for (const auto& id : request->nccl_ids()) {
    const bool tp_group = rank0 && spec.workers.size() >= 2 && id.group() == TpGroupName(stage);
    const bool link = sends && id.group() == PpLinkName(stage, rank);
    if (!tp_group && !link) {
      return grpc::Status(
          grpc::StatusCode::INVALID_ARGUMENT,
          absl::StrCat("rendezvous: worker '", request->worker_id(),
                       "' may publish only its own TP group's id as its rank 0 and, under the "
                       "nccl stage transport, its link to the next stage's id (got group '",
                       id.group(), "')"));
    }
    if (id.unique_id().size() != kNcclUniqueIdBytes) {
      return grpc::Status(
          grpc::StatusCode::INVALID_ARGUMENT,
          absl::StrCat("rendezvous: NCCL id of group '", id.group(), "' has ",
                       id.unique_id().size(), " bytes, expected ", kNcclUniqueIdBytes));
    }
  }
  it->second.met = true;
  const uint64_t generation = it->second.info.generation;
  for (const auto& id : request->nccl_ids()) nccl_ids_[id.group()] = id.unique_id();
  cv_.SignalAll();
  absl::Time deadline = absl::Now() + rendezvous_timeout_;
  const absl::Time call_deadline = absl::FromChrono(context->deadline());
  if (call_deadline < deadline) deadline = call_deadline;
  auto all_met = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const auto& [id, m] : members_) {
      if (!m.met || !m.info.registered || m.info.dead) return false;
    }
    return true;
  };
  while (!all_met()) {
    if (shutdown_) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "coordinator is stopping");
    if (context->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      std::string missing;
      for (const auto& [id, m] : members_) {
        if (!m.met || m.info.dead) absl::StrAppend(&missing, missing.empty() ? "" : ", ", id);
      }
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                          absl::StrCat("rendezvous: still waiting for ", missing));
    }
    cv_.WaitWithTimeout(
        &mu_, std::min(absl::Milliseconds(200),
                       absl::Milliseconds(absl::ToInt64Milliseconds(deadline - now) + 1)));
  }
  if (spec.workers.size() > 1 && !nccl_ids_.contains(TpGroupName(stage))) {
    return grpc::Status(
        grpc::StatusCode::FAILED_PRECONDITION,
        absl::StrCat("rendezvous: stage ", stage, "'s TP rank 0 (worker '", spec.workers.front(),
                     "') published no NCCL id for group '", TpGroupName(stage),
                     "' (TP > 1 needs the cuda backend built with NCCL)"));
  }
  for (int s = 0; links && s + 1 < static_cast<int>(config_.stages.size()); ++s) {
    for (size_t r = 0; r < config_.stages[s].workers.size(); ++r) {
      const std::string group = PpLinkName(s, static_cast<int>(r));
      if (!nccl_ids_.contains(group)) {
        return grpc::Status(
            grpc::StatusCode::FAILED_PRECONDITION,
            absl::StrCat("rendezvous: worker '", config_.stages[s].workers[r],
                         "' published no NCCL id for its stage link '", group,
                         "' (stage_transport \"nccl\" needs the cuda backend built with NCCL)"));
      }
    }
  }
  if (it->second.info.generation == generation) it->second.joined = true;
  const std::vector<std::string> ids = config_.GpuWorkerIds();
  for (size_t s = 0, i = 0; s < config_.stages.size(); ++s) {
    for (size_t r = 0; r < config_.stages[s].workers.size(); ++r, ++i) {
      splitserve::v1::PeerInfo* p = reply->add_peers();
      p->set_worker_id(ids[i]);
      p->set_address(members_.at(ids[i]).info.address);
      p->set_stage(static_cast<int>(s));
      p->set_tp_rank(static_cast<int>(r));
    }
  }
  for (const auto& [group, bytes] : nccl_ids_) {
    splitserve::v1::NcclGroupId* g = reply->add_nccl_ids();
    g->set_group(group);
    g->set_unique_id(bytes);
  }
  return grpc::Status::OK;
}

grpc::Status ControlService::Heartbeat(grpc::ServerContext* context,
                                       const splitserve::v1::HeartbeatRequest* request,
                                       splitserve::v1::HeartbeatReply* reply) {
  if (grpc::Status st = credential_.Check(*context, "Coordinator.Heartbeat"); !st.ok()) return st;
  if (grpc::Status st = CheckVersion(request->protocol_version()); !st.ok()) return st;
  absl::MutexLock lock(&mu_);
  auto it = members_.find(request->worker_id());
  const bool member = it != members_.end() && it->second.info.registered && !it->second.info.dead;
  if (member) {
    MemberInfo& info = it->second.info;
    info.last_heartbeat = absl::Now();
    if (request->progress() != info.progress) {
      info.progress = request->progress();
      info.last_progress = info.last_heartbeat;
    }
  }
  reply->set_member(member);
  return grpc::Status::OK;
}

std::vector<MemberInfo> ControlService::Members() const {
  absl::MutexLock lock(&mu_);
  std::vector<MemberInfo> out;
  for (const std::string& id : config_.GpuWorkerIds()) out.push_back(members_.at(id).info);
  return out;
}

bool ControlService::WaitAllAlive(absl::Duration timeout) const {
  const absl::Time deadline = absl::Now() + timeout;
  absl::MutexLock lock(&mu_);
  auto alive = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const auto& [id, m] : members_) {
      if (!m.info.registered || m.info.dead) return false;
    }
    return true;
  };
  while (!alive() && !shutdown_) {
    if (cv_.WaitWithDeadline(&mu_, deadline)) break;
  }
  return alive() && !shutdown_;
}

void ControlService::DeclareDeadLocked(const std::string& id, const std::string& why,
                                       std::vector<std::string>* newly_dead) {
  Member& m = members_.at(id);
  if (!m.info.dead) {
    m.Kill();
    spdlog::warn("worker {} (generation {}) declared dead: {}", id, m.info.generation, why);
    newly_dead->push_back(id);
  }
  for (const std::string& peer : FatePeers(config_, id)) {
    Member& p = members_.at(peer);
    if (!p.info.registered || p.info.dead) continue;
    p.Kill();
    spdlog::warn(
        "worker {} declared dead with {} (a TP group, and under the nccl stage transport the "
        "whole pipeline, lives and dies as one)",
        peer, id);
    newly_dead->push_back(peer);
  }
}

void ControlService::DeclareDead(const std::string& id, uint64_t generation) {
  absl::MutexLock lock(&mu_);
  auto it = members_.find(id);
  if (it == members_.end() || it->second.info.dead || it->second.info.generation != generation) {
    return;
  }
  std::vector<std::string> dead;
  DeclareDeadLocked(id, "by the engine", &dead);
  cv_.SignalAll();
}

std::vector<std::string> ControlService::CheckHeartbeats() {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> dead;
  const absl::Time cutoff = absl::Now() - absl::Milliseconds(config_.heartbeat_timeout_ms);
  for (auto& [id, m] : members_) {
    if (m.info.registered && !m.info.dead && m.info.last_heartbeat < cutoff) {
      DeclareDeadLocked(id, absl::StrCat("no heartbeat for ", config_.heartbeat_timeout_ms, " ms"),
                        &dead);
    }
  }
  if (!dead.empty()) cv_.SignalAll();
  return dead;
}

void ControlService::Shutdown() {
  absl::MutexLock lock(&mu_);
  shutdown_ = true;
  cv_.SignalAll();
}

}  // namespace ss::coord
