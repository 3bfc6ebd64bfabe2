// The shared-memory expert transport (cpu_expert_worker/transport) without the engine: a test
// handler answers with self-describing payloads (STYLE.md "Self-describing payloads"): every
// output element is a function of the layer, the token's x value and its routed ids and
// weights, and every call sends different x and ids, so a misrouted, partial or stale answer
// shows as a mismatch. Peers that die are real processes (fork + SIGKILL).
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cpu_expert_worker/transport/shm_client.h"
#include "cpu_expert_worker/transport/shm_protocol.h"
#include "cpu_expert_worker/transport/shm_server.h"
#include "gtest/gtest.h"

namespace ss::expert::shm {
namespace {

constexpr uint32_t kDim = 64;
constexpr uint32_t kTopK = 6;
constexpr uint32_t kMaxT = 8;
constexpr int kSlowLayer = 99;       // the test handler sleeps on this layer
constexpr int kEarlyWakeLayer = 80;  // ... and on this one calls almost_done between two sleeps

std::string UniqueName() {
  static std::atomic<int> counter{0};
  return "ss-shm-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
}

float Bf16ToFloat(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

uint16_t FloatToBf16(float f) {  // exact for the small integers used here
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(f));
  return static_cast<uint16_t>(bits >> 16);
}

// The answer for one output element; exact in fp32 for layer < 1000.
float Expected(int layer, uint16_t x, int32_t id, float weight) {
  return Bf16ToFloat(x) + 1000.0f * static_cast<float>(layer) + 10.0f * static_cast<float>(id) +
         weight;
}

// One call's inputs, different for every `tag`.
struct Inputs {
  int layer = 0, tokens = 0, top_k = 0, dim = 0;
  std::vector<uint16_t> x;
  std::vector<int32_t> ids;
  std::vector<float> weights;

  ExpertCallInput view() const {
    return {layer, tokens, top_k, dim, x.data(), ids.data(), weights.data()};
  }
  std::vector<float> expected() const {
    std::vector<float> out(static_cast<size_t>(tokens) * dim);
    for (int t = 0; t < tokens; ++t) {
      for (int d = 0; d < dim; ++d) {
        const int k = d % top_k;
        out[t * dim + d] =
            Expected(layer, x[t * dim + d], ids[t * top_k + k], weights[t * top_k + k]);
      }
    }
    return out;
  }
};

Inputs MakeInputs(int tag, int layer, int tokens, int top_k = kTopK, int dim = kDim) {
  Inputs in;
  in.layer = layer;
  in.tokens = tokens;
  in.top_k = top_k;
  in.dim = dim;
  for (int t = 0; t < tokens; ++t) {
    for (int d = 0; d < dim; ++d) {
      in.x.push_back(FloatToBf16(static_cast<float>((tag * 7 + t * 3 + d) % 256)));
    }
    for (int k = 0; k < top_k; ++k) {
      in.ids.push_back((tag * 13 + t * 6 + k) % 256);
      in.weights.push_back(0.125f * static_cast<float>(k + 1));
    }
  }
  return in;
}

// The handler: the self-describing answer, with hooks for the error and timing cases.
struct TestHandler {
  std::atomic<int> calls{0};
  std::atomic<int> slow_entered{0};
  absl::Duration slow = absl::Milliseconds(300);

