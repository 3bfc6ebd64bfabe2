#include "coordinator/launcher.h"

#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/build_info.h"
#include "common/cluster_defaults.h"
#include "common/expert_store_format.h"
#include "common/fp64_sums.h"
#include "common/gpu_prefill_flags.h"
#include "common/layer_list.h"
#include "common/logging.h"
#include "common/model_config.h"
#include "common/numa_topology.h"
#include "common/safetensors.h"
#include "common/stop_signals.h"
#include "common/tensor_parallel.h"
#include "common/weight_source.h"
#include "coordinator/api_keys.h"
#include "coordinator/cluster_config.h"
#include "coordinator/console.h"
#include "coordinator/load_display.h"
#include "coordinator/run_dir.h"
#include "coordinator/supervisor.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "proto/cluster_credential.h"

namespace ss {
namespace {

// Expert workers' idle spin (--spin_us) when the GPU workers run the cpu backend on the same cores
// (the worker's own default, 200 us, suits a machine whose GPU workers wait on GPUs).
constexpr int kSharedCoresSpinUs = 20;

namespace fs = std::filesystem;

constexpr char kUsage[] =
    "usage: splitserve up [--model DIR] [--tokenizer FILE] [--host H] [--port P]\n"
    "                     [--load-format auto|safetensors|dummy] [--hf-overrides JSON]\n"
    "                     [--backend auto|cpu|cuda] [--stages N] [--tp N]\n"
    "                     [--expert-workers N|auto]\n"
    "                     [--isa auto|scalar|avx2|avx512] [--kv-tokens N|auto]\n"
    "                     [--max-model-len N] [--api-keys-file FILE] [--allowed-origins LIST]\n"
    "                     [--stage-transport auto|grpc|nccl] [--fp64-sums auto|on|off]\n"
    "                     [--max-num-batched-tokens N]\n"
    "                     [--gpu-prefill-threshold auto|off|N] [--gpu-prefill-ring-mib MIB]\n"
    "                     [--enable-prefix-caching | --no-enable-prefix-caching]\n"
    "                     [--ready-timeout-s S] [--log-dir DIR]\n"
    "                     [--log-level LEVEL] [--log-format text|json] [--version]\n"
    "  Starts the coordinator, the GPU workers and one expert worker per NUMA node on this\n"
    "  machine, waits until the API is ready and serves until Ctrl-C / SIGTERM.\n"
    "  Without --model: the bundled tiny model (random weights: its text is noise).\n"
    "  --load-format dummy: every weight generated in memory (deterministic random values);\n"
    "  DIR needs only config.json (and tokenizer.json). auto (default) and safetensors read\n"
    "  DIR's safetensors.\n"
    "  --hf-overrides JSON: a JSON object merged into config.json in every process, e.g.\n"
    "  '{\"n_routed_experts\": 128}' (nested objects merge key by key); the result must\n"
    "  still pass every check of config.json.\n"
    "  --tp N (cuda): N tensor-parallel GPU workers per stage; stage s, rank r runs on GPU\n"
    "  (s*N + r) mod G of the machine's G GPUs (stages may share GPUs, a stage's ranks not).\n"
    "  --expert-workers auto (default): one per NUMA node, or one per TP rank where --tp is a\n"
    "  larger multiple of the nodes (each rank calls, and streams, its own slice of the experts).\n"
    "  --kv-tokens auto (default): with the cuda backend and one GPU worker per GPU each worker\n"
    "  fills its GPU's free memory with KV; otherwise 65536 tokens per worker.\n"
    "  --max-model-len N: the longest prompt + output served (default: the model's positions);\n"
    "  a shorter one leaves the GPU workers more memory for KV.\n"
    "  --fp64-sums (cuda): the sums the reference forms in double, in double (on) or fp32 (off);\n"
    "  auto (default): double on GPUs with fast FP64, fp32 on others (an RTX 3090).\n"
    "  --max-num-batched-tokens N: tokens per scheduler step, which is also the largest\n"
    "  prefill chunk (every step first gives each decoding sequence its one token, then fills\n"
    "  the rest with prefill chunks). Default where the cuda backend may stream a chunk's\n"
    "  routed experts to the GPU: 8192, or 4096 / 2048 when --max-model-len is past 256K /\n"
    "  512K tokens (a step's workspace grows with tokens x context; the default keeps it at\n"
    "  what a 2048-token step at 1M positions takes); else 2048.\n"
    "  --gpu-prefill-threshold (cuda): steps of at least this many tokens stream their routed\n"
    "  experts host -> GPU instead of computing them on the expert workers: auto (default;\n"
    "  from the measured H2D bandwidth and CPU expert rate), off (never), or N.\n"
    "  --gpu-prefill-ring-mib MIB (cuda): each GPU's staging ring for the streamed experts\n"
    "  (default %lld; 0: no streamed path).\n"
    "  --enable-prefix-caching (default) / --no-enable-prefix-caching: reuse the KV of prompt\n"
    "  prefixes (whole blocks) that earlier requests computed; usage.prompt_tokens_details.\n"
    "  cached_tokens reports the tokens a request took from the cache.\n"
    "  --api-keys-file FILE: API keys clients must send (one a line or comma-separated); or\n"
    "  the SPLITSERVE_API_KEYS environment variable. Keys on the command line are refused.\n"
    "  --allowed-origins LIST: CORS, the origins (comma-separated, * for any) browser pages may\n"
    "  call the API from; default none.\n"
    "  --log-level trace|debug|info|warning|error|critical|off, --log-format text|json: the\n"
    "  started processes' logs (json: one object a line); default info, text.\n";

// The options of `up` that take a value, each handled by ParseArgs's chain: any other name is an
// unknown option, whether or not a value follows it.
constexpr absl::string_view kValueOptions[] = {"--model",
                                               "--tokenizer",
                                               "--load-format",
                                               "--hf-overrides",
                                               "--host",
                                               "--port",
                                               "--backend",
                                               "--stages",
                                               "--tp",
                                               "--stage-transport",
                                               "--fp64-sums",
                                               "--expert-workers",
                                               "--isa",
                                               "--kv-tokens",
                                               "--max-model-len",
                                               "--max-num-batched-tokens",
                                               "--gpu-prefill-threshold",
                                               "--gpu-prefill-ring-mib",
                                               "--api-keys",
                                               "--api-keys-file",
                                               "--allowed-origins",
                                               "--ready-timeout-s",
                                               "--log-dir",
                                               "--log-level",
                                               "--log-format"};

struct Options {
  std::string model, tokenizer, host = "127.0.0.1", backend = "auto", expert_workers = "auto";
  std::string isa = "auto", api_keys_file, log_dir, stage_transport = "auto", fp64_sums = "auto";
  std::string allowed_origins;  // the coordinator's --allowed_origins (CORS); "" = none
  LoadFormat load_format = LoadFormat::kAuto;
  std::string hf_overrides;  // a JSON object's text (validated), or ""
  int port = kDefaultHttpPort, stages = 1, tp = 1, ready_timeout_s = 600;
  bool stages_given = false;
  bool prefix_caching = true;
  bool help = false;                  // --help / -h: nothing after it was parsed
  bool version = false;               // --version: nothing after it was parsed
  std::string log_level, log_format;  // validated; "": not given (the children's defaults)
  int64_t kv_tokens = 0;              // 0: auto (coord::LaunchKvTokens)
  int64_t max_model_len = 0;          // 0: the model's max_position_embeddings
  // The streamed path of the routed experts (cuda backend; gpu_worker/streamed_prefill.h).
  std::string gpu_prefill_threshold = "auto";
  int64_t gpu_prefill_ring_mib = ss::gpu::kDefaultGpuPrefillRingMiB;
  int64_t max_num_batched_tokens = 0;  // 0: coord::LaunchMaxBatchTokens's default
};

// --kv-tokens auto where the workers cannot each fill a GPU of their own.
constexpr int64_t kFallbackKvTokens = 65536;

// Sequences running at once (the cluster config's max_running).
constexpr int64_t kMaxRunning = 64;

bool ParseInt(const std::string& s, int64_t min, int64_t max, int64_t* out) {
  return absl::SimpleAtoi(s, out) && *out >= min && *out <= max;
}

// InvalidArgument naming the flag (an unknown one, a missing or bad value, --api-keys); a bad
// --fp64-sums or --api-keys-file value gives the status of its parser.
absl::StatusOr<Options> ParseArgs(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string name = argv[i], value;
    if (name == "--help" || name == "-h") {
      o.help = true;
      return o;
    }
    if (name == "--version") {
      o.version = true;
      return o;
    }
    for (char& c : name) c = c == '_' ? '-' : c;
    if (name == "--enable-prefix-caching" || name == "--no-enable-prefix-caching") {
      o.prefix_caching = name == "--enable-prefix-caching";  // vLLM's flags, without a value
      continue;
    }
    const size_t eq = name.find('=');
    if (eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    if (std::find(std::begin(kValueOptions), std::end(kValueOptions), name) ==
        std::end(kValueOptions)) {
      return absl::InvalidArgumentError(absl::StrCat("unknown option '", name, "'"));
    }
    if (eq == std::string::npos) {
      if (i + 1 >= argc) return absl::InvalidArgumentError(absl::StrCat(name, " needs a value"));
      value = argv[++i];
    }
    int64_t v = 0;
    if (name == "--model") {
      o.model = value;
    } else if (name == "--tokenizer") {
      o.tokenizer = value;
    } else if (name == "--load-format") {
      absl::StatusOr<LoadFormat> f = ParseLoadFormat(value);
      if (!f.ok()) return f.status();
      o.load_format = *f;
    } else if (name == "--hf-overrides") {
      if (absl::Status s = ValidateHfOverrides(value); !s.ok()) return s;
      o.hf_overrides = value;
    } else if (name == "--host") {
      o.host = value;
    } else if (name == "--port") {
      if (!ParseInt(value, 0, 65535, &v))
        return absl::InvalidArgumentError(absl::StrCat("--port ", value, " is not a port"));
      o.port = static_cast<int>(v);
    } else if (name == "--backend") {
      if (value != "auto" && value != "cpu" && value != "cuda") {
        return absl::InvalidArgumentError(
            absl::StrCat("--backend ", value, ": expected auto, cpu or cuda"));
      }
      o.backend = value;
    } else if (name == "--stages") {
      if (!ParseInt(value, 1, 64, &v))
        return absl::InvalidArgumentError(absl::StrCat("--stages ", value, ": expected 1..64"));
      o.stages = static_cast<int>(v);
      o.stages_given = true;
    } else if (name == "--tp") {
      if (!ParseInt(value, 1, 64, &v))
        return absl::InvalidArgumentError(absl::StrCat("--tp ", value, ": expected 1..64"));
      o.tp = static_cast<int>(v);
    } else if (name == "--stage-transport") {
      if (value != "auto" && value != "grpc" && value != "nccl") {
        return absl::InvalidArgumentError(
            absl::StrCat("--stage-transport ", value, ": expected auto, grpc or nccl"));
      }
      o.stage_transport = value;
    } else if (name == "--fp64-sums") {
      const absl::StatusOr<ss::gpu::Fp64Sums> m = ss::gpu::ParseFp64Sums(value);
      if (!m.ok()) return m.status();
      o.fp64_sums = value;
    } else if (name == "--expert-workers") {
      if (value != "auto" && !ParseInt(value, 0, 64, &v)) {
        return absl::InvalidArgumentError(
            absl::StrCat("--expert-workers ", value, ": expected auto or 0..64"));
      }
      o.expert_workers = value;
    } else if (name == "--isa") {
      o.isa = value;
    } else if (name == "--kv-tokens") {
      if (value == "auto") {
        o.kv_tokens = 0;
      } else if (!ParseInt(value, 1, int64_t{1} << 40, &v)) {
        return absl::InvalidArgumentError(
            absl::StrCat("--kv-tokens ", value, ": expected a positive number or auto"));
      } else {
        o.kv_tokens = v;
      }
    } else if (name == "--max-model-len") {
      if (!ParseInt(value, 1, int64_t{1} << 30, &v)) {
        return absl::InvalidArgumentError(
            absl::StrCat("--max-model-len ", value, ": expected a positive number"));
      }
      o.max_model_len = v;
    } else if (name == "--max-num-batched-tokens") {
      // The cluster config needs max_batch_tokens >= max_running (one decode token each).
      if (!ParseInt(value, kMaxRunning, int64_t{1} << 20, &v)) {
        return absl::InvalidArgumentError(absl::StrCat("--max-num-batched-tokens ", value,
                                                       ": expected ", kMaxRunning, "..",
                                                       int64_t{1} << 20));
      }
      o.max_num_batched_tokens = v;
    } else if (name == "--gpu-prefill-threshold") {
      const absl::StatusOr<ss::gpu::GpuPrefillThreshold> t =
          ss::gpu::ParseGpuPrefillThreshold(value);
      if (!t.ok()) return t.status();
      o.gpu_prefill_threshold = t->ToString();
    } else if (name == "--gpu-prefill-ring-mib") {
      if (!ParseInt(value, 0, int64_t{1} << 20, &v)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--gpu-prefill-ring-mib ", value, ": expected 0 (no streamed path) to 1048576 MiB"));
      }
      o.gpu_prefill_ring_mib = v;
    } else if (name == "--api-keys") {
      return absl::InvalidArgumentError(
          absl::StrCat("--api-keys on the command line is refused (every local user sees argv): "
                       "put the keys in a file for --api-keys-file FILE or in the ",
                       kApiKeysEnv, " environment variable"));
    } else if (name == "--api-keys-file") {
      const absl::StatusOr<std::vector<std::string>> keys = ReadApiKeysFile(value);
      if (!keys.ok()) return keys.status();
      o.api_keys_file = fs::absolute(value).string();
    } else if (name == "--ready-timeout-s") {
      if (!ParseInt(value, 1, 86400, &v))
        return absl::InvalidArgumentError(absl::StrCat("--ready-timeout-s ", value));
      o.ready_timeout_s = static_cast<int>(v);
    } else if (name == "--allowed-origins") {
      o.allowed_origins = value;
    } else if (name == "--log-dir") {
      o.log_dir = value;
    } else if (name == "--log-level") {
      if (absl::Status s = ParseLogLevel(value).status(); !s.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("--log-level ", s.message()));
      }
      o.log_level = value;
    } else if (name == "--log-format") {
      if (absl::Status s = ParseLogFormat(value).status(); !s.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("--log-format ", s.message()));
      }
      o.log_format = value;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown option '", name, "'"));
    }
  }
  return o;
}

