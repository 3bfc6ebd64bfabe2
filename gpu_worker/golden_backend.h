// splitserve-golden's --backend: the GPU worker's StageBackends (cpu_backend.h, cuda_backend.h)
// behind golden::GoldenBackend (common/golden/golden.h), so the golden checks run through the
// code that serves, not through the reference model's internals.
//
// Stages. A block stage is block L alone as stage L + 1 of n_layers + 2: neither first nor last,
// so it takes the golden's input streams of that block and returns its output streams, and it
// keeps the sequence's KV state between calls (prefill chunk, then one decode position per call).
// A model stage is every block as stage 0 of 1: token ids in, the last row's logits out. Each
// stage has KV room for kKvTokens positions (far more than any golden case).
//
// Routed experts: with `experts` empty, computed on the host by the reference (model::RoutedSum),
// i.e. on the CPU of the machine the backend runs on; otherwise sent to the expert workers named
// in the GPU worker's --experts syntax (worker_config.h), which needs the services build.
//
// Pipeline (--stages S): the model stage is S stages of the layers split evenly (stage s: layers
// [n·s/S, n·(s+1)/S)), run one after the other, each stage's fp32 output streams the next one's
// input -- what the GPU workers of a pipeline do, without the transport. Block stages stay one
// layer each.
//
// Tensor parallelism (--backend cuda --tp N): every stage is N CudaBackends, rank r of pipeline
// stage s on CUDA device (cuda_device + s·N + r) mod device_count (block stages: s = 0), joined by
// an in-process NCCL group (NcclComm::CreateGroup) per distinct device list, shared by the stages
// that use it (they run one at a time); a stage's Run runs the ranks on one thread each and
// returns rank 0's output (the ranks' outputs are the same bits). Routed experts: without
// `experts`, each rank computes its range of experts on the host (cuda_backend.h); with
// `experts`, each rank calls its own slices (slice i to rank i mod N, ExpertSlicesForRank) and
// adds zero for a layer none of whose slices is its own, as the GPU workers do.
//
// Which backends a build has: cpu needs SS_BUILD_SERVICES (it lives in ss_gpu_backend, with the
// expert-worker client), cuda needs CUDA at configure time. MakeGoldenBackend names what is
// missing; splitserve-golden exits 2 on any of its errors.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/fp64_sums.h"
#include "common/golden/golden.h"
#include "gpu_worker/step_workspace.h"
#include "gpu_worker/streamed_prefill.h"

namespace ss::gpu {

struct GoldenBackendOptions {
  std::string backend = "reference";     // reference | cpu | cuda
  int cuda_device = 0;                   // --backend cuda: the CUDA device ordinal
  std::string experts;                   // "a-b=EP[+EP...],...": see the header comment
  int tp = 1;                            // --backend cuda: tensor-parallel ranks (GPUs)
  int stages = 1;                        // pipeline stages of the whole-model checks
  Fp64Sums fp64_sums = Fp64Sums::kAuto;  // --backend cuda: fp64_sums.h
  // --backend cuda: the streamed path of the routed experts (streamed_prefill.h); off by default
  // here, so the checks compare the CPU path unless asked (--gpu_prefill_threshold 1 streams
  // every step).
  GpuPrefillThreshold gpu_prefill_threshold{GpuPrefillThreshold::Mode::kOff, 0};
  int64_t gpu_prefill_ring_bytes = kBaseGpuPrefillRingMiB << 20;
  // --backend cuda: this many routed experts of every layer resident on the GPU
  // (resident_routed_experts.h), ids spread evenly over [0, E); 0: none.
  int gpu_experts = 0;
  // --backend cuda: the streamed ring's slot size (PlanRing; small slots give tiny models many).
  int64_t gpu_prefill_slot_bytes = kGpuPrefillSlotBytes;
  // --backend cuda: the cap of a prefill chunk's indexer scores (CudaBackendOptions::
  // indexer_scores_bytes; a few KiB slices a tiny model's chunks into rows of a few).
  int64_t indexer_scores_bytes = kIndexerScoresBytes;
};

inline constexpr int64_t kGoldenKvTokens = 1 << 16;

// Null for "reference" (the runner then uses the model directly). InvalidArgument for an unknown
// backend, a malformed --experts, --tp outside [1, 8] (above 1 only with cuda), --stages outside
// [1, 64] or --gpu_experts below 0 (above 0 only with cuda); Unimplemented
// for a backend (or --experts, or --tp > 1 without NCCL) this build lacks; FailedPrecondition for
// --backend cuda with too few CUDA devices.
absl::StatusOr<std::shared_ptr<golden::GoldenBackend>> MakeGoldenBackend(
    const GoldenBackendOptions& options);

}  // namespace ss::gpu
