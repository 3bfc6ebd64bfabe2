#include "coordinator/up_options.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <initializer_list>
#include <iterator>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "common/dummy_weights.h"
#include "common/fp64_sums.h"
#include "common/logging.h"
#include "coordinator/api_keys.h"

namespace ss {
namespace {

constexpr char kUsage[] =
    "usage: splitserve up [--model DIR] [--tokenizer FILE] [--host H] [--port P]\n"
    "                     [--load-format auto|safetensors|dummy] [--hf-overrides JSON]\n"
    "                     [--dummy-router-skew S]\n"
    "                     [--backend auto|cpu|cuda] [--stages N] [--tp N]\n"
    "                     [--expert-workers N|auto]\n"
    "                     [--isa auto|scalar|avx2|avx512|amx] [--kv-tokens N|auto]\n"
    "                     [--max-model-len N] [--api-keys-file FILE] [--allowed-origins LIST]\n"
    "                     [--stage-transport auto|grpc|nccl] [--fp64-sums auto|on|off]\n"
    "                     [--max-num-batched-tokens N]\n"
    "                     [--gpu-prefill-threshold auto|off|N]\n"
    "                     [--gpu-prefill-ring-mib auto|MIB]\n"
    "                     [--gpu-experts auto|N|FRACTION] [--gpu-experts-profile FILE]\n"
    "                     [--gpu-experts-rebalance-s S] [--layer-timing-every N]\n"
    "                     [--enable-prefix-caching | --no-enable-prefix-caching]\n"
    "                     [--ready-timeout-s S] [--log-dir DIR]\n"
    "                     [--log-level LEVEL] [--log-format text|json] [--version]\n"
    "  Starts the coordinator, the GPU workers and one expert worker per NUMA node on this\n"
    "  machine, waits until the API is ready and serves until Ctrl-C / SIGTERM.\n"
    "  Without --model: the bundled tiny model (random weights: its text is noise).\n"
    "  --load-format dummy: every weight generated in memory (deterministic random values);\n"
    "  DIR needs only config.json (and tokenizer.json). auto (default) and safetensors read\n"
    "  DIR's safetensors.\n"
    "  --dummy-router-skew S (--load-format dummy only): S >= 0 adds -S*ln(1+r) to the gate\n"
    "  bias of the expert of rank r in a fixed pseudo-random order per layer, so each\n"
    "  learned-routing layer (not the hash-routed first layers) prefers its own hot experts;\n"
    "  S = 0.2 gives the hottest quarter about 2/3 of the choices with 64 experts. Default 0.\n"
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
    "  routed experts to the GPU: 8192 at any --max-model-len (a step's indexer scores go in\n"
    "  row slices of at most 2 GiB); else 2048.\n"
    "  --gpu-prefill-threshold (cuda): steps of at least this many tokens stream their routed\n"
    "  experts host -> GPU instead of computing them on the expert workers: auto (default;\n"
    "  from the measured H2D bandwidth and CPU expert rate), off (never), or N.\n"
    "  --gpu-prefill-ring-mib auto|MIB (cuda): each GPU's staging ring for the streamed\n"
    "  experts (0: no streamed path), in slots of ~256 MiB; a layer's attention frees no slot,\n"
    "  so a ring of about its attention's copies (e.g. 3072 for 8K chunks on a 3090) keeps\n"
    "  the copies going through it. auto (default): 3072, 2048 or %lld, the largest that\n"
    "  leaves the KV pool room for --max-model-len tokens; %lld where --gpu-experts is not 0\n"
    "  (the experts keep that memory) or the pool has a given size (--kv-tokens N, or GPU\n"
    "  workers sharing a GPU).\n"
    "  --gpu-experts auto|N|FRACTION (cuda): routed experts each GPU worker keeps resident for\n"
    "  decode, over its stage's layers (a fraction in (0, 1) of them), computed there instead of\n"
    "  on the expert workers; auto: as many as fit once each GPU's KV pool keeps room for\n"
    "  --max-model-len tokens (or --kv-tokens N) beside the compressor states, the workspaces,\n"
    "  the streamed ring and the reserve (the GPU worker's memory plan prints the count; one\n"
    "  GPU worker per GPU);\n"
    "  --gpu-experts-profile FILE: routing counts (JSON) that pick the hottest, else each layer\n"
    "  keeps an equal share. Default 0 (none). --gpu-experts-rebalance-s S: every S seconds\n"
    "  (default 10; 0: never) up to 8 resident experts are replaced by ones the recent routing\n"
    "  chose more often, within their layer, while serving.\n"
    "  --layer-timing-every N: the GPU workers time the layers of every Nth step, and of every\n"
    "  step with a prompt chunk of 64 or more tokens, for splitserve:layer_latency_seconds\n"
    "  (default 16; 1: every step; 0: none).\n"
    "  --enable-prefix-caching (default) / --no-enable-prefix-caching: reuse the KV of prompt\n"
    "  prefixes (whole blocks) that earlier requests computed; usage.prompt_tokens_details.\n"
    "  cached_tokens reports the tokens a request took from the cache.\n"
    "  --api-keys-file FILE: API keys clients must send (one a line or comma-separated); or\n"
    "  the SPLITSERVE_API_KEYS environment variable. Keys on the command line are refused.\n"
    "  --allowed-origins LIST: CORS, the origins (comma-separated, * for any) browser pages may\n"
    "  call the API from; default none.\n"
    "  --log-level trace|debug|info|warning|error|critical|off, --log-format text|json: the\n"
    "  started processes' logs (json: one object a line); default info, text.\n";

// Sets `*field` to `value` when it is an integer in [min, max], else InvalidArgument
// "<flag> <value><expected>".
template <typename T>
absl::Status SetIntIn(absl::string_view flag, const std::string& value, int64_t min, int64_t max,
                      absl::string_view expected, T* field) {
  int64_t v = 0;
  if (!absl::SimpleAtoi(value, &v) || v < min || v > max) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " ", value, expected));
  }
  *field = static_cast<T>(v);
  return absl::OkStatus();
}

