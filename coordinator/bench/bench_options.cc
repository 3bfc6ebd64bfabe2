#include "coordinator/bench/bench_options.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace ss::bench {
namespace {

// How many values a flag takes: none (a switch), one, or every word up to the next "--flag".
enum class Arity { kSwitch, kOne, kMany };

struct Flag {
  const char* name;
  Arity arity;
  const char* help;
  std::function<absl::Status(BenchOptions&, const std::vector<std::string>&)> set;
};

absl::Status Bad(const std::string& flag, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat("--", flag, ": ", why));
}

absl::Status ToInt(const std::string& flag, const std::string& v, int64_t min, int64_t* out) {
  if (!absl::SimpleAtoi(v, out))
    return Bad(flag, absl::StrCat("expected an integer, got '", v, "'"));
  if (*out < min) return Bad(flag, absl::StrCat("must be >= ", min, ", got ", v));
  return absl::OkStatus();
}

absl::Status ToDouble(const std::string& flag, const std::string& v, double* out) {
  if (v == "inf") {
    *out = std::numeric_limits<double>::infinity();
    return absl::OkStatus();
  }
  if (!absl::SimpleAtod(v, out) || std::isnan(*out)) {
    return Bad(flag, absl::StrCat("expected a number, got '", v, "'"));
  }
  return absl::OkStatus();
}

#define SS_INT_FLAG(NAME, FIELD, MIN, HELP)                                           \
  Flag {                                                                              \
    NAME, Arity::kOne, HELP, [](BenchOptions& o, const std::vector<std::string>& v) { \
      return ToInt(NAME, v[0], MIN, &o.FIELD);                                        \
    }                                                                                 \
  }
#define SS_STR_FLAG(NAME, FIELD, HELP)                                                \
  Flag {                                                                              \
    NAME, Arity::kOne, HELP, [](BenchOptions& o, const std::vector<std::string>& v) { \
      o.FIELD = v[0];                                                                 \
      return absl::OkStatus();                                                        \
    }                                                                                 \
  }
#define SS_SWITCH(NAME, FIELD, HELP)                                                   \
  Flag {                                                                               \
    NAME, Arity::kSwitch, HELP, [](BenchOptions& o, const std::vector<std::string>&) { \
      o.FIELD = true;                                                                  \
      return absl::OkStatus();                                                         \
    }                                                                                  \
  }

