// GPU decode kernels: bytes read per second as a fraction of a device-to-device copy measured in
// the same run (the copy's bytes read + written per second). Needs a CUDA device.
//
//   build/bin/gpu_kernels_bench
#include <cuda_runtime.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "gpu_worker/kernels/kernels.h"

namespace {

#define CHECK_CUDA(expr)                                                                  \
  do {                                                                                    \
    const cudaError_t e_ = (expr);                                                        \
    if (e_ != cudaSuccess) {                                                              \
      std::fprintf(stderr, "%s: %s\n", #expr, cudaGetErrorString(e_));                    \
      std::exit(1);                                                                       \
    }                                                                                     \
  } while (0)

template <typename F>
float TimeMs(int iters, F&& f) {
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  f();  // warm-up
  CHECK_CUDA(cudaEventRecord(a));
  for (int i = 0; i < iters; ++i) f();
  CHECK_CUDA(cudaEventRecord(b));
  CHECK_CUDA(cudaEventSynchronize(b));
  float ms = 0;
  CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms / iters;
}

}  // namespace

int main() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::fprintf(stderr, "gpu_kernels_bench: no CUDA device\n");
    return 1;
  }
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s\n", prop.name);

  const size_t copy_bytes = size_t{256} << 20;
  void *src, *dst;
  CHECK_CUDA(cudaMalloc(&src, copy_bytes));
  CHECK_CUDA(cudaMalloc(&dst, copy_bytes));
  CHECK_CUDA(cudaMemset(src, 1, copy_bytes));
  const float copy_ms = TimeMs(20, [&] { cudaMemcpyAsync(dst, src, copy_bytes, cudaMemcpyDeviceToDevice); });
  const double copy_gbs = 2.0 * copy_bytes / (copy_ms * 1e-3) / 1e9;
  std::printf("baseline D2D copy: %.1f GB/s (read + write)\n", copy_gbs);

  std::mt19937 rng(1);
  struct Shape {
    const char* name;
    int64_t out, in;
  };
  for (const Shape& s : {Shape{"wq_a", 1024, 4096}, Shape{"wkv", 512, 4096},
                         Shape{"wq_b", 32768, 1024}, Shape{"wo_b", 4096, 8192},
                         Shape{"shared w1", 2048, 4096}, Shape{"shared w2", 4096, 2048}}) {
    const int64_t nb = (s.in + 127) / 128, sbytes = ((s.out + 127) / 128) * nb;
    std::vector<uint8_t> w(s.out * s.in);
    for (auto& b : w) b = static_cast<uint8_t>(rng() % 0x7e);
    uint8_t *dw, *dws, *dq;
    uint16_t *dx, *dy;
    float* dsa;
    CHECK_CUDA(cudaMalloc(&dw, w.size()));
    CHECK_CUDA(cudaMalloc(&dws, sbytes));
    CHECK_CUDA(cudaMemcpy(dw, w.data(), w.size(), cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemset(dws, 127, sbytes));
    for (const int64_t rows : {1, 8}) {
      CHECK_CUDA(cudaMalloc(&dx, rows * s.in * 2));
      CHECK_CUDA(cudaMalloc(&dq, rows * s.in));
      CHECK_CUDA(cudaMalloc(&dsa, rows * nb * 4));
      CHECK_CUDA(cudaMalloc(&dy, rows * s.out * 2));
      CHECK_CUDA(cudaMemset(dx, 0x3f, rows * s.in * 2));
      CHECK_CUDA(ss::cuda::QuantizeActE4m3(dx, rows, s.in, dq, dsa, nullptr));
      const float ms = TimeMs(50, [&] {
        ss::cuda::Fp8Linear(dq, dsa, rows, dw, dws, s.out, s.in, dy, nullptr);
      });
      CHECK_CUDA(cudaGetLastError());
      const double gbs = (w.size() + sbytes) / (ms * 1e-3) / 1e9;
      std::printf("Fp8Linear %-10s [%5ld x %5ld] rows=%ld: %8.2f us  %7.1f GB/s  = %.3f of copy\n",
                  s.name, static_cast<long>(s.out), static_cast<long>(s.in),
                  static_cast<long>(rows), ms * 1e3, gbs, gbs / copy_gbs);
      cudaFree(dx);
      cudaFree(dq);
      cudaFree(dsa);
      cudaFree(dy);
    }
    cudaFree(dw);
    cudaFree(dws);
  }
  return 0;
}
