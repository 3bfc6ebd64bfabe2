// ggml_moe_decode: ggml's CPU backend decoding through DeepSeek-V4-Flash-shaped routed experts in
// MXFP4, the way llama.cpp's MoE layer (build_moe_ffn) runs them, for the side-by-side comparison
// with splitserve's CPU expert worker (bench/ggml_moe/ggml_compare.sh).
//
// Per layer: gate and up [ne0 = dim, ne1 = inter, ne2 = E] and down [inter, dim, E], all
// GGML_TYPE_MXFP4, filled with random raw blocks (random nibbles, e8m0 scales 120..123). One graph
// for all layers, built once: per layer ggml_mul_mat_id for gate and up on the token's hidden row
// with the layer's top-k ids, ggml_swiglu_split, ggml_mul_mat_id for down, times the routing
// weights, the top-k rows summed, then x = rms_norm(x + moe) feeds the next layer. Per token the
// host sets new random distinct top-k ids (uniform over E) and weights for every layer, and the CPU
// backend computes the graph with --threads threads (ggml_backend_cpu_set_n_threads; no threadpool
// object, so ggml's defaults: OpenMP where ggml was built with it).
//
// The weights live where llama.cpp puts them by default: in the CPU backend's extra buffer type
// (CPU_REPACK) when it takes MXFP4 mul_mat_id on this CPU (ggml repacks MXFP4 into 8-row
// interleaved blocks on AVX2 hosts), in the plain CPU buffer otherwise or with --repack 0 (then
// the vec_dot mxfp4 x q8_0 kernel runs). The summary says which (weights=repack|plain).
//
// Token time: setting the routing inputs plus ggml_backend_graph_compute. GB/s: the bytes of the
// distinct experts' weights a token reads (per layer: distinct ids x 3 x dim x inter x 17/32) over
// the token time. Output, one line (plus one per token with --verbose):
//   ggml_moe_decode threads=N layers=L experts=E top_k=K tokens=T build=avx512|avx2|... ...
//   tok_s_median=X gbps_median=Y tok_s_best=.. gbps_best=..
// On the first token, layer 0's output is checked against a double-precision reference computed
// from the same raw blocks (check_rel_err: relative L2 error; ggml rounds activations to q8_0, so
// about 1e-2 is expected). Exits 1 when the output is not finite or that error exceeds 0.05.
//
// Not part of splitserve's CMake build (ggml is no Debian package). Build ggml (CPU only, static)
// and link, e.g.:
//   bench/ggml_moe/pack_ggml.sh GGML_GIT_DIR ggml.tar.xz && tar xJf ggml.tar.xz
//   cmake -S ggml -B ggml-build -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF
//     -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
//     -DGGML_BUILD_TESTS=OFF -DGGML_BUILD_EXAMPLES=OFF && cmake --build ggml-build -j
//   g++ -O3 -std=c++17 -Iggml/include bench/ggml_moe/ggml_moe_decode.cc
//     ggml-build/src/libggml.a ggml-build/src/libggml-cpu.a ggml-build/src/libggml-base.a
//     -fopenmp -lpthread -ldl -o ggml_moe_decode
//   taskset -c 0-15 ./ggml_moe_decode --threads 16
// ggml_compare.sh does all of this for two ISA builds and runs splitserve's bench beside it.
//
//   ggml_moe_decode [--threads N] [--layers L] [--experts E] [--top_k K] [--tokens T]
//       [--warmup W] [--dim D] [--inter I] [--seed S] [--repack 0|1] [--verbose]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"

namespace {

struct Options {
  int threads = 0, layers = 43, experts = 16, top_k = 6, tokens = 30, warmup = 3;
  int64_t dim = 4096, inter = 2048;
  uint64_t seed = 1;
  int repack = 1;
  bool verbose = false;
};

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "ggml_moe_decode: %s\n", what.c_str());
  std::exit(1);
}

void Usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s [--threads N] [--layers L] [--experts E] [--top_k K] [--tokens T] "
               "[--warmup W] [--dim D] [--inter I] [--seed S] [--repack 0|1] [--verbose]\n",
               argv0);
  std::exit(2);
}

Options Parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--verbose") {
      o.verbose = true;
      continue;
    }
    if (i + 1 >= argc) Usage(argv[0]);
    const char* v = argv[++i];
    if (a == "--threads") {
      o.threads = std::atoi(v);
    } else if (a == "--layers") {
      o.layers = std::atoi(v);
    } else if (a == "--experts") {
      o.experts = std::atoi(v);
    } else if (a == "--top_k") {
      o.top_k = std::atoi(v);
    } else if (a == "--tokens") {
      o.tokens = std::atoi(v);
    } else if (a == "--warmup") {
      o.warmup = std::atoi(v);
    } else if (a == "--dim") {
      o.dim = std::atoll(v);
    } else if (a == "--inter") {
      o.inter = std::atoll(v);
    } else if (a == "--seed") {
      o.seed = std::strtoull(v, nullptr, 10);
    } else if (a == "--repack") {
      o.repack = std::atoi(v);
    } else {
      Usage(argv[0]);
    }
  }
  if (o.threads <= 0) o.threads = static_cast<int>(std::thread::hardware_concurrency());
  if (o.layers < 1 || o.top_k < 1 || o.experts < o.top_k || o.tokens < 1 || o.warmup < 0 ||
      o.dim % 32 != 0 || o.inter % 32 != 0 || o.dim <= 0 || o.inter <= 0) {
    Fail("need layers >= 1, 1 <= top_k <= experts, tokens >= 1, dim and inter multiples of 32");
  }
  return o;
}

// splitmix64: a fast seeded generator, one stream per fill task.
struct Rng {
  uint64_t s;
  uint64_t Next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
};

// Raw block_mxfp4 data: per 32 values one e8m0 byte in 120..123, then 16 bytes of random nibbles.
void FillMxfp4(uint8_t* dst, size_t blocks, uint64_t seed) {
  Rng rng{seed};
  for (size_t b = 0; b < blocks; ++b, dst += 17) {
    const uint64_t r0 = rng.Next(), r1 = rng.Next();
    dst[0] = static_cast<uint8_t>(120 + (r0 >> 62));
    std::memcpy(dst + 1, &r0, 8);
    std::memcpy(dst + 9, &r1, 8);
  }
}

// The per-layer expert tensors.
struct Layer {
  ggml_tensor *gate, *up, *down, *ids, *weights;
};

// One token's routing, per layer: top-k ids and weights.
struct Routing {
  std::vector<std::vector<int32_t>> ids;
  std::vector<std::vector<float>> weights;
  std::vector<int> distinct;
};

uint64_t TensorSeed(uint64_t seed, size_t index) { return seed * 1000003 + index; }

struct Model {
  ggml_context* weights_ctx = nullptr;
  ggml_context* inputs_ctx = nullptr;
  ggml_backend_buffer_t weights_buf = nullptr;
  ggml_backend_buffer_t inputs_buf = nullptr;
  std::vector<Layer> layers;
  ggml_tensor* x0 = nullptr;
  bool repacked = false;
};

ggml_context* NoAllocContext(size_t tensors) {
  ggml_init_params p = {tensors * ggml_tensor_overhead() + ggml_graph_overhead_custom(8192, false),
                        nullptr, true};
  ggml_context* ctx = ggml_init(p);
  if (ctx == nullptr) Fail("ggml_init");
  return ctx;
}

