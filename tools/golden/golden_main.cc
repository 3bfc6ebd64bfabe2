// splitserve-golden: runs every check of a golden set against the reference model, or with
// --backend cpu|cuda through the GPU worker's stage backends (gpu_worker/golden_backend.h), and
// prints one line per check with its figures, then "golden: <N> checks, <F> failed". Exit status
// 0 only when every check passes; 2 for bad flags or a backend this build or machine lacks.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_split.h"
#include "common/golden/golden.h"
#include "common/layer_list.h"
#include "common/main_flags.h"
#include "gpu_worker/golden_backend.h"

ABSL_FLAG(std::string, model, "", "checkpoint directory (config.json + model*.safetensors)");
ABSL_FLAG(std::string, golden, "", "golden set directory (cases.json, golden*.safetensors)");
ABSL_FLAG(std::string, filter, "", "comma-separated substrings: run only matching checks");
ABSL_FLAG(std::string, backend, "reference",
          "reference | cpu | cuda: where block outputs and logits come from (checks of internals "
          "a backend does not expose stay on the reference and say so)");
ABSL_FLAG(int, cuda_device, 0, "--backend cuda: the CUDA device ordinal");
ABSL_FLAG(int, tp, 1,
          "--backend cuda: tensor-parallel ranks, on CUDA devices cuda_device .. cuda_device + tp "
          "- 1 (needs NCCL)");
ABSL_FLAG(int, stages, 1,
          "--backend cpu|cuda: pipeline stages of the whole-model checks (layers split evenly; "
          "with --tp, stage s rank r on device (cuda_device + s*tp + r) mod device count)");
ABSL_FLAG(std::string, fp64_sums, "auto",
          "--backend cuda: the sums the reference forms in double, in double (on) or fp32 (off); "
          "auto: double where the GPU's FP64 is fast (common/fp64_sums.h)");
ABSL_FLAG(std::string, gpu_prefill_threshold, "off",
          "--backend cuda: steps of at least this many rows stream their routed experts to the "
          "GPU (gpu_worker/streamed_prefill.h): off | auto | N (1: every step)");
ABSL_FLAG(int64_t, gpu_prefill_ring_mib, ss::gpu::kBaseGpuPrefillRingMiB,
          "--backend cuda: the streamed path's staging ring, MiB");
ABSL_FLAG(int64_t, gpu_prefill_slot_kib, ss::gpu::kGpuPrefillSlotBytes >> 10,
          "--backend cuda: the size each slot of the streamed path's ring aims at, KiB (at least "
          "4 slots, as many as the ring holds: gpu_worker/streamed_prefill.h PlanRing)");
ABSL_FLAG(int64_t, indexer_scores_kib, ss::gpu::kIndexerScoresBytes >> 10,
          "--backend cuda: a prefill chunk's indexer scores at most this many KiB at once, longer "
          "chunks in row slices (gpu_worker/step_workspace.h IndexerScoreRows; the same "
          "selections): a few KiB slices a tiny model's chunks");
ABSL_FLAG(int, gpu_experts, 0,
          "--backend cuda: this many routed experts of every layer resident on the GPU "
          "(gpu_worker/cuda/resident_routed_experts.h; ids spread evenly), the others on the "
          "host path; 0: none");
