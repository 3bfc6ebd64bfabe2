// End to end: splitserve-expert-worker on tiny-a over shared memory with --metrics-listen on a
// loopback port; one expert call, then GET /metrics carries the worker's ISA label and the call,
// and the store's memory: its bytes (the size of its /dev/shm segment), the bytes huge pages back
// and the kernel setting deciding that, which the start-up log names too.
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "common/bf16.h"
#include "common/model_config.h"
#include "cpu_expert_worker/transport/shm_client.h"
#include "gtest/gtest.h"
#include "tests/common/http_get.h"
#include "tests/cpu_expert_worker/expert_test_util.h"
#include "tests/test_util.h"

namespace ss::expert {
namespace {

using ::ss::testing_util::FreeLoopbackPort;
using ::ss::testing_util::HttpGet;

using testing_util::kTinyA;

// The worker on tiny-a with one thread and `extra` flags.
class Worker : public testing_util::WorkerProcess {
 public:
  explicit Worker(const std::vector<std::string>& extra, const std::string& log_path = "")
      : WorkerProcess(
            [&] {
              std::vector<std::string> a = {"--model", kTinyA, "--threads", "1"};
              a.insert(a.end(), extra.begin(), extra.end());
              return a;
            }(),
            log_path) {}
};

// The value of the series line that starts with `series` (name and labels exactly), or NAN.
double Sample(const std::string& text, const std::string& series) {
  size_t pos = 0;
  while ((pos = text.find(series + " ", pos)) != std::string::npos) {
    if (pos == 0 || text[pos - 1] == '\n') return std::stod(text.substr(pos + series.size() + 1));
    pos += series.size();
  }
  return NAN;
}

TEST(ExpertWorkerMetrics, ScrapeShowsIsaAndCalls) {
  auto cfg = LoadModelConfig(kTinyA);
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  const int port = FreeLoopbackPort();
  ASSERT_GT(port, 0);
  const std::string seg = "ss-e2e-metrics-" + std::to_string(getpid());
  ::ss::testing_util::TempDir dir("ss_worker_metrics");
  const std::string log = dir / "worker.log";
  Worker worker({"--isa", "scalar", "--shm-name", seg, "--metrics-listen",
                 "127.0.0.1:" + std::to_string(port)},
                log);
  std::unique_ptr<shm::ShmClient> client;
  for (const absl::Time until = absl::Now() + absl::Seconds(60); !client && absl::Now() < until;) {
    auto c = shm::ShmClient::Connect(seg);
    if (c.ok()) {
      client = std::move(*c);
    } else {
      absl::SleepFor(absl::Milliseconds(20));
    }
  }
  ASSERT_NE(client, nullptr) << "worker did not come up";

  // One call of T tokens with distinct experts per token.
  const int64_t T = 3, dim = cfg->dim, k = cfg->n_activated_experts, E = cfg->n_routed_experts;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<uint16_t> x(T * dim);
  for (auto& v : x) v = FloatToBf16(nd(rng));
  std::vector<int32_t> ids(T * k);
  std::vector<float> w(T * k, 1.0f / k);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j) ids[t * k + j] = static_cast<int32_t>((t * 5 + j) % E);
  std::vector<float> out(T * dim);
  const int layer = 1;
  const shm::ExpertCallInput in{layer,
                                static_cast<int32_t>(T),
                                static_cast<int32_t>(k),
                                static_cast<int32_t>(dim),
                                x.data(),
                                ids.data(),
                                w.data()};
  ASSERT_TRUE(client->Call(in, out.data(), absl::Now() + absl::Seconds(30)).ok());

  const std::string resp = HttpGet(port, "/metrics");
  ASSERT_NE(resp.find("200 OK"), std::string::npos) << resp;
  EXPECT_NE(resp.find("splitserve:expert_worker_info{isa=\"scalar\",numa_node=\""),
            std::string::npos)
      << resp;
  EXPECT_NE(resp.find("slice=\"0/1\"} 1"), std::string::npos) << resp;
  EXPECT_GE(Sample(resp, "splitserve:expert_calls_total{transport=\"shm\"}"), 1.0) << resp;
  EXPECT_EQ(Sample(resp, "splitserve:expert_calls_total{transport=\"grpc\"}"), 0.0) << resp;
  EXPECT_EQ(Sample(resp, "splitserve:expert_call_errors_total{transport=\"shm\"}"), 0.0) << resp;
  EXPECT_EQ(
      Sample(resp, "splitserve:expert_call_seconds_count{layer=\"" + std::to_string(layer) + "\"}"),
      1.0)
      << resp;
  EXPECT_GT(Sample(resp, "splitserve:expert_weight_bytes_total"), 0.0) << resp;
  EXPECT_GT(Sample(resp, "splitserve:expert_achieved_gbps"), 0.0) << resp;

  // The store lives in the segment "<seg>-store": its bytes are the segment's size.
  struct stat st;
  ASSERT_EQ(::stat(("/dev/shm/" + seg + "-store").c_str(), &st), 0);
  EXPECT_EQ(Sample(resp, "splitserve:expert_store_bytes{memory=\"shared\"}"),
            static_cast<double>(st.st_size))
      << resp;
  const double huge = Sample(resp, "splitserve:expert_store_huge_page_bytes{memory=\"shared\"}");
  EXPECT_GE(huge, 0.0) << resp;  // /proc/self/smaps is readable here
  EXPECT_LE(huge, static_cast<double>(st.st_size)) << resp;
  // The setting as the start-up log names it.
  const size_t info = resp.find("splitserve:expert_store_huge_page_policy_info{");
  ASSERT_NE(info, std::string::npos) << resp;
  const size_t from = resp.find("setting=\"", info);
  ASSERT_NE(from, std::string::npos) << resp;
  const std::string setting = resp.substr(from + 9, resp.find('"', from + 9) - from - 9);
  const std::string text = ::ss::testing_util::ReadAll(log);
  EXPECT_NE(text.find("MB in huge pages (" + setting), std::string::npos) << setting << "\n"
                                                                          << text;

  client.reset();
  EXPECT_EQ(worker.Stop(), 0);
}

TEST(ExpertWorkerMetrics, BadMetricsAddressIsAUsageError) {
  Worker worker({"--shm-name", "ss-e2e-metrics-bad-" + std::to_string(getpid()), "--metrics-listen",
                 "127.0.0.1"});
  EXPECT_EQ(worker.Wait(), 2);
}

}  // namespace
}  // namespace ss::expert
