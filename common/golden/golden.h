// Conformance of the reference model against a golden set of the official demo, in the format
// of tests/data/tiny-a (README.md there): cases.json, golden.safetensors and optionally
// golden_blocks.safetensors. Checks that a set does not contain are skipped, and nothing
// depends on tiny-a's shapes, so any checkpoint + golden pair of that format works.
//
// The primary checks are per block and teacher-forced (block L alone on the golden streams
// after block L-1, fresh state), in prefill and in decode; whole-model logits are a smoke test,
// because the reference is numerically chaotic end to end (tiny-a README, "Numerical
// conditioning"). Tolerances are that README's table.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/model.h"

namespace ss::golden {

struct GoldenOptions {
  std::string model_dir;
  std::string golden_dir;
  // Only checks whose name contains one of these substrings run (all when empty).
  std::vector<std::string> filters;
};

struct CheckResult {
  std::string name;
  bool pass = false;
  std::string figures;  // "rms_rel=0.0031 max_rel=0.012 bit_identical=0.962 ..."
};

// Closeness of a to a reference b (both bf16/fp32 values as float).
struct Closeness {
  double rms_rel = 0;        // ‖a−b‖₂ / ‖b‖₂
  double max_rel = 0;        // max|a−b| / max|b|
  double bit_identical = 0;  // fraction of elements with identical values
  size_t n = 0;
};
Closeness Compare(const float* a, const float* b, size_t n);

// Runs every check present in the golden set. Fails only when the model or the golden files
// cannot be read; check failures are results.
absl::StatusOr<std::vector<CheckResult>> RunGolden(const GoldenOptions& options);

}  // namespace ss::golden
