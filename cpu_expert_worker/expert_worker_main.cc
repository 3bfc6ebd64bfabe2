// splitserve-expert-worker: one NUMA node's slice of the routed experts, served to GPU workers
// (ARCHITECTURE.md "Processes"). Flags: worker_flags.h (their table), worker_config.h.
//
// Start-up: parse and validate every flag; discover the topology (before any thread is pinned);
// pick the node, its physical cores and the kernel ISA, and log them; build the pinned pool;
// load the store onto the node; preallocate the engine. Then --selftest N runs N random requests
// through the engine (0 = load only); --shm_name NAME serves expert calls over a shared-memory
// segment and --grpc_listen ADDR over gRPC (both may be given: both are served, with one engine
// whose calls each transport serialises) until SIGTERM or SIGINT (which unlink the segment).
// With --shm_name the store itself lives in the segment "<NAME>-store" (--store_memory auto or
// shared; common/expert_store_format.h), filled before the call segment is created and unlinked
// with the store on the way out.
// --metrics_listen HOST:PORT serves Prometheus metrics on GET /metrics (ARCHITECTURE.md):
// splitserve:expert_worker_info{isa,slice,numa_node}, calls and errors per transport, per-layer
// call latency, expert weight bytes streamed and the achieved GB/s over the last calls, and the
// store's bytes, the bytes huge pages back and the kernel setting deciding that (AddStoreGauges).
//
// Exit status: 0 success, 1 a runtime failure (load, engine), 2 a usage error.

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/bf16.h"
#include "common/load_progress.h"
#include "common/main_flags.h"
#include "common/metrics/metrics.h"
#include "common/model_config.h"
#include "common/shm_segment.h"
#include "common/stop_signals.h"
#include "common/thread_pool.h"
#include "cpu_expert_worker/expert_engine.h"
#include "cpu_expert_worker/expert_store.h"
#include "cpu_expert_worker/kernels/dispatch.h"
#include "cpu_expert_worker/numa.h"
#include "cpu_expert_worker/transport/grpc_server.h"
#include "cpu_expert_worker/transport/shm_server.h"
#include "cpu_expert_worker/worker_config.h"
#include "cpu_expert_worker/worker_flags.h"
#include "proto/cluster_credential.h"
#include "spdlog/spdlog.h"

namespace ss::expert {
namespace {

constexpr char kName[] = "splitserve-expert-worker";

int Usage(const std::string& message) {
  std::fprintf(stderr, "%s: %s\n", kName, message.c_str());
  return 2;
}

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "%s: %s\n", kName, std::string(status.message()).c_str());
  return 1;
}

// The baseline the self-test's rate is compared to: GB/s of a parallel sequential read (a sum of
// 64-bit words) of every held expert slice, on the same pool (best of 3 passes).
double StreamReadGbps(const ExpertStore& store, ThreadPool& pool) {
  const int64_t dim = store.dim(), is = store.inter_slice(), E = store.num_experts();
  const int64_t sizes[6] = {is * dim / 2,  is * dim / 32, is * dim / 2,
                            is * dim / 32, dim * is / 2,  dim * is / 32};
  const auto& layers = store.layers();
  std::vector<uint64_t> sums(pool.size() * 8, 0);  // one cache line per worker
  double best = 0.0;
  for (int pass = 0; pass < 3; ++pass) {
    const auto t0 = std::chrono::steady_clock::now();
    const absl::Status st =
        pool.ParallelFor(static_cast<int64_t>(layers.size()) * E, [&](int64_t u, int worker) {
          const ExpertSliceView& v = store.layer_views(layers[u / E])[u % E];
          const uint8_t* ptrs[6] = {v.w1, v.w1_scale, v.w3, v.w3_scale, v.w2, v.w2_scale};
          uint64_t acc = 0;
          for (int p = 0; p < 6; ++p) {
            for (int64_t i = 0; i + 8 <= sizes[p]; i += 8) {
              uint64_t w;
              std::memcpy(&w, ptrs[p] + i, 8);
              acc += w;
            }
          }
          sums[worker * 8] += acc;
        });
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (st.ok() && s > 0) best = std::max(best, store.slice_bytes() / s / 1e9);
  }
  if (std::accumulate(sums.begin(), sums.end(), uint64_t{0}) == 1) std::printf(" ");
  return best;
}