// Sets `*field` to `value` when it is one of `choices`, else InvalidArgument
// "<flag> <value>: expected <expected>".
absl::Status SetChoice(absl::string_view flag, const std::string& value,
                       std::initializer_list<absl::string_view> choices, absl::string_view expected,
                       std::string* field) {
  if (std::find(choices.begin(), choices.end(), value) == choices.end()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " ", value, ": expected ", expected));
  }
  *field = value;
  return absl::OkStatus();
}

// --log-level / --log-format: sets `*field` to `value` when `parsed` (common/logging.h's verdict on
// it) is OK, else InvalidArgument "<flag> <its message>".
absl::Status SetLogOption(absl::string_view flag, const absl::Status& parsed,
                          const std::string& value, std::string* field) {
  if (!parsed.ok()) return absl::InvalidArgumentError(absl::StrCat(flag, " ", parsed.message()));
  *field = value;
  return absl::OkStatus();
}

// Sets the option's text as given.
template <std::string UpOptions::*field>
absl::Status SetText(const std::string& value, UpOptions& o) {
  o.*field = value;
  return absl::OkStatus();
}

// An option of `up` that takes a value: its name and what sets it from the value.
struct ValueOption {
  absl::string_view name;
  absl::Status (*set)(const std::string& value, UpOptions& o);
};

