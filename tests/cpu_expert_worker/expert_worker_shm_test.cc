// End to end: splitserve-expert-worker processes serving slices over shared memory, a client
// sending MoE inputs, and the sum over slices against the reference routed-expert output; the
// store's own segment over the worker's life.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/bf16.h"
#include "common/expert_store_format.h"
#include "common/golden/golden.h"
#include "common/model/linear.h"
#include "common/model/moe.h"
#include "common/model/weights.h"
#include "cpu_expert_worker/transport/shm_client.h"
#include "gtest/gtest.h"
#include "tests/cpu_expert_worker/expert_test_util.h"

namespace ss::expert {
namespace {

using testing_util::I256Checkpoint;
using testing_util::kTinyA;

// A worker process serving one slice over shared memory.
class WorkerProcess : public testing_util::WorkerProcess {
 public:
  WorkerProcess(const std::string& model, const std::string& slice, const std::string& name)
      : testing_util::WorkerProcess(
            {"--model", model, "--slice", slice, "--threads", "1", "--shm-name", name}),
        name_(name) {}
  // Connects, retrying while the worker loads (bounded).
  std::unique_ptr<shm::ShmClient> Connect() {
    const absl::Time until = absl::Now() + absl::Seconds(60);
    while (absl::Now() < until) {
      auto c = shm::ShmClient::Connect(name_);
      if (c.ok()) return std::move(*c);
      absl::SleepFor(absl::Milliseconds(20));
    }
    ADD_FAILURE() << "worker on " << name_ << " did not come up";
    return nullptr;
  }