ABSL_FLAG(std::string, experts, "",
          "--backend cpu|cuda: routed experts on expert workers, in splitserve-gpu-worker's "
          "--experts syntax; empty: computed on the host by the reference");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "splitserve-golden --model DIR --golden DIR [--filter a,b] [--backend reference|cpu|cuda] "
      "[--tp N] [--stages N]");
  ss::InitFlagsUsage("splitserve-golden");
  ss::NormalizeFlagDashes(argc, argv);
  absl::ParseCommandLine(argc, argv);
  if (absl::Status s = ss::ApplyLogFlags("splitserve-golden"); !s.ok()) {
    std::fprintf(stderr, "splitserve-golden: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  ss::golden::GoldenOptions o;
  o.model_dir = absl::GetFlag(FLAGS_model);
  o.golden_dir = absl::GetFlag(FLAGS_golden);
  if (o.model_dir.empty() || o.golden_dir.empty()) {
    std::fprintf(stderr, "splitserve-golden: --model and --golden are required\n");
    return 2;
  }
  if (!absl::GetFlag(FLAGS_filter).empty()) {
    o.filters = absl::StrSplit(absl::GetFlag(FLAGS_filter), ',', absl::SkipEmpty());
  }
  const absl::StatusOr<ss::gpu::Fp64Sums> fp64 =
      ss::gpu::ParseFp64Sums(absl::GetFlag(FLAGS_fp64_sums));
  if (!fp64.ok()) {
    std::fprintf(stderr, "splitserve-golden: %s\n", std::string(fp64.status().message()).c_str());
    return 2;
  }
  const absl::StatusOr<ss::gpu::GpuPrefillThreshold> threshold =
      ss::gpu::ParseGpuPrefillThreshold(absl::GetFlag(FLAGS_gpu_prefill_threshold));
  if (!threshold.ok()) {
    std::fprintf(stderr, "splitserve-golden: %s\n",
                 std::string(threshold.status().message()).c_str());
    return 2;
  }
  if (absl::GetFlag(FLAGS_gpu_prefill_slot_kib) < 1) {
    std::fprintf(stderr, "splitserve-golden: --gpu_prefill_slot_kib %lld: expected at least 1\n",
                 static_cast<long long>(absl::GetFlag(FLAGS_gpu_prefill_slot_kib)));
    return 2;
  }
  if (absl::GetFlag(FLAGS_indexer_scores_kib) < 1) {
    std::fprintf(stderr, "splitserve-golden: --indexer_scores_kib %lld: expected at least 1\n",
                 static_cast<long long>(absl::GetFlag(FLAGS_indexer_scores_kib)));
    return 2;
  }
  auto backend = ss::gpu::MakeGoldenBackend(
      {absl::GetFlag(FLAGS_backend), absl::GetFlag(FLAGS_cuda_device), absl::GetFlag(FLAGS_experts),
       absl::GetFlag(FLAGS_tp), absl::GetFlag(FLAGS_stages), *fp64, *threshold,
       absl::GetFlag(FLAGS_gpu_prefill_ring_mib) << 20, absl::GetFlag(FLAGS_gpu_experts),
       absl::GetFlag(FLAGS_gpu_prefill_slot_kib) << 10,
       absl::GetFlag(FLAGS_indexer_scores_kib) << 10});
  if (!backend.ok()) {
    std::fprintf(stderr, "splitserve-golden: %s\n",
                 std::string(backend.status().message()).c_str());
    return 2;
  }
  o.backend = *backend;
  if (o.backend != nullptr) {
    std::printf(
        "backend %s: block outputs (one-layer stages) and logits (one whole-model stage) through "
        "the StageBackend, routed experts %s; checks marked [reference model: ...] and "
        "block_prefill's internals run on the reference model\n",
        o.backend->name().c_str(),
        absl::GetFlag(FLAGS_experts).empty() ? "on the host (reference RoutedSum)"
                                             : "on the expert workers of --experts");
    std::fflush(stdout);
  }
  auto results = ss::golden::RunGolden(o);
  if (!results.ok()) {
    std::fprintf(stderr, "splitserve-golden: %s\n",
                 std::string(results.status().message()).c_str());
    return 1;
  }
  int failed = 0;
  for (const auto& r : *results) {
    failed += !r.pass;
    std::printf("%s %-34s %s\n", r.pass ? "PASS" : "FAIL", r.name.c_str(), r.figures.c_str());
    std::fflush(stdout);
  }
  std::printf("golden: %zu checks, %d failed\n", results->size(), failed);
  return failed == 0 && !results->empty() ? 0 : 1;
}
