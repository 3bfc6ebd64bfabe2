// splitserve-coordinator: the cluster's one coordinator (ARCHITECTURE.md "Processes"): the
// OpenAI-compatible gateway (openai_server.h) in front of the ClusterEngine (cluster_engine.h),
// and the control plane (control_service.h) GPU workers register with.
//
// Start-up: parse and validate every flag, load the model config, the tokenizer and the cluster
// config (any error: one line naming the file or flag, exit 2 for usage, 1 otherwise); serve the
// control plane and the HTTP API at once. GET /health answers 200 while the process serves HTTP
// (liveness); GET /ready answers 200 only while a complete pipeline serves (ClusterEngine::Ready:
// 503 until every GPU worker is registered and ready, while the cluster re-forms after a worker
// died, and while a micro-batch's workers have made no progress for --stall_timeout_s:
// cluster_engine.h "Stalls"). Every gRPC call in or out carries the cluster token
// (--cluster_token_file or $SPLITSERVE_CLUSTER_TOKEN; proto/cluster_credential.h): without one
// (and without --insecure_cluster) the coordinator refuses to start. --ports_file writes
// {"http": P, "control": Q} once both are bound.
//
// SIGTERM / SIGINT: drain — new requests get 503, running ones finish (up to --drain_timeout_s),
// then everything stops and the process exits 0.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/build_info.h"
#include "common/cluster_defaults.h"
#include "common/file_write.h"
#include "common/layer_list.h"
#include "common/main_flags.h"
#include "common/metrics/metrics.h"
#include "common/model_config.h"
#include "common/stop_signals.h"
#include "common/weight_source.h"
#include "coordinator/api_keys.h"
#include "coordinator/cluster_config.h"
#include "coordinator/cluster_engine.h"
#include "coordinator/control_service.h"
#include "coordinator/openai_server.h"
#include "coordinator/tokenizer.h"
#include "grpcpp/grpcpp.h"
#include "nlohmann/json.hpp"
#include "proto/cluster_credential.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, model, "",
          "checkpoint directory (its config.json; tokenizer.json unless "
          "--tokenizer is given)");
ABSL_FLAG(std::string, tokenizer, "", "tokenizer.json; default: MODEL/tokenizer.json");
ABSL_FLAG(std::string, hf_overrides, "",
          "a JSON object merged into --model's config.json at start (vLLM's --hf-overrides); "
          "every process of the cluster must be given the same");
ABSL_FLAG(std::string, cluster, "", "cluster config (JSON, coordinator/cluster_config.h)");
ABSL_FLAG(std::string, host, "127.0.0.1", "HTTP API address");
ABSL_FLAG(int, port, ss::kDefaultHttpPort, "HTTP API port (0 = any free port)");
ABSL_FLAG(std::string, control_listen, "127.0.0.1:50050",
          "gRPC control-plane address GPU workers register with (port 0 = any free port)");
ABSL_FLAG(std::string, api_keys_file, "",
          "file of API keys clients must send as 'Authorization: Bearer KEY' (coordinator/"
          "api_keys.h: one a line or comma-separated). Or the environment variable "
          "SPLITSERVE_API_KEYS; neither = no authentication. Keys on the command line are refused");
ABSL_FLAG(std::string, cluster_token_file, "",
          "file holding the cluster token every gRPC call between the cluster's processes carries "
          "(0600; proto/cluster_credential.h). Environment mirror: SPLITSERVE_CLUSTER_TOKEN");
ABSL_FLAG(bool, insecure_cluster, false,
          "run the control plane without a cluster token: any process that can reach it may "
          "register, heartbeat and read the cluster's layout (trusted single-user machines only)");
ABSL_FLAG(std::string, ports_file, "", "write {\"http\": P, \"control\": Q} here once bound");
ABSL_FLAG(int, drain_timeout_s, 30, "on SIGTERM, seconds to let running requests finish");
ABSL_FLAG(int, step_timeout_s, 120,
          "a micro-batch whose GPU workers make no progress this long fails the cluster (a "
          "micro-batch may take longer while its workers keep working)");