 private:
  std::string name_;
};

std::string SegmentName(const std::string& tag) {
  return "ss-e2e-" + tag + "-" + std::to_string(getpid());
}

const model::MoeWeights& Moe(const model::ModelWeights& w, int layer) {
  const int64_t n = w.config.n_layers;
  return layer < n ? w.blocks[layer].moe : w.mtp[layer - n].block.moe;
}

struct MoeInput {
  int64_t T = 0, k = 0, dim = 0;
  std::vector<float> x;
  std::vector<uint16_t> x_bf16;
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

// T tokens of bf16 activations routed by the layer's own router.
MoeInput MakeInput(const model::ModelWeights& w, int layer, int64_t T, uint64_t seed) {
  MoeInput in;
  in.T = T;
  in.dim = w.config.dim;
  in.k = w.config.n_activated_experts;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  in.x.resize(T * in.dim);
  for (float& v : in.x) v = RoundBf16(nd(rng));
  for (float v : in.x) in.x_bf16.push_back(FloatToBf16(v));
  std::vector<int64_t> tokens(T);
  for (int64_t t = 0; t < T; ++t) tokens[t] = (t * 37 + 5) % w.config.vocab_size;
  const model::RouterResult r =
      model::Route(Moe(w, layer), w.config, in.x.data(), tokens.data(), T);
  in.ids = r.indices;
  in.weights = r.weights;
  return in;
}

// The reference routed sum: each expert's bf16 output, summed in fp32 in ascending expert order.
std::vector<float> ReferenceRouted(const model::ModelWeights& w, int layer, const MoeInput& in) {
  std::vector<float> acc(in.T * in.dim, 0.0f), y(in.dim);
  const float limit = static_cast<float>(w.config.swiglu_limit);
  for (int64_t e = 0; e < w.config.n_routed_experts; ++e) {
    for (int64_t t = 0; t < in.T; ++t) {
      for (int64_t i = 0; i < in.k; ++i) {
        if (in.ids[t * in.k + i] != e) continue;
        model::RoutedExpert(Moe(w, layer).experts[e], in.x.data() + t * in.dim,
                            &in.weights[t * in.k + i], 1, limit, y.data());
        for (int64_t d = 0; d < in.dim; ++d) acc[t * in.dim + d] += y[d];
      }
    }
  }
  return acc;
}

std::vector<float> Call(shm::ShmClient& c, int layer, const MoeInput& in) {
  std::vector<float> out(in.T * in.dim, NAN);
  const shm::ExpertCallInput ci{layer,
                                static_cast<int32_t>(in.T),
                                static_cast<int32_t>(in.k),
                                static_cast<int32_t>(in.dim),
                                in.x_bf16.data(),
                                in.ids.data(),
                                in.weights.data()};
  const absl::Status st = c.Call(ci, out.data(), absl::Now() + absl::Seconds(30));
  EXPECT_TRUE(st.ok()) << st;
  return out;
}

TEST(ExpertWorkerShm, TinyAWholeExpertsMatchTheReference) {
  auto w = model::LoadModelWeights(kTinyA);
  ASSERT_TRUE(w.ok()) << w.status();
  WorkerProcess worker(kTinyA, "0/1", SegmentName("tiny"));
  auto client = worker.Connect();
  ASSERT_NE(client, nullptr);
  for (const int layer : {0, 3, 6}) {
    const MoeInput in = MakeInput(**w, layer, 7, layer);
    const std::vector<float> got = Call(*client, layer, in);
    const std::vector<float> ref = ReferenceRouted(**w, layer, in);
    // The worker sums unrounded expert outputs; the reference rounds each expert to bf16 first.
    const golden::Closeness c = golden::Compare(got.data(), ref.data(), ref.size());
    EXPECT_LE(c.rms_rel, 1.0 / 256) << "layer " << layer;
  }
  // A malformed request is an error and the worker keeps serving.
  MoeInput bad = MakeInput(**w, 3, 2, 9);
  bad.ids[0] = 99;
  std::vector<float> out(bad.T * bad.dim);
  const shm::ExpertCallInput ci{3,
                                2,
                                static_cast<int32_t>(bad.k),
                                static_cast<int32_t>(bad.dim),
                                bad.x_bf16.data(),
                                bad.ids.data(),
                                bad.weights.data()};
  EXPECT_FALSE(client->Call(ci, out.data(), absl::Now() + absl::Seconds(30)).ok());
  const MoeInput again = MakeInput(**w, 4, 3, 11);
  const std::vector<float> ref = ReferenceRouted(**w, 4, again);
  const std::vector<float> got = Call(*client, 4, again);
  EXPECT_LE(golden::Compare(got.data(), ref.data(), ref.size()).rms_rel, 1.0 / 256);
  client.reset();
  EXPECT_EQ(worker.Stop(), 0);
}

TEST(ExpertWorkerShm, TwoSlicesSumToTheWholeExpert) {
  const std::string& dir = I256Checkpoint();
  auto w = model::LoadModelWeights(dir);
  ASSERT_TRUE(w.ok()) << w.status();
  WorkerProcess whole(dir, "0/1", SegmentName("whole"));
  WorkerProcess s0(dir, "0/2", SegmentName("s0"));
  WorkerProcess s1(dir, "1/2", SegmentName("s1"));
  auto cw = whole.Connect(), c0 = s0.Connect(), c1 = s1.Connect();
  ASSERT_TRUE(cw && c0 && c1);
  for (const int layer : {0, 2, 5}) {  // hash, HCA and the MTP block's experts
    const MoeInput in = MakeInput(**w, layer, 9, 100 + layer);
    const std::vector<float> a = Call(*c0, layer, in), b = Call(*c1, layer, in);
    const std::vector<float> one = Call(*cw, layer, in);
    std::vector<float> sum(a.size());
    for (size_t i = 0; i < a.size(); ++i) sum[i] = a[i] + b[i];
    const std::vector<float> ref = ReferenceRouted(**w, layer, in);
    // Whole experts (slice 0/1): each expert's output rounded to bf16 and summed in ascending
    // id, exactly the reference's routed sum. Two slices: unrounded partials, so close to it.
    EXPECT_EQ(one, ref) << "layer " << layer;
    EXPECT_LE(golden::Compare(sum.data(), one.data(), one.size()).rms_rel, 1.0 / 256)
        << "layer " << layer;
    EXPECT_LE(golden::Compare(sum.data(), ref.data(), ref.size()).rms_rel, 1.0 / 256)
        << "layer " << layer;
  }
  cw.reset();
  c0.reset();
  c1.reset();
  EXPECT_EQ(whole.Stop(), 0);
  EXPECT_EQ(s0.Stop(), 0);
  EXPECT_EQ(s1.Stop(), 0);
}

// The store's segment "<NAME>-store" (--store_memory auto with --shm_name): complete and owned
// by the worker once it serves, removed on SIGTERM; a SIGKILLed worker's leftover is reclaimed by
// the next worker of the name; --store_memory anonymous makes none.
struct StoreSegment {
  bool exists = false;
  absl::Status parsed;  // ParseExpertStore's verdict
  int32_t owner_pid = 0;
};

StoreSegment ReadStoreSegment(const std::string& name) {
  StoreSegment s;
  const int fd = shm_open(absl::StrCat("/", ExpertStoreSegmentName(name)).c_str(), O_RDONLY, 0);
  if (fd < 0) return s;
  s.exists = true;
  struct stat st;
  fstat(fd, &st);
  void* p = mmap(nullptr, st.st_size, PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    s.parsed = absl::InternalError("mmap");
    return s;
  }
  auto h = ParseExpertStore(static_cast<const uint8_t*>(p), st.st_size);
  s.parsed = h.status();
  if (h.ok()) s.owner_pid = (*h)->owner_pid;
  munmap(p, st.st_size);
  return s;
}

TEST(ExpertWorkerShm, StoreSegmentLivesWithTheWorker) {
  const std::string name = SegmentName("store");
  {
    WorkerProcess worker(kTinyA, "0/1", name);
    auto client = worker.Connect();  // the store is complete before the call segment exists
    ASSERT_NE(client, nullptr);
    const StoreSegment s = ReadStoreSegment(name);
    EXPECT_TRUE(s.exists);
    EXPECT_TRUE(s.parsed.ok()) << s.parsed;
    EXPECT_EQ(s.owner_pid, worker.pid());
    client.reset();
    EXPECT_EQ(worker.Stop(), 0);  // SIGTERM
    EXPECT_FALSE(ReadStoreSegment(name).exists);
  }
  {
    WorkerProcess killed(kTinyA, "0/1", name);
    ASSERT_NE(killed.Connect(), nullptr);
    const int old_pid = killed.pid();
    killed.Kill();
    EXPECT_EQ(ReadStoreSegment(name).owner_pid, old_pid);  // the leftover
    WorkerProcess next(kTinyA, "0/1", name);
    ASSERT_NE(next.Connect(), nullptr);
    const StoreSegment s = ReadStoreSegment(name);
    EXPECT_TRUE(s.parsed.ok()) << s.parsed;
    EXPECT_EQ(s.owner_pid, next.pid());
    EXPECT_EQ(next.Stop(), 0);
    EXPECT_FALSE(ReadStoreSegment(name).exists);
  }
  {
    testing_util::WorkerProcess anonymous(
        {"--model", kTinyA, "--threads", "1", "--shm-name", name, "--store-memory", "anonymous"});
    const absl::Time until = absl::Now() + absl::Seconds(60);
    bool up = false;
    while (!up && absl::Now() < until) {
      up = shm::ShmClient::Connect(name).ok();
      if (!up) absl::SleepFor(absl::Milliseconds(20));
    }
    ASSERT_TRUE(up);
    EXPECT_FALSE(ReadStoreSegment(name).exists);
    EXPECT_EQ(anonymous.Stop(), 0);
  }
}

}  // namespace
}  // namespace ss::expert
