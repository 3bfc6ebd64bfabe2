// The command line of `splitserve up` (launcher.h): parsed once into a validated UpOptions.
//
// What each flag means, its values and its default are in the usage text (UpUsage, printed by
// --help), the one place that says it; the fields below are the parsed values.
//
// Parsing rules: "--name value" and "--name=value" are the same, and '_' in a name reads as '-'
// (--max_model_len is --max-model-len; a value is taken as given). --help /
// -h and --version stop the parse (the flag's field is set, nothing after it is read). An unknown
// option is an error naming it whether or not a value follows; so is a missing or bad value, and
// --api-keys (keys on the command line are refused: every local user sees argv). --log-level and
// --log-format are validated here, so a child never starts with a value it would refuse;
// --api-keys-file's file is read here (and made absolute) for the same reason.
//
// Errors: InvalidArgument naming the flag; a bad --load-format, --hf-overrides, --fp64-sums,
// --gpu-prefill-threshold or --api-keys-file value gives the status of its parser. The caller
// prints it as a usage error (exit 2).
//
// Threads: none of its own; ParseUpOptions is a pure function of argv (and the --api-keys-file
// file).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "common/cluster_defaults.h"
#include "common/gpu_prefill_flags.h"
#include "common/weight_source.h"

namespace ss {

// Sequences running at once (the cluster config's max_running); also the least
// --max-num-batched-tokens (a step gives each running sequence its one decode token).
inline constexpr int64_t kUpMaxRunning = 64;

struct UpOptions {
  std::string model, tokenizer, host = "127.0.0.1", backend = "auto", expert_workers = "auto";
  std::string isa = "auto", api_keys_file, log_dir, stage_transport = "auto", fp64_sums = "auto";
  std::string allowed_origins;  // the coordinator's --allowed_origins (CORS); "" = none
  LoadFormat load_format = LoadFormat::kAuto;
  std::string hf_overrides;      // a JSON object's text (validated), or ""
  double dummy_router_skew = 0;  // validated: finite, >= 0, > 0 only with dummy weights
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
  std::string gpu_prefill_ring_mib = "auto";  // validated: auto or MiB (ParseGpuPrefillRing)
  std::string gpu_experts = "0";              // validated: auto, a count or a fraction in (0, 1)
  std::string gpu_experts_profile;
  // Validated: seconds in [0, 86400]; unset: the GPU workers' default (10 s). Needs --gpu-experts.
  std::optional<double> gpu_experts_rebalance_s;
  // Validated: N >= 0; unset: the GPU workers' default (gpu_worker/worker_config.h).
  std::optional<int> layer_timing_every;
  int64_t max_num_batched_tokens = 0;  // 0: coord::LaunchMaxBatchTokens's default
};

// argv[0] is the command ("up"); the options follow.
absl::StatusOr<UpOptions> ParseUpOptions(int argc, char** argv);

// The text --help prints (every flag, its values and its default).
std::string UpUsage();

}  // namespace ss