// N requests of T tokens with distinct random top-k ids per token, over the held layers.
int SelfTest(const WorkerConfig& c, const ExpertStore& store, ThreadPool& pool,
             ExpertEngine& engine) {
  const ModelConfig& m = store.config();
  const int64_t T = c.selftest_tokens, dim = m.dim, E = m.n_routed_experts;
  const int k = static_cast<int>(m.n_activated_experts);
  constexpr int kInputs = 8;  // a small ring of inputs, reused
  std::mt19937 rng(1234);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uniform(0.1f, 1.0f);
  std::vector<std::vector<uint16_t>> xs(kInputs, std::vector<uint16_t>(T * dim));
  std::vector<std::vector<int32_t>> ids(kInputs, std::vector<int32_t>(T * k));
  std::vector<std::vector<float>> ws(kInputs, std::vector<float>(T * k));
  std::vector<int64_t> distinct(kInputs);
  std::vector<int32_t> perm(E);
  for (int r = 0; r < kInputs; ++r) {
    for (auto& v : xs[r]) v = FloatToBf16(normal(rng));
    std::vector<bool> used(E, false);
    for (int64_t t = 0; t < T; ++t) {
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      float sum = 0.0f;
      for (int j = 0; j < k; ++j) {
        ids[r][t * k + j] = perm[j];
        used[perm[j]] = true;
        sum += ws[r][t * k + j] = uniform(rng);
      }
      for (int j = 0; j < k; ++j) ws[r][t * k + j] *= static_cast<float>(m.route_scale) / sum;
    }
    distinct[r] = std::count(used.begin(), used.end(), true);
  }
  std::vector<float> out(T * dim);
  std::vector<double> us;
  double bytes = 0.0;
  const auto& layers = store.layers();
  for (int64_t i = 0; i < c.selftest; ++i) {
    const int r = static_cast<int>(i % kInputs);
    const int layer = layers[i % layers.size()];
    const auto t0 = std::chrono::steady_clock::now();
    const absl::Status st =
        engine.Compute(layer, T, xs[r].data(), ids[r].data(), ws[r].data(), k, out.data());
    us.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    if (!st.ok()) return Fail(st);
    bytes += static_cast<double>(distinct[r]) * store.expert_slice_bytes();
  }
  const double total_s = std::accumulate(us.begin(), us.end(), 0.0) / 1e6;
  std::sort(us.begin(), us.end());
  const double median_us = us.empty() ? 0.0 : us[us.size() / 2];
  const double tokens_per_s = total_s > 0 ? c.selftest * T / total_s : 0.0;
  const double gbps = total_s > 0 ? bytes / total_s / 1e9 : 0.0;
  const double stream = StreamReadGbps(store, pool);
  const double efficiency = stream > 0 ? gbps / stream : 0.0;
  std::printf(
      "selftest: %ld requests of T=%ld (top-%d, %ld layer(s), slice %d/%d, isa %s, %d threads): "
      "%.1f tokens/s, %.2f GB/s of expert bytes = %.2f x a %.2f GB/s streaming read of the "
      "store on the same threads; median %.1f us per call\n",
      static_cast<long>(c.selftest), static_cast<long>(T), k, static_cast<long>(layers.size()),
      store.slice_index(), store.slice_count(), engine.isa_name(), pool.size(), tokens_per_s, gbps,
      efficiency, stream, median_us);
  std::printf(
      "requests=%ld tokens=%ld threads=%d tokens_per_s=%.1f gbps=%.3f stream_gbps=%.3f "
      "efficiency=%.3f median_us=%.1f load_s=%.3f slice_gb=%.4f resident_gb=%.4f\n",
      static_cast<long>(c.selftest), static_cast<long>(T), pool.size(), tokens_per_s, gbps, stream,
      efficiency, median_us, store.load_seconds(), store.slice_bytes() / 1e9,
      ResidentBytes() / 1e9);
  return 0;
}

