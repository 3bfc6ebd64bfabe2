#include "gpu_worker/cuda/graph_cache.h"

#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "gpu_worker/cuda/step.h"
#include "gpu_worker/cuda_status.h"

namespace ss::gpu::cuda_backend_internal {

std::vector<int64_t> GraphKeyOf(const StepState& s) {
  const CudaBackend::Impl& im = s.im;
  const StepPlan& plan = s.plan;
  const std::vector<int64_t>&row0 = plan.row0, &n_sel = plan.n_sel, &n_cols = plan.n_cols,
        &table_off = plan.table_off, &n_cand = plan.n_cand;
  const size_t nc = s.nc;
  std::vector<int64_t> key = {
      s.T,     static_cast<int64_t>(nc), plan.max_rows,   s.attn_rows,  s.routed,
      s.marks, plan.index_one_launch,    plan.index_cols, plan.index_k, plan.table_cap};
  for (size_t i = 0; i < nc; ++i) {
    key.push_back(row0[i + 1] - row0[i]);
    // A decode step's launches take no chunk's own widths (index_one_launch).
    if (!plan.index_one_launch) {
      key.insert(key.end(), {n_sel[i], n_cols[i], plan.score_rows[i], table_off[i + 1]});
    }
  }
  key.insert(key.end(), n_cand.begin(), n_cand.end());
  for (const void* p : {static_cast<const void*>(im.arena.p), static_cast<const void*>(im.params.p),
                        static_cast<const void*>(im.cand.p), static_cast<const void*>(im.kvrows.p),
                        static_cast<const void*>(im.scores.p), static_cast<const void*>(im.sel.p),
                        static_cast<const void*>(s.pool)}) {
    key.push_back(static_cast<int64_t>(reinterpret_cast<uintptr_t>(p)));
  }
  im.routed->AppendGraphKey(&key);
  return key;
}

absl::StatusOr<bool> StepGraphCache::Run(std::vector<int64_t> key, int slot, cudaStream_t stream,
                                         bool* capturing,
                                         absl::FunctionRef<absl::Status()> layers) {
  if (slot < 0 || slot >= kSlots) {
    return absl::InvalidArgumentError(absl::StrCat("graph slot ", slot, " of ", kSlots));
  }
  Slot& sl = slots_[slot];
  if (sl.exec != nullptr && key == sl.key) {
    CUDA_RETURN_IF_ERROR(cudaGraphLaunch(sl.exec, stream));
    ++replays_;
    return false;
  }
  if (key != sl.pending_key) {
    sl.pending_key = std::move(key);
    RETURN_IF_ERROR(layers());
    return true;
  }
  sl.key.clear();
  CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  *capturing = true;
  const absl::Status e = layers();
  *capturing = false;
  cudaGraph_t graph = nullptr;
  const cudaError_t ce = cudaStreamEndCapture(stream, &graph);
  if (!e.ok()) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    return e;
  }
  if (ce != cudaSuccess) return CudaStatus(ce, "cudaStreamEndCapture");
  cudaGraphExecUpdateResultInfo info;
  if (sl.exec != nullptr && cudaGraphExecUpdate(sl.exec, graph, &info) != cudaSuccess) {
    (void)cudaGetLastError();  // a different topology: instantiate anew
    cudaGraphExecDestroy(sl.exec);
    sl.exec = nullptr;
  }
  cudaError_t ie = cudaSuccess;
  if (sl.exec == nullptr) {
    ie = cudaGraphInstantiate(&sl.exec, graph, cudaGraphInstantiateFlagUseNodePriority);
  }
  cudaGraphDestroy(graph);
  if (ie != cudaSuccess) {
    sl.exec = nullptr;
    return CudaStatus(ie, "cudaGraphInstantiate");
  }
  sl.key = std::move(key);
  ++captures_;
  CUDA_RETURN_IF_ERROR(cudaGraphLaunch(sl.exec, stream));
  ++replays_;
  return true;
}

void StepGraphCache::Reset() {
  for (Slot& sl : slots_) {
    if (sl.exec != nullptr) cudaGraphExecDestroy(sl.exec);
    sl.exec = nullptr;
    sl.key.clear();
  }
}

}  // namespace ss::gpu::cuda_backend_internal
