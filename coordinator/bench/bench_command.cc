#include "coordinator/bench/bench_command.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <ctime>
#include <iostream>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "coordinator/bench/bench_arrivals.h"
#include "coordinator/bench/bench_dataset.h"
#include "coordinator/bench/bench_metrics.h"
#include "coordinator/bench/bench_options.h"
#include "coordinator/bench/bench_report.h"
#include "coordinator/bench/bench_runner.h"

namespace ss::bench {
namespace {

constexpr char kPrefix[] = "splitserve bench serve: ";

std::string LocalDate() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y%m%d-%H%M%S", &tm);
  return buf;
}

// A one-line bar on stderr, redrawn every 200 ms until destroyed.
class ProgressBar {
 public:
  ProgressBar(const std::atomic<int64_t>* done, int64_t total) : done_(done), total_(total) {
    thread_ = std::thread([this] {
      const auto start = std::chrono::steady_clock::now();
      std::unique_lock<std::mutex> lock(mu_);
      while (true) {
        Draw(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
        if (cv_.wait_for(lock, std::chrono::milliseconds(200), [this] { return stop_; })) break;
      }
      Draw(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      std::fputc('\n', stderr);
    });
  }
  ~ProgressBar() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  void Draw(double seconds) const {
    constexpr int kWidth = 30;
    const int64_t d = done_->load();
    const int filled = total_ > 0 ? static_cast<int>(kWidth * d / total_) : kWidth;
    std::fprintf(stderr, "\r%3d%%|%s%s| %lld/%lld [%.1fs]",
                 total_ > 0 ? int(100 * d / total_) : 100, std::string(filled, '#').c_str(),
                 std::string(kWidth - filled, ' ').c_str(), static_cast<long long>(d),
                 static_cast<long long>(total_), seconds);
    std::fflush(stderr);
  }

  const std::atomic<int64_t>* done_;
  const int64_t total_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

int RunServe(int argc, char** argv, std::ostream& out, std::ostream& err) {
  absl::StatusOr<BenchOptions> parsed =
      ParseBenchOptions(argc, argv, std::getenv("OPENAI_API_KEY"));
  if (!parsed.ok()) {
    err << kPrefix << parsed.status().message() << " (--help lists the flags)\n";
    return 2;
  }
  const BenchOptions& o = *parsed;
  if (o.help) {
    out << BenchServeUsage();
    return 0;
  }

  absl::StatusOr<TokenPool> pool =
      o.tokenizer.empty() ? TokenPool::Default() : TokenPool::FromTokenizer(o.tokenizer);
  if (!pool.ok()) {
    err << kPrefix << pool.status().message() << "\n";
    return 1;
  }
  absl::StatusOr<std::vector<Conversation>> dataset = BuildDataset(o, *pool);
  if (!dataset.ok()) {
    err << kPrefix << dataset.status().message() << "\n";
    return 1;
  }

  const std::string base_url = o.BaseUrl();
  absl::StatusOr<std::string> listed = FirstModelId(base_url, o.api_key, o.request_timeout_s);
  if (!listed.ok() && (o.model.empty() || absl::IsUnavailable(listed.status()))) {
    err << kPrefix << listed.status().message() << "\n";
    return 1;
  }
  const std::string model_id = o.model.empty() ? *listed : o.model;

  ClientTarget target;
  target.base_url = base_url;
  target.endpoint = o.endpoint;
  target.model = o.served_model_name.empty() ? model_id : o.served_model_name;
  target.api_key = o.api_key;
  target.temperature = o.temperature;
  target.ignore_eos = o.ignore_eos;
  target.timeout_s = o.request_timeout_s;

  int64_t num_requests = 0;
  for (const Conversation& c : *dataset) num_requests += static_cast<int64_t>(c.turns.size());
  out << "Model: " << model_id << "  URL: " << base_url << o.endpoint << "\n"
      << "Dataset: " << o.dataset_name << ", " << dataset->size() << " conversation(s), "
      << num_requests << " request(s); request rate: "
      << (std::isinf(o.request_rate) ? std::string("inf") : absl::StrCat(o.request_rate))
      << ", burstiness " << o.burstiness << ", max concurrency: "
      << (o.max_concurrency > 0 ? absl::StrCat(o.max_concurrency) : std::string("unlimited"))
      << "\n";
  out.flush();

  if (o.num_warmups > 0) {
    // The first request of the dataset, num_warmups times, at the run's concurrency.
    std::vector<Conversation> warm(static_cast<size_t>(o.num_warmups));
    for (Conversation& c : warm) c.turns.push_back(dataset->front().turns.front());
    LoadResult w =
        RunLoad(warm, std::vector<double>(warm.size(), 0.0), o.max_concurrency, target, nullptr);
    int64_t failed = 0;
    for (const RequestOutput& r : w.outputs) failed += r.success ? 0 : 1;
    out << "Warm-up: " << o.num_warmups << " request(s), " << failed << " failed\n";
  }

  const std::vector<double> arrivals =
      ArrivalTimes(static_cast<int64_t>(dataset->size()), o.request_rate, o.burstiness, o.seed);
  std::atomic<int64_t> finished{0};
  LoadResult load;
  {
    std::optional<ProgressBar> bar;
    if (!o.disable_tqdm && isatty(STDERR_FILENO)) bar.emplace(&finished, num_requests);
    load = RunLoad(*dataset, arrivals, o.max_concurrency, target, &finished);
  }

  const BenchMetrics m =
      ComputeMetrics(load.outputs, load.duration_s, o.metric_percentiles, o.goodput_ms);
  out << FormatTable(o, m);
  out.flush();
  for (const RequestOutput& r : load.outputs) {
    if (!r.success) {
      err << kPrefix << m.failed << " of " << num_requests
          << " request(s) failed; the first: " << r.error << "\n";
      break;
    }
  }

  if (o.save_result) {
    RunInfo info;
    info.model_id = model_id;
    info.date = LocalDate();
    info.num_requests = num_requests;
    info.num_conversations = static_cast<int64_t>(dataset->size());
    const std::string path = ResultPath(o, info);
    if (absl::Status s = WriteResult(path, ResultJson(o, info, m, load.outputs)); !s.ok()) {
      err << kPrefix << s.message() << "\n";
      return 1;
    }
    out << "Result written to " << path << "\n";
  }
  return m.completed > 0 ? 0 : 1;
}

}  // namespace

int RunBenchCommand(int argc, char** argv, std::ostream& out, std::ostream& err) {
  if (argc >= 2 && std::string(argv[1]) == "serve") return RunServe(argc - 1, argv + 1, out, err);
  const bool help = argc >= 2 && (std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h");
  (help ? out : err) << "usage: splitserve bench serve [flags]   (serve --help lists them)\n"
                        "  serve   load an OpenAI-compatible server, report throughput and latency "
                        "as `vllm bench serve`\n";
  if (!help && argc >= 2) err << "splitserve bench: unknown benchmark '" << argv[1] << "'\n";
  return help ? 0 : 2;
}

}  // namespace ss::bench