// The servers being run, for the stop-signal thread.
std::atomic<shm::ShmServer*> g_server{nullptr};
std::atomic<grpc_transport::GrpcExpertServer*> g_grpc_server{nullptr};

// Set by a stop signal that arrives before a server exists, so that server stops at once.
std::atomic<bool> g_stop_requested{false};

// Set once Serve starts; a stop signal before that (loading, the self-test) ends the process.
std::atomic<bool> g_serving{false};

// The store's segment while it loads (Main sets it before Load): a stop signal then unlinks it
// if this process owns it, since the store's destructor will not run.
std::atomic<const std::string*> g_loading_store{nullptr};

void RemoveLoadingStore() {
  const std::string* store = g_loading_store.load();
  if (store == nullptr || store->empty()) return;
  const std::string name = "/" + *store;
  const int fd = ::shm_open(name.c_str(), O_RDONLY | O_CLOEXEC, 0);
  if (fd < 0) return;
  ShmOwnerPrefix owner{};
  const bool ours = ::pread(fd, &owner, sizeof(owner), 0) == static_cast<ssize_t>(sizeof(owner)) &&
                    owner.owner_pid == static_cast<int32_t>(::getpid());
  ::close(fd);
  if (ours) ::shm_unlink(name.c_str());
}

void OnStopSignal(int sig) {
  if (!g_serving.load()) {
    RemoveLoadingStore();
    DieOfSignal(sig);
  }
  g_stop_requested.store(true);
  if (shm::ShmServer* s = g_server.load()) s->RequestStop();
  if (grpc_transport::GrpcExpertServer* g = g_grpc_server.load()) g->RequestStop();
}

// The store's memory: its bytes, the bytes huge pages back (re-read from /proc/self/smaps at a
// scrape at most every kHugePageRefresh, since khugepaged may collapse pages later; -1 when
// unreadable) and the kernel setting deciding it, each labelled memory="anonymous|shared". The
// scrape hook reads `store`, which must outlive `m`.
constexpr std::chrono::seconds kHugePageRefresh{10};
void AddStoreGauges(metrics::Metrics& m, const ExpertStore& store) {
  const bool shared = !store.shm_name().empty();
  const metrics::Labels memory = {{"memory", shared ? "shared" : "anonymous"}};
  m.Gauge("expert_store_bytes", "bytes of memory holding the expert store", memory)
      .Set(static_cast<double>(store.allocated_bytes()));
  const HugePagePolicy policy = shared ? SharedHugePagePolicy() : AnonymousHugePagePolicy();
  m.Gauge("expert_store_huge_page_policy_info",
          "the kernel setting that decides whether transparent huge pages may back the expert "
          "store (at start)",
          {{"memory", memory.at("memory")},
           {"setting", policy.setting},
           {"allows", policy.allows ? "yes" : "no"}})
      .Set(1);
  prometheus::Gauge& huge = m.Gauge(
      "expert_store_huge_page_bytes",
      "bytes of the expert store backed by transparent huge pages (-1: unknown), re-read at "
      "most every " +
          std::to_string(kHugePageRefresh.count()) + " s",
      memory);
  huge.Set(static_cast<double>(store.huge_page_bytes()));
  m.OnScrape([&store, &huge, last = std::chrono::steady_clock::now()]() mutable {
    const auto now = std::chrono::steady_clock::now();
    if (now - last < kHugePageRefresh) return;
    last = now;
    huge.Set(static_cast<double>(store.huge_page_bytes()));
  });
}

