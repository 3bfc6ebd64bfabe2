#include "gpu_worker/coordinator_client.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/cluster_protocol.h"
#include "proto/cluster.grpc.pb.h"

namespace ss::gpu {

namespace pb = ::splitserve::v1;

namespace {

constexpr absl::Duration kAttempt = absl::Seconds(5);

absl::Status FromGrpc(const ::grpc::Status& st, const std::string& what) {
  return absl::Status(static_cast<absl::StatusCode>(st.error_code()),
                      absl::StrCat(what, ": ", st.error_message()));
}

bool Unreachable(const ::grpc::Status& st) {
  return st.error_code() == ::grpc::StatusCode::UNAVAILABLE ||
         st.error_code() == ::grpc::StatusCode::DEADLINE_EXCEEDED;
}

// Calls `rpc(ctx)` until it answers with something other than "unreachable", `until` passes or
// `*stop` is set. Rendezvous blocks on the coordinator's side, so its attempts get `attempt`.
template <typename Rpc>
::grpc::Status Retry(Rpc rpc, absl::Time until, const std::atomic<bool>* stop,
                     absl::Duration attempt) {
  while (true) {
    ::grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(std::min(until, absl::Now() + attempt)));
    const ::grpc::Status st = rpc(&ctx);
    if (!Unreachable(st) || absl::Now() >= until) return st;
    if (stop != nullptr && stop->load()) {
      return ::grpc::Status(::grpc::StatusCode::CANCELLED, "stopped");
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
}

}  // namespace

StageRole RoleFromProto(const pb::Role& r, const std::string& worker_id) {
  StageRole role;
  role.worker_id = worker_id;
  role.stage = r.stage();
  role.num_stages = r.num_stages();
  role.tp_rank = r.tp_rank();
  role.tp_size = r.tp_size();
  role.first_layer = r.first_layer();
  role.end_layer = r.end_layer();
  role.runs_mtp = r.runs_mtp();
  for (const pb::LayerExperts& le : r.experts()) {
    LayerExpertsConfig l;
    l.layer = le.layer();
    l.slice_count = le.slice_count();
    for (const pb::ExpertEndpoint& e : le.endpoints()) {
      ExpertEndpointConfig ep;
      ep.slice_index = e.slice_index();
      ep.slice_count = e.slice_count();
      ep.shm_name = e.shm_name();
      ep.grpc_address = e.grpc_address();
      ep.worker_id = e.worker_id();
      l.endpoints.push_back(std::move(ep));
    }
    role.experts.push_back(std::move(l));
  }
  role.kv_block_tokens = r.kv_block_tokens();
  role.stage_transport = r.stage_transport().empty() ? "grpc" : r.stage_transport();
  role.max_batch_tokens = r.max_batch_tokens();
  role.max_running = r.max_running();
  role.max_model_len = r.max_model_len();
  role.heartbeat_interval_ms = r.heartbeat_interval_ms();
  role.model_name = r.model_name();
  return role;
}

class CoordinatorClient::Impl {
 public:
  Impl(const std::string& address, const ClusterCredential& credential)
      : stub_(pb::Coordinator::NewStub(credential.CreateChannel(address))) {}
  std::unique_ptr<pb::Coordinator::Stub> stub_;
};

CoordinatorClient::CoordinatorClient(const std::string& address,
                                     const ClusterCredential& credential)
    : address_(address), impl_(std::make_unique<Impl>(address, credential)) {}

CoordinatorClient::~CoordinatorClient() = default;

absl::StatusOr<StageRole> CoordinatorClient::Register(
    const std::string& worker_id, const std::string& address, const std::string& backend,
    const DeviceDescription& device, absl::Time until, const std::atomic<bool>* stop) {
  pb::RegisterRequest req;
  req.set_protocol_version(kClusterProtocolVersion);
  req.set_worker_id(worker_id);
  req.set_address(address);
  req.set_backend(backend);
  req.mutable_device()->set_name(device.name);
  req.mutable_device()->set_memory_bytes(device.memory_bytes);
  req.mutable_device()->set_compute_capability(device.compute_capability);
  req.mutable_device()->set_host(device.host);
  req.set_pid(static_cast<int32_t>(getpid()));
  pb::RegisterReply reply;
  const ::grpc::Status st =
      Retry([&](::grpc::ClientContext* ctx) { return impl_->stub_->Register(ctx, req, &reply); },
            until, stop, kAttempt);
  const std::string what =
      absl::StrCat("registering as '", worker_id, "' with the coordinator at ", address_);
  if (!st.ok()) return FromGrpc(st, what);
  if (reply.protocol_version() != kClusterProtocolVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": the coordinator speaks protocol version ", reply.protocol_version(),
                     ", this worker version ", kClusterProtocolVersion));
  }
  if (!reply.has_role()) return absl::InternalError(absl::StrCat(what, ": no role in the reply"));
  return RoleFromProto(reply.role(), worker_id);
}

absl::StatusOr<RendezvousResult> CoordinatorClient::Rendezvous(
    const std::string& worker_id, const std::map<std::string, std::string>& publish,
    absl::Time until, const std::atomic<bool>* stop) {
  pb::RendezvousRequest req;
  req.set_protocol_version(kClusterProtocolVersion);
  req.set_worker_id(worker_id);
  for (const auto& [group, id] : publish) {
    pb::NcclGroupId* g = req.add_nccl_ids();
    g->set_group(group);
    g->set_unique_id(id);
  }
  pb::RendezvousReply reply;
  const ::grpc::Status st =
      Retry([&](::grpc::ClientContext* ctx) { return impl_->stub_->Rendezvous(ctx, req, &reply); },
            until, stop, until - absl::Now());
  if (!st.ok()) {
    return FromGrpc(st, absl::StrCat("rendezvous with the coordinator at ", address_));
  }
  RendezvousResult out;
  for (const pb::PeerInfo& p : reply.peers()) {
    out.peers.push_back({p.worker_id(), p.address(), p.stage(), p.tp_rank()});
  }
  for (const pb::NcclGroupId& g : reply.nccl_ids()) out.nccl_ids[g.group()] = g.unique_id();
  return out;
}

absl::StatusOr<bool> CoordinatorClient::Heartbeat(const std::string& worker_id, uint64_t progress,
                                                  absl::Duration timeout) {
  pb::HeartbeatRequest req;
  req.set_protocol_version(kClusterProtocolVersion);
  req.set_worker_id(worker_id);
  req.set_progress(progress);
  pb::HeartbeatReply reply;
  ::grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  const ::grpc::Status st = impl_->stub_->Heartbeat(&ctx, req, &reply);
  if (!st.ok()) return FromGrpc(st, absl::StrCat("heartbeat to the coordinator at ", address_));
  return reply.member();
}

}  // namespace ss::gpu