// Every option that takes a value: any other name is an unknown option, whether or not a value
// follows it.
constexpr ValueOption kValueOptions[] = {
    {"--model", SetText<&UpOptions::model>},
    {"--tokenizer", SetText<&UpOptions::tokenizer>},
    {"--load-format",
     [](const std::string& v, UpOptions& o) -> absl::Status {
       absl::StatusOr<LoadFormat> f = ParseLoadFormat(v);
       if (!f.ok()) return f.status();
       o.load_format = *f;
       return absl::OkStatus();
     }},
    {"--hf-overrides",
     [](const std::string& v, UpOptions& o) -> absl::Status {
       if (absl::Status s = ValidateHfOverrides(v); !s.ok()) return s;
       o.hf_overrides = v;
       return absl::OkStatus();
     }},
    {"--dummy-router-skew",
     [](const std::string& v, UpOptions& o) -> absl::Status {
       double x = 0;
       if (!absl::SimpleAtod(v, &x)) {
         return absl::InvalidArgumentError(
             absl::StrCat("--dummy-router-skew ", v, ": must be a finite number >= 0"));
       }
       if (absl::Status s = ValidateDummyRouterSkew(x); !s.ok()) return s;
       o.dummy_router_skew = x;
       return absl::OkStatus();
     }},
    {"--host", SetText<&UpOptions::host>},
    {"--port",
     [](const std::string& v, UpOptions& o) {
       return SetIntIn("--port", v, 0, 65535, " is not a port", &o.port);
     }},
    {"--backend",
     [](const std::string& v, UpOptions& o) {
       return SetChoice("--backend", v, {"auto", "cpu", "cuda"}, "auto, cpu or cuda", &o.backend);
     }},
    {"--stages",
     [](const std::string& v, UpOptions& o) {
       o.stages_given = true;  // an error fails the whole parse
       return SetIntIn("--stages", v, 1, 64, ": expected 1..64", &o.stages);
     }},
    {"--tp", [](const std::string& v,
                UpOptions& o) { return SetIntIn("--tp", v, 1, 64, ": expected 1..64", &o.tp); }},
    {"--stage-transport",
     [](const std::string& v, UpOptions& o) {
       return SetChoice("--stage-transport", v, {"auto", "grpc", "nccl"}, "auto, grpc or nccl",
                        &o.stage_transport);
     }},
    {"--fp64-sums",
     [](const std::string& v, UpOptions& o) -> absl::Status {
       if (absl::Status s = ss::gpu::ParseFp64Sums(v).status(); !s.ok()) return s;
       o.fp64_sums = v;
       return absl::OkStatus();
     }},
    {"--expert-workers",
     [](const std::string& v, UpOptions& o) -> absl::Status {
       int64_t n = 0;
       if (v != "auto") {
         absl::Status s = SetIntIn("--expert-workers", v, 0, 64, ": expected auto or 0..64", &n);
         if (!s.ok()) return s;
       }
       o.expert_workers = v;
       return absl::OkStatus();
     }},
    {"--isa", SetText<&UpOptions::isa>},
    {"--kv-tokens",
     [](const std::string& v, UpOptions& o) {
       if (v == "auto") {
         o.kv_tokens = 0;
         return absl::OkStatus();
       }
       return SetIntIn("--kv-tokens", v, 1, int64_t{1} << 40,
                       ": expected a positive number or auto", &o.kv_tokens);
     }},
    {"--max-model-len",
     [](const std::string& v, UpOptions& o) {
       return SetIntIn("--max-model-len", v, 1, int64_t{1} << 30, ": expected a positive number",
                       &o.max_model_len);
     }},
    {"--max-num-batched-tokens",
     [](const std::string& v, UpOptions& o) {
       // The cluster config needs max_batch_tokens >= max_running (one decode token each).
       return SetIntIn("--max-num-batched-tokens", v, kUpMaxRunning, int64_t{1} << 20,
                       absl::StrCat(": expected ", kUpMaxRunning, "..", int64_t{1} << 20),
                       &o.max_num_batched_tokens);
     }},
    {"--gpu-prefill-threshold",
     [](const std::string& v, UpOptions& o) -> absl::Status {
       const absl::StatusOr<ss::gpu::GpuPrefillThreshold> t = ss::gpu::ParseGpuPrefillThreshold(v);
       if (!t.ok()) return t.status();
       o.gpu_prefill_threshold = t->ToString();
       return absl::OkStatus();
     }},
    {"--gpu-prefill-ring-mib",
     [](const std::string& v, UpOptions& o) {
       const absl::StatusOr<ss::gpu::GpuPrefillRing> r =
           ss::gpu::ParseGpuPrefillRing(v, "--gpu-prefill-ring-mib");
       if (!r.ok()) return r.status();
       o.gpu_prefill_ring_mib = r->ToString();
       return absl::OkStatus();
     }},
    {"--gpu-experts",
     [](const std::string& v, UpOptions& o) -> absl::Status {
       double x = 0;
       if (v != "auto" && (!absl::SimpleAtod(v, &x) || !(x >= 0) || !std::isfinite(x) ||
                           (x >= 1 && x != std::floor(x)))) {
         return absl::InvalidArgumentError(absl::StrCat(
             "--gpu-experts ", v, ": expected auto, a number of experts or a fraction in (0, 1)"));
       }
       o.gpu_experts = v;
       return absl::OkStatus();
     }},
    {"--gpu-experts-profile",
     [](const std::string& v, UpOptions& o) {
       o.gpu_experts_profile = v;
       return absl::OkStatus();
     }},
    {"--gpu-experts-rebalance-s",
     [](const std::string& v, UpOptions& o) -> absl::Status {
       double x = 0;
       if (!absl::SimpleAtod(v, &x) || !(x >= 0) || x > 86400) {
         return absl::InvalidArgumentError(absl::StrCat(
             "--gpu-experts-rebalance-s ", v, ": expected seconds in [0, 86400] (0: never)"));
       }
       o.gpu_experts_rebalance_s = x;
       return absl::OkStatus();
     }},
    {"--layer-timing-every",
     [](const std::string& v, UpOptions& o) -> absl::Status {
       int x = 0;
       if (!absl::SimpleAtoi(v, &x) || x < 0) {
         return absl::InvalidArgumentError(absl::StrCat(
             "--layer-timing-every ", v, ": expected N >= 0 (1: every step; 0: none)"));
       }
       o.layer_timing_every = x;
       return absl::OkStatus();
     }},
    {"--api-keys",
     [](const std::string&, UpOptions&) {
       return absl::InvalidArgumentError(
           absl::StrCat("--api-keys on the command line is refused (every local user sees argv): "
                        "put the keys in a file for --api-keys-file FILE or in the ",
                        kApiKeysEnv, " environment variable"));
     }},
    {"--api-keys-file",
     [](const std::string& v, UpOptions& o) -> absl::Status {
       if (absl::Status s = ReadApiKeysFile(v).status(); !s.ok()) return s;
       o.api_keys_file = std::filesystem::absolute(v).string();
       return absl::OkStatus();
     }},
    {"--allowed-origins", SetText<&UpOptions::allowed_origins>},
    {"--ready-timeout-s",
     [](const std::string& v, UpOptions& o) {
       return SetIntIn("--ready-timeout-s", v, 1, 86400, "", &o.ready_timeout_s);
     }},
    {"--log-dir", SetText<&UpOptions::log_dir>},
    {"--log-level",
     [](const std::string& v, UpOptions& o) {
       return SetLogOption("--log-level", ParseLogLevel(v).status(), v, &o.log_level);
     }},
    {"--log-format",
     [](const std::string& v, UpOptions& o) {
       return SetLogOption("--log-format", ParseLogFormat(v).status(), v, &o.log_format);
     }},
};

}  // namespace

