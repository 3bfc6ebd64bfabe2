// splitserve-bench-experts: the CPU expert worker's benchmarks (issue 3 item 7), all on
// DeepSeek-V4-Flash shapes (hidden 4096, moe intermediate 2048, MXFP4 in the checkpoint's own
// format, synthetic weights):
//   (a) the kernel rate per core at T = 1, cache-resident (one 13.4 MB expert, called again and
//       again, stays in the last-level cache), per ISA this CPU has, in GB/s of expert bytes;
//   (b) decode through the real worker process (splitserve-expert-worker started as a child,
//       ShmClient over shared memory): L layers x E experts (default 43 x 16 = 9.2 GB), random
//       top-6, T = 1, one call per layer and token; tokens/s and efficiency = achieved GB/s /
//       min(streaming read on the worker's thread count, threads x (a)), the read measured as the
//       median of passes run right before every decode token (the machine is shared and its
//       read bandwidth swings, here 20-70 GB/s within one run; two diagnostics pair tokens and
//       passes);
//   (c) T = 4, 16, 64, 256 through the worker: GB/s of the distinct experts' bytes, GFLOP/s,
//       the best of 3 timed passes a T, as the FMA peak (the baseline) is the best of 3 passes:
//       on a shared host either side otherwise catches quiet or busy minutes alone;
//   (d) call overhead, median: an empty call (T = 1, a handler that does nothing, in a child
//       process) over shared memory and gRPC, and a T = 1 call through the worker minus the same
//       call on an in-process engine with the same threads, ISA and weights;
// plus the worker's start-up time (spawn to serving) and its resident memory after load
// (VmRSS) against the bytes of its slice.
//
// The synthetic checkpoint is written once to --workdir (default <build>/bench-experts-data;
// one file per layer, reused by later runs; --quick uses its first layers). The last line
// printed is name=value pairs.
//
// --cpu_choices K (1..6, default 6): in (b), only the first K of a token's six choices reach the
// worker, the rest as skipped ids, as a GPU worker with resident experts sends them; the
// efficiency then counts K experts a layer.
//
// --engine_passes 1|2 (default 1, the worker's default): the worker's and the in-process engine's
// ExpertEngineOptions::passes (expert_engine.h), for A/B runs of the one-pass engine.
//
// --stream_only prints the streaming-read baseline alone (5 passes on the node's cores or
// --threads; last line `stream_read_gbps=X threads=N`), for scripts that need the host's limit.
//
//   build/bin/splitserve-bench-experts [--quick] [--stream_only] [--workdir DIR] [--layers L]
//   [--experts E]
//       [--threads N] [--isa auto|scalar|avx2|avx512|amx] [--tokens N] [--calls N]
//       [--client_spin_us US] [--cpu_choices K] [--engine_passes 1|2] [--worker PATH]
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "bench/expert_bench_lib.h"
#include "bench/fma_peak.h"
#include "common/model/moe.h"
#include "common/thread_pool.h"
#include "cpu_expert_worker/expert_engine.h"
#include "cpu_expert_worker/expert_store.h"
#include "cpu_expert_worker/kernels/dispatch.h"
#include "cpu_expert_worker/numa.h"
#include "cpu_expert_worker/transport/grpc_client.h"
#include "cpu_expert_worker/transport/grpc_server.h"
#include "cpu_expert_worker/transport/shm_client.h"
#include "cpu_expert_worker/transport/shm_server.h"
#include "proto/cluster_credential.h"

namespace ss::bench {
namespace {

namespace fs = std::filesystem;
using ss::expert::Isa;

constexpr int64_t kDim = 4096, kInter = 2048, kTopK = 6;

struct Options {
  bool quick = false;
  bool stream_only = false;  // --stream_only: the streaming-read baseline alone
  std::string workdir, worker, isa = "auto";
  int layers = 0, experts = 16, threads = 0, tokens = 0, calls = 0;
  int client_spin_us = 20;  // ShmClientOptions::spin of the bench's client (the default)
  int cpu_choices = 6;      // (b): choices of a token the worker computes; the rest skipped
  int engine_passes = 1;    // ExpertEngineOptions::passes of the worker and in-process engine
};

[[noreturn]] void Die(const std::string& what, const absl::Status& st) {
  std::fprintf(stderr, "splitserve-bench-experts: %s: %s\n", what.c_str(), st.ToString().c_str());
  std::exit(1);
}

template <class T>
T Must(absl::StatusOr<T> v, const std::string& what) {
  if (!v.ok()) Die(what, v.status());
  return std::move(*v);
}

std::string SelfDir() { return fs::read_symlink("/proc/self/exe").parent_path().string(); }

std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.starts_with("model name")) return line.substr(line.find(':') + 2);
  }
  return "unknown CPU";
}

