// The cluster credential: one shared secret token that every gRPC call between splitserve's
// processes carries and every service checks (proto/cluster.proto's Coordinator and GpuWorker,
// proto/expert.proto's ExpertService).
//
// Wire form: request metadata `authorization: Bearer <token>`. Clients attach it to every call of
// a channel made by CreateChannel (a client interceptor, so no call site can forget it); servers
// call Check at the top of every handler, before they look at the request, and answer a missing
// or wrong token with UNAUTHENTICATED and nothing else (no detail of the cluster reaches an
// unauthenticated caller). Refusals are logged (spdlog warn: the method and the peer's address),
// at most one line a second per credential; the lines in between are counted in the next one.
// The comparison takes the same time wherever the tokens differ.
//
// The channels are plaintext (gRPC sends call credentials only over TLS, so the token travels as
// ordinary metadata): the token proves membership of the cluster to the services, it does not
// hide the traffic. Bind the services to loopback or a private network (deploy/README.md
// "Security").
//
// Where the token comes from (Load; one rule for every binary):
//   --cluster_token_file PATH   the file's content, surrounding whitespace trimmed; the file
//                               should be 0600 (a warning names a file group or others can read)
//   SPLITSERVE_CLUSTER_TOKEN    the token itself, when no file is given (`splitserve up` sets it
//                               for its children: a fresh random token each run)
//   --insecure_cluster          no token: nothing is attached and every call is accepted.
//                               Only for a trusted single-user machine; it conflicts with a token.
// Neither a token nor --insecure_cluster is an error: a service never runs open by omission.
// Tokens never come from argv (visible to every local user in `ps`). A token is at least
// kMinTokenChars characters of the RFC 7235 token68 alphabet ([A-Za-z0-9-._~+/=]); generate one
// with GenerateClusterToken or `openssl rand -hex 32`.
//
// A default-constructed ClusterCredential holds no token and is not insecure: its Check refuses
// every call and its channels carry nothing (fail closed: a credential that was never plumbed
// through shows as UNAUTHENTICATED, not as an open service).
//
// Threads: a ClusterCredential is an immutable value (copies share the refusal-log limiter);
// every method may be called from any thread.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace grpc {
class Channel;
class ChannelArguments;
class ServerContext;
class Status;
}  // namespace grpc

namespace ss {

inline constexpr char kClusterTokenEnv[] = "SPLITSERVE_CLUSTER_TOKEN";
inline constexpr size_t kMinTokenChars = 32;

class ClusterCredential {
 public:
  ClusterCredential();  // fails closed (see above)

  // A credential holding `token` (validated: InvalidArgument naming what is wrong, never the
  // token itself).
  static absl::StatusOr<ClusterCredential> FromToken(absl::string_view token);
  // No token: attaches nothing, accepts every call.
  static ClusterCredential Insecure();
  // The rule above: `token_file` if not empty, else $SPLITSERVE_CLUSTER_TOKEN, else `insecure`.
  // InvalidArgument for an empty or malformed token, a token given with `insecure`, or neither;
  // NotFound / PermissionDenied for a file that cannot be read.
  static absl::StatusOr<ClusterCredential> Load(const std::string& token_file, bool insecure);

  bool insecure() const { return insecure_; }
  // "token", "insecure" or "none", for the start-up log (never the token).
  std::string Describe() const;

  // Server side: OK when the call carries this credential's token (or the credential is
  // insecure); UNAUTHENTICATED otherwise, logged with `method` and the peer.
  ::grpc::Status Check(const ::grpc::ServerContext& context, absl::string_view method) const;

  // Client side: a plaintext channel to `target` whose every call carries the token.
  std::shared_ptr<::grpc::Channel> CreateChannel(const std::string& target,
                                                 const ::grpc::ChannelArguments& args) const;
  std::shared_ptr<::grpc::Channel> CreateChannel(const std::string& target) const;

 private:
  struct RefusalLog;

  std::shared_ptr<const std::string> header_;  // "Bearer <token>"; null without a token
  bool insecure_ = false;
  std::shared_ptr<RefusalLog> log_;
};

// A fresh token: 32 bytes from the kernel's random source (getrandom), as 64 hex digits.
absl::StatusOr<std::string> GenerateClusterToken();

}  // namespace ss
