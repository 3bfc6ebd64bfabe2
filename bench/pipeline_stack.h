// cuda_backend_layer_bench --pp P [--tp N]: a Flash-shaped layer stack (2·P layers, compress
// ratios 4, 128, 4, 128, ...) cut into P pipeline stages of two layers, each stage TP N, run the
// way splitserve runs it: one CudaBackend per (stage, rank) on its own thread, the stage's ranks in
// their own NCCL group, and each rank of a stage pushing its output streams to the same rank of the
// next stage over gRPC (StreamSender into that rank's GpuWorkerServer inbox, gpu_worker/
// stage_transfer.h), one micro-batch at a time. Every stage is a middle stage (streams in, streams
// out; no embedding, no LM head) and the routed experts are excluded, as in the one-layer figures.
//
// Stage s, rank r runs on GPU (s·N + r) mod (GPUs found): with fewer than N·P GPUs the stages share
// them (said in the output). One micro-batch runs through the stages one after another, so a
// stage never runs beside another one on its GPU and its step time is what it would be on GPUs
// of its own; what sharing changes is the GPU pair each push crosses.
//
// Per decode configuration (batch 1 and 8, context 8K and 64K), from timestamps taken inside the
// rank threads (thread start-up excluded):
//   step        first stage's start to the last stage's end, under CUDA graphs
//   stage s     its ranks' Run (the slowest rank), the bytes it reads and their fraction of a
//               same-run device-to-device copy, and its NCCL all-reduce time per layer (a second
//               pass with StageTimings, rank 0)
//   push s      the gRPC push of stage s's streams to stage s + 1 (the slowest rank's)
//
// With `links` (--stage-transport nccl) the streams go device to device over NCCL stage links
// (gpu_worker/nccl_stage_link.h; the backends' RunDevice) and push s is the link's Send; the GPUs
// are then assigned as splitserve up does for that transport (coord::AssignCudaDevices with links:
// a link's two ends on different GPUs).
#pragma once

#include <memory>

#include "common/model/model.h"
#include "common/model_config.h"

namespace ss::bench {

// The paged cache's bytes a decode step reads per sequence in a layer of compress ratio `ratio`
// at context `ctx`: the window's fp8_ds_mla records (584 B), and the compressed records and MXFP4
// indexer keys (68 B) the layer reads.
int64_t LayerKvBytes(const ModelConfig& c, int64_t ratio, int64_t ctx);

// Returns the process exit code. `model` has at least 2·pp layers; needs tp GPUs at least.
int RunPipelineStack(const std::shared_ptr<const model::Model>& model, int tp, int pp, int n_dev,
                     double copy_bw, bool links = false);

// Whether this build can run it (the services build: gRPC carries the streams between stages).
bool PipelineStackAvailable();

}  // namespace ss::bench