const std::vector<Flag>& Flags() {
  static const std::vector<Flag> flags = {
      SS_STR_FLAG("backend", backend,
                  "openai | vllm (default vllm): both stream OpenAI /v1/completions"),
      SS_STR_FLAG("base-url", base_url,
                  "server URL, e.g. http://127.0.0.1:8000 (instead of "
                  "--host/--port)"),
      SS_STR_FLAG("host", host, "server host (default 127.0.0.1)"),
      Flag{"port", Arity::kOne, "server port (default 8000)",
           [](BenchOptions& o, const std::vector<std::string>& v) {
             int64_t p = 0;
             if (auto s = ToInt("port", v[0], 1, &p); !s.ok()) return s;
             if (p > 65535) return Bad("port", "must be <= 65535");
             o.port = static_cast<int>(p);
             return absl::OkStatus();
           }},
      SS_STR_FLAG("endpoint", endpoint, "API path (default /v1/completions)"),
      SS_STR_FLAG("model", model,
                  "model name sent in requests (default: the first id of GET "
                  "/v1/models)"),
      SS_STR_FLAG("served-model-name", served_model_name,
                  "model name sent in requests when it differs from --model"),
      SS_STR_FLAG("tokenizer", tokenizer,
                  "tokenizer.json (or a directory holding one): random prompts draw among its "
                  "non-special ids. Without it, ids 16..999, ordinary tokens of every "
                  "DeepSeek-V4 tokenizer and of the bundled tiny model's"),
      SS_STR_FLAG("dataset-name", dataset_name,
                  "random (default) | prefix-repeat (or prefix_repetition) | custom"),
      SS_STR_FLAG("dataset-path", dataset_path,
                  "custom: a JSONL file, each line {\"prompt\": \"text\" or [ids], optional "
                  "\"output_tokens\": n}"),
      SS_INT_FLAG("num-prompts", num_prompts, 1,
                  "requests to send (default 1000); prefix-repeat: conversations, each of "
                  "--prefix-repetition-turns requests"),
      SS_INT_FLAG("random-input-len", random_input_len, 1, "random: prompt tokens (default 1024)"),
      SS_INT_FLAG("random-output-len", random_output_len, 1,
                  "random: max_tokens of each request (default 128)"),
      Flag{"random-range-ratio", Arity::kOne,
           "random: lengths uniform in [len*(1-r), len*(1+r)] (default 0.0, 0 <= r < 1)",
           [](BenchOptions& o, const std::vector<std::string>& v) {
             if (auto s = ToDouble("random-range-ratio", v[0], &o.random_range_ratio); !s.ok()) {
               return s;
             }
             if (o.random_range_ratio < 0 || o.random_range_ratio >= 1) {
               return Bad("random-range-ratio", "must be in [0, 1)");
             }
             return absl::OkStatus();
           }},
      SS_INT_FLAG("random-prefix-len", random_prefix_len, 0,
                  "random: tokens of one prefix shared by every prompt, before its own "
                  "--random-input-len (default 0)"),
      SS_INT_FLAG("prefix-repetition-prefix-len", prefix_len, 0,
                  "prefix-repeat: tokens of each shared prefix (default 256)"),
      SS_INT_FLAG("prefix-repetition-suffix-len", suffix_len, 1,
                  "prefix-repeat: tokens of each request's own suffix (default 256)"),
      SS_INT_FLAG("prefix-repetition-num-prefixes", num_prefixes, 1,
                  "prefix-repeat: distinct prefixes (default 10)"),
      SS_INT_FLAG("prefix-repetition-output-len", prefix_output_len, 1,
                  "prefix-repeat: max_tokens of each request (default 128)"),
      SS_INT_FLAG("prefix-repetition-turns", turns, 1,
                  "prefix-repeat: requests per conversation (default 1). Turn k+1 is sent when "
                  "turn k finishes; its prompt is turn k's prompt + output-len fresh ids (the "
                  "reply) + a new suffix. Conversations run concurrently"),
      SS_INT_FLAG("custom-output-len", custom_output_len, 1,
                  "custom: max_tokens of lines without output_tokens (default 256)"),
      Flag{"seed", Arity::kOne, "seed of every dataset and of the arrivals (default 0)",
           [](BenchOptions& o, const std::vector<std::string>& v) {
             int64_t s = 0;
             if (auto st = ToInt("seed", v[0], 0, &s); !st.ok()) return st;
             o.seed = static_cast<uint64_t>(s);
             return absl::OkStatus();
           }},
      Flag{"temperature", Arity::kOne, "sampling temperature (default 0: greedy)",
           [](BenchOptions& o, const std::vector<std::string>& v) {
             if (auto s = ToDouble("temperature", v[0], &o.temperature); !s.ok()) return s;
             if (o.temperature < 0) return Bad("temperature", "must be >= 0");
             return absl::OkStatus();
           }},
      SS_SWITCH("ignore-eos", ignore_eos,
                "send ignore_eos: true (output tokens are always counted from the server's "
                "usage, never assumed)"),
      Flag{"request-rate", Arity::kOne,
           "requests per second, Poisson arrivals (gamma with --burstiness); default inf: all "
           "at once",
           [](BenchOptions& o, const std::vector<std::string>& v) {
             if (auto s = ToDouble("request-rate", v[0], &o.request_rate); !s.ok()) return s;
             if (!(o.request_rate > 0)) return Bad("request-rate", "must be > 0");
             return absl::OkStatus();
           }},
      Flag{"burstiness", Arity::kOne,
           "gamma shape of the inter-arrival times (default 1.0: Poisson; < 1 burstier)",
           [](BenchOptions& o, const std::vector<std::string>& v) {
             if (auto s = ToDouble("burstiness", v[0], &o.burstiness); !s.ok()) return s;
             if (!(o.burstiness > 0) || std::isinf(o.burstiness)) {
               return Bad("burstiness", "must be a finite number > 0");
             }
             return absl::OkStatus();
           }},
      SS_INT_FLAG("max-concurrency", max_concurrency, 1,
                  "most requests in flight at once (default unlimited; at most 1000 either way, "
                  "a thread and a connection each)"),
      SS_INT_FLAG("num-warmups", num_warmups, 0,
                  "requests sent (and not measured) before the run (default 0)"),
      Flag{"request-timeout", Arity::kOne,
           "seconds before one request is ended as failed (default 3600)",
           [](BenchOptions& o, const std::vector<std::string>& v) {
             if (auto s = ToDouble("request-timeout", v[0], &o.request_timeout_s); !s.ok()) {
               return s;
             }
             if (!(o.request_timeout_s > 0)) return Bad("request-timeout", "must be > 0");
             return absl::OkStatus();
           }},
      Flag{"percentile-metrics", Arity::kOne,
           "comma-separated metrics to report percentiles of: ttft,tpot,itl,e2el (default all)",
           [](BenchOptions& o, const std::vector<std::string>& v) {
             o.percentile_metrics.clear();
             for (absl::string_view m : absl::StrSplit(v[0], ',', absl::SkipEmpty())) {
               if (m != "ttft" && m != "tpot" && m != "itl" && m != "e2el") {
                 return Bad("percentile-metrics", absl::StrCat("unknown metric '", m, "'"));
               }
               o.percentile_metrics.emplace_back(m);
             }
             return absl::OkStatus();
           }},
      Flag{"metric-percentiles", Arity::kOne,
           "comma-separated percentiles (default \"90,99\"; vLLM's default is \"99\")",
           [](BenchOptions& o, const std::vector<std::string>& v) {
             o.metric_percentiles.clear();
             for (absl::string_view m : absl::StrSplit(v[0], ',', absl::SkipEmpty())) {
               double p = 0;
               if (!absl::SimpleAtod(m, &p) || !(p >= 0 && p <= 100)) {
                 return Bad("metric-percentiles",
                            absl::StrCat("expected numbers in [0, 100], got '", m, "'"));
               }
               o.metric_percentiles.push_back(p);
             }
             return absl::OkStatus();
           }},
      Flag{"goodput", Arity::kMany,
           "SLOs as KEY:MS pairs (ttft, tpot, e2el), e.g. --goodput ttft:500 tpot:50; a "
           "request is good when it meets all of them",
           [](BenchOptions& o, const std::vector<std::string>& v) {
             for (const std::string& kv : v) {
               std::vector<std::string> parts = absl::StrSplit(kv, ':');
               double ms = 0;
               if (parts.size() != 2 || !absl::SimpleAtod(parts[1], &ms) || ms < 0) {
                 return Bad("goodput", absl::StrCat("expected KEY:MS, got '", kv, "'"));
               }
               if (parts[0] != "ttft" && parts[0] != "tpot" && parts[0] != "e2el") {
                 return Bad("goodput",
                            absl::StrCat("unknown metric '", parts[0], "' (ttft, tpot or e2el)"));
               }
               o.goodput_ms[parts[0]] = ms;
             }
             return absl::OkStatus();
           }},
      SS_SWITCH("save-result", save_result, "write the result as JSON"),
      SS_SWITCH("save-detailed", save_detailed,
                "accepted for vLLM compatibility; the per-request arrays are always written"),
      SS_STR_FLAG("result-dir", result_dir, "directory of the JSON result (default .)"),
      SS_STR_FLAG("result-filename", result_filename,
                  "file name of the JSON result (default "
                  "{backend}-{rate}qps[-concurrency{N}]-{model}-{YYYYmmdd-HHMMSS}.json)"),
      SS_STR_FLAG("label", label, "label of the run in the JSON (default: --backend)"),
      Flag{"metadata", Arity::kMany, "KEY=VALUE pairs added to the JSON result",
           [](BenchOptions& o, const std::vector<std::string>& v) {
             for (const std::string& kv : v) {
               const size_t eq = kv.find('=');
               if (eq == std::string::npos || eq == 0) {
                 return Bad("metadata", absl::StrCat("expected KEY=VALUE, got '", kv, "'"));
               }
               o.metadata.emplace_back(kv.substr(0, eq), kv.substr(eq + 1));
             }
             return absl::OkStatus();
           }},
      SS_SWITCH("disable-tqdm", disable_tqdm, "no progress bar (it shows only on a terminal)"),
      SS_SWITCH("help", help, "this text"),
  };
  return flags;
}