  absl::Status operator()(const ExpertRequestView& r, float* out) {
    calls.fetch_add(1);
    if (r.layer == kSlowLayer) {
      slow_entered.fetch_add(1);
      absl::SleepFor(slow);
    }
    if (r.layer == kEarlyWakeLayer) {  // the engine's pattern: work, the early wake, the tail
      absl::SleepFor(absl::Milliseconds(20));
      if (r.almost_done != nullptr) (*r.almost_done)();
      absl::SleepFor(absl::Milliseconds(50));  // long enough for a loaded machine to run the client
    }
    if (r.layer == 77) return absl::InvalidArgumentError("unknown layer 77");
    if (r.layer == 78) return absl::ResourceExhaustedError(std::string(1000, 'm'));
    if (r.layer == 79) throw std::runtime_error("boom");
    if (r.protocol_version != kShmProtocolVersion || r.client_pid <= 0) {
      return absl::InternalError("bad protocol fields in the view");
    }
    for (int t = 0; t < r.tokens; ++t) {
      for (int d = 0; d < r.dim; ++d) {
        const int k = d % r.top_k;
        out[t * r.dim + d] = Expected(r.layer, r.x_bf16[t * r.dim + d], r.ids[t * r.top_k + k],
                                      r.weights[t * r.top_k + k]);
      }
    }
    return absl::OkStatus();
  }
};

ShmServerOptions Options(const std::string& name, uint32_t slots = 4) {
  ShmServerOptions o;
  o.name = name;
  o.slots = slots;
  o.max_tokens = kMaxT;
  o.dim = kDim;
  o.top_k = kTopK;
  o.client_sweep_interval = absl::Milliseconds(10);
  return o;
}

std::unique_ptr<ShmServer> StartServer(const ShmServerOptions& o, TestHandler* h) {
  auto server =
      ShmServer::Create(o, [h](const ExpertRequestView& r, float* out) { return (*h)(r, out); });
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? std::move(*server) : nullptr;
}

absl::Time In(absl::Duration d) { return absl::Now() + d; }

// Calls and checks every output element.
absl::Status CallAndCheck(ShmClient& client, const Inputs& in,
                          absl::Duration timeout = absl::Seconds(5)) {
  std::vector<float> out(static_cast<size_t>(in.tokens) * in.dim, -1.0f);
  absl::Status s = client.Call(in.view(), out.data(), In(timeout));
  if (!s.ok()) return s;
  const std::vector<float> want = in.expected();
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] != want[i]) {
      return absl::DataLossError("element " + std::to_string(i) + ": got " +
                                 std::to_string(out[i]) + ", want " + std::to_string(want[i]));
    }
  }
  return absl::OkStatus();
}

// Forks; the child runs `body` and exits with its return value, never returning into gtest.
// Call only while this process has no other threads.
pid_t ForkChild(const std::function<int()>& body) {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(body());
  EXPECT_GT(pid, 0);
  return pid;
}

