// GPU FP8 linear kernels. Needs a CUDA device.
//
//   build/bin/gpu_kernels_bench [--indexer | --attention | --fused | --gemv | --sync | --persistent
//   |
//                                path/to/libcublas.so]
//
// Decode (Fp8Gemv, rows 1 and 8): weight bytes read per second as a fraction of a
// device-to-device copy measured in the same run (the copy's bytes read + written per second).
// Every timed launch reads a different copy of the weights, cycling through at least 512 MiB of
// them, so no launch finds its weights in L2 (an H200 has 60 MB of it, more than one Flash
// matrix), as in a real decode step that reads every layer once. The launches are captured in a
// CUDA graph and replayed, as decode runs (the time launched one by one from the host is printed
// beside it). The plain fallback kernel is timed the same way for comparison, and so is a kernel
// that only reads the same bytes (bench/stream_read.h: the ceiling for one launch reading them).
// `--gemv` runs only this part.
//
// Prefill (Fp8Gemm, T = 512 and 8192 rows): time, tokens/s and TFLOP/s (2·T·out·in), and, where
// cuBLAS can be loaded (dlopen: the bench links only cudart), the same shape as a cuBLAS bf16
// GEMM (bf16 in and out, fp32 compute) in the same run.
//
// Indexer (batch-1 decode at Flash's shape: 64 heads x 128 dims, rope 64, k 512): IndexerPrepQ,
// KvIndexerScores over MXFP4 keys in a paged pool, IndexerTopK of those scores, and the three in
// a row, each as graph-replayed time per call (the keys stay in L2, as the step's do), at 2304
// to 262144 compressed columns (9K to 1M context at ratio 4); then a 256-token prefill chunk's
// scores and top-k at 16384 columns. `--indexer` runs only this part.
//
// Decode attention (`--attention` alone): the candidate build, split chunks and combine at
// Flash's shape, per kernel and as a chain. Fused HcPost (`--fused` alone): wo_b's GEMV with
// HcPost in its epilogue and the MoE combine with HcPost, each against the launches it replaces.
// Phase boundaries (`--sync` alone, not in the full run): bench/sync_cost.h. A layer step's phases
// as launches, as one persistent launch, and with cross-phase prefetch (`--persistent` alone, not
// in the full run): bench/persistent_layer.h.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench/cuda_check.h"
#include "bench/persistent_layer.h"
#include "bench/stream_read.h"
#include "bench/sync_cost.h"
#include "common/bf16.h"
#include "gpu_worker/kernels/elementwise.h"
#include "gpu_worker/kernels/fp8_gemm.h"
#include "gpu_worker/kernels/fp8_linear.h"
#include "gpu_worker/kernels/hyper_connection.h"
#include "gpu_worker/kernels/indexer.h"
#include "gpu_worker/kernels/indexer_topk.h"
#include "gpu_worker/kernels/paged_kv.h"
#include "gpu_worker/kernels/prepare.h"

namespace {

// Mean milliseconds per call of f(i) over `iters` calls after one warm-up call, launched one by
// one from the host.
template <typename F>
float TimeMs(int iters, F&& f) {
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  f(0);
  CHECK_CUDA(cudaEventRecord(a));
  for (int i = 0; i < iters; ++i) f(i + 1);
  CHECK_CUDA(cudaEventRecord(b));
  CHECK_CUDA(cudaEventSynchronize(b));
  CHECK_CUDA(cudaGetLastError());
  float ms = 0;
  CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms / iters;
}

// Milliseconds of `reps` replays of an instantiated graph on s, after one warm-up replay.
float ReplayMs(cudaGraphExec_t exec, cudaStream_t s, int reps) {
  CHECK_CUDA(cudaGraphLaunch(exec, s));
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  CHECK_CUDA(cudaEventRecord(a, s));
  for (int r = 0; r < reps; ++r) CHECK_CUDA(cudaGraphLaunch(exec, s));
  CHECK_CUDA(cudaEventRecord(b, s));
  CHECK_CUDA(cudaEventSynchronize(b));
  float ms = 0;
  CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms;
}

// The same with the `n` calls f(i, stream) captured in one CUDA graph (global capture mode, as
// decode runs) and the graph replayed: no host launch cost between kernels. -1 if capture fails.
template <typename F>
float GraphMs(int n, F&& f) {
  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  f(0, s);  // first calls outside capture
  CHECK_CUDA(cudaStreamSynchronize(s));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < n; ++i) f(i, s);
  const cudaError_t e = cudaStreamEndCapture(s, &graph);
  if (e != cudaSuccess) {
    std::printf("graph capture failed: %s\n", cudaGetErrorString(e));
    cudaGetLastError();
    cudaStreamDestroy(s);
    return -1.0f;
  }
  CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  constexpr int kReps = 5;
  const float ms = ReplayMs(exec, s, kReps);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
  return ms / (kReps * n);
}

template <typename T>
T* DeviceAlloc(size_t n) {
  void* p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)));
  return static_cast<T*>(p);
}

// e4m3 bytes without the NaN codes, as in a checkpoint.
std::vector<uint8_t> RandomCodes(size_t n, std::mt19937& rng) {
  std::vector<uint8_t> v(n);
  for (auto& b : v) {
    b = static_cast<uint8_t>(rng());
    if ((b & 0x7f) == 0x7f) b ^= 1;
  }
  return v;
}

// bf16 values of a unit normal, as bit patterns.
std::vector<uint16_t> RandomBf16(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<uint16_t> v(n);
  for (auto& x : v) {
    const float f = d(rng);
    uint32_t u;
    std::memcpy(&u, &f, 4);
    x = static_cast<uint16_t>(u >> 16);
  }
  return v;
}

