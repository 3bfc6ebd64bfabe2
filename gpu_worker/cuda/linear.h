// The FP8 linears as a step launches them (Fp8Linear of kernels/fp8_linear.h): Lin8 quantises its
// bf16 input per row (e4m3, into the scratch's qbuf / sbuf) first; Gemv8 takes activations
// already quantised (by RmsNormQuant, SwiGluBf16Quant or Lin8). The output is bf16, or the fp32
// partial of a TP rank's column slice. Both enqueue on `stream` and return the CUDA error.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "gpu_worker/cuda/cuda_backend_internal.h"
#include "gpu_worker/kernels/fp8_linear.h"
#include "gpu_worker/step_workspace.h"

namespace ss::gpu::cuda_backend_internal {

template <typename OutT>
cudaError_t Lin8(const DevFp8& w, const cuda::bf16_t* x, int64_t rows, const StepScratch& s,
                 OutT* y, cudaStream_t stream) {
  cudaError_t e = cuda::QuantizeActE4m3(x, rows, w.in, s.qbuf, s.sbuf, stream);
  if (e != cudaSuccess) return e;
  return cuda::Fp8Linear(s.qbuf, s.sbuf, rows, w.w, w.s, w.out, w.in, y, stream);
}

template <typename OutT>
cudaError_t Gemv8(const DevFp8& w, const cuda::e4m3_t* q, const float* s, int64_t rows, OutT* y,
                  cudaStream_t stream) {
  return cuda::Fp8Linear(q, s, rows, w.w, w.s, w.out, w.in, y, stream);
}

}  // namespace ss::gpu::cuda_backend_internal