// The worker's Prometheus series; every engine call of every transport goes through Observe().
class WorkerMetrics {
 public:
  WorkerMetrics(metrics::Metrics& m, const ExpertStore& store, const ExpertEngine& engine,
                int numa_node)
      : expert_slice_bytes_(store.expert_slice_bytes()),
        weight_bytes_(m.Counter("expert_weight_bytes_total",
                                "bytes of expert weight slices streamed by successful calls")),
        gbps_(m.Gauge("expert_achieved_gbps", "GB/s of expert weight bytes over the last " +
                                                  std::to_string(kWindow) +
                                                  " successful calls (bytes / compute time)")),
        used_(store.num_experts(), 0) {
    m.Gauge("expert_worker_info", "the expert worker's kernel ISA, slice and NUMA node",
            {{"isa", engine.isa_name()},
             {"slice", absl::StrCat(store.slice_index(), "/", store.slice_count())},
             {"numa_node", std::to_string(numa_node)}})
        .Set(1);
    for (const char* t : {"shm", "grpc"}) {
      calls_[t] = &m.Counter("expert_calls_total", "expert calls handled", {{"transport", t}});
      errors_[t] =
          &m.Counter("expert_call_errors_total", "expert calls that failed", {{"transport", t}});
    }
    for (const int layer : store.layers()) {
      latency_[layer] = &m.Histogram("expert_call_seconds", "engine time per expert call",
                                     {{"layer", std::to_string(layer)}});
    }
    AddStoreGauges(m, store);
  }

  // One engine call on `transport` (a key of calls_) that took `seconds`. Called with the engine
  // mutex held, so the scratch and the window need no lock of their own.
  void Observe(const std::string& transport, const shm::ExpertRequestView& r, double seconds,
               bool ok) {
    calls_.at(transport)->Increment();
    if (auto it = latency_.find(r.layer); it != latency_.end()) it->second->Observe(seconds);
    if (!ok) {
      errors_.at(transport)->Increment();
      return;
    }
    // Each distinct expert of the call streams its slice once.
    int64_t distinct = 0;
    const int64_t n = static_cast<int64_t>(r.tokens) * r.top_k;
    for (int64_t i = 0; i < n; ++i) {
      const int32_t e = r.ids[i];
      if (e >= 0 && e < static_cast<int32_t>(used_.size()) && !used_[e]) {
        used_[e] = 1;
        ++distinct;
      }
    }
    for (int64_t i = 0; i < n; ++i) {
      const int32_t e = r.ids[i];
      if (e >= 0 && e < static_cast<int32_t>(used_.size())) used_[e] = 0;
    }
    const double bytes = static_cast<double>(distinct * expert_slice_bytes_);
    weight_bytes_.Increment(bytes);
    Sample& old = window_[next_ % kWindow];
    window_bytes_ += bytes - old.bytes;
    window_seconds_ += seconds - old.seconds;
    old = {bytes, seconds};
    ++next_;
    if (next_ % kWindow == 0) {  // re-sum now and then: no drift from the running sums
      window_bytes_ = window_seconds_ = 0.0;
      for (const Sample& s : window_) window_bytes_ += s.bytes, window_seconds_ += s.seconds;
    }
    gbps_.Set(window_seconds_ > 0 ? window_bytes_ / window_seconds_ / 1e9 : 0.0);
  }

 private:
  static constexpr int kWindow = 64;
  struct Sample {
    double bytes = 0.0, seconds = 0.0;
  };
  const int64_t expert_slice_bytes_;
  prometheus::Counter& weight_bytes_;
  prometheus::Gauge& gbps_;
  std::map<std::string, prometheus::Counter*> calls_, errors_;
  std::map<int, prometheus::Histogram*> latency_;
  std::vector<uint8_t> used_;
  Sample window_[kWindow];
  double window_bytes_ = 0.0, window_seconds_ = 0.0;
  uint64_t next_ = 0;
};