// Connects, retrying while the server starts (up to 5 s).
absl::StatusOr<std::unique_ptr<ShmClient>> ConnectRetrying(const std::string& name) {
  absl::StatusOr<std::unique_ptr<ShmClient>> c;
  for (int i = 0; i < 500; ++i) {
    c = ShmClient::Connect(name);
    if (c.ok()) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return c;
}

bool WaitFor(const std::function<bool()>& cond, absl::Duration limit = absl::Seconds(5)) {
  for (const absl::Time end = In(limit); absl::Now() < end;) {
    if (cond()) return true;
    absl::SleepFor(absl::Milliseconds(2));
  }
  return cond();
}

bool SegmentExists(const std::string& name) {
  struct stat st;
  return ::stat(("/dev/shm/" + name).c_str(), &st) == 0;
}

TEST(ShmTransport, LayoutIsPageAligned) {
  auto l = ComputeLayout({4, 256, 4096, 6});
  ASSERT_TRUE(l.ok()) << l.status();
  for (uint64_t off : {l->x_offset, l->ids_offset, l->weights_offset, l->out_offset, l->slot_stride,
                       l->segment_bytes}) {
    EXPECT_EQ(off % kShmPageBytes, 0u) << off;
  }
  EXPECT_EQ(l->x_offset, kShmPageBytes);
  EXPECT_GE(l->out_offset - l->weights_offset, 256u * 6 * 4);
  EXPECT_GE(l->slot_stride - l->out_offset, 256u * 4096 * 4);
  EXPECT_FALSE(ComputeLayout({0, 1, 1, 1}).ok());
  EXPECT_FALSE(ComputeLayout({kShmMaxSlots + 1, 1, 1, 1}).ok());
  EXPECT_FALSE(ComputeLayout({1024, 1u << 20, 1u << 16, 8}).ok());  // > kShmMaxSegmentBytes
}

TEST(ShmTransport, NamesAreValidated) {
  EXPECT_EQ(*ShmObjectName("abc-1.2_x"), "/abc-1.2_x");
  EXPECT_EQ(*ShmObjectName("/abc"), "/abc");
  for (const char* bad : {"", "/", "a/b", "..", ".", "a b", "/../x"}) {
    EXPECT_EQ(ShmObjectName(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_FALSE(ShmObjectName(std::string(201, 'a')).ok());
  TestHandler h;
  ShmServerOptions o = Options("bad/name");
  EXPECT_EQ(ShmServer::Create(o, std::ref(h)).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ShmClient::Connect(UniqueName()).status().code(), absl::StatusCode::kNotFound);
}

TEST(ShmTransport, RoundTripSelfDescribing) {
  TestHandler h;
  const std::string name = UniqueName();
  auto server = StartServer(Options(name), &h);
  ASSERT_NE(server, nullptr);
  auto client = ShmClient::Connect(name);
  ASSERT_TRUE(client.ok()) << client.status();
  int tag = 0;
  for (int tokens : {1, 3, 8}) {
    for (int top_k : {6, 2, 1}) {
      ++tag;
      const Inputs in = MakeInputs(tag, /*layer=*/tag % 43, tokens, top_k);
      EXPECT_TRUE(CallAndCheck(**client, in).ok()) << "T=" << tokens << " top_k=" << top_k;
    }
  }
  EXPECT_EQ(h.calls.load(), tag);

  // The lease API: fill the slot in place, invoke several times, read the answer in place.
  auto lease = (*client)->AcquireSlot(In(absl::Seconds(1)));
  ASSERT_TRUE(lease.ok()) << lease.status();
  for (int i = 0; i < 3; ++i) {
    const Inputs in = MakeInputs(100 + i, 7, 5);
    std::copy(in.x.begin(), in.x.end(), lease->x_bf16());
    std::copy(in.ids.begin(), in.ids.end(), lease->ids());
    std::copy(in.weights.begin(), in.weights.end(), lease->weights());
    ASSERT_TRUE(lease->Invoke({kShmProtocolVersion, 7, 5, kTopK, kDim}, In(absl::Seconds(5))).ok());
    const std::vector<float> want = in.expected();
    EXPECT_TRUE(std::equal(want.begin(), want.end(), lease->out())) << "lease call " << i;
  }
  EXPECT_EQ(server->stats().calls, static_cast<uint64_t>(tag + 3));
}

TEST(ShmTransport, ManyConcurrentClientThreads) {
  TestHandler h;
  const std::string name = UniqueName();
  ShmServerOptions o = Options(name, /*slots=*/8);
  o.serving_threads = 2;
  auto server = StartServer(o, &h);
  ASSERT_NE(server, nullptr);
  auto client = ShmClient::Connect(name);
  ASSERT_TRUE(client.ok()) << client.status();
  constexpr int kThreads = 8, kCalls = 150;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int th = 0; th < kThreads; ++th) {
    threads.emplace_back([&, th] {
      for (int i = 0; i < kCalls; ++i) {
        const Inputs in = MakeInputs(th * 1000 + i, /*layer=*/th, 1 + (i + th) % kMaxT);
        absl::Status s = CallAndCheck(**client, in);
        if (!s.ok()) {
          ADD_FAILURE() << "thread " << th << " call " << i << ": " << s;
          failures.fetch_add(1);
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(server->stats().calls, static_cast<uint64_t>(kThreads * kCalls));
}

// The early wake (shm_protocol.h "Doorbells"): a client that went to sleep (spin 0) is woken
// when the handler reports its answer near, and counts it; a handler that does not report wakes
// it only with the answer.
TEST(ShmTransport, EarlyWakeReachesASleepingClient) {
  TestHandler h;
  h.slow = absl::Milliseconds(25);
  const std::string name = UniqueName();
  auto server = StartServer(Options(name), &h);
  ASSERT_NE(server, nullptr);
  ShmClientOptions co;
  co.spin = absl::ZeroDuration();
  // One sleep covers the handler's work, so the early wake cannot meet the end of a liveness
  // slice (which counts as no early wake, and may find the client between two sleeps).
  co.liveness_poll = absl::Seconds(1);
  auto client = ShmClient::Connect(name, co);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_TRUE(CallAndCheck(**client, MakeInputs(1, kSlowLayer, 2)).ok());
  EXPECT_EQ((*client)->early_wakes(), 0u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(CallAndCheck(**client, MakeInputs(2 + i, kEarlyWakeLayer, 2)).ok());
  }
  EXPECT_EQ((*client)->early_wakes(), 3u);
  co.spin_after_wake = absl::Microseconds(-1);
  EXPECT_EQ(ShmClient::Connect(name, co).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ShmTransport, DeadlineExceededWhileProcessingAndSlotIsReusedCleanly) {
  TestHandler h;
  const std::string name = UniqueName();
  auto server = StartServer(Options(name, /*slots=*/1), &h);  // one slot: it must be reused
  ASSERT_NE(server, nullptr);
  auto client = ShmClient::Connect(name);
  ASSERT_TRUE(client.ok()) << client.status();
  const Inputs slow = MakeInputs(1, kSlowLayer, 2);
  std::vector<float> out(2 * kDim);
  const absl::Time t0 = absl::Now();
  absl::Status s = (*client)->Call(slow.view(), out.data(), In(absl::Milliseconds(50)));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_LT(absl::Now() - t0, absl::Milliseconds(250));
  // The late answer to the slow call must not be taken for this one.
  EXPECT_TRUE(CallAndCheck(**client, MakeInputs(2, 3, 2)).ok());
  EXPECT_EQ(server->stats().abandoned, 1u);
}

TEST(ShmTransport, DeadlineExceededWhileQueuedKeepsTheLease) {
  TestHandler h;
  const std::string name = UniqueName();
  auto server = StartServer(Options(name, /*slots=*/2), &h);  // one serving thread
  ASSERT_NE(server, nullptr);
  auto client = ShmClient::Connect(name);
  ASSERT_TRUE(client.ok()) << client.status();
  std::thread busy([&] { EXPECT_TRUE(CallAndCheck(**client, MakeInputs(1, kSlowLayer, 1)).ok()); });
  ASSERT_TRUE(WaitFor([&] { return h.slow_entered.load() == 1; }));
  auto lease = (*client)->AcquireSlot(In(absl::Seconds(1)));
  ASSERT_TRUE(lease.ok()) << lease.status();
  const Inputs in = MakeInputs(2, 4, 3);
  std::copy(in.x.begin(), in.x.end(), lease->x_bf16());
  std::copy(in.ids.begin(), in.ids.end(), lease->ids());
  std::copy(in.weights.begin(), in.weights.end(), lease->weights());
  const ExpertRequestHeader req{kShmProtocolVersion, 4, 3, kTopK, kDim};
  absl::Status s = lease->Invoke(req, In(absl::Milliseconds(30)));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_TRUE(lease->valid());  // withdrawn before any server thread took it
  busy.join();
  ASSERT_TRUE(lease->Invoke(req, In(absl::Seconds(5))).ok());
  const std::vector<float> want = in.expected();
  EXPECT_TRUE(std::equal(want.begin(), want.end(), lease->out()));
}

TEST(ShmTransport, HandlerErrorsReachTheClientAndServingContinues) {
  TestHandler h;
  const std::string name = UniqueName();
  auto server = StartServer(Options(name), &h);
  ASSERT_NE(server, nullptr);
  auto client = ShmClient::Connect(name);
  ASSERT_TRUE(client.ok()) << client.status();
  std::vector<float> out(kDim);
  absl::Status s = (*client)->Call(MakeInputs(1, 77, 1).view(), out.data(), In(absl::Seconds(5)));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("unknown layer 77"), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find(name), absl::string_view::npos) << s;
  s = (*client)->Call(MakeInputs(2, 78, 1).view(), out.data(), In(absl::Seconds(5)));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_LT(s.message().size(), kShmMessageBytes + name.size() + 32);  // bounded
  s = (*client)->Call(MakeInputs(3, 79, 1).view(), out.data(), In(absl::Seconds(5)));
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_NE(s.message().find("boom"), absl::string_view::npos) << s;
  EXPECT_TRUE(CallAndCheck(**client, MakeInputs(4, 5, 4)).ok());
  EXPECT_EQ(server->stats().handler_errors, 3u);
}

TEST(ShmTransport, MalformedRequestsAreRejectedAndServingContinues) {
  TestHandler h;
  const std::string name = UniqueName();
  auto server = StartServer(Options(name), &h);
  ASSERT_NE(server, nullptr);
  auto client = ShmClient::Connect(name);
  ASSERT_TRUE(client.ok()) << client.status();
  auto lease = (*client)->AcquireSlot(In(absl::Seconds(1)));
  ASSERT_TRUE(lease.ok()) << lease.status();
  struct Case {
    ExpertRequestHeader req;
    std::string want;
  };
  const int T = kMaxT, K = kTopK, D = kDim;
  const Case cases[] = {
      {{kShmProtocolVersion, 1, T + 1, K, D}, "T = 9"},
      {{kShmProtocolVersion, 1, 0, K, D}, "T = 0"},
      {{kShmProtocolVersion, 1, -5, K, D}, "T = -5"},
      {{kShmProtocolVersion, 1, 1, 0, D}, "top_k = 0"},
      {{kShmProtocolVersion, 1, 1, K + 1, D}, "top_k = 7"},
      {{kShmProtocolVersion, 1, 1, K, D - 1}, "dim = 63"},
      {{kShmProtocolVersion + 1, 1, 1, K, D},
       absl::StrCat("protocol version ", kShmProtocolVersion + 1)},
  };
  for (const Case& c : cases) {
    absl::Status s = lease->Invoke(c.req, In(absl::Seconds(5)));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.want << ": " << s;
    EXPECT_NE(s.message().find(c.want), absl::string_view::npos) << s;
    EXPECT_TRUE(lease->valid());
  }
  EXPECT_EQ(h.calls.load(), 0);  // none reached the handler
  EXPECT_EQ(server->stats().rejected, std::size(cases));
  lease->Release();
  EXPECT_TRUE(CallAndCheck(**client, MakeInputs(1, 2, 3)).ok());
  // The client checks what it copies itself.
  std::vector<float> out(kMaxT * 2 * kDim);
  Inputs big = MakeInputs(2, 2, kMaxT);
  big.tokens = kMaxT + 1;
  EXPECT_EQ((*client)->Call(big.view(), out.data(), In(absl::Seconds(1))).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*client)->Call(MakeInputs(3, 2, 1).view(), out.data(), absl::InfiniteFuture()).code(),
            absl::StatusCode::kInvalidArgument);  // every call needs a deadline
}

TEST(ShmTransport, WrongMagicVersionOrLayoutIsAClearConnectError) {
  TestHandler h;
  const std::string name = UniqueName();
  auto server = StartServer(Options(name), &h);
  ASSERT_NE(server, nullptr);
  const int fd = ::shm_open(("/" + name).c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  void* p = ::mmap(nullptr, kShmPageBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  ASSERT_NE(p, MAP_FAILED);
  auto* hdr = static_cast<SegmentHeader*>(p);

  hdr->protocol_version = 99;
  absl::Status s = ShmClient::Connect(name).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("protocol version 99"), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find(absl::StrCat("speaks version ", kShmProtocolVersion)),
            absl::string_view::npos)
      << s;
  hdr->protocol_version = kShmProtocolVersion;

  hdr->magic = 0x1234;
  s = ShmClient::Connect(name).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("not a splitserve expert segment"), absl::string_view::npos) << s;
  hdr->magic = kShmMagic;

  hdr->out_offset += kShmPageBytes;
  s = ShmClient::Connect(name).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("out_offset"), absl::string_view::npos) << s;
  hdr->out_offset -= kShmPageBytes;
  ::munmap(p, kShmPageBytes);

  ShmClientOptions want;
  want.expect_dim = 4096;
  s = ShmClient::Connect(name, want).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("dim is 64 in the segment, 4096 in this client"),
            absl::string_view::npos)
      << s;

  auto client = ShmClient::Connect(name);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_TRUE(CallAndCheck(**client, MakeInputs(1, 1, 1)).ok());
}

TEST(ShmTransport, SegmentIsPrivateExclusiveAndUnlinkedAfterStop) {
  TestHandler h;
  const std::string name = UniqueName();
  const mode_t old_umask = ::umask(0);  // the mode must not depend on the umask
  auto server = StartServer(Options(name), &h);
  ::umask(old_umask);
  ASSERT_NE(server, nullptr);
  struct stat st;
  ASSERT_EQ(::stat(("/dev/shm/" + name).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  EXPECT_EQ(st.st_uid, ::geteuid());

  // A second server for a name a live server holds: refused, naming the owner.
  auto second = ShmServer::Create(Options(name), std::ref(h));
  EXPECT_EQ(second.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_NE(second.status().message().find(std::to_string(::getpid())), absl::string_view::npos)
      << second.status();

  auto client = ShmClient::Connect(name);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_TRUE(CallAndCheck(**client, MakeInputs(1, 1, 1)).ok());
  server->Stop();
  EXPECT_FALSE(SegmentExists(name));
  // A client still mapping the unlinked segment gets Unavailable at once, not a hang.
  const absl::Time t0 = absl::Now();
  std::vector<float> out(kDim);
  absl::Status s = (*client)->Call(MakeInputs(2, 1, 1).view(), out.data(), In(absl::Seconds(5)));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_LT(absl::Now() - t0, absl::Milliseconds(100));
  server.reset();  // Stop again from the destructor: a no-op
}

// A server process that stops on SIGTERM through RequestStop() + Wait().
ShmServer* g_sigterm_server = nullptr;

TEST(ShmTransport, SigtermUnlinksTheSegment) {
  const std::string name = UniqueName();
  const pid_t child = ForkChild([&] {
    TestHandler h;
    auto server = ShmServer::Create(Options(name), std::ref(h));
    if (!server.ok()) return 2;
    g_sigterm_server = server->get();
    struct sigaction sa = {};
    sa.sa_handler = [](int) { g_sigterm_server->RequestStop(); };
    ::sigaction(SIGTERM, &sa, nullptr);
    (*server)->Wait();
    return SegmentExists(name) ? 3 : 0;
  });
  auto client = ConnectRetrying(name);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_TRUE(CallAndCheck(**client, MakeInputs(1, 1, 1)).ok());
  ASSERT_EQ(::kill(child, SIGTERM), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_FALSE(SegmentExists(name));
}

TEST(ShmTransport, ClientKilledMidCallFreesItsSlot) {
  const std::string name = UniqueName();
  // Fork first, while this process has one thread; the child waits for the segment.
  const pid_t child = ForkChild([&] {
    auto client = ConnectRetrying(name);
    if (!client.ok()) return 2;
    std::vector<float> out(kDim);
    (void)(*client)->Call(MakeInputs(1, kSlowLayer, 1).view(), out.data(), In(absl::Seconds(10)));
    return 0;
  });
  TestHandler h;
  auto server = StartServer(Options(name, /*slots=*/1), &h);
  ASSERT_NE(server, nullptr);
  ASSERT_TRUE(WaitFor([&] { return h.slow_entered.load() == 1; }));
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status));
  // The only slot belonged to the dead child; the next client gets it once the handler returns
  // and the sweep notices the death.
  auto client = ShmClient::Connect(name);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_TRUE(CallAndCheck(**client, MakeInputs(2, 1, 2), absl::Seconds(3)).ok());
  EXPECT_EQ(server->stats().clients_reaped, 1u);
}

TEST(ShmTransport, ServerKilledGivesUnavailableAndItsSegmentIsReclaimed) {
  const std::string name = UniqueName();
  const pid_t child = ForkChild([&] {
    TestHandler h;
    h.slow = absl::Seconds(30);
    auto server = ShmServer::Create(Options(name), std::ref(h));
    if (!server.ok()) return 2;
    for (;;) ::pause();
  });
  auto client = ConnectRetrying(name);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ((*client)->server_pid(), child);
  std::thread killer([&] {
    absl::SleepFor(absl::Milliseconds(100));
    ::kill(child, SIGKILL);  // not reaped until the call returns: a zombie must count as dead
  });
  const absl::Time t0 = absl::Now();
  std::vector<float> out(kDim);
  absl::Status s =
      (*client)->Call(MakeInputs(1, kSlowLayer, 1).view(), out.data(), In(absl::Seconds(5)));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find(std::to_string(child)), absl::string_view::npos) << s;
  EXPECT_LT(absl::Now() - t0, absl::Seconds(1));
  killer.join();
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);

  // SIGKILL left the segment behind; it refuses new clients and the next server reclaims it.
  EXPECT_TRUE(SegmentExists(name));
  EXPECT_EQ(ShmClient::Connect(name).status().code(), absl::StatusCode::kUnavailable);
  ShmServerOptions no_reclaim = Options(name);
  no_reclaim.reclaim_stale = false;
  TestHandler h;
  EXPECT_EQ(ShmServer::Create(no_reclaim, std::ref(h)).status().code(),
            absl::StatusCode::kAlreadyExists);
  auto server = StartServer(Options(name), &h);
  ASSERT_NE(server, nullptr);
  auto fresh = ShmClient::Connect(name);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_TRUE(CallAndCheck(**fresh, MakeInputs(2, 1, 1)).ok());
  server->Stop();
  EXPECT_FALSE(SegmentExists(name));
}

TEST(ShmTransport, FrozenServerGivesUnavailableFromItsHeartbeat) {
  const std::string name = UniqueName();
  const pid_t child = ForkChild([&] {
    TestHandler h;
    auto server = ShmServer::Create(Options(name), std::ref(h));
    if (!server.ok()) return 2;
    for (;;) ::pause();
  });
  ShmClientOptions o;
  o.heartbeat_stale_after = absl::Milliseconds(200);
  absl::StatusOr<std::unique_ptr<ShmClient>> client;
  ASSERT_TRUE(WaitFor([&] { return (client = ShmClient::Connect(name, o)).ok(); }));
  EXPECT_TRUE(CallAndCheck(**client, MakeInputs(1, 1, 1)).ok());
  ASSERT_EQ(::kill(child, SIGSTOP), 0);  // alive, but neither serving nor beating
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, WUNTRACED), child);  // every thread has stopped
  ASSERT_TRUE(WIFSTOPPED(status));
  const absl::Time t0 = absl::Now();
  std::vector<float> out(kDim);
  absl::Status s = (*client)->Call(MakeInputs(2, 1, 1).view(), out.data(), In(absl::Seconds(5)));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("heartbeat stale"), absl::string_view::npos) << s;
  EXPECT_LT(absl::Now() - t0, absl::Seconds(1));
  ::kill(child, SIGKILL);
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ::shm_unlink(("/" + name).c_str());
}

TEST(ShmTransport, ForeignSegmentIsNeverTaken) {
  const std::string name = UniqueName();
  const int fd = ::shm_open(("/" + name).c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, 8192), 0);
  ASSERT_EQ(::pwrite(fd, "not ours, not ours, not ours", 28, 0), 28);
  ::close(fd);
  TestHandler h;
  auto server = ShmServer::Create(Options(name), std::ref(h));
  EXPECT_EQ(server.status().code(), absl::StatusCode::kFailedPrecondition) << server.status();
  EXPECT_EQ(ShmClient::Connect(name).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(SegmentExists(name));
  ::shm_unlink(("/" + name).c_str());
}

}  // namespace
}  // namespace ss::expert::shm
