// The attention sublayer of stage layer l (LaunchAttentionSublayer), as model::Model::RunBlock
// computes it: HcPre + RmsNorm → the query path (wq_a, q_norm, wq_b, per-head norm, RoPE) and the
// raw KV (wkv, kv_norm, RoPE, FP8 simulation, staged as records) → the compressors (one launch for
// the batch's chunks each; their entries encoded into records / MXFP4 keys) → the indexer (CSA
// layers: wq_b, IndexerPrepQ, its head weights, scores from the MXFP4 keys in place, top-k) →
// every token's candidate list and the sparse attention over window + compressed entries (ending
// in the inverse RoPE) → the ring writes → grouped wo_a, wo_b → HcPost into sc.mid (TP > 1: wo_b's
// fp32 partial all-reduced first).
//
// The work off the critical path runs on branch streams (branches.h); the enqueue order is part
// of the contract: a captured graph launches its branches in the order they were enqueued, and a
// ratio-4 layer's critical path (wq_a, its norm, the indexer's wq_b, scores and top-k) must not
// queue behind the compressors' long projections. Enqueues only (TP > 1: the all-reduce too);
// returns the first failure.
#pragma once

#include "absl/status/status.h"
#include "gpu_worker/cuda/step.h"

namespace ss::gpu::cuda_backend_internal {

absl::Status LaunchAttentionSublayer(StepState& s, int l);

}  // namespace ss::gpu::cuda_backend_internal