// Serves expert calls on the shared-memory segment and/or gRPC until SIGTERM / SIGINT; the
// segment is unlinked on the way out. The engine is not thread-safe across transports, so with
// both, one mutex serialises every engine call. With `metrics`, each call is timed and counted.
int Serve(const WorkerConfig& c, const ClusterCredential& credential, const ExpertStore& store,
          ExpertEngine& engine, WorkerMetrics* metrics, const ThreadPool& pool) {
  absl::Mutex engine_mu;
  const auto handler_for = [&engine, &engine_mu, metrics, &pool](std::string transport) {
    return shm::ExpertHandler([&engine, &engine_mu, metrics, &pool, transport](
                                  const shm::ExpertRequestView& r, float* out) {
      // The thread that calls Compute is the pool's worker 0: pin it to the pool's first core
      // (once per serving thread), or it may share a core with a pinned worker.
      thread_local const bool pinned = pool.PinCallingThread();
      (void)pinned;
      absl::MutexLock lock(&engine_mu);
      const auto t0 = std::chrono::steady_clock::now();
      absl::Status st = engine.Compute(r.layer, r.tokens, r.x_bf16, r.ids, r.weights, r.top_k, out,
                                       r.almost_done);
      if (metrics != nullptr) {
        metrics->Observe(
            transport, r,
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), st.ok());
      }
      return st;
    });
  };
  // From here a stop signal during start-up is remembered and honoured.
  g_serving.store(true);
  std::unique_ptr<grpc_transport::GrpcExpertServer> grpc_server;
  if (!c.grpc_listen.empty()) {
    grpc_transport::GrpcServerOptions go;
    go.listen_address = c.grpc_listen;
    go.credential = credential;
    go.max_tokens = static_cast<uint32_t>(engine.max_tokens());
    go.dim = static_cast<uint32_t>(store.dim());
    go.top_k = static_cast<uint32_t>(engine.max_top_k());
    go.layers = store.layers();
    go.slice_index = store.slice_index();
    go.slice_count = store.slice_count();
    auto g = grpc_transport::GrpcExpertServer::Start(go, handler_for("grpc"));
    if (!g.ok()) return Fail(g.status());
    grpc_server = std::move(*g);
    g_grpc_server.store(grpc_server.get());
    if (g_stop_requested.load()) grpc_server->RequestStop();
    spdlog::info(absl::StrCat("serving expert calls on gRPC '", c.grpc_listen, "' (port ",
                              grpc_server->port(), ", protocol version ",
                              grpc_transport::kGrpcProtocolVersion, ")"));
    std::fflush(stdout);
  }
  if (c.shm_name.empty()) {
    grpc_server->Wait();
    g_grpc_server.store(nullptr);
    const auto gs = grpc_server->stats();
    spdlog::info(absl::StrCat("gRPC stopped: ", gs.calls, " calls, ", gs.handler_errors,
                              " handler errors, ", gs.rejected, " rejected"));
    return 0;
  }
  shm::ShmServerOptions so;
  so.name = c.shm_name;
  so.max_tokens = static_cast<uint32_t>(engine.max_tokens());
  so.dim = static_cast<uint32_t>(store.dim());
  so.top_k = static_cast<uint32_t>(engine.max_top_k());
  // The engine serialises calls and parallelises each one over the pool: one serving thread,
  // which polls for the next call as long as an idle pool thread does.
  so.serving_threads = 1;
  so.spin = absl::Microseconds(c.spin_us);
  auto server = shm::ShmServer::Create(so, handler_for("shm"));
  if (!server.ok()) {
    if (grpc_server != nullptr) {
      g_grpc_server.store(nullptr);
      grpc_server->Stop();
    }
    return Fail(server.status());
  }
  g_server.store(server->get());
  if (g_stop_requested.load()) (*server)->RequestStop();
  spdlog::info(absl::StrCat("serving expert calls on shared memory '", c.shm_name, "' (max_tokens ",
                            so.max_tokens, ", dim ", so.dim, ", top_k ", so.top_k, ")"));
  std::fflush(stdout);
  (*server)->Wait();
  g_server.store(nullptr);
  if (grpc_server != nullptr) {  // the same signal asked it to stop
    grpc_server->Wait();
    g_grpc_server.store(nullptr);
  }
  const auto stats = (*server)->stats();
  spdlog::info(absl::StrCat("stopped: ", stats.calls, " calls, ", stats.handler_errors,
                            " handler errors, ", stats.rejected, " rejected"));
  return 0;
}