// --serve_empty NAME PORT: a process serving empty calls on shared memory and gRPC until SIGTERM.
std::atomic<ss::expert::shm::ShmServer*> g_empty_shm{nullptr};
std::atomic<ss::expert::grpc_transport::GrpcExpertServer*> g_empty_grpc{nullptr};

// The gRPC calls carry one cluster token: $SPLITSERVE_CLUSTER_TOKEN, set to a fresh one when
// unset before the children (which inherit it) are started.
ss::ClusterCredential BenchCredential() {
  static const ss::ClusterCredential credential = [] {
    if (std::getenv(ss::kClusterTokenEnv) == nullptr) {
      setenv(ss::kClusterTokenEnv, Must(ss::GenerateClusterToken(), "cluster token").c_str(), 1);
    }
    return Must(ss::ClusterCredential::Load("", false), "cluster token");
  }();
  return credential;
}

ss::expert::grpc_transport::GrpcClientOptions GrpcOptions() {
  ss::expert::grpc_transport::GrpcClientOptions o;
  o.credential = BenchCredential();
  return o;
}

int ServeEmpty(const std::string& name, int port) {
  auto shm = ss::expert::shm::ShmServer::Create(
      EmptyServerOptions(name, ss::expert::shm::ShmServerOptions{}.spin, 1), EmptyHandler);
  if (!shm.ok()) Die("empty shm server", shm.status());
  ss::expert::grpc_transport::GrpcServerOptions go;
  go.listen_address = absl::StrCat("127.0.0.1:", port);
  go.max_tokens = 1;
  go.dim = kDim;
  go.top_k = kTopK;
  go.credential = BenchCredential();
  auto grpc = ss::expert::grpc_transport::GrpcExpertServer::Start(go, EmptyHandler);
  if (!grpc.ok()) Die("empty gRPC server", grpc.status());
  g_empty_shm.store(shm->get());
  g_empty_grpc.store(grpc->get());
  struct sigaction sa {};
  sa.sa_handler = [](int) {
    g_empty_shm.load()->RequestStop();
    g_empty_grpc.load()->RequestStop();
  };
  sigaction(SIGTERM, &sa, nullptr);
  (*shm)->Wait();
  (*grpc)->Wait();
  return 0;
}

// (a): GB/s of one whole expert per T = 1 call, the expert L3-resident (median of the calls
// after two warm-up calls).
double CacheResidentRate(const ss::expert::ExpertKernel& kernel, int repeats) {
  static const std::vector<SyntheticExpert> expert = MakeExperts(1, kDim, kInter, 3);
  const KernelRun run =
      Must(TimeKernel(kernel, expert, kDim, 1, 1, repeats + 2, {{0}}), "kernel rate");
  const std::vector<double> s(run.seconds.begin() + 2, run.seconds.end());
  return static_cast<double>(run.bytes_per_call) / Median(s) / 1e9;
}

// One T-token request: random x, distinct random top-6 per token.
struct Request {
  int64_t T;
  std::vector<uint16_t> x;
  Routing routing;
  ss::expert::shm::ExpertCallInput Input(int layer) const {
    return {
        layer,    static_cast<int32_t>(T), static_cast<int32_t>(kTopK), static_cast<int32_t>(kDim),
        x.data(), routing.ids.data(),      routing.weights.data()};
  }
};

std::vector<Request> MakeRequests(int64_t T, int count, int64_t E, uint64_t seed) {
  std::vector<Request> r;
  for (int i = 0; i < count; ++i) {
    r.push_back(
        {T, RandomBf16(T * kDim, seed * 1000 + i), RandomRouting(T, kTopK, E, seed * 77 + i)});
  }
  return r;
}

double Us(Clock::time_point t0) { return SecondsSince(t0) * 1e6; }

