// make_golden: writes a golden set in the tiny-a format for any checkpoint, computed by the
// reference model itself (see golden_writer.h), so that `splitserve-golden` can be exercised on
// shapes and shardings other than tiny-a's.
//
//   make_golden --model DIR --out DIR [--seed N]
#include <cstdint>
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "common/model/model.h"
#include "tests/tools/golden_writer.h"

ABSL_FLAG(std::string, model, "", "checkpoint directory (config.json + model*.safetensors)");
ABSL_FLAG(std::string, out, "", "output directory for cases.json and golden*.safetensors");
ABSL_FLAG(uint64_t, seed, 1, "seed of the prompt token ids");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("make_golden --model DIR --out DIR [--seed N]");
  absl::ParseCommandLine(argc, argv);
  const std::string model_dir = absl::GetFlag(FLAGS_model), out = absl::GetFlag(FLAGS_out);
  if (model_dir.empty() || out.empty()) {
    std::fprintf(stderr, "make_golden: --model and --out are required\n");
    return 2;
  }
  auto m = ss::model::Model::Load(model_dir);
  if (!m.ok()) {
    std::fprintf(stderr, "make_golden: %s\n", std::string(m.status().message()).c_str());
    return 1;
  }
  const uint64_t seed = absl::GetFlag(FLAGS_seed);
  const absl::Status st = ss::golden::WriteGoldenSet(**m, out, seed);
  if (!st.ok()) {
    std::fprintf(stderr, "make_golden: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  std::printf("make_golden: wrote %s (seed %llu)\n", out.c_str(),
              static_cast<unsigned long long>(seed));
  return 0;
}