ABSL_FLAG(int, stall_timeout_s, 10,
          "a micro-batch whose GPU workers make no progress this long turns GET /ready 503 (a "
          "worker is stopped or hung) until it is answered, progresses, or fails at "
          "--step_timeout_s; both must be at least twice the cluster's heartbeat_interval_ms");
ABSL_FLAG(int, ready_timeout_s, 600, "seconds a GPU worker may take to load before it is failed");
ABSL_FLAG(std::vector<std::string>, allowed_origins, {},
          "CORS: origins browsers may call the API from (comma-separated; * = any). Default none "
          "(vLLM's is *: any web page the user opens could then call a local server)");
ABSL_FLAG(bool, allow_credentials, false, "CORS: allow credentials (cookies, Authorization)");
ABSL_FLAG(std::vector<std::string>, allowed_methods, {"*"}, "CORS: allowed methods");
ABSL_FLAG(std::vector<std::string>, allowed_headers, {"*"}, "CORS: allowed request headers");
ABSL_FLAG(bool, disable_log_stats, false,
          "no periodic engine statistics in the log (by default a line every 10 s while busy)");

namespace ss::coord {
namespace {

constexpr char kName[] = "splitserve-coordinator";

int Fail(int code, const std::string& message) {
  std::fprintf(stderr, "%s: %s\n", kName, message.c_str());
  return code;
}

// Keys in argv are visible to every local user (ps): --api_keys is refused, not parsed.
bool HasArgvApiKeys(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const absl::string_view a = argv[i];
    if (a == "--") return false;
    for (absl::string_view name : {"--api_keys", "-api_keys"}) {
      if (a == name || absl::StartsWith(a, absl::StrCat(name, "="))) return true;
    }
  }
  return false;
}

// The API keys from --api_keys_file or SPLITSERVE_API_KEYS (at most one); none: empty.
absl::StatusOr<std::vector<std::string>> LoadApiKeys() {
  const std::string file = absl::GetFlag(FLAGS_api_keys_file);
  const char* env = std::getenv(kApiKeysEnv);
  if (!file.empty() && env != nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("--api_keys_file and ", kApiKeysEnv, " are both set: give one"));
  }
  if (!file.empty()) return ReadApiKeysFile(file);
  if (env != nullptr) return ParseApiKeys(env, kApiKeysEnv);
  return std::vector<std::string>{};
}

