#include "common/weight_source.h"

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ss {

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

absl::StatusOr<ModelConfig> LoadModelConfig(const WeightSource& source) {
  if (!source.hf_overrides.empty()) {
    return absl::UnimplementedError("--hf-overrides: not implemented yet");  // STUB (h-flags)
  }
  return LoadModelConfig(source.model_dir);
}

}  // namespace ss