fs::path SelfDir() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::current_path() : exe.parent_path();
}

int CountGpus() {
  int n = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/dev", ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() > 6 && name.rfind("nvidia", 0) == 0 &&
        name.find_first_not_of("0123456789", 6) == std::string::npos) {
      ++n;
    }
  }
  return n;
}

// "0-27,32-59" for the start-up line.
std::string CpuList(std::vector<int> cpus) {
  std::sort(cpus.begin(), cpus.end());
  return FormatIdList(cpus);
}

std::string ReadFile(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Supervision of a running cluster (launcher.h).
constexpr std::chrono::milliseconds kStoppedGrace{1000};   // a child stopped this long is hung
constexpr std::chrono::milliseconds kProbeInterval{500};   // GET /ready while serving
constexpr std::chrono::milliseconds kNotReadyGrace{5000};  // /ready 503 this long: restart

// What every child is started from.
struct LaunchPlan {
  const Options& o;
  fs::path bin;
  std::string backend;
  int n_layers = 0, experts = 0;
  std::vector<int> node_ids;  // the usable NUMA nodes (coord::LaunchNodes::ids)
  coord::LaunchCpus cpus;
  std::vector<std::string> shm_names, gpu_ids;
  std::string cluster_path, ports_file;
  std::vector<int> devices;  // per GPU worker (cuda)
  int64_t kv_tokens = 0;
  // Child i's --load-progress-file (GPU workers first, then expert workers; LoadDisplay).
  std::vector<std::string> load_files;
};

// Metrics port of child `i` (GPU workers first, then expert workers): the ones after --port.
std::string MetricsAddr(const LaunchPlan& p, int i) {
  return absl::StrCat("127.0.0.1:", p.o.port == 0 ? 0 : p.o.port + 1 + i);
}

// The weight source's flags every worker gets (the coordinator only the overrides: it reads no
// weights).
void AddWeightSourceArgs(const Options& o, bool load_format, std::vector<std::string>* args) {
  if (load_format) {
    args->push_back("--load-format");
    args->push_back(std::string(LoadFormatName(o.load_format)));
  }
  if (!o.hf_overrides.empty()) {
    args->push_back("--hf-overrides");
    args->push_back(o.hf_overrides);
  }
}

// --log-level / --log-format as given to `up`, for every child.
void AddLogArgs(const Options& o, std::vector<std::string>* args) {
  if (!o.log_level.empty()) args->insert(args->end(), {"--log-level", o.log_level});
  if (!o.log_format.empty()) args->insert(args->end(), {"--log-format", o.log_format});
}

// Tokens of one expert-worker call (--max-tokens): the CPU path's step size, so that at the
// default 2048-token steps a prefill chunk's layer is one call (every expert's weights read once
// for all the chunk's tokens routed to it). With larger steps (coord::LaunchMaxBatchTokens) the
// GPU worker's client cuts a CPU-path call into calls of this many rows
// (gpu_worker/routed_experts_client.h), and the streamed path does not call the expert workers.
constexpr int64_t kExpertCallTokens = 2048;

std::vector<std::string> ExpertArgs(const LaunchPlan& p, int e) {
  std::vector<std::string> args = {(p.bin / "splitserve-expert-worker").string(),
                                   "--model",
                                   p.o.model,
                                   "--layers",
                                   absl::StrCat("0-", p.n_layers - 1),
                                   "--slice",
                                   absl::StrCat(e, "/", p.experts),
                                   "--isa",
                                   p.o.isa,
                                   "--shm-name",
                                   p.shm_names[e],
                                   "--metrics-listen",
                                   MetricsAddr(p, static_cast<int>(p.gpu_ids.size()) + e),
                                   "--max-tokens",
                                   absl::StrCat(kExpertCallTokens),
                                   "--load-progress-file",
                                   p.load_files[p.gpu_ids.size() + e]};
  AddWeightSourceArgs(p.o, /*load_format=*/true, &args);
  AddLogArgs(p.o, &args);
  if (const int node = coord::LaunchExpertNode(e, p.experts, p.node_ids); node >= 0) {
    args.push_back("--numa-node");
    args.push_back(absl::StrCat(node));
  }
  if (p.backend == "cpu") {
    // The GPU workers then compute on these same cores: an idle expert thread polls only
    // briefly, so it does not take a core from a decode step while the step runs.
    args.push_back("--spin_us");
    args.push_back(absl::StrCat(kSharedCoresSpinUs));
  }
  return args;
}

// `http_port` 0: any free port (the first start without --port); a restarted coordinator gets
// the port its predecessor had, so clients find it again.
std::vector<std::string> CoordinatorArgs(const LaunchPlan& p, int http_port) {
  const Options& o = p.o;
  std::vector<std::string> cargs = {(p.bin / "splitserve-coordinator").string(),
                                    "--model",
                                    o.model,
                                    "--tokenizer",
                                    o.tokenizer,
                                    "--cluster",
                                    p.cluster_path,
                                    "--host",
                                    o.host,
                                    "--port",
                                    absl::StrCat(http_port),
                                    "--control-listen",
                                    "127.0.0.1:0",
                                    "--ports-file",
                                    p.ports_file};
  AddWeightSourceArgs(o, /*load_format=*/false, &cargs);
  AddLogArgs(o, &cargs);
  if (!o.api_keys_file.empty()) {  // the path, never the keys (argv is public); or the env
    cargs.push_back("--api-keys-file");
    cargs.push_back(o.api_keys_file);
  }
  if (!o.allowed_origins.empty()) {
    cargs.push_back("--allowed-origins");
    cargs.push_back(o.allowed_origins);
  }
  return cargs;
}

std::vector<std::string> GpuWorkerArgs(const LaunchPlan& p, size_t i, int control_port) {
  std::vector<std::string> args = {(p.bin / "splitserve-gpu-worker").string(),
                                   "--coordinator",
                                   absl::StrCat("127.0.0.1:", control_port),
                                   "--worker-id",
                                   p.gpu_ids[i],
                                   "--listen",
                                   "127.0.0.1:0",
                                   "--backend",
                                   p.backend,
                                   "--model",
                                   p.o.model,
                                   "--kv-tokens",
                                   absl::StrCat(p.kv_tokens),
                                   "--metrics-listen",
                                   MetricsAddr(p, static_cast<int>(i)),
                                   "--load-progress-file",
                                   p.load_files[i]};
  AddWeightSourceArgs(p.o, /*load_format=*/true, &args);
  AddLogArgs(p.o, &args);
  if (p.backend == "cuda") {
    args.push_back("--cuda-device");
    args.push_back(absl::StrCat(p.devices[i]));
    args.push_back("--fp64-sums");
    args.push_back(p.o.fp64_sums);
    args.push_back("--gpu-prefill-threshold");
    args.push_back(p.o.gpu_prefill_threshold);
    args.push_back("--gpu-prefill-ring-mib");
    args.push_back(absl::StrCat(p.o.gpu_prefill_ring_mib));
  }
  return args;
}

void PrintBanner(const LaunchPlan& p, const std::string& model_name, int http_port,
                 std::chrono::steady_clock::duration took) {
  const Options& o = p.o;
  const std::string url = absl::StrCat("http://", o.host, ":", http_port);
  const int children = static_cast<int>(p.gpu_ids.size()) + p.experts;
  std::printf(
      "splitserve up: ready in %.1f s: %s (%d stage(s) of TP %d, %s backend, %d expert "
      "worker(s)%s)\n"
      "  try:\n"
      "  curl %s/v1/chat/completions -H 'Content-Type: application/json' \\\n"
      "    -d '{\"model\": \"%s\", \"messages\": [{\"role\": \"user\", \"content\": \"Hello!\"}], "
      "\"max_tokens\": 32}'\n"
      "  metrics: %s/metrics%s\n"
      "  Ctrl-C stops everything.\n",
      std::chrono::duration<double>(took).count(), url.c_str(), o.stages, o.tp, p.backend.c_str(),
      p.experts,
      o.stages > 1 ? absl::StrCat(", streams between stages over ", o.stage_transport).c_str() : "",
      url.c_str(), model_name.c_str(), url.c_str(),
      o.port == 0
          ? ""
          : absl::StrCat(" (workers: 127.0.0.1:", o.port + 1, "-", o.port + children, "/metrics)")
                .c_str());
  std::fflush(stdout);
}

}  // namespace