absl::StatusOr<UpOptions> ParseUpOptions(int argc, char** argv) {
  UpOptions o;
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
    const size_t eq = name.find('=');
    if (eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    for (char& c : name) c = c == '_' ? '-' : c;  // --kv_tokens is --kv-tokens; values stay
    if (name == "--enable-prefix-caching" || name == "--no-enable-prefix-caching") {
      if (eq != std::string::npos) {
        return absl::InvalidArgumentError(absl::StrCat(name, " takes no value"));
      }
      o.prefix_caching = name == "--enable-prefix-caching";  // vLLM's flags, without a value
      continue;
    }
    const ValueOption* option = std::find_if(std::begin(kValueOptions), std::end(kValueOptions),
                                             [&](const ValueOption& v) { return v.name == name; });
    if (option == std::end(kValueOptions)) {
      return absl::InvalidArgumentError(absl::StrCat("unknown option '", name, "'"));
    }
    if (eq == std::string::npos) {
      if (i + 1 >= argc) return absl::InvalidArgumentError(absl::StrCat(name, " needs a value"));
      value = argv[++i];
    }
    if (absl::Status s = option->set(value, o); !s.ok()) return s;
  }
  if (o.dummy_router_skew > 0 && o.load_format != LoadFormat::kDummy) {
    return absl::InvalidArgumentError("--dummy-router-skew needs --load-format dummy");
  }
  return o;
}

std::string UpUsage() {
  return absl::StrFormat(kUsage, static_cast<long long>(ss::gpu::kBaseGpuPrefillRingMiB),
                         static_cast<long long>(ss::gpu::kBaseGpuPrefillRingMiB));
}

}  // namespace ss