// A pool on the node's first `threads` cores (all of them when threads <= 0), their ids in `cpus`;
// exits 2 when the node has fewer cores.
std::unique_ptr<ss::ThreadPool> NodePool(int threads, std::vector<int>* cpus) {
  auto topo = Must(ss::NumaTopology::Discover(), "topology");
  const int node = Must(topo->ResolveNode(-1), "NUMA node");
  const std::vector<int>& cores = topo->FindNode(node)->core_cpus;
  if (threads <= 0) threads = static_cast<int>(cores.size());
  if (threads > static_cast<int>(cores.size())) {
    std::fprintf(stderr, "--threads %d exceeds the node's %zu cores\n", threads, cores.size());
    std::exit(2);
  }
  ss::ThreadPoolOptions po;
  po.num_threads = threads;
  po.cpus.assign(cores.begin(), cores.begin() + threads);
  *cpus = po.cpus;
  return Must(ss::ThreadPool::Create(po), "thread pool");
}

// `bytes` of memory, each thread's share first touched by that thread (the streaming read's).
std::unique_ptr<uint8_t[]> TouchedBuffer(ss::ThreadPool* pool, size_t bytes) {
  std::unique_ptr<uint8_t[]> buf(new uint8_t[bytes]);
  const int threads = pool->size();
  const size_t part = bytes / threads;
  (void)pool->ParallelFor(threads,
                          [&](int64_t i, int) { std::memset(buf.get() + i * part, 1, part); });
  return buf;
}

// --stream_only: the streaming read of 1 GiB on the node's first --threads cores (all by default).
int StreamOnly(const Options& o) {
  std::vector<int> cpus;
  auto pool = NodePool(o.threads, &cpus);
  const size_t bytes = size_t{1} << 30;
  const std::unique_ptr<uint8_t[]> buf = TouchedBuffer(pool.get(), bytes);
  const double gbps = StreamReadGbps(pool.get(), buf.get(), bytes, 5);
  std::printf("stream_read_gbps=%.2f threads=%zu\n", gbps, cpus.size());
  return 0;
}