// CPU_REPACK, llama.cpp's first choice for weights, when it takes this MXFP4 mul_mat_id (asked the
// way llama.cpp asks: the op on a zero-sized buffer of that type, through supports_op).
ggml_backend_buffer_type_t RepackBufferType(const Options& o) {
  ggml_backend_dev_t dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
  auto get_extra =
      reinterpret_cast<ggml_backend_dev_get_extra_bufts_t>(ggml_backend_reg_get_proc_address(
          ggml_backend_cpu_reg(), "ggml_backend_dev_get_extra_bufts"));
  if (dev == nullptr || get_extra == nullptr) return nullptr;
  for (ggml_backend_buffer_type_t* b = get_extra(dev); *b != nullptr; ++b) {
    if (std::strcmp(ggml_backend_buft_name(*b), "CPU_REPACK") != 0) continue;
    ggml_context* ctx = NoAllocContext(8);
    bool ok = true;
    ggml_backend_buffer_t dummy = ggml_backend_buft_alloc_buffer(*b, 0);
    for (auto [k, n] : {std::pair{o.dim, o.inter}, std::pair{o.inter, o.dim}}) {
      ggml_tensor* w = ggml_new_tensor_3d(ctx, GGML_TYPE_MXFP4, k, n, o.experts);
      ggml_tensor* x = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, k, 1, 1);
      ggml_tensor* ids = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, o.top_k, 1);
      w->buffer = dummy;
      ok = ok && ggml_backend_dev_supports_op(dev, ggml_mul_mat_id(ctx, w, x, ids));
    }
    ggml_backend_buffer_free(dummy);
    ggml_free(ctx);
    if (ok) return *b;
  }
  return nullptr;
}

// Fills every expert tensor on all hardware threads: written in place in a plain CPU buffer,
// or generated per tensor and handed to ggml_backend_tensor_set, which repacks, in CPU_REPACK.
void FillWeights(const Model& m, uint64_t seed) {
  std::vector<ggml_tensor*> all;  // tensor i: layer i / 3, gate, up, down
  for (const Layer& l : m.layers) all.insert(all.end(), {l.gate, l.up, l.down});
  const int workers =
      std::max(1, std::min<int>(std::thread::hardware_concurrency(), static_cast<int>(all.size())));
  std::vector<std::thread> pool;
  for (int w = 0; w < workers; ++w) {
    pool.emplace_back([&, w] {
      std::vector<uint8_t> staging;
      for (size_t i = w; i < all.size(); i += workers) {
        ggml_tensor* t = all[i];
        const size_t bytes = ggml_nbytes(t);
        uint8_t* dst = static_cast<uint8_t*>(t->data);
        if (m.repacked) {
          staging.resize(bytes);
          dst = staging.data();
        }
        FillMxfp4(dst, bytes / 17, TensorSeed(seed, i));
        if (m.repacked) ggml_backend_tensor_set(t, staging.data(), 0, bytes);
      }
    });
  }
  for (std::thread& t : pool) t.join();
}

