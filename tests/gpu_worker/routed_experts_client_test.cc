// The expert-worker client (gpu_worker/routed_experts_client.h) against splitserve-expert-worker
// processes on a checkpoint whose experts split in two (I = 256): two slices (one over shared
// memory, one over gRPC with a small max_tokens, so calls are cut into chunks) sum, in slice
// order, to exactly the workers' own partials; a layer without endpoints is the reference's
// RoutedSum; configuration and transport errors name the layer and the endpoint.
#include "gpu_worker/routed_experts_client.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/bf16.h"
#include "common/golden/golden.h"
#include "common/model/model.h"
#include "common/model/moe.h"
#include "cpu_expert_worker/transport/grpc_client.h"
#include "cpu_expert_worker/transport/shm_client.h"
#include "gpu_worker/step_progress.h"
#include "gtest/gtest.h"
#include "tests/cluster_credential_util.h"
#include "tests/cpu_expert_worker/expert_test_util.h"

namespace ss::gpu {
namespace {

using expert::testing_util::I256Checkpoint;
using expert::testing_util::WorkerProcess;

// The expert workers this test starts serve gRPC with the tests' cluster token.
[[maybe_unused]] const bool kTokenExported = (::ss::testing_util::ExportTestClusterToken(), true);

ExpertClientOptions Opts() {
  ExpertClientOptions o;
  o.credential = ::ss::testing_util::TestCredential();
  return o;
}

int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

struct MoeInput {
  int64_t T = 0;
  std::vector<float> x;
  std::vector<uint16_t> xb;
  model::RouterResult r;
};

MoeInput MakeInput(const model::Model& m, int layer, int64_t T, uint64_t seed) {
  const ModelConfig& c = m.config();
  MoeInput in;
  in.T = T;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  in.x.resize(T * c.dim);
  for (float& v : in.x) v = RoundBf16(nd(rng));
  for (float v : in.x) in.xb.push_back(FloatToBf16(v));
  std::vector<int64_t> tokens(T);
  for (int64_t t = 0; t < T; ++t) tokens[t] = (t * 31 + 7) % c.vocab_size;
  in.r = model::Route(m.weights().blocks[layer].moe, c, in.x.data(), tokens.data(), T);
  return in;
}

ExpertEndpointConfig Shm(const std::string& name, int i, int n) {
  ExpertEndpointConfig e;
  e.shm_name = name;
  e.slice_index = i;
  e.slice_count = n;
  return e;
}

ExpertEndpointConfig Grpc(const std::string& address, int i, int n) {
  ExpertEndpointConfig e;
  e.grpc_address = address;
  e.slice_index = i;
  e.slice_count = n;
  e.worker_id = "exp1";
  return e;
}

TEST(RoutedExpertsClient, SlicesSumInOrderAndLocalLayersAreTheReference) {
  const std::string& dir = I256Checkpoint();
  auto m = model::Model::Load(dir);
  ASSERT_TRUE(m.ok()) << m.status();
  const ModelConfig& c = (*m)->config();
  const std::string shm = absl::StrCat("ss-gw-client-", getpid());
  const std::string grpc = absl::StrCat("127.0.0.1:", FreePort());
  WorkerProcess s0({"--model", dir, "--slice", "0/2", "--threads", "1", "--isa", "scalar",
                    "--layers", "1-2", "--shm-name", shm});
  WorkerProcess s1({"--model", dir, "--slice", "1/2", "--threads", "1", "--isa", "scalar",
                    "--layers", "1-2", "--max-tokens", "4", "--grpc-listen", grpc});
  std::vector<LayerExpertsConfig> layers;
  for (const int l : {1, 2}) layers.push_back({l, {Grpc(grpc, 1, 2), Shm(shm, 0, 2)}});
  layers.push_back({0, {}});  // local
  auto client = RoutedExpertsClient::Connect(**m, layers, Opts());
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_TRUE((*client)->remote(1));
  EXPECT_FALSE((*client)->remote(0));

  auto direct0 = expert::shm::ShmClient::Connect(shm);
  expert::grpc_transport::GrpcClientOptions go;
  go.credential = ::ss::testing_util::TestCredential();
  auto direct1 = expert::grpc_transport::GrpcExpertClient::Connect(grpc, go);
  ASSERT_TRUE(direct0.ok() && direct1.ok());
  const int k = static_cast<int>(c.n_activated_experts);
  for (const int layer : {1, 2}) {
    const MoeInput in = MakeInput(**m, layer, 9, 40 + layer);
    std::vector<float> got(in.T * c.dim, NAN);
    const uint64_t progress = StepProgress();
    const absl::Status st = (*client)->Compute(layer, in.T, in.x.data(), in.r.indices.data(),
                                               in.r.weights.data(), k, got.data());
    ASSERT_TRUE(st.ok()) << st;
    // One unit of step progress per answered chunk of rows (9 rows in chunks of 4).
    EXPECT_EQ(StepProgress() - progress, 3u) << "layer " << layer;
    // The workers' own partials, row chunks of at most 4 (slice 1's max_tokens).
    std::vector<float> p0(in.T * c.dim), p1(in.T * c.dim);
    for (int64_t r0 = 0; r0 < in.T; r0 += 4) {
      const int64_t n = std::min<int64_t>(4, in.T - r0);
      const expert::shm::ExpertCallInput ci{layer,
                                            static_cast<int32_t>(n),
                                            k,
                                            static_cast<int32_t>(c.dim),
                                            in.xb.data() + r0 * c.dim,
                                            in.r.indices.data() + r0 * k,
                                            in.r.weights.data() + r0 * k};
      const absl::Time d = absl::Now() + absl::Seconds(30);
      ASSERT_TRUE((*direct0)->Call(ci, p0.data() + r0 * c.dim, d).ok());
      ASSERT_TRUE((*direct1)->Call(ci, p1.data() + r0 * c.dim, d).ok());
    }
    std::vector<float> sum(p0.size());
    for (size_t i = 0; i < sum.size(); ++i) sum[i] = p0[i] + p1[i];
    EXPECT_EQ(std::memcmp(sum.data(), got.data(), sum.size() * 4), 0) << "layer " << layer;
    // TP 2: rank r's client holds slice r alone and returns exactly that worker's partial (the
    // backend's MoE all-reduce adds the ranks').
    for (int rank = 0; rank < 2; ++rank) {
      ExpertClientOptions o = Opts();
      o.tp_rank = rank;
      o.tp_size = 2;
      auto mine = RoutedExpertsClient::Connect(**m, ExpertSlicesForRank(layers, rank, 2), o);
      ASSERT_TRUE(mine.ok()) << mine.status();
      EXPECT_TRUE((*mine)->remote(layer));
      std::vector<float> part(in.T * c.dim, NAN);
      ASSERT_TRUE((*mine)
                      ->Compute(layer, in.T, in.x.data(), in.r.indices.data(), in.r.weights.data(),
                                k, part.data())
                      .ok());
      const std::vector<float>& want = rank == 0 ? p0 : p1;
      EXPECT_EQ(std::memcmp(want.data(), part.data(), want.size() * 4), 0)
          << "layer " << layer << " rank " << rank;
    }
    std::vector<float> ref(in.T * c.dim);
    model::RoutedSum((*m)->weights().blocks[layer].moe, c, in.x.data(), in.r, in.T, ref.data());
    EXPECT_LE(golden::Compare(got.data(), ref.data(), ref.size()).rms_rel, 1.0 / 256);
  }
  // Layer 0 has no endpoints: the reference, exactly.
  const MoeInput in = MakeInput(**m, 0, 5, 3);
  std::vector<float> got(in.T * c.dim), ref(in.T * c.dim);
  ASSERT_TRUE(
      (*client)
          ->Compute(0, in.T, in.x.data(), in.r.indices.data(), in.r.weights.data(), k, got.data())
          .ok());
  model::RoutedSum((*m)->weights().blocks[0].moe, c, in.x.data(), in.r, in.T, ref.data());
  EXPECT_EQ(std::memcmp(got.data(), ref.data(), ref.size() * 4), 0);

  // A dead worker: the error names the layer and the endpoint.
  direct1->reset();
  EXPECT_EQ(s1.Stop(), 0);
  const MoeInput again = MakeInput(**m, 2, 3, 5);
  const uint64_t progress = StepProgress();
  const absl::Status dead = (*client)->Compute(2, again.T, again.x.data(), again.r.indices.data(),
                                               again.r.weights.data(), k, got.data());
  EXPECT_FALSE(dead.ok());
  EXPECT_EQ(StepProgress(), progress);  // a call that was not answered is no progress
  EXPECT_NE(dead.message().find("layer 2"), std::string::npos) << dead;
  EXPECT_NE(dead.message().find(grpc), std::string::npos) << dead;
  // Every choice skipped (resident on the GPU): zeros, without calling the workers (the dead one
  // would fail the call).
  const std::vector<int32_t> skipped(again.T * k, model::kSkippedExpert);
  std::fill(got.begin(), got.end(), NAN);
  const absl::Status none = (*client)->Compute(2, again.T, again.x.data(), skipped.data(),
                                               again.r.weights.data(), k, got.data());
  EXPECT_TRUE(none.ok()) << none;
  for (int64_t i = 0; i < again.T * c.dim; ++i) ASSERT_EQ(got[i], 0.0f) << i;
  client->reset();
  direct0->reset();
  EXPECT_EQ(s0.Stop(), 0);
}

TEST(RoutedExpertsClient, ConfigurationErrorsNameLayerAndEndpoint) {
  EXPECT_TRUE(ValidateLayerExperts({3, {}}).ok());
  EXPECT_FALSE(ValidateLayerExperts({3, {Shm("a", 0, 2)}}).ok());                  // slice 1?
  EXPECT_FALSE(ValidateLayerExperts({3, {Shm("a", 0, 2), Shm("b", 0, 2)}}).ok());  // twice
  EXPECT_FALSE(ValidateLayerExperts({3, {Shm("a", 0, 1), Shm("b", 1, 2)}}).ok());  // n differs
  ExpertEndpointConfig both = Shm("a", 0, 1);
  both.grpc_address = "127.0.0.1:1";
  const absl::Status st = ValidateLayerExperts({3, {both}});
  EXPECT_NE(st.message().find("layer 3"), std::string::npos) << st;

  auto m = model::Model::Load("tests/data/tiny-a");
  ASSERT_TRUE(m.ok()) << m.status();
  ExpertClientOptions o = Opts();
  o.connect_timeout = absl::Milliseconds(200);
  auto missing = RoutedExpertsClient::Connect(
      **m, {{2, {Shm(absl::StrCat("ss-gw-nobody-", getpid()), 0, 1)}}}, o);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("layer 2"), std::string::npos) << missing.status();
  EXPECT_NE(missing.status().message().find("ss-gw-nobody"), std::string::npos);
  auto outside = RoutedExpertsClient::Connect(**m, {{99, {}}}, o);
  EXPECT_EQ(outside.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(RoutedExpertsClient, TpRanksHoldSlicesIModTpAndARankWithoutSlicesAddsZero) {
  // Four slices over two ranks: rank 0 holds 0 and 2, rank 1 holds 1 and 3.
  const LayerExpertsConfig whole{
      5, {Shm("s0", 0, 4), Shm("s1", 1, 4), Shm("s2", 2, 4), Shm("s3", 3, 4)}};
  EXPECT_TRUE(ValidateLayerExperts(whole).ok());
  const std::vector<LayerExpertsConfig> r1 = ExpertSlicesForRank({whole, {6, {}}}, 1, 2);
  ASSERT_EQ(r1.size(), 2u);
  ASSERT_EQ(r1[0].endpoints.size(), 2u);
  EXPECT_EQ(r1[0].endpoints[0].shm_name, "s1");
  EXPECT_EQ(r1[0].endpoints[1].shm_name, "s3");
  EXPECT_EQ(r1[0].slice_count, 4);
  EXPECT_TRUE(r1[1].endpoints.empty());  // a local layer stays local
  EXPECT_EQ(r1[1].slice_count, 0);
  EXPECT_TRUE(ValidateLayerExperts(r1[0], 1, 2).ok());
  EXPECT_FALSE(ValidateLayerExperts(r1[0], 0, 2).ok());  // rank 1's slices given to rank 0
  EXPECT_FALSE(ValidateLayerExperts(r1[0]).ok());        // half the slices at TP 1
  LayerExpertsConfig missing = r1[0];
  missing.endpoints.pop_back();
  const absl::Status st = ValidateLayerExperts(missing, 1, 2);
  EXPECT_NE(st.message().find("layer 5"), std::string::npos) << st;

  // One slice over two ranks: rank 1 holds none and adds zero (remote, so its backend does not
  // compute a share of the experts itself); no endpoint for rank 0 would be an error.
  const std::vector<LayerExpertsConfig> one = ExpertSlicesForRank({{2, {Shm("x", 0, 1)}}}, 1, 2);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_TRUE(one[0].endpoints.empty());
  EXPECT_EQ(one[0].slice_count, 1);
  EXPECT_TRUE(ValidateLayerExperts(one[0], 1, 2).ok());
  EXPECT_FALSE(ValidateLayerExperts(one[0], 0, 2).ok());
  auto m = model::Model::Load("tests/data/tiny-a");
  ASSERT_TRUE(m.ok()) << m.status();
  ExpertClientOptions o = Opts();
  o.tp_rank = 1;
  o.tp_size = 2;
  auto client = RoutedExpertsClient::Connect(**m, one, o);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_TRUE((*client)->remote(2));
  EXPECT_FALSE((*client)->remote(3));
  const ModelConfig& c = (*m)->config();
  const MoeInput in = MakeInput(**m, 2, 3, 9);
  std::vector<float> out(in.T * c.dim, NAN);
  ASSERT_TRUE((*client)
                  ->Compute(2, in.T, in.x.data(), in.r.indices.data(), in.r.weights.data(),
                            static_cast<int>(c.n_activated_experts), out.data())
                  .ok());
  for (float v : out) ASSERT_EQ(v, 0.0f);
}

TEST(RoutedExpertsClient, AGrpcWorkerServingAnotherSliceIsRefused) {
  const std::string& dir = I256Checkpoint();
  auto m = model::Model::Load(dir);
  ASSERT_TRUE(m.ok()) << m.status();
  const std::string grpc = absl::StrCat("127.0.0.1:", FreePort());
  WorkerProcess s1(
      {"--model", dir, "--slice", "1/2", "--threads", "1", "--layers", "1", "--grpc-listen", grpc});
  auto client = RoutedExpertsClient::Connect(**m, {{1, {Grpc(grpc, 0, 1)}}}, Opts());
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), absl::StatusCode::kFailedPrecondition) << client.status();
  EXPECT_NE(client.status().message().find("slice 1/2"), std::string::npos) << client.status();
  auto wrong_layer = RoutedExpertsClient::Connect(
      **m, {{2, {Grpc(grpc, 1, 2), Shm("never-reached", 0, 2)}}}, Opts());
  ASSERT_FALSE(wrong_layer.ok());
  EXPECT_NE(wrong_layer.status().message().find("does not hold"), std::string::npos)
      << wrong_layer.status();
  EXPECT_EQ(s1.Stop(), 0);
}

}  // namespace
}  // namespace ss::gpu
