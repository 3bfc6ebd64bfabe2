// Conformance of the reference model against a golden set of the official demo, in the format
// of tests/data/tiny-a (README.md there): cases.json, golden.safetensors and optionally
// golden_blocks.safetensors. Checks that a set does not contain are skipped, and nothing
// depends on tiny-a's shapes, so any checkpoint + golden pair of that format works.
//
// The primary checks are per block and teacher-forced (block L alone on the golden streams
// after block L-1, fresh state), in prefill and in decode; whole-model logits are a smoke test,
// because the reference is numerically chaotic end to end (tiny-a README, "Numerical
// conditioning"). Tolerances are that README's table.
//
// The model outputs come from the reference model itself, or from a GoldenBackend: pipeline
// stages of a serving backend (gpu_worker/golden_backend.h adapts the cpu and cuda StageBackends;
// this library depends on none of them). With a backend,
//   * block_prefill.* / block_decode.*: block L alone as a stage of one layer, fed the golden
//     input streams of that block, its positions in order (the prefill chunk, then one decode
//     position per call; the stage keeps the sequence's KV state), its output streams compared
//     as on the reference;
//   * model.* and variant.*: the whole model as one stage, token ids in, logits out;
//   * the internals a stage does not expose stay on the reference model and their figures say
//     so: loader, rope, hc_split, mtp, and block_prefill's attn_out / moe_out / router /
//     indexer / compressed-KV parts (still gating); block_decode's reported-only indexer sets
//     are left out, with a note.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/model.h"

namespace ss::golden {

// One sequence's share of a stage call: tokens [start, start + n), ids as in the golden set.
struct GoldenChunk {
  uint64_t seq_id = 0;
  int64_t start = 0;
  const int64_t* tokens = nullptr;
  int64_t n = 0;
};

// A pipeline stage with its sequences' state. Called from one thread.
class GoldenStage {
 public:
  virtual ~GoldenStage() = default;
  // A block stage takes streams_in [T, hc*dim] (rows in chunk order) and fills `streams` with
  // [T, hc*dim]; a model stage ignores streams_in and fills `logits` with the last row's logits
  // of every chunk. A chunk with start 0 begins its sequence; any other continues it.
  virtual absl::Status Run(std::span<const GoldenChunk> chunks, const float* streams_in,
                           std::vector<float>* streams,
                           std::vector<std::vector<float>>* logits) = 0;
  virtual void Release(uint64_t seq_id) = 0;
};

// Makes stages of a serving backend over a loaded model (the runner passes the variants'
// models too, so a backend must use the model it is given).
class GoldenBackend {
 public:
  virtual ~GoldenBackend() = default;
  virtual std::string name() const = 0;  // "cpu", "cuda": printed beside the figures
  // Block `layer` alone, as a middle pipeline stage: streams in, streams out.
  virtual absl::StatusOr<std::unique_ptr<GoldenStage>> BlockStage(
      std::shared_ptr<const model::Model> model, int64_t layer) = 0;
  // Every block as one stage that is first and last: token ids in, logits out.
  virtual absl::StatusOr<std::unique_ptr<GoldenStage>> ModelStage(
      std::shared_ptr<const model::Model> model) = 0;
};

struct GoldenOptions {
  std::string model_dir;
  std::string golden_dir;
  // Only checks whose name contains one of these substrings run (all when empty).
  std::vector<std::string> filters;
  // Null: every check on the reference model. Otherwise see the header comment.
  std::shared_ptr<GoldenBackend> backend;
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
