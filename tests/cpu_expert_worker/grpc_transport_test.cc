// The gRPC expert transport (grpc_server.h, grpc_client.h) on loopback with a self-describing
// handler (no engine): out[t][j] = x[t][j] + 1000·layer + Σ_k ids[t][k]·weights[t][k], so a
// misrouted row, a stale buffer or a lost token shows without a numeric reference.
// Layer 99 makes the handler fail, layer 77 makes it slow. Every call carries the tests' cluster
// token; callers without it are refused before the handler.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/codegen/client_unary_call.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cpu_expert_worker/transport/grpc_client.h"
#include "cpu_expert_worker/transport/grpc_server.h"
#include "gtest/gtest.h"
#include "proto/expert.grpc.pb.h"
#include "tests/cluster_credential_util.h"

namespace ss::expert::grpc_transport {
namespace {

constexpr int kDim = 8, kMaxTokens = 4, kTopK = 2;
using testing_util::TestCredential;

std::atomic<int> handler_runs{0};

float Bf16(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

absl::Status Describe(const shm::ExpertRequestView& r, float* out) {
  handler_runs.fetch_add(1);
  if (r.layer == 99) return absl::NotFoundError("layer 99 is not held by this worker");
  if (r.layer == 77) absl::SleepFor(absl::Milliseconds(600));
  for (int t = 0; t < r.tokens; ++t) {
    float routed = 0.0f;
    for (int k = 0; k < r.top_k; ++k) routed += r.ids[t * r.top_k + k] * r.weights[t * r.top_k + k];
    for (int j = 0; j < r.dim; ++j) {
      out[t * r.dim + j] = Bf16(r.x_bf16[t * r.dim + j]) + 1000.0f * r.layer + routed;
    }
  }
  return absl::OkStatus();
}

struct Inputs {
  std::vector<uint16_t> x;
  std::vector<int32_t> ids;
  std::vector<float> w;
  shm::ExpertCallInput in;
  Inputs(int layer, int tokens, int top_k = kTopK, int dim = kDim) {
    x.resize(tokens * dim);
    ids.resize(tokens * top_k);
    w.resize(tokens * top_k);
    for (int t = 0; t < tokens; ++t) {
      for (int j = 0; j < dim; ++j) {  // small integers are exact in bf16
        const float v = static_cast<float>(t * 16 + j);
        uint32_t u;
        std::memcpy(&u, &v, 4);
        x[t * dim + j] = static_cast<uint16_t>(u >> 16);
      }
      for (int k = 0; k < top_k; ++k) {
        ids[t * top_k + k] = t + 10 * k;
        w[t * top_k + k] = 0.5f * (k + 1);
      }
    }
    in = {layer, tokens, top_k, dim, x.data(), ids.data(), w.data()};
  }
  float Expected(int t, int j) const {
    float routed = 0.0f;
    for (int k = 0; k < in.top_k; ++k) routed += ids[t * in.top_k + k] * w[t * in.top_k + k];
    return static_cast<float>(t * 16 + j) + 1000.0f * in.layer + routed;
  }
};

class GrpcTransportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    GrpcServerOptions o;
    o.listen_address = "127.0.0.1:0";
    o.max_tokens = kMaxTokens;
    o.dim = kDim;
    o.top_k = kTopK;
    o.layers = {0, 1, 2};
    o.slice_index = 1;
    o.slice_count = 2;
    o.credential = TestCredential();
    auto s = GrpcExpertServer::Start(o, Describe);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(*s);
    ASSERT_GT(server_->port(), 0);
    address_ = absl::StrCat("127.0.0.1:", server_->port());
    auto c = GrpcExpertClient::Connect(address_, Options());
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = std::move(*c);
  }

  static GrpcClientOptions Options() {
    GrpcClientOptions o;
    o.credential = TestCredential();
    return o;
  }

  absl::Time Soon(int ms = 2000) { return absl::Now() + absl::Milliseconds(ms); }