// cuBLAS, loaded at run time so the bench needs no link dependency on it.
struct Cublas {
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasDestroy_v2) destroy = nullptr;
  using GemmEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int,
                                    int, const void*, const void*, cudaDataType, int, const void*,
                                    cudaDataType, int, const void*, void*, cudaDataType, int,
                                    cublasComputeType_t, cublasGemmAlgo_t);
  GemmEx gemm = nullptr;
  cublasHandle_t handle = nullptr;
  std::string from;

  bool Load(const char* user_path) {
    std::vector<std::string> paths;
    if (user_path) paths.push_back(user_path);
    for (const char* p :
         {"libcublas.so.13", "libcublas.so", "/usr/local/cuda/lib64/libcublas.so.13",
          "/usr/local/cuda/lib/libcublas.so.13",
          "/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib/"
          "libcublas.so.13",
          "/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cublas/lib/"
          "libcublas.so.13"}) {
      paths.push_back(p);
    }
    for (const std::string& p : paths) {
      const size_t slash = p.rfind('/');
      if (slash != std::string::npos) {  // its libcublasLt beside it, for the loader to find
        dlopen((p.substr(0, slash + 1) + "libcublasLt.so.13").c_str(), RTLD_NOW | RTLD_GLOBAL);
      }
      void* lib = dlopen(p.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (!lib) continue;
      create = reinterpret_cast<decltype(create)>(dlsym(lib, "cublasCreate_v2"));
      destroy = reinterpret_cast<decltype(destroy)>(dlsym(lib, "cublasDestroy_v2"));
      gemm = reinterpret_cast<GemmEx>(dlsym(lib, "cublasGemmEx"));
      if (create && destroy && gemm && create(&handle) == CUBLAS_STATUS_SUCCESS) {
        from = p;
        return true;
      }
    }
    return false;
  }
  // y[T, out] = x[T, in] · w[out, in]ᵀ, all bf16 row-major (column-major yᵀ = wᵀᵀ·xᵀ).
  bool Gemm(const uint16_t* x, const uint16_t* w, uint16_t* y, int64_t t, int64_t out,
            int64_t in) const {
    const float one = 1.0f, zero = 0.0f;
    return gemm(handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(out), static_cast<int>(t),
                static_cast<int>(in), &one, w, CUDA_R_16BF, static_cast<int>(in), x, CUDA_R_16BF,
                static_cast<int>(in), &zero, y, CUDA_R_16BF, static_cast<int>(out),
                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS;
  }
};

struct Shape {
  const char* name;
  int64_t out, in;
};

void BenchDecode(double copy_gbs, std::mt19937& rng) {
  std::printf("\n== decode GEMV: weight bytes/s as a fraction of the copy (L2 defeated) ==\n");
  std::printf("(\"read\": a kernel that only streams the same weight bytes, the ceiling)\n");
  uint32_t* sink = DeviceAlloc<uint32_t>(1);
  for (const Shape& s : {Shape{"wq_a", 1024, 4096}, Shape{"wkv", 512, 4096},
                         Shape{"wq_b", 32768, 1024}, Shape{"wo_b", 4096, 8192},
                         Shape{"shared w1", 2048, 4096}, Shape{"shared w2", 4096, 2048}}) {
    const int64_t nb = (s.in + 127) / 128, sbytes = ((s.out + 127) / 128) * nb;
    const size_t wbytes = static_cast<size_t>(s.out * s.in);
    const int copies =
        static_cast<int>(std::max<size_t>(1, ((size_t{512} << 20) + wbytes - 1) / wbytes));
    const std::vector<uint8_t> w = RandomCodes(wbytes, rng);
    std::vector<uint8_t*> dw(copies), dws(copies);
    for (int c = 0; c < copies; ++c) {
      dw[c] = DeviceAlloc<uint8_t>(wbytes);
      dws[c] = DeviceAlloc<uint8_t>(sbytes);
      CHECK_CUDA(cudaMemcpy(dw[c], w.data(), wbytes, cudaMemcpyHostToDevice));
      CHECK_CUDA(cudaMemset(dws[c], 127, sbytes));
    }
    {
      const int n_calls = std::max(copies, 64);
      const float gms = GraphMs(n_calls, [&](int i, cudaStream_t st) {
        ss::bench::StreamRead(dw[i % copies], static_cast<int64_t>(wbytes / 16 * 16), sink, st);
      });
      const double gbs = wbytes / (gms * 1e-3) / 1e9;
      std::printf("%-8s %-10s [%5ld x %5ld]       : graph %7.2f us %7.1f GB/s = %.3f of copy\n",
                  "read", s.name, static_cast<long>(s.out), static_cast<long>(s.in), gms * 1e3, gbs,
                  gbs / copy_gbs);
    }
    for (const int64_t rows : {1, 8}) {
      uint16_t* dx = DeviceAlloc<uint16_t>(rows * s.in);
      uint8_t* dq = DeviceAlloc<uint8_t>(rows * s.in);
      float* dsa = DeviceAlloc<float>(rows * nb);
      uint16_t* dy = DeviceAlloc<uint16_t>(rows * s.out);
      CHECK_CUDA(cudaMemcpy(dx, RandomBf16(rows * s.in, rng).data(), rows * s.in * 2,
                            cudaMemcpyHostToDevice));
      CHECK_CUDA(ss::cuda::QuantizeActE4m3(ss::cuda::AsBf16(dx), rows, s.in, ss::cuda::AsE4m3(dq),
                                           dsa, nullptr));
      // The bf16-output overloads.
      using Linear = cudaError_t (*)(const ss::cuda::e4m3_t*, const float*, int64_t,
                                     const ss::cuda::e4m3_t*, const ss::cuda::ue8m0_t*, int64_t,
                                     int64_t, ss::cuda::bf16_t*, cudaStream_t);
      for (const auto& [path, fn] :
           {std::pair{"Fp8Gemv", static_cast<Linear>(&ss::cuda::Fp8Gemv)},
            std::pair{"plain", static_cast<Linear>(&ss::cuda::Fp8LinearGeneric)}}) {
        const auto call = [&, fn = fn](int i, cudaStream_t st) {
          fn(ss::cuda::AsE4m3(dq), dsa, rows, ss::cuda::AsE4m3(dw[i % copies]),
             ss::cuda::AsUe8m0(dws[i % copies]), s.out, s.in, ss::cuda::AsBf16(dy), st);
        };
        const int n_calls = std::max(copies, 64);
        const float gms = GraphMs(n_calls, call);
        const float sms = TimeMs(n_calls, [&](int i) { call(i, nullptr); });
        const double gbs = (wbytes + sbytes) / (gms * 1e-3) / 1e9;
        std::printf(
            "%-8s %-10s [%5ld x %5ld] rows=%ld: graph %7.2f us %7.1f GB/s = %.3f of copy"
            " | stream-launched %7.2f us\n",
            path, s.name, static_cast<long>(s.out), static_cast<long>(s.in),
            static_cast<long>(rows), gms * 1e3, gbs, gbs / copy_gbs, sms * 1e3);
      }
      cudaFree(dx);
      cudaFree(dq);
      cudaFree(dsa);
      cudaFree(dy);
    }
    for (int c = 0; c < copies; ++c) {
      cudaFree(dw[c]);
      cudaFree(dws[c]);
    }
  }
  cudaFree(sink);
}

void BenchPrefill(const Cublas* cublas, std::mt19937& rng) {
  std::printf("\n== prefill GEMM: Fp8Gemm (e4m3 codes in) vs cuBLAS bf16 GEMM, same shape ==\n");
  for (const Shape& s :
       {Shape{"wq_a", 1024, 4096}, Shape{"wq_b", 32768, 1024}, Shape{"wo_b", 4096, 8192}}) {
    const int64_t nb = s.in / 128, sbytes = ((s.out + 127) / 128) * nb;
    uint8_t* dw = DeviceAlloc<uint8_t>(s.out * s.in);
    uint8_t* dws = DeviceAlloc<uint8_t>(sbytes);
    CHECK_CUDA(cudaMemcpy(dw, RandomCodes(s.out * s.in, rng).data(), s.out * s.in,
                          cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemset(dws, 120, sbytes));
    uint16_t* dwb = DeviceAlloc<uint16_t>(s.out * s.in);  // cuBLAS's bf16 weights
    CHECK_CUDA(cudaMemcpy(dwb, RandomBf16(s.out * s.in, rng).data(), s.out * s.in * 2,
                          cudaMemcpyHostToDevice));
    for (const int64_t t : {512, 8192}) {
      uint16_t* dx = DeviceAlloc<uint16_t>(t * s.in);
      uint8_t* dq = DeviceAlloc<uint8_t>(t * s.in);
      float* dsa = DeviceAlloc<float>(t * nb);
      uint16_t* dy = DeviceAlloc<uint16_t>(t * s.out);
      CHECK_CUDA(
          cudaMemcpy(dx, RandomBf16(t * s.in, rng).data(), t * s.in * 2, cudaMemcpyHostToDevice));
      const float quant_ms = TimeMs(20, [&](int) {
        ss::cuda::QuantizeActE4m3(ss::cuda::AsBf16(dx), t, s.in, ss::cuda::AsE4m3(dq), dsa,
                                  nullptr);
      });
      const double flop = 2.0 * t * s.out * s.in;
      const int iters = std::max(5, static_cast<int>(2e12 / flop));
      const float ms = TimeMs(iters, [&](int) {
        ss::cuda::Fp8Gemm(ss::cuda::AsE4m3(dq), dsa, t, ss::cuda::AsE4m3(dw),
                          ss::cuda::AsUe8m0(dws), s.out, s.in, ss::cuda::AsBf16(dy), nullptr);
      });
      const double tflops = flop / (ms * 1e-3) / 1e12;
      std::printf(
          "Fp8Gemm %-5s [%5ld x %5ld] T=%5ld: %9.1f us  %10.0f tokens/s  %6.1f TFLOP/s"
          "  (+ quantise %.1f us)",
          s.name, static_cast<long>(s.out), static_cast<long>(s.in), static_cast<long>(t), ms * 1e3,
          t / (ms * 1e-3), tflops, quant_ms * 1e3);
      if (cublas) {
        bool ok = true;
        const float cms =
            TimeMs(iters, [&](int) { ok = cublas->Gemm(dx, dwb, dy, t, s.out, s.in) && ok; });
        const double ctflops = flop / (cms * 1e-3) / 1e12;
        if (ok) {
          std::printf("  | cuBLAS bf16 %9.1f us %6.1f TFLOP/s  ratio %.3f", cms * 1e3, ctflops,
                      tflops / ctflops);
        } else {
          std::printf("  | cuBLAS bf16 failed");
        }
      }
      std::printf("\n");
      cudaFree(dx);
      cudaFree(dq);
      cudaFree(dsa);
      cudaFree(dy);
    }
    cudaFree(dw);
    cudaFree(dws);
    cudaFree(dwb);
  }
}

// FNV-1a of a device buffer's bytes: the indexer's scores and selections, to compare builds.
uint64_t DeviceHash(const void* p, size_t bytes) {
  std::vector<uint8_t> h(bytes);
  CHECK_CUDA(cudaMemcpy(h.data(), p, bytes, cudaMemcpyDeviceToHost));
  uint64_t x = 1469598103934665603ull;
  for (const uint8_t b : h) x = (x ^ b) * 1099511628211ull;
  return x;
}

// A paged pool of n_cols MXFP4 indexer keys (random bf16 values, encoded) at Flash's layout: 64
// keys per block, the blocks in reverse order behind one leading block, as in the tests.
struct IndexerPool {
  ss::cuda::KvGeom g;
  uint8_t* pool = nullptr;
  int32_t* table = nullptr;
  int64_t n_table = 0;

  IndexerPool(int64_t n_cols, int64_t hd, std::mt19937& rng) {
    const int64_t per_block = 64, key_bytes = ss::cuda::KvKeyBytes(hd);
    const int64_t block_bytes = per_block * key_bytes + 40;
    const int64_t blocks = (n_cols + per_block - 1) / per_block;
    n_table = 1 + blocks;
    pool = DeviceAlloc<uint8_t>((blocks + 1) * block_bytes);
    std::vector<int32_t> tab(1 + blocks);
    for (int64_t b = 0; b <= blocks; ++b) tab[b] = static_cast<int32_t>(blocks - b);
    g = ss::cuda::KvGeom{.pool = reinterpret_cast<uint64_t>(pool),
                         .block_bytes = block_bytes,
                         .first_entry_block = 1,
                         .key_dim = static_cast<int32_t>(hd),
                         .keys_per_block = static_cast<int32_t>(per_block),
                         .key_off = 40};
    std::vector<uint64_t> dst(n_cols);
    for (int64_t j = 0; j < n_cols; ++j) {
      dst[j] =
          g.pool + tab[1 + j / per_block] * block_bytes + g.key_off + (j % per_block) * key_bytes;
    }
    uint16_t* keys = DeviceAlloc<uint16_t>(n_cols * hd);
    uint64_t* ddst = DeviceAlloc<uint64_t>(n_cols);
    table = DeviceAlloc<int32_t>(tab.size());
    CHECK_CUDA(cudaMemcpy(keys, RandomBf16(n_cols * hd, rng).data(), n_cols * hd * 2,
                          cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(ddst, dst.data(), n_cols * 8, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(table, tab.data(), tab.size() * 4, cudaMemcpyHostToDevice));
    CHECK_CUDA(ss::cuda::KvEncodeKeys(ss::cuda::AsBf16(keys), ddst, n_cols, hd, nullptr));
    CHECK_CUDA(cudaDeviceSynchronize());
    cudaFree(keys);
    cudaFree(ddst);
  }
  ~IndexerPool() {
    cudaFree(pool);
    cudaFree(table);
  }
};

// IndexerTopK's scratch for its split path, zeroed once (its launches leave it zeroed).
void* TopKScratch() {
  static void* p = [] {
    void* q = DeviceAlloc<uint8_t>(static_cast<size_t>(ss::cuda::IndexerTopKScratchBytes()));
    CHECK_CUDA(cudaMemset(q, 0, static_cast<size_t>(ss::cuda::IndexerTopKScratchBytes())));
    return q;
  }();
  return p;
}

void BenchIndexer(std::mt19937& rng) {
  std::printf("\n== indexer, T = 1: graph-replayed time per call ==\n");
  const int64_t H = 64, hd = 128, rd = 64, k = 512;
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> cs(rd / 2), sn(rd / 2);
  for (int64_t i = 0; i < rd / 2; ++i) {
    const float a = 3.0f * u(rng);
    cs[i] = std::cos(a);
    sn[i] = std::sin(a);
  }
  uint16_t* q = DeviceAlloc<uint16_t>(H * hd);
  uint16_t* q0 = DeviceAlloc<uint16_t>(H * hd);
  uint16_t* w = DeviceAlloc<uint16_t>(H);
  float* dcs = DeviceAlloc<float>(rd / 2);
  float* dsn = DeviceAlloc<float>(rd / 2);
  CHECK_CUDA(cudaMemcpy(q0, RandomBf16(H * hd, rng).data(), H * hd * 2, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(w, RandomBf16(H, rng).data(), H * 2, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(dcs, cs.data(), cs.size() * 4, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(dsn, sn.data(), sn.size() * 4, cudaMemcpyHostToDevice));
  const auto prep = [&](int, cudaStream_t st) {
    cudaMemcpyAsync(q, q0, H * hd * 2, cudaMemcpyDeviceToDevice, st);
    ss::cuda::IndexerPrepQ(ss::cuda::AsBf16(q), 1, H, hd, rd, dcs, dsn, true, st);
  };
  const auto copy = [&](int, cudaStream_t st) {
    cudaMemcpyAsync(q, q0, H * hd * 2, cudaMemcpyDeviceToDevice, st);
  };
  const float copy_us = GraphMs(64, copy) * 1e3f;
  std::printf(
      "IndexerPrepQ     T=1 (fp64 Hadamard): %7.2f us  (graph of copy + prep, the copy"
      " alone %.2f us)\n",
      GraphMs(64, prep) * 1e3f, copy_us);
  prep(0, nullptr);
  for (const int64_t n_cols : {2304, 16384, 65536, 262144}) {
    const IndexerPool kp(n_cols, hd, rng);
    int64_t* pos = DeviceAlloc<int64_t>(1);
    float* scores = DeviceAlloc<float>(n_cols);
    int32_t* sel = DeviceAlloc<int32_t>(k);
    const int64_t p = 4 * n_cols - 1;
    CHECK_CUDA(cudaMemcpy(pos, &p, 8, cudaMemcpyHostToDevice));
    const auto scores_call = [&](int, cudaStream_t st) {
      ss::cuda::KvIndexerScores({.q = ss::cuda::AsBf16(q),
                                 .w = ss::cuda::AsBf16(w),
                                 .g = kp.g,
                                 .positions = pos,
                                 .T = 1,
                                 .heads = H,
                                 .ratio = 4,
                                 .n_cols = n_cols,
                                 .scores = scores},
                                kp.table, kp.n_table, st);
    };
    const auto topk = [&](int, cudaStream_t st) {
      ss::cuda::IndexerTopK(scores, 1, n_cols, k, sel, TopKScratch(), st);
    };
    const auto chain = [&](int i, cudaStream_t st) {
      prep(i, st);
      scores_call(i, st);
      topk(i, st);
    };
    const int n_calls = n_cols > 65536 ? 16 : 64;
    std::printf("KvIndexerScores  T=1 n_cols=%6ld:      %7.2f us\n", static_cast<long>(n_cols),
                GraphMs(n_calls, scores_call) * 1e3f);
    std::printf("IndexerTopK      T=1 n_cols=%6ld k=%ld: %7.2f us\n", static_cast<long>(n_cols),
                static_cast<long>(k), GraphMs(n_calls, topk) * 1e3f);
    std::printf(
        "copy + prep + scores + top-k n_cols=%6ld: %7.2f us  (hashes: scores %016llx,"
        " top-k %016llx)\n",
        static_cast<long>(n_cols), GraphMs(n_calls, chain) * 1e3f,
        static_cast<unsigned long long>(DeviceHash(scores, n_cols * 4)),
        static_cast<unsigned long long>(DeviceHash(sel, k * 4)));
    for (void* ptr :
         {static_cast<void*>(pos), static_cast<void*>(scores), static_cast<void*>(sel)}) {
      cudaFree(ptr);
    }
  }
  // A decode step of 8 sequences (one launch each for their scores and top-k, as the backend
  // runs them; here 8 tokens reading one pool), and a prefill chunk of 256 tokens ending at 64K
  // context, each row 16384 columns wide.
  const auto rows_of_tokens = [&](int64_t T, int64_t n_cols, const std::vector<int64_t>& hpos,
                                  int calls) {
    const IndexerPool kp(n_cols, hd, rng);
    uint16_t* qt = DeviceAlloc<uint16_t>(T * H * hd);
    uint16_t* wt = DeviceAlloc<uint16_t>(T * H);
    int64_t* pos = DeviceAlloc<int64_t>(T);
    float* scores = DeviceAlloc<float>(T * n_cols);
    int32_t* sel = DeviceAlloc<int32_t>(T * k);
    CHECK_CUDA(
        cudaMemcpy(qt, RandomBf16(T * H * hd, rng).data(), T * H * hd * 2, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(wt, RandomBf16(T * H, rng).data(), T * H * 2, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(pos, hpos.data(), T * 8, cudaMemcpyHostToDevice));
    const auto scores_call = [&](int, cudaStream_t st) {
      ss::cuda::KvIndexerScores({.q = ss::cuda::AsBf16(qt),
                                 .w = ss::cuda::AsBf16(wt),
                                 .g = kp.g,
                                 .positions = pos,
                                 .T = T,
                                 .heads = H,
                                 .ratio = 4,
                                 .n_cols = n_cols,
                                 .scores = scores},
                                kp.table, kp.n_table, st);
    };
    const auto topk = [&](int, cudaStream_t st) {
      ss::cuda::IndexerTopK(scores, T, n_cols, k, sel, TopKScratch(), st);
    };
    std::printf("KvIndexerScores  T=%ld n_cols=%6ld:    %7.2f us\n", static_cast<long>(T),
                static_cast<long>(n_cols), GraphMs(calls, scores_call) * 1e3f);
    std::printf(
        "IndexerTopK      T=%ld n_cols=%6ld k=%ld: %7.2f us  (hashes: scores %016llx,"
        " top-k %016llx)\n",
        static_cast<long>(T), static_cast<long>(n_cols), static_cast<long>(k),
        GraphMs(calls, topk) * 1e3f,
        static_cast<unsigned long long>(DeviceHash(scores, T * n_cols * 4)),
        static_cast<unsigned long long>(DeviceHash(sel, T * k * 4)));
    for (void* ptr : {static_cast<void*>(qt), static_cast<void*>(wt), static_cast<void*>(pos),
                      static_cast<void*>(scores), static_cast<void*>(sel)}) {
      cudaFree(ptr);
    }
  };
  for (const int64_t n_cols : {2048, 16384}) {
    std::vector<int64_t> hpos(8);
    for (int64_t t = 0; t < 8; ++t) hpos[t] = 4 * n_cols - 1 - 4 * t;
    rows_of_tokens(8, n_cols, hpos, 64);
  }
  // Scores close together (bf16 values of 20 + N(0, 1): thousands in the k-th largest's first
  // 11-bit bin), where the split top-k needs its second histogram; the one-block filtered kernel
  // (the split path's fallback) as the baseline.
  for (const int64_t n_cols : {16384, 65536}) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> host(n_cols);
    for (float& v : host) v = ss::RoundBf16(20.0f + nd(rng));
    float* scores = DeviceAlloc<float>(n_cols);
    int32_t* sel = DeviceAlloc<int32_t>(k);
    int32_t* sel_f = DeviceAlloc<int32_t>(k);
    CHECK_CUDA(cudaMemcpy(scores, host.data(), n_cols * 4, cudaMemcpyHostToDevice));
    const auto split = [&](int, cudaStream_t st) {
      ss::cuda::IndexerTopK(scores, 1, n_cols, k, sel, TopKScratch(), st);
    };
    const auto filtered = [&](int, cudaStream_t st) {
      ss::cuda::IndexerTopKPath(scores, 1, n_cols, k, ss::cuda::IndexerTopKKind::kFiltered, sel_f,
                                nullptr, st);
    };
    const float split_us = GraphMs(64, split) * 1e3f, filtered_us = GraphMs(64, filtered) * 1e3f;
    std::printf(
        "IndexerTopK      T=1 n_cols=%6ld k=%ld, scores 20 + N(0,1) in bf16: %7.2f us, one-block"
        " filtered %7.2f us (ratio %.2f), selections %s\n",
        static_cast<long>(n_cols), static_cast<long>(k), split_us, filtered_us,
        split_us / filtered_us,
        DeviceHash(sel, k * 4) == DeviceHash(sel_f, k * 4) ? "equal" : "DIFFER");
    for (void* ptr :
         {static_cast<void*>(scores), static_cast<void*>(sel), static_cast<void*>(sel_f)}) {
      cudaFree(ptr);
    }
  }

  {
    std::vector<int64_t> hpos(256);
    for (int64_t t = 0; t < 256; ++t) hpos[t] = 4 * 16384 - 256 + t;
    rows_of_tokens(256, 16384, hpos, 8);
  }
  for (void* ptr : {static_cast<void*>(q), static_cast<void*>(q0), static_cast<void*>(w),
                    static_cast<void*>(dcs), static_cast<void*>(dsn)}) {
    cudaFree(ptr);
  }

  // Each top-k kernel on rows of bf16 normal scores, for the choice between them.
  std::printf("IndexerTopK per kernel (counting / radix / filtered / split), k=%ld:\n",
              static_cast<long>(k));
  std::mt19937 srng(11);
  for (const auto& [T, n_cols] : {std::pair<int64_t, int64_t>{1, 4096},
                                  {1, 6144},
                                  {1, 8192},
                                  {1, 16384},
                                  {1, 65536},
                                  {1, 262144},
                                  {8, 8192},
                                  {8, 16384},
                                  {256, 4096},
                                  {256, 16384}}) {
    std::vector<uint16_t> bits = RandomBf16(T * n_cols, srng);
    std::vector<float> hs(T * n_cols);
    for (int64_t i = 0; i < T * n_cols; ++i) {
      const uint32_t u = static_cast<uint32_t>(bits[i]) << 16;
      std::memcpy(&hs[i], &u, 4);
    }
    float* scores = DeviceAlloc<float>(T * n_cols);
    int32_t* sel = DeviceAlloc<int32_t>(T * k);
    CHECK_CUDA(cudaMemcpy(scores, hs.data(), hs.size() * 4, cudaMemcpyHostToDevice));
    std::printf("  T=%3ld n_cols=%6ld:", static_cast<long>(T), static_cast<long>(n_cols));
    for (const auto kind :
         {ss::cuda::IndexerTopKKind::kCounting, ss::cuda::IndexerTopKKind::kRadix,
          ss::cuda::IndexerTopKKind::kFiltered, ss::cuda::IndexerTopKKind::kSplit}) {
      if ((kind == ss::cuda::IndexerTopKKind::kCounting && T * n_cols * n_cols > (1ll << 28)) ||
          ss::cuda::IndexerTopKPath(scores, T, n_cols, k, kind, sel, TopKScratch(), nullptr) !=
              cudaSuccess) {
        cudaGetLastError();
        std::printf("       -   ");
        continue;
      }
      std::printf(" %8.2f us", GraphMs(16, [&](int, cudaStream_t st) {
                                 ss::cuda::IndexerTopKPath(scores, T, n_cols, k, kind, sel,
                                                           TopKScratch(), st);
                               }) * 1e3f);
    }
    std::printf("\n");
    cudaFree(scores);
    cudaFree(sel);
  }
}

// Decode attention at Flash's shape (64 heads x 512 dims, nope 448 + rope 64, window 128) over a
// paged pool of fp8_ds_mla records: KvBuildCandidates (decoding the rows) then KvSparseAttention
// (decoded rows, the inverse RoPE in its last launch), for a ratio-128 layer (64 compressed
// entries: 192 candidates) and a ratio-4 layer (top-512 selections: 640), at T = 1 and 8. Graph-
// replayed time per call of the chain, then of each kernel in it: every kernel node of one
// captured chain replayed alone, 64 times in a row (the pool stays in L2, as the step's rows do).
void BenchDecodeAttention() {
  std::printf("\n== decode sparse attention, 64 heads x 512: graph-replayed time per call ==\n");
  std::mt19937 rng(7);
  const int64_t D = 512, nope = 448, rope = 64, H = 64, W = 128, n_entries = 2048;
  const int64_t E = ss::cuda::KvRecordBytes(nope, rope), per_block = 64, block_bytes = W * E;
  const int64_t blocks = 1 + n_entries / per_block, max_t = 8;
  uint8_t* pool = DeviceAlloc<uint8_t>(blocks * block_bytes + max_t * E);
  std::vector<int32_t> table(blocks);
  for (int64_t b = 0; b < blocks; ++b) table[b] = static_cast<int32_t>(blocks - 1 - b);
  std::vector<uint64_t> dst;  // the ring, the compressed entries, the staged records
  const uint64_t base = reinterpret_cast<uint64_t>(pool);
  for (int64_t i = 0; i < W; ++i) dst.push_back(base + table[0] * block_bytes + i * E);
  for (int64_t j = 0; j < n_entries; ++j) {
    dst.push_back(base + table[1 + j / per_block] * block_bytes + (j % per_block) * E);
  }
  for (int64_t t = 0; t < max_t; ++t) dst.push_back(base + blocks * block_bytes + t * E);
  const int64_t n_rec = static_cast<int64_t>(dst.size());
  uint16_t* ent = DeviceAlloc<uint16_t>(n_rec * D);
  uint64_t* ddst = DeviceAlloc<uint64_t>(n_rec);
  int32_t* dtable = DeviceAlloc<int32_t>(blocks);
  CHECK_CUDA(
      cudaMemcpy(ent, RandomBf16(n_rec * D, rng).data(), n_rec * D * 2, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(ddst, dst.data(), n_rec * 8, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(dtable, table.data(), blocks * 4, cudaMemcpyHostToDevice));
  CHECK_CUDA(ss::cuda::KvEncodeRecords(ss::cuda::AsBf16(ent), ddst, n_rec, nope, rope, nullptr));
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  std::vector<float> cs(max_t * rope / 2), sn(max_t * rope / 2), sink(H);
  for (size_t i = 0; i < cs.size(); ++i) {
    const float a = u(rng);
    cs[i] = std::cos(a);
    sn[i] = std::sin(a);
  }
  for (float& s : sink) s = u(rng);
  float* dcs = DeviceAlloc<float>(cs.size());
  float* dsn = DeviceAlloc<float>(sn.size());
  float* dsink = DeviceAlloc<float>(H);
  uint16_t* q = DeviceAlloc<uint16_t>(max_t * H * D);
  uint16_t* out = DeviceAlloc<uint16_t>(max_t * H * D);
  CHECK_CUDA(cudaMemcpy(dcs, cs.data(), cs.size() * 4, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(dsn, sn.data(), sn.size() * 4, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(dsink, sink.data(), H * 4, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(q, RandomBf16(max_t * H * D, rng).data(), max_t * H * D * 2,
                        cudaMemcpyHostToDevice));
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  for (const int64_t ratio : {128, 4}) {
    const int64_t n_comp = ratio == 4 ? 512 : 64, n_cand = W + n_comp;
    ss::cuda::KvGeom g{.pool = base,
                       .block_bytes = block_bytes,
                       .nope = static_cast<int32_t>(nope),
                       .rope = static_cast<int32_t>(rope),
                       .record_bytes = static_cast<int32_t>(E),
                       .window = static_cast<int32_t>(W),
                       .win_per_block = static_cast<int32_t>(W),
                       .first_entry_block = 1,
                       .ratio = static_cast<int32_t>(ratio),
                       .entries_per_block = static_cast<int32_t>(per_block)};
    for (const int64_t T : {1, 8}) {
      std::vector<ss::cuda::KvToken> tok(T);
      std::vector<int32_t> sel(T * n_comp);
      for (int64_t t = 0; t < T; ++t) {
        ss::cuda::KvToken& k = tok[t];
        k.table = reinterpret_cast<uint64_t>(dtable);
        k.staging = dst[W + n_entries + t];
        k.n_table = static_cast<int32_t>(blocks);
        k.pos = static_cast<int32_t>(8191 - t);
        k.chunk_start = k.pos;
        k.chunk_end = k.pos + 1;
        k.win_width = static_cast<int32_t>(W);
        k.n_comp = static_cast<int32_t>(n_comp);
        k.sel_off = ratio == 4 ? static_cast<int32_t>(t * n_comp) : -1;
        for (int64_t m = 0; m < n_comp; ++m) sel[t * n_comp + m] = rng() % n_entries;
      }
      ss::cuda::KvToken* dtok = DeviceAlloc<ss::cuda::KvToken>(T);
      int32_t* dsel = DeviceAlloc<int32_t>(sel.size());
      uint64_t* cand = DeviceAlloc<uint64_t>(T * n_cand);
      uint16_t* rows =
          DeviceAlloc<uint16_t>(ss::cuda::KvSparseAttentionRowsBytes(T, n_cand, D, H) / 2);
      CHECK_CUDA(cudaMemcpy(dtok, tok.data(), T * sizeof(tok[0]), cudaMemcpyHostToDevice));
      CHECK_CUDA(cudaMemcpy(dsel, sel.data(), sel.size() * 4, cudaMemcpyHostToDevice));
      const auto build = [&](int, cudaStream_t st) {
        CHECK_CUDA(ss::cuda::KvBuildCandidates(g, dtok, T, dsel, n_cand, cand, st,
                                               ss::cuda::AsBf16(rows)));
      };
      const auto attend = [&](int, cudaStream_t st) {
        CHECK_CUDA(ss::cuda::KvSparseAttention({.q = ss::cuda::AsBf16(q),
                                                .cand = cand,
                                                .sink = dsink,
                                                .T = T,
                                                .n_heads = H,
                                                .head_dim = D,
                                                .nope = nope,
                                                .n_cand = n_cand,
                                                .scale = scale,
                                                .out = ss::cuda::AsBf16(out),
                                                .rows = ss::cuda::AsBf16(rows),
                                                .rows_decoded = true,
                                                .rope_cos = dcs,
                                                .rope_sin = dsn,
                                                .rope_dim = rope},
                                               st));
      };
      const auto chain = [&](int i, cudaStream_t st) {
        build(i, st);
        attend(i, st);
      };
      std::printf(
          "ratio %3ld layer, T=%ld, %ld candidates: chain %6.2f us (build %.2f us,"
          " attention %.2f us)\n",
          static_cast<long>(ratio), static_cast<long>(T), static_cast<long>(n_cand),
          GraphMs(64, chain) * 1e3f, GraphMs(64, build) * 1e3f, GraphMs(64, attend) * 1e3f);
      // Each kernel node of one captured chain, replayed alone.
      cudaStream_t s;
      CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      cudaGraph_t one;
      CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
      chain(0, s);
      CHECK_CUDA(cudaStreamEndCapture(s, &one));
      size_t n_nodes = 0;
      CHECK_CUDA(cudaGraphGetNodes(one, nullptr, &n_nodes));
      std::vector<cudaGraphNode_t> nodes(n_nodes);
      CHECK_CUDA(cudaGraphGetNodes(one, nodes.data(), &n_nodes));
      for (cudaGraphNode_t node : nodes) {
        cudaGraphNodeType type;
        CHECK_CUDA(cudaGraphNodeGetType(node, &type));
        if (type != cudaGraphNodeTypeKernel) continue;
        cudaKernelNodeParams p{};
        CHECK_CUDA(cudaGraphKernelNodeGetParams(node, &p));
        constexpr int kCopies = 64, kReps = 5;
        cudaGraph_t rep;
        CHECK_CUDA(cudaGraphCreate(&rep, 0));
        cudaGraphNode_t prev = nullptr;
        for (int c = 0; c < kCopies; ++c) {
          cudaGraphNode_t n;
          CHECK_CUDA(cudaGraphAddKernelNode(&n, rep, prev ? &prev : nullptr, prev ? 1 : 0, &p));
          prev = n;
        }
        cudaGraphExec_t exec;
        CHECK_CUDA(cudaGraphInstantiate(&exec, rep, 0));
        const float ms = ReplayMs(exec, s, kReps);
        // The kernel's name from its mangled symbol: the identifier that ends in "KernelImpl".
        const char* name = nullptr;
        std::string shown = "?";
        if (cudaFuncGetName(&name, p.func) == cudaSuccess && name != nullptr) {
          const std::string m = name;
          const size_t end = m.find("KernelImpl");
          if (end != std::string::npos) {
            size_t b = end;
            while (b > 0 && ((m[b - 1] | 0x20) >= 'a' && (m[b - 1] | 0x20) <= 'z')) --b;
            shown = m.substr(b, end + 10 - b);
          }
        }
        std::printf("    %-34s grid (%u,%u,%u) x %u: %6.2f us\n", shown.c_str(), p.gridDim.x,
                    p.gridDim.y, p.gridDim.z, p.blockDim.x * p.blockDim.y * p.blockDim.z,
                    ms * 1e3f / (kReps * kCopies));
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(rep);
      }
      cudaGraphDestroy(one);
      cudaStreamDestroy(s);
      for (void* ptr : {static_cast<void*>(dtok), static_cast<void*>(dsel),
                        static_cast<void*>(cand), static_cast<void*>(rows)}) {
        cudaFree(ptr);
      }
    }
  }
  for (void* ptr : {static_cast<void*>(pool), static_cast<void*>(ent), static_cast<void*>(ddst),
                    static_cast<void*>(dtable), static_cast<void*>(dcs), static_cast<void*>(dsn),
                    static_cast<void*>(dsink), static_cast<void*>(q), static_cast<void*>(out)}) {
    cudaFree(ptr);
  }
}

}  // namespace

// Launches that run HcPost on a result they have just formed, against the launches they
// replace, in the same run (graph-replayed time per call): wo_b's GEMV with HcPost in its
// epilogue (after QuantizeActE4m3, as decode runs it) against QuantizeActE4m3 + Fp8Linear +
// HcPost, every call reading another copy of the weights (L2 defeated); the MoE combine with
// HcPost against MoeCombineBf16 + HcPost.
void BenchFusedEpilogues(std::mt19937& rng) {
  std::printf(
      "\n== HcPost fused into its producer (hc 4, dim 4096): graph-replayed time per call ==\n");
  const int64_t hc = 4, dim = 4096, in = 8192, copies = 20;
  std::vector<uint8_t*> w(copies), ws(copies);
  const std::vector<uint8_t> codes = RandomCodes(dim * in, rng);
  const std::vector<uint8_t> scales((dim / 128) * (in / 128), 120);
  for (int64_t c = 0; c < copies; ++c) {
    w[c] = DeviceAlloc<uint8_t>(codes.size());
    ws[c] = DeviceAlloc<uint8_t>(scales.size());
    CHECK_CUDA(cudaMemcpy(w[c], codes.data(), codes.size(), cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(ws[c], scales.data(), scales.size(), cudaMemcpyHostToDevice));
  }
  const auto upload_bf16 = [&](int64_t n) {
    uint16_t* d = DeviceAlloc<uint16_t>(n);
    CHECK_CUDA(cudaMemcpy(d, RandomBf16(n, rng).data(), n * 2, cudaMemcpyHostToDevice));
    return d;
  };
  const auto upload_f32 = [&](int64_t n, float v) {
    float* d = DeviceAlloc<float>(n);
    CHECK_CUDA(cudaMemcpy(d, std::vector<float>(n, v).data(), n * 4, cudaMemcpyHostToDevice));
    return d;
  };
  for (const int64_t rows : {1, 4, 8}) {
    uint16_t* x = upload_bf16(rows * in);
    uint16_t* res = upload_bf16(rows * hc * dim);
    float* post = upload_f32(rows * hc, 0.75f);
    float* comb = upload_f32(rows * hc * hc, 0.25f);
    uint16_t* y = DeviceAlloc<uint16_t>(rows * dim);
    uint16_t* out = DeviceAlloc<uint16_t>(rows * hc * dim);
    uint8_t* q = DeviceAlloc<uint8_t>(rows * in);
    float* s = DeviceAlloc<float>(rows * in / 128);
    const ss::cuda::HcPostOperands hp{res, post, comb, hc, dim, out};
    const float gemv = GraphMs(copies, [&](int i, cudaStream_t st) {
      ss::cuda::Fp8Linear(ss::cuda::AsE4m3(q), s, rows, ss::cuda::AsE4m3(w[i]),
                          ss::cuda::AsUe8m0(ws[i]), dim, in, ss::cuda::AsBf16(y), st);
    });
    const float three = GraphMs(copies, [&](int i, cudaStream_t st) {
      ss::cuda::QuantizeActE4m3(ss::cuda::AsBf16(x), rows, in, ss::cuda::AsE4m3(q), s, st);
      ss::cuda::Fp8Linear(ss::cuda::AsE4m3(q), s, rows, ss::cuda::AsE4m3(w[i]),
                          ss::cuda::AsUe8m0(ws[i]), dim, in, ss::cuda::AsBf16(y), st);
      ss::cuda::HcPost(ss::cuda::AsBf16(y), ss::cuda::AsBf16(res), post, comb, rows, hc, dim,
                       ss::cuda::AsBf16(out), st);
    });
    const float two = GraphMs(copies, [&](int i, cudaStream_t st) {
      ss::cuda::QuantizeActE4m3(ss::cuda::AsBf16(x), rows, in, ss::cuda::AsE4m3(q), s, st);
      ss::cuda::Fp8LinearHcPost({.q = ss::cuda::AsE4m3(q),
                                 .s_act = s,
                                 .rows = rows,
                                 .w = ss::cuda::AsE4m3(w[i]),
                                 .w_scale = ss::cuda::AsUe8m0(ws[i]),
                                 .out = dim,
                                 .in = in,
                                 .y = ss::cuda::AsBf16(y),
                                 .hp = hp},
                                st);
    });
    std::printf(
        "wo_b 4096x8192 rows %ld: quantise + GEMV + HcPost %6.2f us, quantise + GEMV(HcPost) "
        "%6.2f us (%.3f of it; the GEMV alone %6.2f us)\n",
        static_cast<long>(rows), three * 1e3f, two * 1e3f, two / three, gemv * 1e3f);
    for (void* p : {static_cast<void*>(x), static_cast<void*>(res), static_cast<void*>(post),
                    static_cast<void*>(comb), static_cast<void*>(y), static_cast<void*>(out),
                    static_cast<void*>(q), static_cast<void*>(s)}) {
      cudaFree(p);
    }
  }
  for (int64_t c = 0; c < copies; ++c) {
    cudaFree(w[c]);
    cudaFree(ws[c]);
  }
  for (const int64_t T : {1, 8}) {
    uint16_t* shared = upload_bf16(T * dim);
    float* routed = upload_f32(T * dim, 0.5f);
    uint16_t* res = upload_bf16(T * hc * dim);
    float* post = upload_f32(T * hc, 0.75f);
    float* comb = upload_f32(T * hc * hc, 0.25f);
    uint16_t* x = DeviceAlloc<uint16_t>(T * dim);
    uint16_t* out = DeviceAlloc<uint16_t>(T * hc * dim);
    const ss::cuda::HcPostOperands hp{res, post, comb, hc, dim, out};
    const float two = GraphMs(20, [&](int, cudaStream_t st) {
      ss::cuda::MoeCombineBf16(ss::cuda::AsBf16(shared), routed, T * dim, ss::cuda::AsBf16(x), st);
      ss::cuda::HcPost(ss::cuda::AsBf16(x), ss::cuda::AsBf16(res), post, comb, T, hc, dim,
                       ss::cuda::AsBf16(out), st);
    });
    const float one = GraphMs(20, [&](int, cudaStream_t st) {
      ss::cuda::MoeCombineHcPost(ss::cuda::AsBf16(shared), routed, T, hp, st);
    });
    std::printf("MoE combine T %ld: combine + HcPost %6.2f us, MoeCombineHcPost %6.2f us (%.3f)\n",
                static_cast<long>(T), two * 1e3f, one * 1e3f, one / two);
    for (void* p : {static_cast<void*>(shared), static_cast<void*>(routed), static_cast<void*>(res),
                    static_cast<void*>(post), static_cast<void*>(comb), static_cast<void*>(x),
                    static_cast<void*>(out)}) {
      cudaFree(p);
    }
  }
}

// --sync: what a dependency between two phases of a decode step costs, each as time per boundary
// in the same run: a chain of launches that each store a word per block (graph-replayed: a kernel
// boundary), the same launches ending in a last-block handoff, and a persistent launch of one
// block per SM passing grid barriers (fence, atomic arrival, spin), against the boundary.
void BenchSync() {
  std::printf(
      "\n== phase boundaries: graph kernel boundary, last-block handoff, grid barrier ==\n");
  int sms = 1, coop = 0;
  CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CHECK_CUDA(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, 0));
  uint32_t* out = DeviceAlloc<uint32_t>(static_cast<size_t>(sms) + 1);
  uint32_t* counter = DeviceAlloc<uint32_t>(1);
  CHECK_CUDA(cudaMemset(counter, 0, 4));
  constexpr int kChain = 64;
  float boundary_us = 0.0f;
  for (const int blocks : {1, sms}) {
    const float touch = GraphMs(
        kChain, [&](int, cudaStream_t s) { CHECK_CUDA(ss::bench::TouchKernel(blocks, out, s)); });
    const float handoff = GraphMs(kChain, [&](int, cudaStream_t s) {
      CHECK_CUDA(ss::bench::HandoffKernel(blocks, counter, out, s));
    });
    const float fences = GraphMs(kChain, [&](int, cudaStream_t s) {
      CHECK_CUDA(ss::bench::HandoffFencesKernel(blocks, counter, out, s));
    });
    if (blocks == sms) boundary_us = touch * 1e3f;
    std::printf(
        "%4d blocks: kernel boundary %.2f us a launch; ending in LastBlockFinishes's handoff %.2f "
        "us (+%.2f), in fences around a relaxed atomic %.2f us (+%.2f)\n",
        blocks, touch * 1e3, handoff * 1e3, (handoff - touch) * 1e3, fences * 1e3,
        (fences - touch) * 1e3);
  }
  if (coop == 0) {
    std::printf("grid barrier: no cooperative launch on this device\n");
  } else {
    constexpr int kRounds = 1024;
    const auto loop = [&](int rounds) {
      return TimeMs(8, [&](int) {
        CHECK_CUDA(cudaMemsetAsync(counter, 0, 4));
        CHECK_CUDA(ss::bench::GridBarrierLoop(sms, rounds, counter, nullptr));
      });
    };
    const float per = (loop(kRounds + 1) - loop(1)) * 1e3f / kRounds;
    std::printf(
        "%4d blocks: grid barrier in one persistent launch %.2f us = %.2f of the kernel "
        "boundary\n",
        sms, per, per / boundary_us);
    CHECK_CUDA(cudaMemset(counter, 0, 4));
  }
  cudaFree(out);
  cudaFree(counter);
}

// --persistent: bench/persistent_layer.h's model of a Flash layer's batch-1 decode step (ratio 4,
// 8K): its weight (and KV) bytes in the phases of the cuda backend's critical path, with L us of
// latency-bound work spread over its 14 latency-bound steps, run as launches in a graph, as one
// persistent launch, and as one persistent launch that prefetches the coming phases' weights
// into shared memory; each as a fraction of the copy (the bytes read per second over the copy's
// bytes read and written per second, as the layer bench reports it). Three copies of the bytes
// in turn, so every step reads them from memory.
void BenchPersistent(double copy_gbs) {
  std::printf(
      "\n== a layer's decode step as launches, as one persistent launch, with prefetch ==\n");
  int coop = 0;
  CHECK_CUDA(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, 0));
  if (coop == 0) {
    std::printf("no cooperative launch on this device\n");
    return;
  }
  constexpr int64_t kMiB = int64_t{1} << 20;
  ss::bench::LayerPlan plan;
  const auto phase = [&](int spins, int64_t bytes) {
    plan.spins[plan.n] = spins;
    plan.bytes[plan.n] = bytes / 16 * 16;
    ++plan.n;
  };
  // HcPre (mix, finish) -> wq_a + wkv, the compressors' bf16 projections beside them
  phase(2, 6 * kMiB + 20 * kMiB + kMiB / 2);
  phase(1, 40 * kMiB);             // the query norm -> wq_b, the indexer's wq_b
  phase(7, 32 * kMiB + 5 * kMiB);  // indexer (4), candidates, attention (2) -> wo_a; the KV
  phase(0, 32 * kMiB);             // -> wo_b (+ HcPost)
  phase(2, 18 * kMiB);             // HcPre -> the router's gate, w1 + w3
  phase(1, 8 * kMiB);              // SwiGLU -> w2
  phase(1, 0);                     // HcPost
  int64_t total = 0;
  int spins = 0;
  for (int p = 0; p < plan.n; ++p) {
    total += plan.bytes[p];
    spins += plan.spins[p];
  }
  constexpr int kCopies = 3;
  uint8_t* w = DeviceAlloc<uint8_t>(static_cast<size_t>(total) * kCopies);
  CHECK_CUDA(cudaMemset(w, 1, static_cast<size_t>(total) * kCopies));
  uint32_t* sink = DeviceAlloc<uint32_t>(1);
  uint32_t* barrier = DeviceAlloc<uint32_t>(2);
  CHECK_CUDA(cudaMemset(barrier, 0, 2 * sizeof(uint32_t)));
  const auto copy_of = [&](int i) { return w + static_cast<size_t>(i % kCopies) * total; };
  const auto frac = [&](float ms) {
    return static_cast<double>(total) / (ms * 1e-3) / 1e9 / copy_gbs;
  };
  const float read_ms = GraphMs(kCopies * 4, [&](int i, cudaStream_t s) {
    CHECK_CUDA(ss::bench::StreamRead(copy_of(i), total, sink, s));
  });
  std::printf(
      "%.1f MB in %d phases, %d latency-bound steps; all of it in one read: %.1f us, %.3f "
      "of copy\n",
      total / 1e6, plan.n, spins, read_ms * 1e3, frac(read_ms));
  const int ring = ss::bench::LayerPersistentMaxPrefetch();
  for (const int latency_us : {0, 10, 20, 40, 60, 80}) {
    const int64_t spin_ns = static_cast<int64_t>(latency_us) * 1000 / spins;
    const float launches = GraphMs(kCopies * 4, [&](int i, cudaStream_t s) {
      CHECK_CUDA(ss::bench::LayerAsLaunches(copy_of(i), plan, spin_ns, sink, s));
    });
    // Graph-replayed as the launches; launched from the host where a cooperative launch cannot
    // be captured.
    const auto persistent = [&](int prefetch) {
      const auto launch = [&](int i, cudaStream_t s) {
        CHECK_CUDA(
            ss::bench::LayerPersistent(copy_of(i), plan, spin_ns, prefetch, barrier, sink, s));
      };
      const float ms = GraphMs(kCopies * 4, launch);
      return ms >= 0.0f ? ms : TimeMs(kCopies * 4, [&](int i) { launch(i, nullptr); });
    };
    const float plain = persistent(0), pre = persistent(ring);
    std::printf(
        "latency-bound work %2d us (%4.2f us a step): launches %6.1f us (%.3f), persistent "
        "%6.1f us (%.3f), persistent + %d KiB prefetch %6.1f us (%.3f)\n",
        latency_us, spin_ns / 1e3, launches * 1e3, frac(launches), plain * 1e3, frac(plain),
        ring / 1024, pre * 1e3, frac(pre));
  }
  // The prefetch alone: one latency-bound step of 20 us, then as many bytes as the rings hold
  // (read in one step, as the spin ends, only if the rings filled during it).
  int sms = 1;
  CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  ss::bench::LayerPlan one;
  one.n = 1;
  one.spins[0] = 1;
  one.bytes[0] = static_cast<int64_t>(ring) * sms;
  for (const int64_t spin_ns : {int64_t{0}, int64_t{20000}}) {
    const auto run = [&](int prefetch) {
      return GraphMs(kCopies * 4, [&](int i, cudaStream_t s) {
        CHECK_CUDA(
            ss::bench::LayerPersistent(copy_of(i), one, spin_ns, prefetch, barrier, sink, s));
      });
    };
    const float plain = run(0), pre = run(ring);
    std::printf("one step of %5.1f us, then %.1f MB: persistent %6.1f us, with prefetch %6.1f us\n",
                spin_ns / 1e3, one.bytes[0] / 1e6, plain * 1e3, pre * 1e3);
  }
  cudaFree(w);
  cudaFree(sink);
  cudaFree(barrier);
}

int main(int argc, char** argv) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::fprintf(stderr, "gpu_kernels_bench: no CUDA device\n");
    return 1;
  }
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, %d MB L2\n", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize >> 20);
  if (const absl::Status s = ss::cuda::PrepareKernels(); !s.ok()) {
    std::fprintf(stderr, "gpu_kernels_bench: %s\n", s.ToString().c_str());
    return 1;
  }

  const size_t copy_bytes = size_t{256} << 20;
  void* src = DeviceAlloc<uint8_t>(copy_bytes);
  void* dst = DeviceAlloc<uint8_t>(copy_bytes);
  CHECK_CUDA(cudaMemset(src, 1, copy_bytes));
  const float copy_ms =
      TimeMs(20, [&](int) { cudaMemcpyAsync(dst, src, copy_bytes, cudaMemcpyDeviceToDevice); });
  const double copy_gbs = 2.0 * copy_bytes / (copy_ms * 1e-3) / 1e9;
  std::printf("baseline D2D copy: %.1f GB/s (read + write)\n", copy_gbs);
  cudaFree(src);
  cudaFree(dst);

  std::mt19937 rng(1);
  if (argc > 1 && std::string(argv[1]) == "--fused") {  // the fused HcPost launches alone
    BenchFusedEpilogues(rng);
    return 0;
  }
  if (argc > 1 && std::string(argv[1]) == "--gemv") {  // the decode GEMVs alone
    BenchDecode(copy_gbs, rng);
    return 0;
  }
  if (argc > 1 && std::string(argv[1]) == "--persistent") {  // a layer step's phase model
    BenchPersistent(copy_gbs);
    return 0;
  }
  if (argc > 1 && std::string(argv[1]) == "--sync") {  // phase-boundary costs alone
    BenchSync();
    return 0;
  }
  if (argc > 1 && std::string(argv[1]) == "--attention") {  // the decode attention alone
    BenchDecodeAttention();
    return 0;
  }
  BenchIndexer(rng);
  if (argc > 1 && std::string(argv[1]) == "--indexer") return 0;  // the indexer alone
  BenchDecodeAttention();
  BenchFusedEpilogues(rng);
  BenchDecode(copy_gbs, rng);
  Cublas cublas;
  const bool have_cublas = cublas.Load(argc > 1 ? argv[1] : nullptr);
  if (have_cublas) {
    std::printf("\ncuBLAS from %s\n", cublas.from.c_str());
  } else {
    std::printf("\ncuBLAS not found: the ratio to cuBLAS is skipped\n");
  }
  BenchPrefill(have_cublas ? &cublas : nullptr, rng);
  if (have_cublas) cublas.destroy(cublas.handle);
  return 0;
}
