// The GPU worker's end of the gRPC expert transport (server: grpc_server.h; wire format:
// proto/expert.proto). For expert workers on other machines; on the same host prefer
// ShmClient (shm_client.h), which takes the same ExpertCallInput.
//
//   ASSIGN_OR_RETURN(auto client, GrpcExpertClient::Connect("10.0.0.7:50051"));
//   RETURN_IF_ERROR(client->Call(input, out, absl::Now() + absl::Milliseconds(50)));
//
// Connect opens a channel and calls Info (within `connect_timeout`): the server's protocol
// version must equal kGrpcProtocolVersion (FailedPrecondition naming both otherwise) and its
// sizes must fit what the caller expects. Info's answer is kept (info()).
//
// Every Call carries a gRPC deadline (an infinite one is refused), so no call ever hangs. The
// client fails fast when the server cannot be reached (no wait-for-ready): a server that is gone
// gives Unavailable within the deadline. Errors, each message prefixed with the address:
// the handler's own status (code and message), InvalidArgument / FailedPrecondition from the
// server's validation (or this client's, for inputs that do not fit info()), DeadlineExceeded,
// Unavailable; any other gRPC failure keeps its code.
//
// Threads: a GrpcExpertClient may be used from any number of threads at once (the server
// serialises the handler calls).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cpu_expert_worker/transport/shm_client.h"
#include "proto/cluster_credential.h"

namespace ss::expert::grpc_transport {

struct GrpcClientOptions {
  ClusterCredential credential;  // every call carries it (proto/cluster_credential.h)
  absl::Duration connect_timeout = absl::Seconds(5);  // for the Info call in Connect
  // What the caller needs from the server; 0 accepts whatever it serves.
  uint32_t expect_dim = 0;
  uint32_t expect_top_k = 0;
  uint32_t min_max_tokens = 0;
  // Tests only: the protocol version written into requests (default: kGrpcProtocolVersion).
  uint32_t protocol_version_override = 0;
};

// What the server reported at connect time.
struct GrpcServerInfo {
  uint32_t protocol_version = 0;
  int32_t dim = 0;
  int32_t max_tokens = 0;
  int32_t top_k = 0;
  std::vector<int32_t> layers;
  int32_t slice_index = 0;
  int32_t slice_count = 1;
};

class GrpcExpertClient {
 public:
  static absl::StatusOr<std::unique_ptr<GrpcExpertClient>> Connect(
      std::string_view address, const GrpcClientOptions& options = {});
  ~GrpcExpertClient();
  GrpcExpertClient(const GrpcExpertClient&) = delete;
  GrpcExpertClient& operator=(const GrpcExpertClient&) = delete;

  // One call: writes out[T, dim] (fp32) on success. With `check_inputs` false the sizes are
  // sent unchecked (tests of the server's validation).
  absl::Status Call(const shm::ExpertCallInput& input, float* out, absl::Time deadline,
                    bool check_inputs = true);

  const std::string& address() const { return address_; }
  const GrpcServerInfo& info() const { return info_; }

  class Impl;

 private:
  GrpcExpertClient(std::string address, const GrpcClientOptions& options,
                   std::unique_ptr<Impl> impl);

  const std::string address_;
  const GrpcClientOptions options_;
  std::unique_ptr<Impl> impl_;
  GrpcServerInfo info_;
};

}  // namespace ss::expert::grpc_transport