  // A good call still works (the server keeps serving).
  void ExpectServing() {
    Inputs in(2, 3);
    std::vector<float> out(3 * kDim, -1.0f);
    ASSERT_TRUE(client_->Call(in.in, out.data(), Soon()).ok());
    for (int t = 0; t < 3; ++t) {
      for (int j = 0; j < kDim; ++j) EXPECT_EQ(out[t * kDim + j], in.Expected(t, j));
    }
  }

  std::unique_ptr<GrpcExpertServer> server_;
  std::string address_;
  std::unique_ptr<GrpcExpertClient> client_;
};

TEST_F(GrpcTransportTest, InfoAndRoundTrip) {
  const GrpcServerInfo& info = client_->info();
  EXPECT_EQ(info.protocol_version, kGrpcProtocolVersion);
  EXPECT_EQ(info.dim, kDim);
  EXPECT_EQ(info.max_tokens, kMaxTokens);
  EXPECT_EQ(info.top_k, kTopK);
  EXPECT_EQ(info.layers, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(info.slice_index, 1);
  EXPECT_EQ(info.slice_count, 2);
  for (int tokens = 1; tokens <= kMaxTokens; ++tokens) {
    for (int top_k = 1; top_k <= kTopK; ++top_k) {
      Inputs in(tokens % 3, tokens, top_k);
      std::vector<float> out(tokens * kDim, -1.0f);
      const absl::Status st = client_->Call(in.in, out.data(), Soon());
      ASSERT_TRUE(st.ok()) << st;
      for (int t = 0; t < tokens; ++t) {
        for (int j = 0; j < kDim; ++j) {
          ASSERT_EQ(out[t * kDim + j], in.Expected(t, j)) << "T=" << tokens << " t=" << t;
        }
      }
    }
  }
  EXPECT_EQ(server_->stats().calls, static_cast<uint64_t>(kMaxTokens * kTopK));
}

TEST_F(GrpcTransportTest, HandlerErrorKeepsServing) {
  Inputs in(99, 1);
  std::vector<float> out(kDim);
  const absl::Status st = client_->Call(in.in, out.data(), Soon());
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound) << st;
  EXPECT_NE(st.message().find("layer 99 is not held"), std::string::npos) << st;
  EXPECT_NE(st.message().find(address_), std::string::npos) << st;
  EXPECT_EQ(server_->stats().handler_errors, 1u);
  ExpectServing();
}

TEST_F(GrpcTransportTest, ProtocolVersionMismatch) {
  GrpcClientOptions o = Options();
  o.protocol_version_override = 7;
  auto c = GrpcExpertClient::Connect(address_, o);
  ASSERT_TRUE(c.ok()) << c.status();
  Inputs in(0, 1);
  std::vector<float> out(kDim);
  const absl::Status st = (*c)->Call(in.in, out.data(), Soon());
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_NE(st.message().find("version 7"), std::string::npos) << st;
  EXPECT_NE(st.message().find(absl::StrCat("version ", kGrpcProtocolVersion)), std::string::npos)
      << st;
  ExpectServing();
}

TEST_F(GrpcTransportTest, ConnectChecksExpectedSizes) {
  GrpcClientOptions o = Options();
  o.expect_dim = kDim + 1;
  auto c = GrpcExpertClient::Connect(address_, o);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition) << c.status();
}