int Main(int argc, char** argv) {
  if (argc == 4 && std::strcmp(argv[1], "--serve_empty") == 0) {
    return ServeEmpty(argv[2], std::atoi(argv[3]));
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // progress shows when the output goes to a file
  BenchCredential();                         // before any child starts
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--quick") {
      o.quick = true;
    } else if (a == "--stream_only") {
      o.stream_only = true;
    } else if (a == "--workdir") {
      o.workdir = value();
    } else if (a == "--worker") {
      o.worker = value();
    } else if (a == "--isa") {
      o.isa = value();
    } else if (a == "--layers") {
      o.layers = std::atoi(value().c_str());
    } else if (a == "--experts") {
      o.experts = std::atoi(value().c_str());
    } else if (a == "--threads") {
      o.threads = std::atoi(value().c_str());
    } else if (a == "--tokens") {
      o.tokens = std::atoi(value().c_str());
    } else if (a == "--calls") {
      o.calls = std::atoi(value().c_str());
    } else if (a == "--client_spin_us") {
      o.client_spin_us = std::atoi(value().c_str());
    } else if (a == "--cpu_choices") {
      o.cpu_choices = std::atoi(value().c_str());
    } else if (a == "--engine_passes") {
      o.engine_passes = std::atoi(value().c_str());
    } else {
      std::fprintf(
          stderr,
          "usage: %s [--quick] [--stream_only] [--workdir DIR] [--layers L] [--experts E] "
          "[--threads N] "
          "[--isa auto|scalar|avx2|avx512|amx] [--tokens N] [--calls N] [--client_spin_us US] "
          "[--cpu_choices K] [--engine_passes 1|2] [--worker PATH]\n",
          argv[0]);
      return 2;
    }
  }
  if (o.layers <= 0) o.layers = o.quick ? 6 : 43;
  if (o.tokens <= 0) o.tokens = o.quick ? 6 : 30;
  if (o.calls <= 0) o.calls = o.quick ? 150 : 600;
  if (o.workdir.empty())
    o.workdir = (fs::path(SelfDir()).parent_path() / "bench-experts-data").string();
  if (o.worker.empty()) o.worker = (fs::path(SelfDir()) / "splitserve-expert-worker").string();
  if (o.experts < kTopK || o.layers < 1 || o.layers > 43 || o.cpu_choices < 1 ||
      o.cpu_choices > kTopK || (o.engine_passes != 1 && o.engine_passes != 2)) {
    std::fprintf(stderr,
                 "need --experts >= 6, --layers in 1..43, --cpu_choices in 1..6 and "
                 "--engine_passes 1 or 2\n");
    return 2;
  }
  const Isa worker_isa = Must(ss::expert::ParseIsa(o.isa), "--isa");
  if (o.stream_only) return StreamOnly(o);
  const Clock::time_point start = Clock::now();
  const std::string self = fs::read_symlink("/proc/self/exe").string();
  const std::string tag = std::to_string(::getpid());

  // The empty-call servers first: a clean child process, idle until (d).
  const std::string empty_shm = "ss-bench-empty-" + tag;
  const int empty_port = FreeLoopbackPort();
  auto empty =
      Must(ChildProcess::Start({self, "--serve_empty", empty_shm, std::to_string(empty_port)}, ""),
           "empty-call server");

  std::printf("splitserve-bench-experts%s: %s; avx2 %s, avx512 (F/BW/VL/DQ/VNNI) %s, amx %s\n",
              o.quick ? " --quick" : "", CpuModel().c_str(),
              ss::expert::IsaSupported(Isa::kAvx2) ? "yes" : "no",
              ss::expert::IsaSupported(Isa::kAvx512) ? "yes" : "no",
              ss::expert::IsaSupported(Isa::kAmx) ? "yes" : "no");

  // (a)
  std::map<Isa, double> rate;
  std::printf(
      "(a) kernel rate, T=1, one %.1f MB Flash expert (dim %ld, I %ld) cache-resident, "
      "one thread:\n",
      ExpertBytes(kDim, kInter) / 1e6, kDim, kInter);
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kAmx}) {
    const auto k = ss::expert::KernelFor(isa);
    if (!k.ok()) {
      std::printf("    %-7s not supported by this CPU\n", ss::expert::IsaName(isa));
      continue;
    }
    rate[isa] = CacheResidentRate(**k, isa == Isa::kScalar ? 3 : (o.quick ? 20 : 100));
    std::printf("    %-7s %7.2f GB/s per core\n", (*k)->name, rate[isa]);
  }

  // The node, its cores and a pool like the worker's, for the baselines.
  std::vector<int> pool_cpus;
  auto pool = NodePool(o.threads, &pool_cpus);
  const int threads = static_cast<int>(pool_cpus.size());

  // Streaming-read baseline on the same thread count: a pass before the worker starts, then one
  // pass before each decode token (the machine is shared: the baseline is measured while the
  // decode runs, and its median is used).
  const size_t stream_bytes = size_t{1} << 30;
  std::unique_ptr<uint8_t[]> stream_buf = TouchedBuffer(pool.get(), stream_bytes);
  std::vector<double> stream_passes{
      StreamReadGbps(pool.get(), stream_buf.get(), stream_bytes, o.quick ? 3 : 5)};
  std::printf(
      "streaming read: %.2f GB/s on %d thread(s) (cpus %s; 64-bit loads, prefetched 16 "
      "KB ahead)\n",
      stream_passes[0], threads, absl::StrJoin(pool_cpus, ",").c_str());
  // The cores' FMA peak at the worker's vector width (amx: AVX-512's), on the same cores: what
  // (c) is a share of.
  const bool wide = worker_isa == Isa::kAvx512 || worker_isa == Isa::kAmx;
  const double fma_peak = FmaPeakGflops(pool.get(), wide, 3);
  std::printf("FMA peak: %.1f GFLOP/s on %d thread(s) (%s FMAs, register-only)\n", fma_peak,
              threads, wide ? "512-bit" : "256-bit");

  // The checkpoint.
  int64_t generated = 0;
  Clock::time_point t0 = Clock::now();
  const absl::Status gen = EnsureFlashExpertCheckpoint(o.workdir, o.layers, o.experts, &generated);
  if (!gen.ok()) Die("writing the synthetic checkpoint", gen);
  const int64_t expert_bytes = ExpertBytes(kDim, kInter);
  const int64_t slice_bytes = expert_bytes * o.experts * o.layers;
  std::printf("checkpoint: %s, %d layers x %d experts = %.2f GB of expert slices (%s)\n",
              o.workdir.c_str(), o.layers, o.experts, slice_bytes / 1e9,
              generated > 0 ? absl::StrCat("wrote ", generated / 1000000, " MB in ",
                                           static_cast<int>(SecondsSince(t0)), " s")
                                  .c_str()
                            : "reused");

  // The worker.
  const std::string shm_name = "ss-bench-experts-" + tag;
  int grpc_port = FreeLoopbackPort(), metrics_port = grpc_port;
  while (grpc_port == empty_port) grpc_port = FreeLoopbackPort();
  while (metrics_port == grpc_port || metrics_port == empty_port) metrics_port = FreeLoopbackPort();
  const std::string log = (fs::path(o.workdir) / "worker.log").string();
  t0 = Clock::now();
  auto worker =
      Must(ChildProcess::Start(
               {o.worker, "--model", o.workdir, "--layers", absl::StrCat("0-", o.layers - 1),
                "--threads", std::to_string(threads), "--isa", o.isa, "--engine_passes",
                std::to_string(o.engine_passes), "--shm_name", shm_name, "--grpc_listen",
                absl::StrCat("127.0.0.1:", grpc_port), "--metrics_listen",
                absl::StrCat("127.0.0.1:", metrics_port)},
               log),
           "starting the worker");
  std::unique_ptr<ss::expert::shm::ShmClient> shm;
  while (shm == nullptr) {
    ss::expert::shm::ShmClientOptions co;
    co.spin = absl::Microseconds(o.client_spin_us);
    auto c = ss::expert::shm::ShmClient::Connect(shm_name, co);
    if (c.ok()) {
      shm = std::move(*c);
    } else if (!worker->Alive()) {
      std::fprintf(stderr, "the worker exited with status %d; see %s\n", worker->status(),
                   log.c_str());
      return 1;
    } else {
      absl::SleepFor(absl::Milliseconds(5));
    }
  }
  const double startup_s = SecondsSince(t0);
  const int64_t rss = VmRssBytes(worker->pid());
  const double rss_ratio = static_cast<double>(rss) / slice_bytes;
  std::printf(
      "worker: serving %.2f s after spawn; VmRSS %.3f GB = %.3f x the slice's %.3f GB, %.3f GB of "
      "it in 2 MB pages (log: %s)\n",
      startup_s, rss / 1e9, rss_ratio, slice_bytes / 1e9, AnonHugeBytes(worker->pid()) / 1e9,
      log.c_str());
  auto grpc = Must(ss::expert::grpc_transport::GrpcExpertClient::Connect(
                       absl::StrCat("127.0.0.1:", grpc_port), GrpcOptions()),
                   "gRPC connect");

  // (b) decode: T = 1, one call per layer, a new routing every call.
  std::vector<float> out(256 * kDim);
  auto call = [&](const Request& r, int layer) {
    const absl::Status st = shm->Call(r.Input(layer), out.data(), absl::Now() + absl::Seconds(60));
    if (!st.ok()) Die("shm call", st);
  };
  std::vector<Request> decode = MakeRequests(1, 64, o.experts, 1);
  // The choices a GPU serves (resident experts) reach the worker as skipped ids.
  for (Request& r : decode) {
    for (int64_t j = o.cpu_choices; j < kTopK; ++j) r.routing.ids[j] = ss::model::kSkippedExpert;
  }
  for (int l = 0; l < o.layers; ++l) call(decode[l % decode.size()], l);  // warm-up token
  std::vector<double> decode_us, token_eff;
  double decode_s = 0.0;
  const double kernel_bound = threads * rate[worker_isa];
  const double token_bytes = static_cast<double>(o.layers) * o.cpu_choices * expert_bytes;
  for (int t = 0; t < o.tokens; ++t) {
    const double read = StreamReadGbps(pool.get(), stream_buf.get(), stream_bytes, 1);
    stream_passes.push_back(read);
    t0 = Clock::now();
    for (int l = 0; l < o.layers; ++l) {
      const Clock::time_point c0 = Clock::now();
      call(decode[(t * o.layers + l) % decode.size()], l);
      decode_us.push_back(Us(c0));
    }
    const double s = SecondsSince(t0);
    decode_s += s;
    token_eff.push_back(token_bytes / s / 1e9 / std::min(read, kernel_bound));
  }
  stream_buf.reset();
  const double stream = Median(stream_passes);
  const double tokens_per_s = o.tokens / decode_s;
  const double decode_gbps = o.tokens * token_bytes / decode_s / 1e9;
  // The definition: all decode bytes over the decode time, over the median read pass. On a
  // shared host the read bandwidth swings within a run, so two diagnostics too: the median over
  // tokens of (token GB/s / the pass just before it), and best against best (the fastest token
  // over the fastest pass: both are the quiet moments).
  const double efficiency = decode_gbps / std::min(stream, kernel_bound);
  const double paired = Median(token_eff);
  double best_token = 0.0;
  for (size_t t = 0; t < token_eff.size(); ++t) {
    best_token = std::max(best_token, token_eff[t] * std::min(stream_passes[t + 1], kernel_bound));
  }
  const double best_read = *std::max_element(stream_passes.begin(), stream_passes.end());
  const double best = best_token / std::min(best_read, kernel_bound);
  std::printf(
      "(b) decode through the worker (isa %s, %d threads, %d engine pass%s): %d tokens x %d "
      "layers x %d of 6 choices, %.2f tokens/s, %.2f GB/s, median call %.0f us\n",
      ss::expert::IsaName(worker_isa), threads, o.engine_passes, o.engine_passes == 1 ? "" : "es",
      o.tokens, o.layers, o.cpu_choices, tokens_per_s, decode_gbps, Median(decode_us));
  std::printf(
      "    efficiency %.3f = %.2f GB/s / min(median read %.2f, %d x %.2f); read passes (one before "
      "each token) min %.2f, max %.2f GB/s\n",
      efficiency, decode_gbps, stream, threads, rate[worker_isa],
      *std::min_element(stream_passes.begin(), stream_passes.end()), best_read);
  std::printf(
      "    diagnostics: median over tokens of token / preceding pass %.3f (min %.3f, max %.3f); "
      "best token %.2f GB/s / best pass = %.3f\n",
      paired, *std::min_element(token_eff.begin(), token_eff.end()),
      *std::max_element(token_eff.begin(), token_eff.end()), best_token, best);

  // (c) larger batches: per T the fastest of kBatchPasses timed passes (GB/s, GFLOP/s).
  constexpr int kBatchPasses = 3;
  std::printf(
      "(c) batches through the worker, best of %d passes (share of the FMA peak %.1f GFLOP/s):\n",
      kBatchPasses, fma_peak);
  std::map<int, std::pair<double, double>> batch;
  for (int64_t T : {4, 16, 64, 256}) {
    const std::vector<Request> reqs = MakeRequests(T, 4, o.experts, 100 + T);
    call(reqs[0], 0);  // warm-up
    const int calls = std::max<int>(2, static_cast<int>((o.quick ? 96 : 1024) / T));
    std::string passes;  // each pass's GFLOP/s
    double best_s = 0.0;
    for (int pass = 0; pass < kBatchPasses; ++pass) {
      double bytes = 0, flops = 0;
      t0 = Clock::now();
      for (int i = 0; i < calls; ++i) {
        const Request& r = reqs[i % reqs.size()];
        call(r, i % o.layers);
        bytes += static_cast<double>(r.routing.distinct) * expert_bytes;
        flops += 2.0 * T * kTopK * 3 * kDim * kInter;
      }
      const double s = SecondsSince(t0), gflops = flops / s / 1e9;
      absl::StrAppend(&passes, pass == 0 ? "" : ", ", static_cast<int64_t>(gflops + 0.5));
      if (gflops >= batch[T].second) {
        batch[T] = {bytes / s / 1e9, gflops};
        best_s = s;
      }
    }
    std::printf(
        "    T=%-4ld %3d calls a pass, %8.2f ms per call, %7.2f GB/s, %7.1f GFLOP/s = %.2f of peak "
        "(passes: %s GFLOP/s)\n",
        T, calls, best_s / calls * 1e3, batch[T].first, batch[T].second,
        fma_peak > 0 ? batch[T].second / fma_peak : 0.0, passes.c_str());
  }

  // (d) overheads. Empty calls: a child whose handlers do nothing.
  auto empty_client = Must(ConnectShm(empty_shm, {}, absl::Seconds(10)), "empty shm server");
  auto empty_grpc = Must(ss::expert::grpc_transport::GrpcExpertClient::Connect(
                             absl::StrCat("127.0.0.1:", empty_port), GrpcOptions()),
                         "empty gRPC server");
  const Request one = MakeRequests(1, 1, o.experts, 999)[0];
  std::vector<double> shm_empty, grpc_empty, shm_t1, grpc_t1, engine_t1;
  const int block = 10, rounds = std::max(1, o.calls / block);
  for (int r = 0; r < rounds + 1; ++r) {  // round 0 warms up
    for (int i = 0; i < block; ++i) {
      Clock::time_point c0 = Clock::now();
      absl::Status st =
          empty_client->Call(one.Input(0), out.data(), absl::Now() + absl::Seconds(5));
      if (r > 0) shm_empty.push_back(Us(c0));
      if (!st.ok()) Die("empty shm call", st);
      c0 = Clock::now();
      st = empty_grpc->Call(one.Input(0), out.data(), absl::Now() + absl::Seconds(5));
      if (r > 0) grpc_empty.push_back(Us(c0));
      if (!st.ok()) Die("empty gRPC call", st);
    }
  }
  // A T = 1 top-6 call through the worker, over shm and gRPC: its round trip minus the engine
  // time the worker itself recorded for that call (the delta of its expert_call_seconds sum on
  // /metrics, read before and after each call): the overhead beyond kernel time, call by call.
  // For reference, the same call on an in-process engine (layer 0 of the same checkpoint, same
  // ISA and threads). Every call sits between two metrics reads, so every case sees the same
  // gap between calls (the pools are asleep: the wake-up is part of the engine time).
  const std::string series = "splitserve:expert_call_seconds_sum{layer=\"0\"}";
  auto engine_s = [&]() {
    const double v = MetricValue(Must(HttpGet(metrics_port, "/metrics"), "GET /metrics"), series);
    if (std::isnan(v)) Die("GET /metrics", absl::NotFoundError(series + " not found"));
    return v;
  };
  std::vector<double> shm_beyond, grpc_beyond;
  {
    ss::expert::ExpertStoreOptions so;
    so.source.model_dir = o.workdir;
    so.layers = {0};
    auto store = Must(ss::expert::ExpertStore::Load(so, pool.get()), "in-process store");
    ss::expert::ExpertEngineOptions eo;
    eo.isa = worker_isa;
    eo.passes = o.engine_passes;
    auto engine = Must(ss::expert::ExpertEngine::Create(*store, *pool, eo), "in-process engine");
    pool->PinCallingThread();  // this thread is the pool's worker 0 in Compute
    std::printf(
        "    (the in-process reference holds %.3f GB, %.3f GB of this process in 2 MB pages)\n",
        store->slice_bytes() / 1e9, AnonHugeBytes(::getpid()) / 1e9);
    for (int r = 0; r < rounds + 1; ++r) {
      for (int i = 0; i < block; ++i) {
        engine_s();
        Clock::time_point c0 = Clock::now();
        absl::Status st = engine->Compute(0, 1, one.x.data(), one.routing.ids.data(),
                                          one.routing.weights.data(), kTopK, out.data());
        if (r > 0) engine_t1.push_back(Us(c0));
        if (!st.ok()) Die("in-process engine", st);
        engine_s();
      }
      for (int i = 0; i < block; ++i) {
        const double before = engine_s();
        Clock::time_point c0 = Clock::now();
        call(one, 0);
        const double us = Us(c0);
        const double server_us = (engine_s() - before) * 1e6;
        if (r > 0) shm_t1.push_back(us), shm_beyond.push_back(us - server_us);
      }
      for (int i = 0; i < block; ++i) {
        const double before = engine_s();
        Clock::time_point c0 = Clock::now();
        const absl::Status st =
            grpc->Call(one.Input(0), out.data(), absl::Now() + absl::Seconds(60));
        const double us = Us(c0);
        const double server_us = (engine_s() - before) * 1e6;
        if (r > 0) grpc_t1.push_back(us), grpc_beyond.push_back(us - server_us);
        if (!st.ok()) Die("gRPC call", st);
      }
    }
  }
  // Warm: blocks of back-to-back calls (the serving thread still spins when the next request
  // comes), the worker's engine time read around each block; per block the mean overhead.
  std::vector<double> shm_warm, grpc_warm;
  for (int r = 0; r < rounds + 1; ++r) {
    for (int transport = 0; transport < 2; ++transport) {
      const double before = engine_s();
      double us = 0.0;
      for (int i = 0; i < block; ++i) {
        const Clock::time_point c0 = Clock::now();
        if (transport == 0) {
          call(one, 0);
        } else {
          const absl::Status st =
              grpc->Call(one.Input(0), out.data(), absl::Now() + absl::Seconds(60));
          if (!st.ok()) Die("gRPC call", st);
        }
        us += Us(c0);
      }
      const double beyond = (us - (engine_s() - before) * 1e6) / block;
      if (r > 0) (transport == 0 ? shm_warm : grpc_warm).push_back(beyond);
    }
  }
  const double shm_overhead = Median(shm_beyond), grpc_overhead = Median(grpc_beyond);
  std::printf("(d) call overhead, median of %zu calls per case, us:\n", shm_empty.size());
  std::printf(
      "    empty call (T=1, no-op handler in a child; back to back): shm %.1f (p99 %.1f), "
      "gRPC %.1f (p99 %.1f)\n",
      Median(shm_empty), Percentile(shm_empty, 0.99), Median(grpc_empty),
      Percentile(grpc_empty, 0.99));
  std::printf(
      "    T=1 top-6 call through the worker, beyond the worker's engine time, each call after "
      "an idle gap (cold): shm %.1f (p90 %.1f), gRPC %.1f (p90 %.1f)\n",
      shm_overhead, Percentile(shm_beyond, 0.9), grpc_overhead, Percentile(grpc_beyond, 0.9));
  std::printf(
      "    the same back to back (warm; median over blocks of %d calls of the mean per call): "
      "shm %.1f, gRPC %.1f\n",
      block, Median(shm_warm), Median(grpc_warm));
  std::printf(
      "    round trips: shm %.1f, gRPC %.1f; the same call on an in-process engine %.1f "
      "(differences %+.1f, %+.1f)\n",
      Median(shm_t1), Median(grpc_t1), Median(engine_t1), Median(shm_t1) - Median(engine_t1),
      Median(grpc_t1) - Median(engine_t1));

  empty->Stop();
  const int worker_exit = worker->Stop();
  std::printf("worker exit status %d; total %.0f s\n", worker_exit, SecondsSince(start));
  auto rate_or = [&](Isa isa) { return rate.count(isa) ? rate[isa] : 0.0; };
  std::printf(
      "efficiency=%.3f efficiency_paired=%.3f efficiency_best=%.3f tokens_per_s=%.2f "
      "decode_gbps=%.2f "
      "stream_gbps=%.2f threads=%d isa=%s "
      "scalar_gbps_per_core=%.2f avx2_gbps_per_core=%.2f avx512_gbps_per_core=%.2f "
      "t4_gbps=%.2f t16_gbps=%.2f t64_gbps=%.2f t256_gbps=%.2f t4_gflops=%.1f t16_gflops=%.1f "
      "t64_gflops=%.1f t256_gflops=%.1f shm_empty_us=%.1f grpc_empty_us=%.1f "
      "shm_overhead_us=%.1f grpc_overhead_us=%.1f shm_overhead_warm_us=%.1f "
      "grpc_overhead_warm_us=%.1f rss_ratio=%.3f startup_s=%.2f fma_peak_gflops=%.1f "
      "t256_peak_ratio=%.3f stream_ratio=%.3f cpu_choices=%d engine_passes=%d\n",
      efficiency, paired, best, tokens_per_s, decode_gbps, stream, threads,
      ss::expert::IsaName(worker_isa), rate_or(Isa::kScalar), rate_or(Isa::kAvx2),
      rate_or(Isa::kAvx512), batch[4].first, batch[16].first, batch[64].first, batch[256].first,
      batch[4].second, batch[16].second, batch[64].second, batch[256].second, Median(shm_empty),
      Median(grpc_empty), shm_overhead, grpc_overhead, Median(shm_warm), Median(grpc_warm),
      rss_ratio, startup_s, fma_peak, fma_peak > 0 ? batch[256].second / fma_peak : 0.0,
      stream > 0 ? decode_gbps / stream : 0.0, o.cpu_choices, o.engine_passes);
  return worker_exit == 0 ? 0 : 1;
}

}  // namespace
}  // namespace ss::bench

int main(int argc, char** argv) { return ss::bench::Main(argc, argv); }