#undef SS_INT_FLAG
#undef SS_STR_FLAG
#undef SS_SWITCH

const Flag* Find(const std::string& name) {
  for (const Flag& f : Flags()) {
    if (name == f.name) return &f;
  }
  return nullptr;
}

absl::Status Validate(BenchOptions& o) {
  if (o.backend != "openai" && o.backend != "vllm") {
    return Bad("backend", absl::StrCat("'", o.backend,
                                       "' is not supported (openai or vllm: OpenAI completions "
                                       "streaming)"));
  }
  if (o.dataset_name == "prefix_repetition") o.dataset_name = "prefix-repeat";
  if (o.dataset_name != "random" && o.dataset_name != "prefix-repeat" &&
      o.dataset_name != "custom") {
    return Bad("dataset-name", absl::StrCat("unknown dataset '", o.dataset_name,
                                            "' (random, prefix-repeat or custom)"));
  }
  if (o.dataset_name == "custom" && o.dataset_path.empty()) {
    return Bad("dataset-path", "required with --dataset-name custom");
  }
  if (!o.base_url.empty() && o.base_url.rfind("http://", 0) != 0) {
    return Bad("base-url", absl::StrCat("expected http://HOST[:PORT], got '", o.base_url, "'"));
  }
  if (o.endpoint.empty() || o.endpoint[0] != '/') {
    return Bad("endpoint", "must start with '/'");
  }
  if (o.endpoint.find("chat") != std::string::npos) {
    return Bad("endpoint", "only the completions API is supported (e.g. /v1/completions)");
  }
  return absl::OkStatus();
}

}  // namespace