TEST_F(GrpcTransportTest, MalformedRequestsAreRejected) {
  std::vector<float> out(8 * kDim);
  // Sizes the server does not serve (sent unchecked by the client).
  for (const auto& [tokens, top_k, dim] : std::vector<std::tuple<int, int, int>>{
           {kMaxTokens + 1, kTopK, kDim}, {0, kTopK, kDim}, {1, kTopK + 1, kDim},
           {1, 0, kDim}, {1, kTopK, kDim + 1}, {-3, kTopK, kDim}}) {
    Inputs in(0, std::max(tokens, 1), std::max(top_k, 1), dim);
    in.in.tokens = tokens;
    in.in.top_k = top_k;
    const absl::Status st = client_->Call(in.in, out.data(), Soon(), /*check_inputs=*/false);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument)
        << tokens << " " << top_k << " " << dim << ": " << st;
  }
  // The client refuses them itself when checking.
  Inputs big(0, kMaxTokens + 1);
  EXPECT_EQ(client_->Call(big.in, out.data(), Soon()).code(), absl::StatusCode::kInvalidArgument);

  // Payloads whose byte sizes do not match the header, through the raw stub.
  auto channel = TestCredential().CreateChannel(address_);
  auto stub = ::splitserve::v1::ExpertService::NewStub(channel);
  Inputs in(0, 2);
  auto make = [&] {
    ::splitserve::v1::ExpertRequest r;
    r.set_protocol_version(kGrpcProtocolVersion);
    r.set_tokens(2);
    r.set_top_k(kTopK);
    r.set_dim(kDim);
    r.set_x_bf16(in.x.data(), in.x.size() * 2);
    r.set_ids(in.ids.data(), in.ids.size() * 4);
    r.set_weights(in.w.data(), in.w.size() * 4);
    return r;
  };
  std::vector<::splitserve::v1::ExpertRequest> bad(5, make());
  bad[0].mutable_x_bf16()->pop_back();  // truncated x
  bad[1].clear_ids();                   // no ids
  bad[2].mutable_weights()->append(4, '\0');  // an extra weight
  bad[3].mutable_x_bf16()->resize(1);  // one byte of x
  bad[4].clear_x_bf16();
  for (size_t i = 0; i < bad.size(); ++i) {
    ::grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(Soon()));
    ::splitserve::v1::ExpertResponse resp;
    const ::grpc::Status st = stub->Compute(&ctx, bad[i], &resp);
    EXPECT_EQ(st.error_code(), ::grpc::StatusCode::INVALID_ARGUMENT) << i << ": "
                                                                      << st.error_message();
  }
  {  // The good one still goes through the raw stub.
    ::grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(Soon()));
    ::splitserve::v1::ExpertResponse resp;
    ASSERT_TRUE(stub->Compute(&ctx, make(), &resp).ok());
    EXPECT_EQ(resp.out().size(), 2u * kDim * 4);
  }

  // A message truncated on the wire (not a parseable ExpertRequest): refused by gRPC, no crash.
  const std::string wire = make().SerializeAsString();
  for (size_t cut : {wire.size() - 1, wire.size() / 2, size_t{3}}) {
    ::grpc::Slice slice(wire.data(), cut);
    ::grpc::ByteBuffer req(&slice, 1), resp;
    ::grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(Soon()));
    const ::grpc::Status st =
        ::grpc::internal::BlockingUnaryCall<::grpc::ByteBuffer, ::grpc::ByteBuffer>(
            channel.get(),
            ::grpc::internal::RpcMethod("/splitserve.v1.ExpertService/Compute",
                                        ::grpc::internal::RpcMethod::NORMAL_RPC),
            &ctx, req, &resp);
    EXPECT_FALSE(st.ok()) << "cut at " << cut;
  }
  EXPECT_GE(server_->stats().rejected, 11u);
  ExpectServing();
}

TEST_F(GrpcTransportTest, DeadlineExceededWithSlowHandler) {
  Inputs slow(77, 1);
  std::vector<float> out(kDim);
  const absl::Time t0 = absl::Now();
  const absl::Status st = client_->Call(slow.in, out.data(), t0 + absl::Milliseconds(100));
  const absl::Duration took = absl::Now() - t0;
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
  EXPECT_NE(st.message().find("deadline"), std::string::npos) << st;
  EXPECT_LT(took, absl::Milliseconds(400));
  // The slow handler finishes on its own; then the server answers again.
  ExpectServing();
}

