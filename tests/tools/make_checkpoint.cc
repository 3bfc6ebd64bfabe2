// make_checkpoint: writes a random-weight DeepSeek-V4 checkpoint in the hub format for any
// valid config (see checkpoint_generator.h for the init and the file layout).
//
//   make_checkpoint --config CONFIG.json --out DIR [--seed N] [--shards K] [--swiglu-limit X]
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>

#include "absl/strings/numbers.h"
#include "common/model_config.h"
#include "nlohmann/json.hpp"
#include "tests/tools/checkpoint_generator.h"

namespace {

struct Flag {
  const char* name;
  const char* help;
  std::string value;  // empty = not given
};

Flag flags[] = {
    {"--config", "HF-style config.json to generate weights for (required)", ""},
    {"--out", "output directory; created if missing (required)", ""},
    {"--seed", "weight seed (default 0)", "0"},
    {"--shards", "number of safetensors files; 1 writes model.safetensors (default 1)", "1"},
    {"--swiglu-limit", "overrides swiglu_limit in the written config.json", ""},
};

int Usage(const char* argv0, const std::string& error) {
  if (!error.empty()) std::fprintf(stderr, "make_checkpoint: %s\n", error.c_str());
  std::fprintf(stderr, "usage: %s --config CONFIG.json --out DIR [flags]\n", argv0);
  for (const Flag& f : flags) std::fprintf(stderr, "  %-15s %s\n", f.name, f.help);
  return error.empty() ? 0 : 2;
}

int Fail(const std::string& msg) {
  std::fprintf(stderr, "make_checkpoint: %s\n", msg.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") return Usage(argv[0], "");
    Flag* flag = nullptr;
    for (Flag& f : flags) flag = arg == f.name ? &f : flag;
    if (flag == nullptr) return Usage(argv[0], "unknown argument " + std::string(arg));
    if (i + 1 == argc) return Usage(argv[0], std::string(arg) + " needs a value");
    flag->value = argv[++i];
  }
  const std::string& config_path = flags[0].value;
  const std::string& out_dir = flags[1].value;
  if (config_path.empty() || out_dir.empty())
    return Usage(argv[0], "--config and --out are required");
  uint64_t seed;
  int shards;
  if (!absl::SimpleAtoi(flags[2].value, &seed))
    return Usage(argv[0], "bad --seed " + flags[2].value);
  if (!absl::SimpleAtoi(flags[3].value, &shards)) {
    return Usage(argv[0], "bad --shards " + flags[3].value);
  }

  std::ifstream in(config_path, std::ios::binary);
  if (!in) return Fail(config_path + ": cannot read");
  std::stringstream text;
  text << in.rdbuf();
  std::string config_text = text.str();
  if (!flags[4].value.empty()) {
    double limit;
    if (!absl::SimpleAtod(flags[4].value, &limit)) {
      return Usage(argv[0], "bad --swiglu-limit " + flags[4].value);
    }
    nlohmann::ordered_json j = nlohmann::ordered_json::parse(config_text, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return Fail(config_path + ": not a JSON object");
    j["swiglu_limit"] = limit;
    config_text = j.dump(2) + "\n";
  }

  absl::StatusOr<ss::ModelConfig> cfg = ss::ParseModelConfig(config_text, config_path);
  if (!cfg.ok()) return Fail(std::string(cfg.status().message()));
  const absl::Status st = ss::GenerateCheckpoint(*cfg, config_text, out_dir, seed, shards);
  if (!st.ok()) return Fail(std::string(st.message()));
  std::printf("make_checkpoint: wrote %s (seed %llu, %d shard%s)\n", out_dir.c_str(),
              static_cast<unsigned long long>(seed), shards, shards == 1 ? "" : "s");
  return 0;
}