Model MakeModel(const Options& o) {
  Model m;
  m.weights_ctx = NoAllocContext(3 * o.layers);
  m.inputs_ctx = NoAllocContext(2 * o.layers + 1);
  for (int l = 0; l < o.layers; ++l) {
    Layer y;
    y.gate = ggml_new_tensor_3d(m.weights_ctx, GGML_TYPE_MXFP4, o.dim, o.inter, o.experts);
    y.up = ggml_new_tensor_3d(m.weights_ctx, GGML_TYPE_MXFP4, o.dim, o.inter, o.experts);
    y.down = ggml_new_tensor_3d(m.weights_ctx, GGML_TYPE_MXFP4, o.inter, o.dim, o.experts);
    y.ids = ggml_new_tensor_2d(m.inputs_ctx, GGML_TYPE_I32, o.top_k, 1);
    y.weights = ggml_new_tensor_3d(m.inputs_ctx, GGML_TYPE_F32, 1, o.top_k, 1);
    m.layers.push_back(y);
  }
  m.x0 = ggml_new_tensor_2d(m.inputs_ctx, GGML_TYPE_F32, o.dim, 1);
  ggml_backend_buffer_type_t buft = o.repack ? RepackBufferType(o) : nullptr;
  m.repacked = buft != nullptr;
  if (buft == nullptr) buft = ggml_backend_cpu_buffer_type();
  m.weights_buf = ggml_backend_alloc_ctx_tensors_from_buft(m.weights_ctx, buft);
  m.inputs_buf =
      ggml_backend_alloc_ctx_tensors_from_buft(m.inputs_ctx, ggml_backend_cpu_buffer_type());
  if (m.weights_buf == nullptr || m.inputs_buf == nullptr) Fail("allocating the weights");
  ggml_backend_buffer_set_usage(m.weights_buf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
  FillWeights(m, o.seed);
  return m;
}

// One MoE layer as llama.cpp's build_moe_ffn builds it (separate gate and up, SwiGLU, weights
// applied after down, the top-k rows summed), then rms_norm(x + moe).
ggml_tensor* MoeLayer(ggml_context* ctx, const Layer& l, ggml_tensor* x, const Options& o) {
  ggml_tensor* cur = ggml_reshape_3d(ctx, x, o.dim, 1, 1);
  ggml_tensor* up = ggml_mul_mat_id(ctx, l.up, cur, l.ids);       // [inter, k, 1]
  ggml_tensor* gate = ggml_mul_mat_id(ctx, l.gate, cur, l.ids);   // [inter, k, 1]
  ggml_tensor* h = ggml_swiglu_split(ctx, gate, up);              // silu(gate) * up
  ggml_tensor* experts = ggml_mul_mat_id(ctx, l.down, h, l.ids);  // [dim, k, 1]
  experts = ggml_mul(ctx, experts, l.weights);
  ggml_tensor* moe = nullptr;
  for (int k = 0; k < o.top_k; ++k) {
    ggml_tensor* row = ggml_view_2d(ctx, experts, o.dim, 1, experts->nb[2], k * experts->nb[1]);
    moe = moe == nullptr ? row : ggml_add(ctx, moe, row);
  }
  if (o.top_k == 1) moe = ggml_cont(ctx, moe);
  return ggml_rms_norm(ctx, ggml_add(ctx, x, moe), 1e-6f);
}

// Distinct top-k ids, uniform over the experts (a partial Fisher-Yates shuffle), and positive
// weights summing to 1, for every layer.
Routing SetRouting(const Model& m, const Options& o, Rng& rng) {
  std::vector<int32_t> perm(o.experts), ids(o.top_k);
  std::vector<float> w(o.top_k);
  Routing r;
  for (const Layer& l : m.layers) {
    for (int e = 0; e < o.experts; ++e) perm[e] = e;
    float sum = 0.0f;
    for (int k = 0; k < o.top_k; ++k) {
      const int j = k + static_cast<int>(rng.Next() % (o.experts - k));
      std::swap(perm[k], perm[j]);
      ids[k] = perm[k];
      w[k] = 0.05f + static_cast<float>(rng.Next() >> 40) / static_cast<float>(1 << 24);
      sum += w[k];
    }
    for (float& v : w) v /= sum;
    std::vector<int32_t> sorted = ids;
    std::sort(sorted.begin(), sorted.end());
    r.distinct.push_back(
        static_cast<int>(std::unique(sorted.begin(), sorted.end()) - sorted.begin()));
    ggml_backend_tensor_set(l.ids, ids.data(), 0, ggml_nbytes(l.ids));
    ggml_backend_tensor_set(l.weights, w.data(), 0, ggml_nbytes(l.weights));
    r.ids.push_back(ids);
    r.weights.push_back(w);
  }
  return r;
}

// y = W[e] x in double, W the raw MXFP4 blocks of a [k, n, E] tensor (value = kvalues x 2^(e-128),
// ggml's convention), x of length k.
std::vector<double> ExpertMatVec(const std::vector<uint8_t>& raw, int64_t k, int64_t n, int e,
                                 const std::vector<double>& x) {
  static constexpr int kValues[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
  std::vector<double> y(n);
  for (int64_t r = 0; r < n; ++r) {
    const uint8_t* b = raw.data() + (e * n + r) * (k / 32) * 17;
    double acc = 0;
    for (int64_t j = 0; j < k; j += 32, b += 17) {
      double block = 0;
      for (int i = 0; i < 16; ++i) {
        block += kValues[b[1 + i] & 15] * x[j + i] + kValues[b[1 + i] >> 4] * x[j + 16 + i];
      }
      acc += std::ldexp(block, b[0] - 128);
    }
    y[r] = acc;
  }
  return y;
}

// The relative L2 error of layer 0's output `got` against the reference from the input `x0` and
// the routing, the weights regenerated from their seeds.
double Layer0Error(const Options& o, const std::vector<float>& x0, const Routing& r,
                   const std::vector<float>& got) {
  std::vector<uint8_t> raw[3];
  for (int i = 0; i < 3; ++i) {
    raw[i].resize(o.experts * o.dim * o.inter / 32 * 17);
    FillMxfp4(raw[i].data(), raw[i].size() / 17, TensorSeed(o.seed, i));
  }
  const std::vector<double> x(x0.begin(), x0.end());
  std::vector<double> y = x;
  for (int k = 0; k < o.top_k; ++k) {
    const int e = r.ids[0][k];
    std::vector<double> h = ExpertMatVec(raw[0], o.dim, o.inter, e, x);
    const std::vector<double> up = ExpertMatVec(raw[1], o.dim, o.inter, e, x);
    for (int64_t i = 0; i < o.inter; ++i) h[i] = h[i] / (1 + std::exp(-h[i])) * up[i];
    const std::vector<double> down = ExpertMatVec(raw[2], o.inter, o.dim, e, h);
    for (int64_t i = 0; i < o.dim; ++i) y[i] += r.weights[0][k] * down[i];
  }
  double ss = 0;
  for (double v : y) ss += v * v;
  const double scale = 1 / std::sqrt(ss / o.dim + 1e-6);
  double err = 0, norm = 0;
  for (int64_t i = 0; i < o.dim; ++i) {
    err += (got[i] - y[i] * scale) * (got[i] - y[i] * scale);
    norm += y[i] * scale * y[i] * scale;
  }
  return std::sqrt(err / norm);
}

std::string BuildName() {
  if (ggml_cpu_has_avx512()) return "avx512";
  if (ggml_cpu_has_avx2()) return "avx2";
  if (ggml_cpu_has_avx()) return "avx";
  return "other";
}

// A feature of the CPU backend's build ("OPENMP", "REPACK"): "1" or "0".
std::string CpuFeature(const char* name) {
  auto get = reinterpret_cast<ggml_backend_get_features_t>(
      ggml_backend_reg_get_proc_address(ggml_backend_cpu_reg(), "ggml_backend_get_features"));
  if (get == nullptr) return "?";
  for (ggml_backend_feature* f = get(ggml_backend_cpu_reg()); f->name != nullptr; ++f) {
    if (std::strcmp(f->name, name) == 0) return f->value;
  }
  return "0";
}

// This process's anonymous memory in transparent huge pages, GB (0 where the kernel does not say).
double AnonHugeGb() {
  std::ifstream in("/proc/self/smaps_rollup");
  std::string key;
  long long kb = 0;
  while (in >> key) {
    if (key == "AnonHugePages:") {
      in >> kb;
      break;
    }
  }
  return kb * 1024.0 / 1e9;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// ggml's log, warnings and errors only (its debug lines name every repacked tensor).
void QuietLog(ggml_log_level level, const char* text, void*) {
  static ggml_log_level last = GGML_LOG_LEVEL_NONE;
  if (level != GGML_LOG_LEVEL_CONT) last = level;
  if (last >= GGML_LOG_LEVEL_WARN) std::fputs(text, stderr);
}

int Run(const Options& o) {
  ggml_log_set(QuietLog, nullptr);
  ggml_backend_t backend = ggml_backend_cpu_init();
  if (backend == nullptr) Fail("ggml_backend_cpu_init");
  ggml_backend_cpu_set_n_threads(backend, o.threads);
  const auto fill0 = std::chrono::steady_clock::now();
  Model m = MakeModel(o);
  const double fill_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - fill0).count();

  ggml_context* gctx = NoAllocContext(8192);
  ggml_cgraph* gf = ggml_new_graph_custom(gctx, 8192, false);
  ggml_tensor* x = m.x0;
  ggml_tensor* layer0 = nullptr;
  for (const Layer& l : m.layers) {
    x = MoeLayer(gctx, l, x, o);
    if (layer0 == nullptr) layer0 = x;
  }
  ggml_set_output(layer0);
  ggml_set_output(x);
  ggml_build_forward_expand(gf, x);
  ggml_gallocr_t galloc = ggml_gallocr_new(ggml_backend_cpu_buffer_type());
  if (!ggml_gallocr_alloc_graph(galloc, gf)) Fail("allocating the graph");

  Rng rng{o.seed * 7919 + 17};
  std::vector<float> x0(o.dim), out(o.dim);
  for (float& v : x0) v = static_cast<float>(rng.Next() >> 40) / (1 << 23) - 1.0f;
  const double expert_bytes = 3.0 * o.dim * o.inter * 17 / 32;
  std::vector<double> seconds, gbps;
  double check_err = -1;
  for (int t = 0; t < o.warmup + o.tokens; ++t) {
    ggml_backend_tensor_set(m.x0, x0.data(), 0, ggml_nbytes(m.x0));
    const auto t0 = std::chrono::steady_clock::now();
    const Routing routing = SetRouting(m, o, rng);
    if (ggml_backend_graph_compute(backend, gf) != GGML_STATUS_SUCCESS) Fail("graph compute");
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ggml_backend_tensor_get(x, out.data(), 0, ggml_nbytes(x));
    for (float v : out) {
      if (!std::isfinite(v)) Fail("the output is not finite at token " + std::to_string(t));
    }
    if (t == 0) {
      std::vector<float> got(o.dim);
      ggml_backend_tensor_get(layer0, got.data(), 0, ggml_nbytes(layer0));
      check_err = Layer0Error(o, x0, routing, got);
      if (!(check_err <= 0.05))
        Fail("layer 0 differs from the reference: relative error " + std::to_string(check_err));
    }
    double bytes = 0;
    for (int d : routing.distinct) bytes += d * expert_bytes;
    if (o.verbose) {
      std::printf("token=%d warmup=%d ms=%.3f gbps=%.2f out0=%.6f\n", t, t < o.warmup ? 1 : 0,
                  s * 1e3, bytes / s / 1e9, out[0]);
    }
    if (t < o.warmup) continue;
    seconds.push_back(s);
    gbps.push_back(bytes / s / 1e9);
    x0 = out;  // the next token starts from this one's output
  }
  const double s_med = Median(seconds), s_best = *std::min_element(seconds.begin(), seconds.end());
  std::printf(
      "ggml_moe_decode threads=%d layers=%d experts=%d top_k=%d tokens=%d warmup=%d dim=%lld "
      "inter=%lld build=%s weights=%s openmp=%s fill_s=%.1f weights_gb=%.2f anon_huge_gb=%.2f "
      "check_rel_err=%.4f tok_s_median=%.3f gbps_median=%.2f tok_s_best=%.3f gbps_best=%.2f\n",
      o.threads, o.layers, o.experts, o.top_k, o.tokens, o.warmup, static_cast<long long>(o.dim),
      static_cast<long long>(o.inter), BuildName().c_str(), m.repacked ? "repack" : "plain",
      CpuFeature("OPENMP").c_str(), fill_s, ggml_backend_buffer_get_size(m.weights_buf) / 1e9,
      AnonHugeGb(), check_err, 1.0 / s_med, Median(gbps), 1.0 / s_best,
      *std::max_element(gbps.begin(), gbps.end()));
  ggml_gallocr_free(galloc);
  ggml_free(gctx);
  ggml_backend_buffer_free(m.weights_buf);
  ggml_backend_buffer_free(m.inputs_buf);
  ggml_free(m.weights_ctx);
  ggml_free(m.inputs_ctx);
  ggml_backend_free(backend);
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return Run(Parse(argc, argv)); }
