#include "common/weight_source.h"

#include <fstream>
#include <sstream>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "nlohmann/json.hpp"

namespace ss {
namespace {

using nlohmann::json;

absl::StatusOr<json> ParseOverrides(std::string_view text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--hf-overrides: malformed JSON: ", std::string(text)));
  }
  if (!j.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--hf-overrides: must be a JSON object, got ", j.type_name()));
  }
  return j;
}

}  // namespace

absl::StatusOr<LoadFormat> ParseLoadFormat(std::string_view name) {
  if (name == "auto") return LoadFormat::kAuto;
  if (name == "safetensors") return LoadFormat::kSafetensors;
  if (name == "dummy") return LoadFormat::kDummy;
  return absl::InvalidArgumentError(
      absl::StrCat("--load-format '", std::string(name), "': one of auto, safetensors, dummy"));
}

std::string_view LoadFormatName(LoadFormat f) {
  switch (f) {
    case LoadFormat::kAuto:
      return "auto";
    case LoadFormat::kSafetensors:
      return "safetensors";
    case LoadFormat::kDummy:
      return "dummy";
  }
  return "?";
}

absl::Status ValidateHfOverrides(std::string_view text) {
  if (text.empty()) return absl::OkStatus();
  return ParseOverrides(text).status();
}

absl::StatusOr<ModelConfig> LoadModelConfig(const WeightSource& source) {
  if (source.hf_overrides.empty()) return LoadModelConfig(source.model_dir);
  ASSIGN_OR_RETURN(const json overrides, ParseOverrides(source.hf_overrides));
  const std::string path = source.model_dir + "/config.json";
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::ostringstream text;
  text << in.rdbuf();
  json config = json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded() || !config.is_object()) {
    // The parser names the defect in the file itself.
    return ParseModelConfig(text.str(), path);
  }
  // vLLM's merge (nlohmann's update with merge_objects): a key whose value is an object on both
  // sides merges key by key; any other value replaces (null included: the parser then reports the
  // field).
  config.update(overrides, /*merge_objects=*/true);
  return ParseModelConfig(config.dump(), absl::StrCat(path, " with --hf-overrides"));
}

}  // namespace ss
