// Pieces shared by the routed-expert benchmarks (splitserve-bench-experts, expert_kernels_bench,
// shm_transport_bench): synthetic MXFP4 experts in memory and on disk, the kernel rate, the
// streaming-read baseline, request generation, empty-call servers and child processes.
//
// Synthetic weights are random nibbles with ue8m0 scales 2^-7..2^-4 in the checkpoint's own
// layout (I8 [rows, cols/2] + F8_E8M0 [rows, cols/32]); the values do not change the work.
// Everything here is single-threaded unless it takes a pool.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/thread_pool.h"
#include "cpu_expert_worker/kernels/expert_kernels.h"
#include "cpu_expert_worker/transport/shm_client.h"
#include "cpu_expert_worker/transport/shm_server.h"

namespace ss::bench {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t);
double Median(std::vector<double> v);
double Percentile(std::vector<double> v, double p);  // p in [0, 1]

// Fills `n` bytes from a splitmix64 stream seeded with `seed`: random nibble pairs, or (scales)
// ue8m0 bytes 120..123.
void FillSynthetic(uint64_t seed, uint8_t* p, size_t n, bool scales);

// Bytes of one expert slice of width `inter` (w1, w3, w2 nibbles and scales).
int64_t ExpertBytes(int64_t dim, int64_t inter);

// One synthetic expert slice in memory (compact, like the expert store holds it).
struct SyntheticExpert {
  std::vector<uint8_t> w1, w1s, w3, w3s, w2, w2s;
  int64_t inter = 0;
  ss::expert::ExpertSliceView View() const;
  size_t Bytes() const;
};
std::vector<SyntheticExpert> MakeExperts(int64_t count, int64_t dim, int64_t inter, uint64_t seed);

// A sequential read (a sum of 64-bit words, software-prefetched 16 KB ahead) of `bytes` from
// `data`, split into equal parts over the pool's threads (or the calling thread alone): the best
// GB/s of `passes` passes.
double StreamReadGbps(ss::ThreadPool* pool, const uint8_t* data, size_t bytes, int passes);

// Random bf16 rows N(0, 1).
std::vector<uint16_t> RandomBf16(int64_t n, uint64_t seed);

// T tokens' top-k: distinct random ids in [0, E) per token, weights summing to 1.5.
struct Routing {
  std::vector<int32_t> ids;
  std::vector<float> weights;
  int64_t distinct = 0;  // distinct experts over all tokens
};
Routing RandomRouting(int64_t T, int64_t top_k, int64_t E, uint64_t seed);

// One kernel call per repeat, T tokens routed by `ids_for(repeat)`; returns the seconds of
// every call. Errors: the kernel's.
struct KernelRun {
  std::vector<double> seconds;
  int64_t bytes_per_call = 0;  // weight bytes of the distinct experts a call touches
};
absl::StatusOr<KernelRun> TimeKernel(const ss::expert::ExpertKernel& kernel,
                                     const std::vector<SyntheticExpert>& experts, int64_t dim,
                                     int64_t tokens, int64_t top_k, int repeats,
                                     const std::vector<std::vector<int32_t>>& id_sets);

// Writes (once) a synthetic checkpoint of DeepSeek-V4-Flash's routed experts (dim 4096, I 2048,
// MXFP4) with `experts` routed experts per layer into `dir`: config.json (the Flash config with
// n_routed_experts = experts) and one shard `model-layer-LL.safetensors` per layer, written under
// a temporary name and renamed. Layers [0, layers) that already exist are kept (a config of
// another expert count first removes every shard). `generated` gets the bytes written.
absl::Status EnsureFlashExpertCheckpoint(const std::string& dir, int layers, int experts,
                                         int64_t* generated_bytes);

// A child process running argv (argv[0] = path); it gets SIGTERM if this process dies.
class ChildProcess {
 public:
  static absl::StatusOr<std::unique_ptr<ChildProcess>> Start(const std::vector<std::string>& argv,
                                                             const std::string& log_path);
  ~ChildProcess();  // Stop()
  pid_t pid() const { return pid_; }
  bool Alive();  // false once it exited (status() then holds the exit status)
  int Stop();    // SIGTERM and wait; the exit status (128 + signal if killed)
  int status() const { return status_; }

 private:
  pid_t pid_ = -1;
  int status_ = -1;
};

// VmRSS of /proc/<pid>/status in bytes; 0 if unreadable.
int64_t VmRssBytes(pid_t pid);
// AnonHugePages of /proc/<pid>/smaps_rollup in bytes (transparent huge pages); 0 if unreadable.
int64_t AnonHugeBytes(pid_t pid);

// A free TCP port on 127.0.0.1 (bound and released: another process may take it first).
int FreeLoopbackPort();

// The body of GET http://127.0.0.1:<port><path> (HTTP/1.0); Unavailable if it cannot be read.
absl::StatusOr<std::string> HttpGet(int port, const std::string& path);

// The value of the sample `series` (name and labels exactly as exposed, e.g.
// `splitserve:expert_call_seconds_sum{layer="0"}`) in a Prometheus text page; NaN if absent.
double MetricValue(const std::string& page, const std::string& series);

// The shared-memory server options the benches use (4 slots, dim 4096, top-6).
ss::expert::shm::ShmServerOptions EmptyServerOptions(const std::string& name, absl::Duration spin,
                                                     int max_tokens);
// A handler that writes nothing and returns at once.
absl::Status EmptyHandler(const ss::expert::shm::ExpertRequestView&, float*);

// Connects to `name`, retrying for up to `wait` (a server starting in another process).
absl::StatusOr<std::unique_ptr<ss::expert::shm::ShmClient>> ConnectShm(
    const std::string& name, const ss::expert::shm::ShmClientOptions& options, absl::Duration wait);

// One T-token call's buffers and the shared-memory round trip (x, ids and weights fixed).
class ShmCaller {
 public:
  ShmCaller(std::unique_ptr<ss::expert::shm::ShmClient> client, int tokens, int dim, int top_k);
  absl::Status RoundTrip(int layer = 0);

 private:
  std::vector<uint16_t> x_;
  std::vector<int32_t> ids_;
  std::vector<float> weights_;
  std::vector<float> out_;
  ss::expert::shm::ExpertCallInput in_;
  std::unique_ptr<ss::expert::shm::ShmClient> client_;
};

}  // namespace ss::bench