std::string BenchOptions::BaseUrl() const {
  if (!base_url.empty()) {
    std::string b = base_url;
    while (!b.empty() && b.back() == '/') b.pop_back();
    return b;
  }
  return absl::StrCat("http://", host, ":", port);
}

absl::StatusOr<BenchOptions> ParseBenchOptions(int argc, char** argv, const char* env_api_key) {
  BenchOptions o;
  if (env_api_key) o.api_key = env_api_key;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "-h") arg = "--help";
    if (arg.rfind("--", 0) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", arg, "'"));
    }
    std::string name = arg.substr(2);
    std::vector<std::string> values;
    if (const size_t eq = name.find('='); eq != std::string::npos) {
      values.push_back(name.substr(eq + 1));
      name = name.substr(0, eq);
    }
    std::replace(name.begin(), name.end(), '_', '-');
    const Flag* f = Find(name);
    if (!f) return absl::InvalidArgumentError(absl::StrCat("unknown flag '--", name, "'"));
    if (f->arity == Arity::kSwitch && !values.empty()) return Bad(name, "takes no value");
    if (f->arity == Arity::kOne && values.empty()) {
      if (i + 1 >= argc) return Bad(name, "expects a value");
      values.push_back(argv[++i]);
    }
    if (f->arity == Arity::kMany) {
      while (i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0) {
        values.push_back(argv[++i]);
      }
      if (values.empty()) return Bad(name, "expects one or more values");
    }
    if (absl::Status s = f->set(o, values); !s.ok()) return s;
  }
  if (o.help) return o;
  if (absl::Status s = Validate(o); !s.ok()) return s;
  return o;
}

std::string BenchServeUsage() {
  std::ostringstream out;
  out << "usage: splitserve bench serve [flags]\n"
         "Load an OpenAI-compatible server with streamed /v1/completions requests (prompts as "
         "token ids, so\nno tokenizer is needed) and report throughput and latency as `vllm "
         "bench serve` does (same\nflag names and JSON keys). The API key is OPENAI_API_KEY's "
         "value, if set.\n\nflags:\n";
  for (const Flag& f : Flags()) {
    std::string head = absl::StrCat("  --", f.name);
    if (f.arity == Arity::kOne) absl::StrAppend(&head, " V");
    if (f.arity == Arity::kMany) absl::StrAppend(&head, " V...");
    out << head;
    if (head.size() < 36) {
      out << std::string(36 - head.size(), ' ');
    } else {
      out << "\n" << std::string(36, ' ');
    }
    // The help text, wrapped at 100 columns under the flag names.
    size_t col = 36;
    for (absl::string_view word : absl::StrSplit(f.help, ' ', absl::SkipEmpty())) {
      if (col > 36 && col + 1 + word.size() > 100) {
        out << "\n" << std::string(36, ' ');
        col = 36;
      } else if (col > 36) {
        out << ' ';
        ++col;
      }
      out << word;
      col += word.size();
    }
    out << "\n";
  }
  out << "\nexamples:\n"
         "  # decode: 64 requests, 8 at a time, 128-token prompts, 256 tokens each\n"
         "  splitserve bench serve --port 8000 --num-prompts 64 --max-concurrency 8 \\\n"
         "      --random-input-len 128 --random-output-len 256 --save-result\n"
         "  # prefill: one 32K-token prompt, one output token (its TTFT; total_token_throughput)\n"
         "  splitserve bench serve --port 8000 --num-prompts 1 --max-concurrency 1 \\\n"
         "      --random-input-len 32768 --random-output-len 1 --save-result\n"
         "  # prefix caching: 10 shared 4K prefixes, 3-turn conversations, 4 at a time\n"
         "  splitserve bench serve --port 8000 --dataset-name prefix-repeat --num-prompts 40 \\\n"
         "      --prefix-repetition-prefix-len 4096 --prefix-repetition-turns 3 --max-concurrency "
         "4\n";
  return out.str();
}

}  // namespace ss::bench