int Run(int argc, char** argv) {
  NormalizeFlagDashes(argc, argv);
  if (HasArgvApiKeys(argc, argv)) {
    return Fail(2, absl::StrCat("--api-keys on the command line is refused (every local user sees "
                                "argv): put the keys in a file for --api-keys-file FILE or in the ",
                                kApiKeysEnv, " environment variable"));
  }
  absl::SetProgramUsageMessage("the splitserve coordinator: OpenAI API + cluster control plane");
  InitFlagsUsage(kName);
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (rest.size() > 1) return Fail(2, absl::StrCat("unexpected argument '", rest[1], "'"));
  if (absl::Status s = ApplyLogFlags(kName); !s.ok()) return Fail(2, std::string(s.message()));
  const std::string model_dir = absl::GetFlag(FLAGS_model);
  const std::string cluster_path = absl::GetFlag(FLAGS_cluster);
  if (model_dir.empty()) return Fail(2, "--model DIR is required");
  if (cluster_path.empty()) return Fail(2, "--cluster FILE is required");
  const std::string hf_overrides = absl::GetFlag(FLAGS_hf_overrides);
  if (absl::Status s = ValidateHfOverrides(hf_overrides); !s.ok()) {
    return Fail(2, std::string(s.message()));
  }
  const int port = absl::GetFlag(FLAGS_port);
  if (port < 0 || port > 65535) return Fail(2, absl::StrCat("--port ", port, " is not a port"));
  if (absl::GetFlag(FLAGS_drain_timeout_s) < 0 || absl::GetFlag(FLAGS_step_timeout_s) < 1 ||
      absl::GetFlag(FLAGS_ready_timeout_s) < 1 || absl::GetFlag(FLAGS_stall_timeout_s) < 1) {
    return Fail(2,
                "--drain_timeout_s must be >= 0, --step_timeout_s, --stall_timeout_s and "
                "--ready_timeout_s >= 1");
  }
  absl::StatusOr<std::vector<std::string>> api_keys = LoadApiKeys();
  if (!api_keys.ok()) return Fail(2, std::string(api_keys.status().message()));

  absl::StatusOr<ClusterCredential> credential = ClusterCredential::Load(
      absl::GetFlag(FLAGS_cluster_token_file), absl::GetFlag(FLAGS_insecure_cluster));
  if (!credential.ok()) return Fail(2, std::string(credential.status().message()));
  if (credential->insecure()) {
    spdlog::warn("{}: --insecure_cluster: the control plane accepts unauthenticated calls", kName);
  }

  absl::StatusOr<ModelConfig> model =
      LoadModelConfig(WeightSource{.model_dir = model_dir, .hf_overrides = hf_overrides});
  if (!model.ok()) return Fail(1, std::string(model.status().message()));
  const std::string tok_path = absl::GetFlag(FLAGS_tokenizer).empty()
                                   ? model_dir + "/tokenizer.json"
                                   : absl::GetFlag(FLAGS_tokenizer);
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::Load(tok_path);
  if (!tokenizer.ok()) return Fail(1, std::string(tokenizer.status().message()));
  if ((*tokenizer)->vocab_size() > model->vocab_size) {
    return Fail(1,
                absl::StrCat(tok_path, ": ", (*tokenizer)->vocab_size(),
                             " tokens do not fit the model's vocabulary of ", model->vocab_size));
  }
  absl::StatusOr<ClusterConfig> cluster = LoadClusterConfig(cluster_path, *model);
  if (!cluster.ok()) return Fail(1, std::string(cluster.status().message()));
  metrics::Metrics registry;
  const int64_t max_model_len = MaxModelLen(*cluster, *model);
  prometheus::Histogram& iteration_tokens =
      registry.Histogram("iteration_tokens_total", "Histogram of number of tokens per engine_step.",
                         {{"model_name", cluster->model_name}},
                         metrics::Buckets125(static_cast<double>(max_model_len)));
  const char* step_help =
      "Histogram of a micro-batch's seconds: from its plan to the workers' last answer "
      "(round_trip), and the sampling worker's own time on it (worker).";
  prometheus::Histogram& step_round_trip =
      registry.Histogram("engine_step_seconds", step_help,
                         {{"model_name", cluster->model_name}, {"part", "round_trip"}});
  prometheus::Histogram& step_worker = registry.Histogram(
      "engine_step_seconds", step_help, {{"model_name", cluster->model_name}, {"part", "worker"}});
  ClusterEngineOptions eo;
  eo.on_step_tokens = [&iteration_tokens](int64_t n) {
    iteration_tokens.Observe(static_cast<double>(n));
  };
  eo.on_step_done = [&step_round_trip, &step_worker](double round_trip_s, double worker_s) {
    step_round_trip.Observe(round_trip_s);
    step_worker.Observe(worker_s);
  };
  eo.step_timeout = absl::Seconds(absl::GetFlag(FLAGS_step_timeout_s));
  eo.ready_timeout = absl::Seconds(absl::GetFlag(FLAGS_ready_timeout_s));
  eo.stall_timeout = absl::Seconds(absl::GetFlag(FLAGS_stall_timeout_s));
  if (absl::Status s = CheckEngineOptions(eo, *cluster); !s.ok()) {
    return Fail(2, absl::StrCat("--stall_timeout_s, --step_timeout_s: ", s.message()));
  }

  // Stop signals are taken by WaitForStopSignal below: block them before any thread starts.
  BlockStopSignals(Sigpipe::kIgnore);

  spdlog::info("{}: model {} ({} layers), cluster {} ({} stages x TP {}, {} expert workers)", kName,
               model_dir, model->n_layers, cluster_path, cluster->stages.size(),
               cluster->stages.front().workers.size(), cluster->expert_workers.size());

  ControlService control(*cluster, *credential);
  int control_port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(absl::GetFlag(FLAGS_control_listen), grpc::InsecureServerCredentials(),
                           &control_port);
  builder.RegisterService(&control);
  std::unique_ptr<grpc::Server> control_server = builder.BuildAndStart();
  if (!control_server || control_port == 0) {
    return Fail(
        1, absl::StrCat("cannot serve the control plane on ", absl::GetFlag(FLAGS_control_listen)));
  }

  ClusterEngine engine(control, *model, eo);
  engine.Start();

  GatewayConfig gc;
  gc.model_name = cluster->model_name;
  gc.api_keys = *std::move(api_keys);
  gc.max_context_tokens = static_cast<int32_t>(max_model_len);
  gc.model_vocab_size = static_cast<int32_t>(model->vocab_size);
  gc.metrics = &registry;
  gc.share_prompt_prefill = cluster->enable_prefix_caching;
  gc.version = absl::StrCat(GetBuildInfo().version, " (commit ", GetBuildInfo().commit, ")");
  gc.allowed_origins = absl::GetFlag(FLAGS_allowed_origins);
  gc.allow_credentials = absl::GetFlag(FLAGS_allow_credentials);
  gc.allowed_methods = absl::GetFlag(FLAGS_allowed_methods);
  gc.allowed_headers = absl::GetFlag(FLAGS_allowed_headers);
  gc.log_stats_interval_s = absl::GetFlag(FLAGS_disable_log_stats) ? 0 : 10;
  gc.max_sequence_tokens = [&engine] { return engine.MaxSequenceTokens(); };
  gc.engine_gauges = [&engine] {
    const ss::coord::ClusterEngine::PrefixCacheCounters c = engine.PrefixCache();
    EngineGauges g;
    g.kv_usage = engine.KvUsage();
    g.running = engine.NumRunning();
    g.waiting = engine.NumWaiting();
    g.preemptions = engine.NumPreemptions();
    g.prefix_queries = c.queries;
    g.prefix_hits = c.hits;
    g.prefix_blocks = c.blocks;
    return g;
  };
  OpenAiServer gateway(gc, **tokenizer, engine);
  absl::StatusOr<int> http_port = gateway.Start(absl::GetFlag(FLAGS_host), port);
  if (!http_port.ok()) {
    engine.Stop();
    control.Shutdown();
    control_server->Shutdown();
    return Fail(1, std::string(http_port.status().message()));
  }
  spdlog::info("{}: HTTP API on http://{}:{}, control plane on port {}", kName,
               absl::GetFlag(FLAGS_host), *http_port, control_port);
  if (!absl::GetFlag(FLAGS_ports_file).empty()) {
    const absl::Status w = WriteFileAtomically(
        absl::GetFlag(FLAGS_ports_file),
        nlohmann::json{{"http", *http_port}, {"control", control_port}}.dump() + "\n");
    if (!w.ok()) spdlog::warn("{}: --ports_file: {}", kName, std::string(w.message()));
  }

  const int sig = WaitForStopSignal();
  spdlog::info("{}: signal {}: draining (up to {} s)", kName, sig,
               absl::GetFlag(FLAGS_drain_timeout_s));
  engine.BeginDrain();
  if (!engine.WaitIdle(absl::Seconds(absl::GetFlag(FLAGS_drain_timeout_s)))) {
    spdlog::warn("{}: drain timed out; cancelling the remaining requests", kName);
  }
  gateway.Stop();
  engine.Stop();
  control.Shutdown();
  control_server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  spdlog::info("{}: stopped", kName);
  return 0;
}

}  // namespace
}  // namespace ss::coord

int main(int argc, char** argv) { return ss::coord::Run(argc, argv); }
