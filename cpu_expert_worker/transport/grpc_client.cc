#include "cpu_expert_worker/transport/grpc_client.h"

#include <grpcpp/grpcpp.h>

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cpu_expert_worker/transport/grpc_server.h"
#include "proto/expert.grpc.pb.h"

namespace ss::expert::grpc_transport {

namespace pb = ::splitserve::v1;

class GrpcExpertClient::Impl {
 public:
  std::shared_ptr<::grpc::Channel> channel;
  std::unique_ptr<pb::ExpertService::Stub> stub;
};

namespace {

// A failed RPC as an absl::Status (gRPC and absl share the canonical code numbering).
absl::Status FromGrpc(const ::grpc::Status& st, const std::string& address, const char* what,
                      absl::Duration budget) {
  const auto code = static_cast<absl::StatusCode>(st.error_code());
  const std::string prefix = absl::StrCat("expert server ", address, ": ", what, ": ");
  switch (st.error_code()) {
    case ::grpc::StatusCode::DEADLINE_EXCEEDED:
      return absl::DeadlineExceededError(absl::StrCat(prefix, "no answer within the deadline (",
                                                      absl::FormatDuration(budget),
                                                      "): ", st.error_message()));
    case ::grpc::StatusCode::UNAVAILABLE:
      return absl::UnavailableError(
          absl::StrCat(prefix, "server unreachable or gone: ", st.error_message()));
    default:
      return absl::Status(code, absl::StrCat(prefix, st.error_message()));
  }
}

}  // namespace

GrpcExpertClient::GrpcExpertClient(std::string address, const GrpcClientOptions& options,
                                   std::unique_ptr<Impl> impl)
    : address_(std::move(address)), options_(options), impl_(std::move(impl)) {}

GrpcExpertClient::~GrpcExpertClient() = default;

absl::StatusOr<std::unique_ptr<GrpcExpertClient>> GrpcExpertClient::Connect(
    std::string_view address, const GrpcClientOptions& options) {
  if (address.empty()) return absl::InvalidArgumentError("expert gRPC client: empty address");
  auto impl = std::make_unique<Impl>();
  ::grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);  // responses are T·dim·4 bytes (4 MiB at T=256, dim=4096)
  args.SetMaxSendMessageSize(-1);
  impl->channel = options.credential.CreateChannel(std::string(address), args);
  impl->stub = pb::ExpertService::NewStub(impl->channel);
  std::unique_ptr<GrpcExpertClient> client(
      new GrpcExpertClient(std::string(address), options, std::move(impl)));

  ::grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + options.connect_timeout));
  pb::InfoRequest req;
  req.set_protocol_version(kGrpcProtocolVersion);
  pb::InfoResponse resp;
  const ::grpc::Status st = client->impl_->stub->Info(&ctx, req, &resp);
  if (!st.ok()) return FromGrpc(st, client->address_, "Info", options.connect_timeout);
  const std::string where = absl::StrCat("expert server ", client->address_, ": ");
  if (resp.protocol_version() != kGrpcProtocolVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat(where, "speaks expert protocol version ", resp.protocol_version(),
                     ", this client speaks version ", kGrpcProtocolVersion));
  }
  if (options.expect_dim != 0 && static_cast<uint32_t>(resp.dim()) != options.expect_dim) {
    return absl::FailedPreconditionError(
        absl::StrCat(where, "serves dim ", resp.dim(), ", expected ", options.expect_dim));
  }
  if (options.expect_top_k != 0 && static_cast<uint32_t>(resp.top_k()) < options.expect_top_k) {
    return absl::FailedPreconditionError(absl::StrCat(where, "serves top_k <= ", resp.top_k(),
                                                      ", expected ", options.expect_top_k));
  }
  if (options.min_max_tokens != 0 &&
      static_cast<uint32_t>(resp.max_tokens()) < options.min_max_tokens) {
    return absl::FailedPreconditionError(absl::StrCat(
        where, "serves max_tokens ", resp.max_tokens(), ", expected >= ", options.min_max_tokens));
  }
  GrpcServerInfo& info = client->info_;
  info.protocol_version = resp.protocol_version();
  info.dim = resp.dim();
  info.max_tokens = resp.max_tokens();
  info.top_k = resp.top_k();
  info.layers.assign(resp.layers().begin(), resp.layers().end());
  info.slice_index = resp.slice_index();
  info.slice_count = resp.slice_count();
  return client;
}

absl::Status GrpcExpertClient::Call(const shm::ExpertCallInput& in, float* out,
                                    absl::Time deadline, bool check_inputs) {
  const std::string where = absl::StrCat("expert server ", address_, ": ");
  if (deadline == absl::InfiniteFuture()) {
    return absl::InvalidArgumentError(absl::StrCat(where, "a call needs a finite deadline"));
  }
  if (check_inputs) {
    if (in.tokens < 1 || in.tokens > info_.max_tokens || in.top_k < 1 ||
        in.top_k > info_.top_k || in.dim != info_.dim) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, "tokens ", in.tokens, ", top_k ", in.top_k, ", dim ", in.dim,
          " do not fit the server (max_tokens ", info_.max_tokens, ", top_k <= ", info_.top_k,
          ", dim ", info_.dim, ")"));
    }
    if (in.x_bf16 == nullptr || in.ids == nullptr || in.weights == nullptr || out == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(where, "null input or output array"));
    }
  }
  const size_t t = in.tokens > 0 ? static_cast<size_t>(in.tokens) : 0;
  const size_t k = in.top_k > 0 ? static_cast<size_t>(in.top_k) : 0;
  const size_t d = in.dim > 0 ? static_cast<size_t>(in.dim) : 0;
  pb::ExpertRequest req;
  req.set_protocol_version(options_.protocol_version_override != 0
                               ? options_.protocol_version_override
                               : kGrpcProtocolVersion);
  req.set_layer(in.layer);
  req.set_tokens(in.tokens);
  req.set_top_k(in.top_k);
  req.set_dim(in.dim);
  if (in.x_bf16 != nullptr) req.set_x_bf16(in.x_bf16, t * d * sizeof(uint16_t));
  if (in.ids != nullptr) req.set_ids(in.ids, t * k * sizeof(int32_t));
  if (in.weights != nullptr) req.set_weights(in.weights, t * k * sizeof(float));

  const absl::Time start = absl::Now();
  ::grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(deadline));
  pb::ExpertResponse resp;
  const ::grpc::Status st = impl_->stub->Compute(&ctx, req, &resp);
  if (!st.ok()) return FromGrpc(st, address_, "Compute", deadline - start);
  if (resp.status_code() != 0) {
    return absl::Status(static_cast<absl::StatusCode>(resp.status_code()),
                        absl::StrCat(where, resp.message()));
  }
  if (resp.out().size() != t * d * sizeof(float)) {
    return absl::InternalError(absl::StrCat(where, "response out has ", resp.out().size(),
                                            " bytes, expected ", t * d * sizeof(float)));
  }
  if (out != nullptr) std::memcpy(out, resp.out().data(), resp.out().size());
  return absl::OkStatus();
}

}  // namespace ss::expert::grpc_transport