int Main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "splitserve-expert-worker --model DIR [--layers 0-42,43] [--slice i/n] "
      "[--numa-node k|auto] [--threads N] [--isa auto|scalar|avx2|avx512|amx] [--selftest N] "
      "[--shm-name NAME] [--store-memory auto|anonymous|shared] [--grpc-listen HOST:PORT] "
      "[--metrics-listen HOST:PORT]");
  InitFlagsUsage(kName);
  // Stop signals are taken by one thread (OnStopSignal); every other thread, the pool's and
  // gRPC's included, is started after this mask and inherits it.
  BlockStopSignals(Sigpipe::kDefault);
  const StopSignalThread signal_thread(OnStopSignal);
  NormalizeFlagDashes(argc, argv);
  const std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (rest.size() > 1) return Usage(absl::StrCat("unexpected argument '", rest[1], "'"));
  if (absl::Status s = ApplyLogFlags(kName); !s.ok()) return Usage(std::string(s.message()));
  const WorkerFlags f = ReadWorkerFlags();
  auto parsed = ParseWorkerConfig(f);
  if (!parsed.ok()) return Usage(std::string(parsed.status().message()));
  const WorkerConfig& c = *parsed;
  if (c.selftest < 0 && c.shm_name.empty() && c.grpc_listen.empty()) {
    return Usage(
        "nothing to do: pass --shm_name NAME and/or --grpc_listen HOST:PORT to serve, or "
        "--selftest N (0 = load only)");
  }
  ClusterCredential credential;  // used only with --grpc_listen
  if (!c.grpc_listen.empty()) {
    absl::StatusOr<ClusterCredential> loaded =
        ClusterCredential::Load(c.cluster_token_file, c.insecure_cluster);
    if (!loaded.ok()) return Usage(std::string(loaded.status().message()));
    credential = *loaded;
    if (credential.insecure()) {
      spdlog::warn("--insecure_cluster: the gRPC expert service accepts unauthenticated calls");
    }
  }

  const Isa isa = *ParseIsa(c.isa);
  auto kernel = KernelFor(isa);
  if (!kernel.ok()) return Usage(absl::StrCat("--isa ", c.isa, ": ", kernel.status().message()));
  spdlog::info(absl::StrCat("expert kernels: ", (*kernel)->name, " (--isa ", c.isa, "; CPU: avx2 ",
                            IsaSupported(Isa::kAvx2) ? "yes" : "no", ", avx512 ",
                            IsaSupported(Isa::kAvx512) ? "yes" : "no", ", amx ",
                            IsaSupported(Isa::kAmx) ? "yes" : "no", ")"));

  auto topo = NumaTopology::Discover();
  if (!topo.ok()) return Fail(topo.status());
  spdlog::info("topology: " + (*topo)->Describe());
  absl::StatusOr<WorkerPlacement> placed = PlaceWorker(**topo, c.numa_node, c.threads);
  if (!placed.ok()) return Usage(std::string(placed.status().message()));
  const int node = placed->node;
  const int threads = static_cast<int>(placed->cpus.size());
  ThreadPoolOptions po;
  po.num_threads = threads;
  po.cpus = placed->cpus;
  po.spin_us = c.spin_us;
  auto pool = ThreadPool::Create(po);
  if (!pool.ok()) return Fail(pool.status());
  const bool caller_pinned = (*pool)->PinCallingThread();
  spdlog::info(
      absl::StrCat("NUMA node ", node, c.numa_node < 0 ? " (auto)" : "", ": ", threads,
                   " threads on cpus ", absl::StrJoin(po.cpus, ","),
                   caller_pinned && (*pool)->workers_pinned() ? " (pinned)" : " (NOT all pinned)"));

  std::vector<int> layers = c.layers;
  if (c.all_layers) {
    auto mc = LoadModelConfig(c.source);
    if (!mc.ok()) return Fail(mc.status());
    layers.resize(mc->n_layers + mc->n_mtp_layers);
    std::iota(layers.begin(), layers.end(), 0);
  }
  ExpertStoreOptions so;
  so.source = c.source;
  so.layers = layers;
  so.slice_index = c.slice_index;
  so.slice_count = c.slice_count;
  so.topology = topo->get();
  so.numa_node = node;
  // Complete before the transport's segment exists: a GPU worker opens the store after connecting.
  so.shm_name = c.store_segment;
  // The weights in the order this ISA's kernel reads them (one sequential stream a call).
  if (auto k = KernelFor(isa); k.ok() && c.tiled_weights) so.tile_rows = (*k)->tile_rows;
  SetLoadProgressFile(c.load_progress_file);
  static const std::string loading_store = so.shm_name;  // outlives the signal thread
  g_loading_store.store(&loading_store);
  auto store = ExpertStore::Load(so, pool->get());
  if (!store.ok() && absl::IsResourceExhausted(store.status()) && c.store_segment_optional) {
    spdlog::warn(absl::StrCat("the expert store stays in this process's memory (",
                              store.status().message(),
                              "); a GPU worker cannot stream this worker's experts"));
    so.shm_name.clear();
    store = ExpertStore::Load(so, pool->get());
  }
  if (!store.ok()) return Fail(store.status());

  ExpertEngineOptions eo;
  eo.isa = isa;
  eo.max_tokens = c.max_tokens;
  eo.split_target = c.split_target;
  eo.min_split_cols = c.min_split_cols;
  eo.passes = c.engine_passes;
  eo.topology = topo->get();
  eo.numa_node = node;
  auto engine = ExpertEngine::Create(**store, **pool, eo);
  if (!engine.ok()) return Fail(engine.status());
  spdlog::info(absl::StrCat("engine ready: isa ", (*engine)->isa_name(), ", max_tokens ",
                            (*engine)->max_tokens(), ", top_k <= ", (*engine)->max_top_k(),
                            ", passes ", c.engine_passes));
  if (c.selftest >= 0) {
    const int rc = SelfTest(c, **store, **pool, **engine);
    if (rc != 0 || (c.shm_name.empty() && c.grpc_listen.empty())) return rc;
  }
  std::unique_ptr<metrics::Metrics> registry;
  std::unique_ptr<WorkerMetrics> worker_metrics;
  const std::string& metrics_listen = c.metrics_listen;
  if (!metrics_listen.empty()) {
    registry = std::make_unique<metrics::Metrics>();
    worker_metrics = std::make_unique<WorkerMetrics>(*registry, **store, **engine, node);
    const absl::Status st = registry->Listen(metrics_listen);
    if (absl::IsInvalidArgument(st)) return Usage(absl::StrCat("--metrics_listen: ", st.message()));
    if (!st.ok()) return Fail(st);
    spdlog::info(absl::StrCat("serving metrics on http://", metrics_listen, "/metrics (port ",
                              registry->port(), ")"));
  }
  return Serve(c, credential, **store, **engine, worker_metrics.get(), **pool);
}

}  // namespace
}  // namespace ss::expert

int main(int argc, char** argv) { return ss::expert::Main(argc, argv); }