TEST_F(GrpcTransportTest, InfiniteDeadlineRefused) {
  Inputs in(0, 1);
  std::vector<float> out(kDim);
  EXPECT_EQ(client_->Call(in.in, out.data(), absl::InfiniteFuture()).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(GrpcTransportTest, ServerGoneIsUnavailableWithinDeadline) {
  ExpectServing();
  server_->Stop();
  server_.reset();
  Inputs in(0, 1);
  std::vector<float> out(kDim);
  const absl::Time t0 = absl::Now();
  const absl::Status st = client_->Call(in.in, out.data(), t0 + absl::Seconds(3));
  EXPECT_LT(absl::Now() - t0, absl::Seconds(3));
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
  EXPECT_NE(st.message().find(address_), std::string::npos) << st;
  // Connecting to nothing fails within the connect timeout too.
  GrpcClientOptions o = Options();
  o.connect_timeout = absl::Seconds(2);
  auto c = GrpcExpertClient::Connect(address_, o);
  EXPECT_FALSE(c.ok());
}

// Info and Compute refuse a caller without the cluster token (a plain gRPC client, or a client
// whose credential holds none) and one with another token: UNAUTHENTICATED with nothing of the
// server's configuration, the handler never runs and the call is not counted.
TEST_F(GrpcTransportTest, CallsWithoutTheClusterTokenAreRefused) {
  const int runs = handler_runs.load();
  const GrpcExpertServer::Stats before = server_->stats();
  absl::StatusOr<ClusterCredential> wrong = ClusterCredential::FromToken(std::string(64, 'a'));
  ASSERT_TRUE(wrong.ok());
  for (const ClusterCredential& credential : {ClusterCredential(), *wrong}) {
    GrpcClientOptions o;
    o.credential = credential;
    EXPECT_EQ(GrpcExpertClient::Connect(address_, o).status().code(),
              absl::StatusCode::kUnauthenticated);
  }
  Inputs in(1, 2);
  ::splitserve::v1::ExpertRequest r;
  r.set_protocol_version(kGrpcProtocolVersion);
  r.set_layer(1);
  r.set_tokens(2);
  r.set_top_k(kTopK);
  r.set_dim(kDim);
  r.set_x_bf16(in.x.data(), in.x.size() * 2);
  r.set_ids(in.ids.data(), in.ids.size() * 4);
  r.set_weights(in.w.data(), in.w.size() * 4);
  for (const std::shared_ptr<::grpc::Channel>& channel :
       {::grpc::CreateChannel(address_, ::grpc::InsecureChannelCredentials()),
        wrong->CreateChannel(address_)}) {
    auto stub = ::splitserve::v1::ExpertService::NewStub(channel);
    ::grpc::ClientContext ctx;
    ::splitserve::v1::ExpertResponse resp;
    const ::grpc::Status st = stub->Compute(&ctx, r, &resp);
    EXPECT_EQ(st.error_code(), ::grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(resp.out().size(), 0u);
    ::grpc::ClientContext info_ctx;
    ::splitserve::v1::InfoRequest info_req;
    info_req.set_protocol_version(kGrpcProtocolVersion);
    ::splitserve::v1::InfoResponse info;
    EXPECT_EQ(stub->Info(&info_ctx, info_req, &info).error_code(),
              ::grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(info.dim(), 0);
    EXPECT_EQ(info.layers_size(), 0);
  }
  EXPECT_EQ(handler_runs.load(), runs);
  EXPECT_EQ(server_->stats().calls, before.calls);
  ExpectServing();
}

TEST(GrpcServerStart, RejectsBadOptionsAndAddresses) {
  GrpcServerOptions o;
  o.dim = 0;
  EXPECT_EQ(GrpcExpertServer::Start(o, Describe).status().code(),
            absl::StatusCode::kInvalidArgument);
  o.dim = kDim;
  o.listen_address = "256.1.2.3:99999";
  EXPECT_FALSE(GrpcExpertServer::Start(o, Describe).ok());
}

}  // namespace
}  // namespace ss::expert::grpc_transport