int RunUpCommand(int argc, char** argv) {
  absl::StatusOr<Options> parsed = ParseArgs(argc, argv);
  if (!parsed.ok()) {
    std::fprintf(stderr, "splitserve up: %s (see --help)\n",
                 std::string(parsed.status().message()).c_str());
    return 2;
  }
  Options& o = *parsed;
  if (o.help) {
    std::printf(kUsage, static_cast<long long>(ss::gpu::kDefaultGpuPrefillRingMiB));
    return 0;
  }
  if (o.version) {
    std::printf("%s\n", VersionLine("splitserve").c_str());
    return 0;
  }
  ConfigureLogging("splitserve", o.log_level.empty() ? "info" : o.log_level,
                   o.log_format.empty() ? "text" : o.log_format)
      .IgnoreError();  // validated by ParseArgs
  const fs::path bin = SelfDir();
  if (o.model.empty()) {
    o.model = (bin.parent_path() / "share/splitserve/tiny").string();
    std::printf(
        "splitserve up: no --model: serving the bundled tiny model (%s; random weights, "
        "its text is noise)\n",
        o.model.c_str());
  }
  if (o.tokenizer.empty()) o.tokenizer = o.model + "/tokenizer.json";
  absl::StatusOr<ModelConfig> model = LoadModelConfig(WeightSource{
      .model_dir = o.model, .load_format = o.load_format, .hf_overrides = o.hf_overrides});
  if (!model.ok()) {
    std::fprintf(stderr, "splitserve up: %s\n", std::string(model.status().message()).c_str());
    return 1;
  }
  // A checkpoint to read (dummy weights read none): refused here, once, rather than by every
  // worker at each of its restarts.
  if (o.load_format != LoadFormat::kDummy) {
    if (absl::StatusOr<std::unique_ptr<Checkpoint>> c = Checkpoint::Open(o.model); !c.ok()) {
      std::fprintf(stderr,
                   "splitserve up: %s (--load-format dummy generates the weights instead)\n",
                   std::string(c.status().message()).c_str());
      return 1;
    }
  }
  if (!fs::exists(o.tokenizer)) {
    std::fprintf(stderr, "splitserve up: no tokenizer at %s (give --tokenizer FILE)\n",
                 o.tokenizer.c_str());
    return 1;
  }
  for (const char* b :
       {"splitserve-coordinator", "splitserve-gpu-worker", "splitserve-expert-worker"}) {
    if (!fs::exists(bin / b)) {
      std::fprintf(stderr, "splitserve up: %s is missing next to %s\n", b, bin.c_str());
      return 1;
    }
  }
  // A fresh cluster token for this run (proto/cluster_credential.h): the children inherit it
  // through the environment (readable only by this user), never through argv.
  absl::StatusOr<std::string> token = GenerateClusterToken();
  if (!token.ok()) {
    std::fprintf(stderr, "splitserve up: %s\n", std::string(token.status().message()).c_str());
    return 1;
  }
  setenv(kClusterTokenEnv, token->c_str(), 1);

  // Layout.
  const int gpus = CountGpus();
#ifdef SS_HAVE_CUDA
  constexpr bool kCudaBuilt = true;
#else
  constexpr bool kCudaBuilt = false;
#endif
  std::string backend = o.backend;
  if (backend == "auto") {
    backend = gpus > 0 && kCudaBuilt ? "cuda" : "cpu";
    if (gpus > 0 && !kCudaBuilt) {
      std::printf(
          "splitserve up: %d GPU device(s) found, but this build has no CUDA: using the "
          "cpu backend\n",
          gpus);
    }
  }
  if (o.tp > 1 && backend != "cuda") {
    std::fprintf(stderr,
                 "splitserve up: --tp %d needs the cuda backend (the cpu backend runs TP 1 only)\n",
                 o.tp);
    return 2;
  }
  if (o.stage_transport == "nccl" && backend != "cuda") {
    std::fprintf(stderr, "splitserve up: --stage-transport nccl needs the cuda backend\n");
    return 2;
  }
  if (backend == "cuda" && (!kCudaBuilt || gpus == 0)) {
    std::fprintf(stderr, "splitserve up: --backend cuda needs a CUDA build and a GPU (%d found)\n",
                 gpus);
    return 2;
  }
  if (o.max_model_len > model->max_position_embeddings) {
    std::fprintf(stderr, "splitserve up: --max-model-len %lld exceeds the model's %lld positions\n",
                 static_cast<long long>(o.max_model_len),
                 static_cast<long long>(model->max_position_embeddings));
    return 2;
  }
  if (absl::Status split = CheckTensorParallelSplit(*model, o.tp); !split.ok()) {
    std::fprintf(stderr, "splitserve up: --tp %d: %s\n", o.tp,
                 std::string(split.message()).c_str());
    return 2;
  }
  // Without --stages: one pipeline stage per TP group of GPUs.
  if (backend == "cuda" && !o.stages_given) {
    o.stages = std::max(1, std::min<int>(gpus / o.tp, model->n_layers));
  }
#ifdef SS_HAVE_NCCL
  constexpr bool kNcclBuilt = true;
#else
  constexpr bool kNcclBuilt = false;
#endif
  o.stage_transport = coord::LaunchStageTransport(o.stage_transport, backend == "cuda", kNcclBuilt,
                                                  o.stages, o.tp, gpus);
  std::vector<int> devices;  // per GPU worker, stage by stage in TP rank order
  if (backend == "cuda") {
    absl::StatusOr<std::vector<int>> d =
        coord::AssignCudaDevices(o.stages, o.tp, gpus, o.stage_transport == "nccl");
    if (!d.ok()) {
      std::fprintf(stderr, "splitserve up: %s\n", std::string(d.status().message()).c_str());
      return 2;
    }
    devices = *d;
  }
  if (o.stages > model->n_layers) {
    std::fprintf(stderr, "splitserve up: --stages %d exceeds the model's %lld layers\n", o.stages,
                 static_cast<long long>(model->n_layers));
    return 2;
  }
  const int64_t kv_tokens =
      coord::LaunchKvTokens(o.kv_tokens, backend == "cuda", devices, kFallbackKvTokens);
  if (o.kv_tokens == 0 && kv_tokens == 0) {
    std::printf("splitserve up: KV cache: each GPU worker fills its GPU's free memory\n");
  } else if (o.kv_tokens == 0 && backend == "cuda") {
    std::printf(
        "splitserve up: KV cache: %lld tokens per GPU worker (workers share GPUs; "
        "--kv-tokens N to choose)\n",
        static_cast<long long>(kv_tokens));
  }
  coord::LaunchNodes nodes;  // none when the topology cannot be read
  if (absl::StatusOr<std::unique_ptr<NumaTopology>> topo = NumaTopology::Discover(); topo.ok()) {
    nodes = coord::LaunchNodesOf((*topo)->nodes());
  }
  const std::vector<std::vector<std::vector<int>>>& node_cores = nodes.cores;
  const int experts = coord::LaunchExpertWorkers(
      o.expert_workers == "auto" ? 0 : std::atoi(o.expert_workers.c_str()),
      std::max(1, static_cast<int>(nodes.ids.size())), o.tp, backend == "cuda",
      model->moe_inter_dim);
  // The coordinator and the GPU workers on cores of their own (cluster_config.h LaunchCpus).
  const coord::LaunchCpus cpus =
      coord::PlanLaunchCpusFor(node_cores, experts, o.stages * o.tp, true, backend == "cuda");
  if (backend == "cuda" && !cpus.split() && !node_cores.empty()) {
    std::printf(
        "splitserve up: warning: too few CPU cores to keep %d for the GPU workers and the "
        "coordinator beside the expert workers; every process shares every core, and expert "
        "calls wait on the GPU workers' spinning threads\n",
        o.stages * o.tp + 1);
  }
  if (cpus.split()) {
    std::printf("splitserve up: CPUs: coordinator and GPU workers on %s",
                CpuList(cpus.serving).c_str());
    for (int e = 0; e < experts; ++e) {
      std::printf("; expert%d on %s", e, CpuList(cpus.experts[e]).c_str());
    }
    std::printf("\n");
  }

  absl::StatusOr<RunDir> run_dir = RunDir::Create();
  if (!run_dir.ok()) {
    std::fprintf(stderr, "splitserve up: %s\n", std::string(run_dir.status().message()).c_str());
    return 1;
  }
  if (!o.log_dir.empty()) fs::create_directories(o.log_dir);

  coord::ClusterConfig cluster;
  cluster.model_name = fs::path(o.model).filename().string();
  if (cluster.model_name.empty()) cluster.model_name = "model";
  int64_t max_ratio = 1;
  for (int64_t r : model->compress_ratios) max_ratio = std::max(max_ratio, r);
  cluster.kv_block_tokens = static_cast<int>(std::max<int64_t>(128, max_ratio));
  // A streamed prefill chunk reads every expert's weights once whatever its tokens: larger chunks
  // where the cuda backend may stream (the GPU workers size their KV pools beside the larger
  // step's workspace and the ring).
  const bool may_stream =
      backend == "cuda" && o.gpu_prefill_ring_mib > 0 && o.gpu_prefill_threshold != "off";
  cluster.max_batch_tokens = static_cast<int>(coord::LaunchMaxBatchTokens(
      o.max_num_batched_tokens, may_stream,
      o.max_model_len > 0 ? o.max_model_len : model->max_position_embeddings));
  cluster.max_running = static_cast<int>(kMaxRunning);
  std::printf(
      "splitserve up: steps of up to %d tokens (prefill chunks too; --max-num-batched-tokens)%s\n",
      cluster.max_batch_tokens,
      backend != "cuda" ? ""
      : may_stream
          ? absl::StrCat("; large prefill steps stream their routed experts to the GPUs "
                         "(--gpu-prefill-threshold ",
                         o.gpu_prefill_threshold, ", a ", o.gpu_prefill_ring_mib, " MiB ring)")
                .c_str()
          : "; routed experts always on the expert workers");
  cluster.max_model_len = static_cast<int>(o.max_model_len);
  cluster.stage_transport = o.stage_transport;
  cluster.enable_prefix_caching = o.prefix_caching;
  const int n_layers = static_cast<int>(model->n_layers);
  for (int s = 0; s < o.stages; ++s) {
    coord::StageSpec st;
    st.first_layer = n_layers * s / o.stages;
    st.end_layer = n_layers * (s + 1) / o.stages;
    for (int r = 0; r < o.tp; ++r) {
      st.workers.push_back(o.tp == 1 ? absl::StrCat("gpu", s) : absl::StrCat("gpu", s, "-", r));
    }
    cluster.stages.push_back(st);
  }
  LaunchPlan plan{o,  bin, backend, n_layers, experts, nodes.ids, cpus,
                  {}, {},  "",      "",       devices, kv_tokens, {}};
  for (int e = 0; e < experts; ++e) {
    coord::ExpertWorkerSpec w;
    w.id = absl::StrCat("expert", e);
    for (int l = 0; l < n_layers; ++l) w.layers.push_back(l);
    w.slice_index = e;
    w.slice_count = experts;
    w.shm_name = absl::StrCat("splitserve-", getpid(), "-expert", e);
    plan.shm_names.push_back(w.shm_name);
    cluster.expert_workers.push_back(w);
  }
  plan.gpu_ids = cluster.GpuWorkerIds();
  plan.cluster_path = run_dir->File("cluster.json");
  plan.ports_file = run_dir->File("ports.json");
  std::vector<std::pair<std::string, std::string>> load_files;  // (child, file)
  for (const std::string& id : plan.gpu_ids) load_files.emplace_back(id, "");
  for (const coord::ExpertWorkerSpec& w : cluster.expert_workers) load_files.emplace_back(w.id, "");
  for (auto& [name, file] : load_files) {
    file = run_dir->File(absl::StrCat(name, ".load.json"));
    plan.load_files.push_back(file);
  }
  if (absl::Status st =
          run_dir->WriteNew("cluster.json", coord::ClusterConfigToJson(cluster) + "\n");
      !st.ok()) {
    std::fprintf(stderr, "splitserve up: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  if (absl::StatusOr<coord::ClusterConfig> check =
          coord::LoadClusterConfig(plan.cluster_path, *model);
      !check.ok()) {
    std::fprintf(stderr, "splitserve up: internal: %s\n",
                 std::string(check.status().message()).c_str());
    return 1;
  }

  // Stop signals: taken with WaitForStopSignal in the loop below.
  BlockStopSignals(Sigpipe::kDefault);

  // On a terminal: the load bar below the children's output, which passes through `console`
  // (unless it goes to --log-dir). Its relay thread starts after the mask above.
  std::unique_ptr<Console> console;
  if (isatty(fileno(stdout)) != 0) {
    absl::StatusOr<std::unique_ptr<Console>> c = Console::Create(stdout, o.log_dir.empty());
    if (!c.ok()) {
      std::fprintf(stderr, "splitserve up: %s\n", std::string(c.status().message()).c_str());
      return 1;
    }
    console = *std::move(c);
  }
  const int child_out = console != nullptr ? console->child_fd() : -1;
  LoadDisplay load_display(load_files, stdout, console.get());

  Supervisor sup;
  auto unlink_segments = [&] {
    for (const std::string& n : plan.shm_names) {
      shm_unlink(("/" + n).c_str());
      shm_unlink(absl::StrCat("/", ExpertStoreSegmentName(n)).c_str());  // a killed worker's store
    }
  };
  // The workers: expert workers (fresh segments), then the GPU workers, which register with the
  // coordinator at `control_port` and wait for the segments.
  auto start_workers = [&](int control_port) {
    unlink_segments();
    load_display.Restart(std::chrono::steady_clock::now());
    for (int e = 0; e < experts; ++e) {
      if (!sup.Start(absl::StrCat("expert", e), ExpertArgs(plan, e), o.log_dir,
                     cpus.split() ? cpus.experts[e] : std::vector<int>{}, child_out)) {
        return false;
      }
    }
    for (size_t i = 0; i < plan.gpu_ids.size(); ++i) {
      if (!sup.Start(plan.gpu_ids[i], GpuWorkerArgs(plan, i, control_port), o.log_dir, cpus.serving,
                     child_out)) {
        return false;
      }
    }
    return true;
  };
  auto start_coordinator = [&](int http_port) {
    unlink(plan.ports_file.c_str());
    return sup.Start("coordinator", CoordinatorArgs(plan, http_port), o.log_dir, cpus.serving,
                     child_out);
  };

  // Supervision (launcher.h): one loop, one phase at a time.
  enum class Phase { kBackoff, kPorts, kReady, kServing };
  Phase phase = Phase::kPorts;
  bool served = false;       // the cluster was whole at least once
  bool restart_all = false;  // kBackoff: the coordinator too
  int http_port = 0, control_port = 0;
  RestartPolicy policy;
  const auto start = std::chrono::steady_clock::now();
  auto deadline = start + std::chrono::seconds(o.ready_timeout_s);  // kPorts, kReady
  std::chrono::steady_clock::time_point restart_at, failed_at, not_ready_since, next_probe;
  std::unique_ptr<httplib::Client> client;
  int exit_code = 0;
  if (!start_coordinator(o.port)) {
    sup.StopAll();
    unlink_segments();
    return 1;
  }
  while (true) {
    if (WaitForStopSignal(absl::Milliseconds(100)) != 0) {
      load_display.Stop(std::chrono::steady_clock::now(), false);
      if (served) {
        std::printf("splitserve up: stopping (draining running requests)\n");
        std::fflush(stdout);
      }
      break;
    }
    const auto now = std::chrono::steady_clock::now();
    std::string failure;        // what failed, for the message
    bool all = false;           // the coordinator failed: restart it with the workers
    bool child_failed = false;  // a child died or stopped (not a deadline)
    if (const Supervisor::Child* c = sup.Reap()) {
      failure = absl::StrCat(c->name, " ", DescribeExit(c->status));
      all = c->name == "coordinator";
      child_failed = true;
    } else if (const Supervisor::Child* s = sup.Stopped(kStoppedGrace)) {
      failure = absl::StrCat(s->name, " (pid ", s->pid, ") is stopped");
      all = s->name == "coordinator";
      child_failed = true;
    } else if (phase == Phase::kBackoff && now >= restart_at) {
      const bool ok = restart_all ? start_coordinator(http_port) : start_workers(control_port);
      phase = restart_all ? Phase::kPorts : Phase::kReady;
      deadline = now + std::chrono::seconds(o.ready_timeout_s);
      if (!ok) failure = "a child could not be started";
    } else if (phase == Phase::kPorts) {
      const nlohmann::json j = nlohmann::json::parse(ReadFile(plan.ports_file), nullptr, false);
      if (j.is_object() && j.contains("http") && j["http"].is_number_integer() &&
          j.contains("control") && j["control"].is_number_integer()) {
        http_port = j["http"].get<int>();
        control_port = j["control"].get<int>();
        client = std::make_unique<httplib::Client>(o.host, http_port);
        client->set_connection_timeout(1, 0);
        client->set_read_timeout(1, 0);
        phase = Phase::kReady;
        if (!start_workers(control_port)) failure = "a child could not be started";
      } else if (now > deadline) {
        failure = "the coordinator did not start in time";
      }
    } else if (phase == Phase::kReady) {
      load_display.Poll(now);
      if (auto res = client->Get("/ready"); res && res->status == 200) {
        load_display.Stop(now, true);
        phase = Phase::kServing;
        not_ready_since = {};
        if (!served) {
          served = true;
          PrintBanner(plan, cluster.model_name, http_port, now - start);
        } else {
          std::printf("splitserve up: serving again %.2f s after the failure\n",
                      std::chrono::duration<double>(now - failed_at).count());
          std::fflush(stdout);
        }
        policy.OnRecovered();
      } else if (now > deadline) {
        failure = absl::StrCat("not ready after ", o.ready_timeout_s, " s (see the logs",
                               o.log_dir.empty() ? "" : " in ", o.log_dir, ")");
      }
    } else if (phase == Phase::kServing && now >= next_probe) {
      next_probe = now + kProbeInterval;
      auto res = client->Get("/ready");
      if (res && res->status == 200) {
        not_ready_since = {};
      } else if (not_ready_since == std::chrono::steady_clock::time_point{}) {
        not_ready_since = now;
      } else if (now - not_ready_since > kNotReadyGrace) {
        failure = res ? absl::StrCat("the coordinator has not been ready for ",
                                     absl::FormatDuration(absl::FromChrono(kNotReadyGrace)))
                      : "the coordinator does not answer";
        all = !res;
      }
    }
    if (failure.empty()) continue;
    load_display.Stop(now, false);
    // Before the first ready only a worker that died or stopped is restarted (under the same
    // backoff and burst limit): the coordinator failing to start, or nothing getting ready in
    // time, is a setup error to report at once.
    if (!served && (all || !child_failed)) {
      std::fprintf(stderr, "splitserve up: %s; stopping everything\n", failure.c_str());
      exit_code = 1;
      break;
    }
    const std::chrono::milliseconds delay = policy.NextDelay();
    if (delay.count() < 0) {
      std::fprintf(stderr,
                   "splitserve up: %s; %d restarts in a row did not bring the cluster back: "
                   "giving up\n",
                   failure.c_str(), RestartPolicy::kBurstLimit);
      exit_code = 1;
      break;
    }
    if (phase == Phase::kServing) failed_at = now;
    restart_all = all || (restart_all && phase != Phase::kServing);
    std::fprintf(stderr, "splitserve up: %s; restarting %s in %.1f s (restart %d of %d in a row)\n",
                 failure.c_str(), restart_all ? "the coordinator and the workers" : "the workers",
                 std::chrono::duration<double>(delay).count(), policy.failed_in_a_row(),
                 RestartPolicy::kBurstLimit);
    std::fflush(stderr);
    sup.KillGroup("gpu");
    sup.KillGroup("expert");
    if (restart_all) sup.KillGroup("coordinator");
    unlink_segments();
    phase = Phase::kBackoff;
    restart_at = now + delay;
  }
  sup.StopAll();
  if (console != nullptr) console->Stop();  // every child has ended: the relay copies the rest
  unlink_segments();
  if (served) std::printf("splitserve up: stopped\n");
  return exit_code;
}

}  // namespace ss
