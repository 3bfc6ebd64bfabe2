// The cluster credential (proto/cluster_credential.h): which tokens are accepted, where they come
// from (file, environment, the explicit opt-out), and that a server checking it answers only
// callers with the same token -- over a real loopback channel, with the generated Coordinator
// service as the carrier.
#include "proto/cluster_credential.h"

#include <grpcpp/grpcpp.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <fstream>
#include <set>
#include <string>

#include "gtest/gtest.h"
#include "proto/cluster.grpc.pb.h"
#include "tests/test_util.h"

namespace ss {
namespace {

namespace pb = ::splitserve::v1;

const std::string kToken(64, 'a');

TEST(ClusterCredential, TokensMustBeLongAndPlain) {
  EXPECT_TRUE(ClusterCredential::FromToken(kToken).ok());
  EXPECT_EQ(ClusterCredential::FromToken("").status().code(), absl::StatusCode::kInvalidArgument);
  const auto short_token = ClusterCredential::FromToken(std::string(31, 'a'));
  EXPECT_NE(short_token.status().message().find("at least 32"), std::string::npos);
  const auto spaced = ClusterCredential::FromToken(std::string(40, 'a') + " b");
  EXPECT_FALSE(spaced.ok());
  EXPECT_EQ(spaced.status().message().find("aaaa"), std::string::npos) << "never the token";
  EXPECT_FALSE(ClusterCredential::FromToken(std::string(40, 'a') + "\n").ok());
}

TEST(ClusterCredential, GeneratedTokensAreFreshHex) {
  std::set<std::string> seen;
  for (int i = 0; i < 8; ++i) {
    absl::StatusOr<std::string> t = GenerateClusterToken();
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->size(), 64u);
    EXPECT_EQ(t->find_first_not_of("0123456789abcdef"), std::string::npos) << *t;
    EXPECT_TRUE(ClusterCredential::FromToken(*t).ok());
    seen.insert(*t);
  }
  EXPECT_EQ(seen.size(), 8u);
}

// File first, then $SPLITSERVE_CLUSTER_TOKEN; neither is an error unless --insecure_cluster,
// which a token excludes.
TEST(ClusterCredential, LoadTakesAFileOrTheEnvironmentAndNeverRunsOpenByOmission) {
  testing_util::TempDir dir("credential");
  unsetenv(kClusterTokenEnv);
  const auto none = ClusterCredential::Load("", false);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(none.status().message().find("--insecure_cluster"), std::string::npos);
  auto open = ClusterCredential::Load("", true);
  ASSERT_TRUE(open.ok());
  EXPECT_TRUE(open->insecure());

  const std::string file = dir / "token";
  std::ofstream(file) << "\n  " << kToken << "\n";
  chmod(file.c_str(), 0600);
  auto from_file = ClusterCredential::Load(file, false);
  ASSERT_TRUE(from_file.ok()) << from_file.status();
  EXPECT_EQ(from_file->Describe(), "token");
  EXPECT_FALSE(ClusterCredential::Load(file, true).ok());
  chmod(file.c_str(), 0644);  // accepted with a warning
  EXPECT_TRUE(ClusterCredential::Load(file, false).ok());
  EXPECT_EQ(ClusterCredential::Load(dir / "missing", false).status().code(),
            absl::StatusCode::kNotFound);
  const std::string empty = dir / "empty";
  std::ofstream(empty) << " \n";
  EXPECT_NE(ClusterCredential::Load(empty, false).status().message().find("empty"),
            std::string::npos);

  setenv(kClusterTokenEnv, kToken.c_str(), 1);
  EXPECT_TRUE(ClusterCredential::Load("", false).ok());
  EXPECT_FALSE(ClusterCredential::Load("", true).ok());
  setenv(kClusterTokenEnv, "", 1);
  EXPECT_NE(ClusterCredential::Load("", false).status().message().find("empty"), std::string::npos);
  unsetenv(kClusterTokenEnv);
}

// A Coordinator whose Heartbeat answers member = true to callers with its credential.
class Checked final : public pb::Coordinator::Service {
 public:
  explicit Checked(ClusterCredential c) : credential_(std::move(c)) {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    b.RegisterService(this);
    server_ = b.BuildAndStart();
  }
  ~Checked() override { server_->Shutdown(std::chrono::system_clock::now()); }
  grpc::Status Heartbeat(grpc::ServerContext* ctx, const pb::HeartbeatRequest*,
                         pb::HeartbeatReply* reply) override {
    if (grpc::Status st = credential_.Check(*ctx, "Heartbeat"); !st.ok()) return st;
    reply->set_member(true);
    return grpc::Status::OK;
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  const ClusterCredential credential_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

grpc::StatusCode Beat(const std::shared_ptr<grpc::Channel>& channel) {
  auto stub = pb::Coordinator::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  pb::HeartbeatReply reply;
  const grpc::Status st = stub->Heartbeat(&ctx, pb::HeartbeatRequest(), &reply);
  EXPECT_EQ(reply.member(), st.ok());
  return st.error_code();
}

TEST(ClusterCredential, OnlyTheSameTokenIsAnswered) {
  const ClusterCredential mine = *ClusterCredential::FromToken(kToken);
  const ClusterCredential other = *ClusterCredential::FromToken(std::string(64, 'b'));
  const ClusterCredential longer = *ClusterCredential::FromToken(kToken + "a");
  Checked server(mine);
  EXPECT_EQ(Beat(mine.CreateChannel(server.address())), grpc::StatusCode::OK);
  for (const ClusterCredential& c :
       {other, longer, ClusterCredential(), ClusterCredential::Insecure()}) {
    EXPECT_EQ(Beat(c.CreateChannel(server.address())), grpc::StatusCode::UNAUTHENTICATED);
  }
  EXPECT_EQ(Beat(grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials())),
            grpc::StatusCode::UNAUTHENTICATED);
  // A credential that was never set refuses everyone; an insecure one answers everyone.
  Checked closed{ClusterCredential()};
  EXPECT_EQ(Beat(mine.CreateChannel(closed.address())), grpc::StatusCode::UNAUTHENTICATED);
  Checked open(ClusterCredential::Insecure());
  EXPECT_EQ(Beat(grpc::CreateChannel(open.address(), grpc::InsecureChannelCredentials())),
            grpc::StatusCode::OK);
}

}  // namespace
}  // namespace ss
