// Where a process's model comes from: the model directory, how its weights are obtained
// (`--load-format`, vLLM's name: `auto`/`safetensors` read the directory's safetensors, `dummy`
// generates every weight in memory from `seed`, see common/dummy_weights.h) and the config
// overrides applied at start (`--hf-overrides`, vLLM's name: a JSON object merged into
// config.json before it is parsed, so every structural check still applies).
//
// Every process of a cluster must be given the same WeightSource (the coordinator, the GPU
// workers and the expert workers each derive the config and the tensors they hold from it); a
// dummy model is the same bytes in every process for one (config, seed).
// Pure data and pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/model_config.h"

namespace ss {

enum class LoadFormat { kAuto, kSafetensors, kDummy };

// "auto", "safetensors", "dummy"; anything else is InvalidArgument listing the three.
absl::StatusOr<LoadFormat> ParseLoadFormat(std::string_view name);
std::string_view LoadFormatName(LoadFormat f);

struct WeightSource {
  std::string model_dir;  // holds config.json (and, unless dummy, the safetensors)
  LoadFormat load_format = LoadFormat::kAuto;
  std::string hf_overrides;  // a JSON object's text; "" = none
  uint64_t seed = 0;         // dummy weights only
  // Dummy weights only: the router skew S of common/dummy_weights.h (`--dummy-router-skew`;
  // 0 = none). Only the processes that run the router (the GPU workers) need it.
  double router_skew = 0.0;

  bool dummy() const { return load_format == LoadFormat::kDummy; }
};

// OK for "" and for any JSON object's text; otherwise InvalidArgument naming --hf-overrides
// (malformed JSON, or a JSON value that is not an object). For checking a flag at start.
absl::Status ValidateHfOverrides(std::string_view text);

// `<model_dir>/config.json` with `hf_overrides` merged in (nested objects merge key by key, any
// other value replaces; the result must still pass ParseModelConfig). Errors: the overrides not
// a JSON object (InvalidArgument naming --hf-overrides), and LoadModelConfig's.
absl::StatusOr<ModelConfig> LoadModelConfig(const WeightSource& source);

}  // namespace ss
