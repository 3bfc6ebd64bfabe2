// The rates that bound the CPU expert worker, per thread count, each thread pinned to its own CPU
// (0..N-1 in OS order) and working on its own memory, with no fork-join between threads:
//
//   fma      the register-only FMA peak (12 independent fp32 FMA chains a thread, AVX2 8 lanes,
//            AVX-512 16 lanes), GFLOP/s: the "cores' FMA peak" issue 30 measures prefill against;
//   ops      register-only throughput of the kernels' instructions (vpdpbusd, vpmaddubsw, ...),
//            12 independent chains a thread, in instructions per ns;
//   stream   a sequential read of --gib GiB split into one contiguous part a thread, with the
//            software prefetch variants the kernels and the baselines use (none, T0 / T2 / NTA
//            at 4, 16 or 64 KB ahead), on memory advised MADV_HUGEPAGE and MADV_NOHUGEPAGE
//            (the AnonHugePages each buffer got is printed: whether THP works here at all);
//   l2       the expert kernel's gate_up on one L2-resident 128-column unit a thread, again and
//            again (T = 1): the kernel's per-core compute rate with every core busy, GB/s of
//            weights;
//   l2rows   the same unit for 64 token rows a call (the largest unit the engine makes; other
//            counts with --rows): the prefill-sized calls' compute rate, GFLOP/s (2 x rows x
//            the unit's weights a call);
//   dram     each thread runs whole experts (gate_up over all columns, then down) over its own
//            share of --gib GiB of Flash-shaped tiled experts (T = 1): the kernel from memory
//            with every core busy but without the engine's fork-join.
//
//   build/bin/cpu_rates_bench [--threads 1,2,4,8,16] [--gib 2] [--sections
//   fma,stream,l2,l2rows,dram]
//                             [--isa avx2,avx512,amx] [--passes 3] [--rows 64]
//
// One line a measurement: `section=... isa=... variant=... pages=... threads=N gbps=X` (or
// gflops=X), the best of --passes passes (for dram: of passes over the thread's experts).
#include <immintrin.h>
#include <sched.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "bench/expert_bench_lib.h"
#include "bench/fma_peak.h"
#include "common/thread_pool.h"
#include "cpu_expert_worker/kernels/dispatch.h"

namespace {

using ss::bench::Clock;
using ss::bench::SecondsSince;
constexpr int64_t kDim = 4096, kInter = 2048;

struct Options {
  std::vector<int> threads = {1, 2, 4, 8, 16};
  double gib = 2.0;
  std::vector<std::string> sections = {"fma", "stream", "l2", "l2rows", "dram"};
  std::vector<std::string> isas = {"avx2", "avx512"};
  int passes = 3;
  std::vector<int64_t> rows = {64};  // l2rows' token rows a call, 2..kMaxUnitRows
};

// Anonymous memory, advised for or against transparent huge pages, first touched by the pool.
struct Region {
  uint8_t* p = nullptr;
  size_t n = 0;
  Region(size_t bytes, bool huge) : n(bytes) {
    void* m = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) {
      std::perror("mmap");
      std::exit(1);
    }
    p = static_cast<uint8_t*>(m);
    madvise(p, n, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
  }
  ~Region() { munmap(p, n); }
};

int64_t AnonHugeKb() {
  std::ifstream f("/proc/self/smaps_rollup");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("AnonHugePages:", 0) == 0) return std::atoll(line.c_str() + 14);
  }
  return -1;
}

// Runs fn(thread) on each of the pool's workers once; returns the slowest worker's seconds.
double TimeEach(ss::ThreadPool& pool, const std::function<void(int)>& fn) {
  std::vector<double> secs(pool.size(), 0.0);
  if (!pool.RunOnEachWorker([&](int w) {
             const Clock::time_point t0 = Clock::now();
             fn(w);
             secs[w] = SecondsSince(t0);
           })
           .ok()) {
    std::fprintf(stderr, "pool failed\n");
    std::exit(1);
  }
  return *std::max_element(secs.begin(), secs.end());
}

// ---- fma ----
// The FMA peak at the ISA's vector width (amx: AVX-512's).
void Fma(ss::ThreadPool& pool, const Options& o, const std::string& isa) {
  const double best = ss::bench::FmaPeakGflops(&pool, isa == "avx512" || isa == "amx", o.passes);
  std::printf("section=fma isa=%s threads=%d gflops=%.1f per_thread=%.1f\n", isa.c_str(),
              pool.size(), best, best / pool.size());
}

// ---- ops ----
// Register-only throughput of single instructions: 12 independent chains x = op(x, a).
__attribute__((target("avx512f,avx512bw,avx512vnni"))) int32_t OpDpbusdZmm(int64_t iters) {
  __m512i x[12];
  for (int j = 0; j < 12; ++j) x[j] = _mm512_set1_epi32(j);
  const __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(5);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int j = 0; j < 12; ++j) x[j] = _mm512_dpbusd_epi32(x[j], a, b);
  }
  for (int j = 1; j < 12; ++j) x[0] = _mm512_add_epi32(x[0], x[j]);
  alignas(64) int32_t out[16];
  _mm512_store_si512(out, x[0]);
  return out[0];
}
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni"))) int32_t OpDpbusdYmm(int64_t iters) {
  __m256i x[12];
  for (int j = 0; j < 12; ++j) x[j] = _mm256_set1_epi32(j);
  const __m256i a = _mm256_set1_epi8(3), b = _mm256_set1_epi8(5);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int j = 0; j < 12; ++j) x[j] = _mm256_dpbusd_epi32(x[j], a, b);
  }
  for (int j = 1; j < 12; ++j) x[0] = _mm256_add_epi32(x[0], x[j]);
  alignas(32) int32_t out[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(out), x[0]);
  return out[0];
}
__attribute__((target("avx512f,avx512bw"))) int32_t OpMaddubsZmm(int64_t iters) {
  __m512i x[12];
  for (int j = 0; j < 12; ++j) x[j] = _mm512_set1_epi8(j);
  const __m512i a = _mm512_set1_epi8(3);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int j = 0; j < 12; ++j) x[j] = _mm512_maddubs_epi16(x[j], a);
  }
  for (int j = 1; j < 12; ++j) x[0] = _mm512_add_epi32(x[0], x[j]);
  alignas(64) int32_t out[16];
  _mm512_store_si512(out, x[0]);
  return out[0];
}
__attribute__((target("avx2"))) int32_t OpMaddubsYmm(int64_t iters) {
  __m256i x[12];
  for (int j = 0; j < 12; ++j) x[j] = _mm256_set1_epi8(j);
  const __m256i a = _mm256_set1_epi8(3);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int j = 0; j < 12; ++j) x[j] = _mm256_maddubs_epi16(x[j], a);
  }
  for (int j = 1; j < 12; ++j) x[0] = _mm256_add_epi32(x[0], x[j]);
  alignas(32) int32_t out[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(out), x[0]);
  return out[0];
}
__attribute__((target("avx2"))) int32_t OpMaddwdYmm(int64_t iters) {
  __m256i x[12];
  for (int j = 0; j < 12; ++j) x[j] = _mm256_set1_epi16(j);
  const __m256i a = _mm256_set1_epi16(3);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int j = 0; j < 12; ++j) x[j] = _mm256_madd_epi16(x[j], a);
  }
  for (int j = 1; j < 12; ++j) x[0] = _mm256_add_epi32(x[0], x[j]);
  alignas(32) int32_t out[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(out), x[0]);
  return out[0];
}
__attribute__((target("avx2"))) int32_t OpShufbYmm(int64_t iters) {
  __m256i x[12];
  for (int j = 0; j < 12; ++j) x[j] = _mm256_set1_epi8(j);
  const __m256i a = _mm256_set1_epi8(1);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int j = 0; j < 12; ++j) x[j] = _mm256_shuffle_epi8(a, x[j]);
  }
  for (int j = 1; j < 12; ++j) x[0] = _mm256_add_epi32(x[0], x[j]);
  alignas(32) int32_t out[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(out), x[0]);
  return out[0];
}
__attribute__((target("avx2,fma"))) int32_t OpFmaYmm(int64_t iters) {
  __m256 x[12];
  for (int j = 0; j < 12; ++j) x[j] = _mm256_set1_ps(0.001f * j);
  const __m256 m = _mm256_set1_ps(0.9999f), a = _mm256_set1_ps(1e-6f);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int j = 0; j < 12; ++j) x[j] = _mm256_fmadd_ps(x[j], m, a);
  }
  for (int j = 1; j < 12; ++j) x[0] = _mm256_add_ps(x[0], x[j]);
  alignas(32) float out[8];
  _mm256_store_ps(out, x[0]);
  return static_cast<int32_t>(out[0]);
}

struct OpLoop {
  const char* name;
  bool (*supported)();
  int32_t (*fn)(int64_t);
};
const OpLoop kOps[] = {
    {"fma_ymm", [] { return static_cast<bool>(__builtin_cpu_supports("fma")); }, OpFmaYmm},
    {"maddubs_ymm", [] { return static_cast<bool>(__builtin_cpu_supports("avx2")); }, OpMaddubsYmm},
    {"maddwd_ymm", [] { return static_cast<bool>(__builtin_cpu_supports("avx2")); }, OpMaddwdYmm},
    {"pshufb_ymm", [] { return static_cast<bool>(__builtin_cpu_supports("avx2")); }, OpShufbYmm},
    {"maddubs_zmm", [] { return static_cast<bool>(__builtin_cpu_supports("avx512bw")); },
     OpMaddubsZmm},
    {"dpbusd_ymm", [] { return static_cast<bool>(__builtin_cpu_supports("avx512vnni")); },
     OpDpbusdYmm},
    {"dpbusd_zmm", [] { return static_cast<bool>(__builtin_cpu_supports("avx512vnni")); },
     OpDpbusdZmm},
};

// Instructions per ns of every thread together (12 per iteration), and per thread.
void Ops(ss::ThreadPool& pool, const Options& o) {
  const int64_t iters = 10'000'000;
  std::vector<int32_t> sink(pool.size());
  for (const OpLoop& op : kOps) {
    if (!op.supported()) continue;
    double best = 0;
    for (int pass = 0; pass < o.passes; ++pass) {
      const double s = TimeEach(pool, [&](int w) { sink[w] += op.fn(iters); });
      best = std::max(best, pool.size() * iters * 12.0 / s / 1e9);
    }
    std::printf("section=ops op=%s threads=%d ginstr_per_s=%.2f per_thread=%.2f%s\n", op.name,
                pool.size(), best, best / pool.size(), sink[0] == 42 ? " " : "");
  }
}

// ---- stream ----
template <int kHint, int64_t kAhead>
uint64_t ReadPart(const uint8_t* p, size_t n) {
  uint64_t a0 = 0, a1 = 0;
  for (size_t i = 0; i < n; i += 64) {
    if constexpr (kAhead > 0) {
      _mm_prefetch(reinterpret_cast<const char*>(p + i + kAhead),
                   static_cast<decltype(_MM_HINT_T0)>(kHint));
    }
    uint64_t w[8];
    std::memcpy(w, p + i, 64);
    a0 += w[0] + w[2] + w[4] + w[6];
    a1 += w[1] + w[3] + w[5] + w[7];
  }
  return a0 ^ a1;
}

struct StreamVariant {
  const char* name;
  uint64_t (*fn)(const uint8_t*, size_t);
};
const StreamVariant kStreamVariants[] = {
    {"none", ReadPart<_MM_HINT_T0, 0>},       {"t0_4k", ReadPart<_MM_HINT_T0, 4096>},
    {"t0_16k", ReadPart<_MM_HINT_T0, 16384>}, {"nta_16k", ReadPart<_MM_HINT_NTA, 16384>},
    {"t2_16k", ReadPart<_MM_HINT_T2, 16384>}, {"t2_64k", ReadPart<_MM_HINT_T2, 65536>},
    {"nta_4k", ReadPart<_MM_HINT_NTA, 4096>},
};

void Stream(ss::ThreadPool& pool, const Options& o, Region& r, const char* pages) {
  const int n = pool.size();
  const size_t per = r.n / n / 4096 * 4096;
  std::vector<uint64_t> sink(n * 8);
  for (const StreamVariant& v : kStreamVariants) {
    double best = 0;
    for (int pass = 0; pass < o.passes; ++pass) {
      const double s = TimeEach(pool, [&](int w) { sink[w * 8] += v.fn(r.p + w * per, per); });
      best = std::max(best, static_cast<double>(per) * n / s / 1e9);
    }
    std::printf("section=stream variant=%s pages=%s threads=%d gbps=%.2f per_thread=%.2f\n", v.name,
                pages, n, best, best / n);
  }
}

// ---- kernels ----
struct ThreadExperts {
  std::vector<ss::expert::ExpertSliceView> views;
};

// Lays out `count` tiled experts of width `inter` back to back at p (random contents).
std::vector<ss::expert::ExpertSliceView> CarveExperts(uint8_t* p, int64_t count, int64_t inter,
                                                      int64_t tile_rows, uint64_t seed) {
  std::vector<ss::expert::ExpertSliceView> out;
  for (int64_t e = 0; e < count; ++e) {
    ss::expert::ExpertSliceView v;
    auto take = [&](int64_t bytes, bool scales) {
      ss::bench::FillSynthetic(seed + e * 7 + (scales ? 1 : 0), p, bytes, scales);
      const uint8_t* q = p;
      p += (bytes + 63) / 64 * 64;
      return q;
    };
    v.w1 = take(inter * kDim / 2, false);
    v.w1_scale = take(inter * kDim / 32, true);
    v.w3 = take(inter * kDim / 2, false);
    v.w3_scale = take(inter * kDim / 32, true);
    v.w2 = take(kDim * inter / 2, false);
    v.w2_scale = take(kDim * inter / 32, true);
    v.w2_stride = inter / 2;
    v.w2_scale_stride = inter / 32;
    v.tile_rows = tile_rows;
    out.push_back(v);
  }
  return out;
}

int64_t CarvedBytes(int64_t inter) {
  auto r = [](int64_t b) { return (b + 63) / 64 * 64; };
  return 2 * (r(inter * kDim / 2) + r(inter * kDim / 32)) + r(kDim * inter / 2) +
         r(kDim * inter / 32);
}

// Per-thread buffers of `rows` token rows' expert evaluation (x, h and out per row).
struct Scratch {
  static constexpr int64_t kRowFloats = kDim + kDim / 128 + kInter + kInter / 128 + kDim + 64;
  std::vector<uint8_t> ws;
  std::vector<float> storage;
  std::vector<const float*> xq, xs, hqc, hsc;
  std::vector<float*> hq, hs, out;
  Scratch(const ss::expert::ExpertKernel& k, int64_t inter, int64_t rows = 1) {
    ws.resize(ss::expert::ExpertUnitWorkspaceBytes(kDim, inter) + 64);
    storage.resize(rows * kRowFloats + 64);
    float* base =
        reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(storage.data()) + 63) & ~63);
    const std::vector<uint16_t> x = ss::bench::RandomBf16(kDim * rows, 5);
    for (int64_t i = 0; i < rows; ++i) {
      float* p = base + i * kRowFloats;
      xq.push_back(p);
      xs.push_back(p + kDim);
      hq.push_back(p + kDim + kDim / 128);
      hs.push_back(hq.back() + kInter);
      out.push_back(hs.back() + kInter / 128);
      hqc.push_back(hq.back());
      hsc.push_back(hs.back());
      k.quantize_row(x.data() + i * kDim, kDim, p, p + kDim);
    }
  }
};

bool GateUp(const ss::expert::ExpertKernel& k, Scratch& s, const ss::expert::ExpertSliceView& v,
            int64_t inter, int64_t c0, int64_t c1) {
  const std::vector<float> weights(s.xq.size(), 0.5f);
  ss::expert::GateUpCall c;
  c.rows = static_cast<int64_t>(s.xq.size());
  c.dim = kDim;
  c.inter_slice = inter;
  c.col_begin = c0;
  c.col_end = c1;
  c.expert = &v;
  c.xq_rows = s.xq.data();
  c.xs_rows = s.xs.data();
  c.weights = weights.data();
  c.hq_rows = s.hq.data();
  c.hs_rows = s.hs.data();
  return k.gate_up(c, s.ws.data(), s.ws.size()).ok();
}

bool Down(const ss::expert::ExpertKernel& k, Scratch& s, const ss::expert::ExpertSliceView& v,
          int64_t inter) {
  const ss::expert::ExpertSliceView* experts[1] = {&v};
  const int32_t offsets[2] = {0, 1};
  ss::expert::DownCall c;
  c.dim = kDim;
  c.inter_slice = inter;
  c.col_begin = 0;
  c.col_end = kDim;
  c.num_groups = 1;
  c.experts = experts;
  c.group_offsets = offsets;
  c.hq_rows = s.hqc.data();
  c.hs_rows = s.hsc.data();
  c.out_rows = s.out.data();
  return k.down(c, s.ws.data(), s.ws.size()).ok();
}

// rows = 1: GB/s of weights (decode); rows > 1: GFLOP/s (2 x rows x weights a call), the
// prefill-sized calls' compute rate.
void L2Rate(ss::ThreadPool& pool, const Options& o, const ss::expert::ExpertKernel& k,
            int64_t rows) {
  const int n = pool.size();
  const int64_t inter = 128, reps = rows == 1 ? 400 : 12;
  std::vector<std::unique_ptr<Region>> mem(n);
  std::vector<std::vector<ss::expert::ExpertSliceView>> views(n);
  std::vector<std::unique_ptr<Scratch>> scratch(n);
  TimeEach(pool, [&](int w) {
    mem[w] = std::make_unique<Region>(CarvedBytes(inter), false);
    views[w] = CarveExperts(mem[w]->p, 1, inter, k.tile_rows, 11 + w);
    scratch[w] = std::make_unique<Scratch>(k, inter, rows);
  });
  const double bytes = 2.0 * inter * (kDim / 2 + kDim / 32);  // w1 + w3 of the unit
  double best = 0;
  bool ok = true;
  for (int pass = 0; pass < o.passes; ++pass) {
    const double s = TimeEach(pool, [&](int w) {
      for (int64_t r = 0; r < reps; ++r) ok &= GateUp(k, *scratch[w], views[w][0], inter, 0, inter);
    });
    best = std::max(best, bytes * reps * n / s / 1e9);
  }
  if (rows == 1) {
    std::printf("section=l2 isa=%s threads=%d gbps=%.2f per_thread=%.2f%s\n", k.name, n, best,
                best / n, ok ? "" : " KERNEL-ERROR");
  } else {
    const double gflops = best / bytes * 2.0 * inter * kDim * 2 * rows;
    std::printf("section=l2rows isa=%s rows=%ld threads=%d gflops=%.1f per_thread=%.1f%s\n", k.name,
                rows, n, gflops, gflops / n, ok ? "" : " KERNEL-ERROR");
  }
}

void DramRate(ss::ThreadPool& pool, const Options& o, const ss::expert::ExpertKernel& k,
              bool huge) {
  const int n = pool.size();
  const int64_t per_expert = CarvedBytes(kInter);
  const int64_t count = std::max<int64_t>(
      1, static_cast<int64_t>(o.gib * (1 << 30) / n / static_cast<double>(per_expert)));
  std::vector<std::unique_ptr<Region>> mem(n);
  std::vector<std::vector<ss::expert::ExpertSliceView>> views(n);
  std::vector<std::unique_ptr<Scratch>> scratch(n);
  TimeEach(pool, [&](int w) {
    mem[w] = std::make_unique<Region>(count * per_expert, huge);
    views[w] = CarveExperts(mem[w]->p, count, kInter, k.tile_rows, 1000 + w * 997);
    scratch[w] = std::make_unique<Scratch>(k, kInter);
  });
  const int64_t huge_kb = AnonHugeKb();
  const double bytes = static_cast<double>(ss::bench::ExpertBytes(kDim, kInter)) * count * n;
  double best = 0;
  bool ok = true;
  for (int pass = 0; pass < o.passes; ++pass) {
    const double s = TimeEach(pool, [&](int w) {
      for (const ss::expert::ExpertSliceView& v : views[w]) {
        ok &= GateUp(k, *scratch[w], v, kInter, 0, kInter);
        ok &= Down(k, *scratch[w], v, kInter);
      }
    });
    best = std::max(best, bytes / s / 1e9);
  }
  std::printf(
      "section=dram isa=%s pages=%s threads=%d experts_per_thread=%ld gbps=%.2f per_thread=%.2f "
      "anon_huge_mb=%ld%s\n",
      k.name, huge ? "thp" : "4k", n, count, best, best / n, huge_kb / 1024,
      ok ? "" : " KERNEL-ERROR");
}

bool Has(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--threads") {
      o.threads.clear();
      for (const auto& t : absl::StrSplit(v, ','))
        o.threads.push_back(std::atoi(std::string(t).c_str()));
    } else if (a == "--gib") {
      o.gib = std::atof(v.c_str());
    } else if (a == "--sections") {
      o.sections = absl::StrSplit(v, ',');
    } else if (a == "--isa") {
      o.isas = absl::StrSplit(v, ',');
    } else if (a == "--passes") {
      o.passes = std::max(1, std::atoi(v.c_str()));
    } else if (a == "--rows") {
      o.rows.clear();
      for (const auto& r : absl::StrSplit(v, ',')) {
        const int64_t n = std::atoll(std::string(r).c_str());
        if (n < 2 || n > ss::expert::kMaxUnitRows) {
          std::fprintf(stderr, "--rows: %lld is outside 2..%lld\n", static_cast<long long>(n),
                       static_cast<long long>(ss::expert::kMaxUnitRows));
          return 2;
        }
        o.rows.push_back(n);
      }
    } else {
      std::fprintf(stderr, "unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  const int ncpu = static_cast<int>(std::thread::hardware_concurrency());
  std::printf("cpu_rates_bench: %d CPUs online; %.1f GiB buffers\n", ncpu, o.gib);
  std::unique_ptr<Region> huge, small;
  for (int t : o.threads) {
    if (t < 1 || t > ncpu) continue;
    ss::ThreadPoolOptions po;
    po.num_threads = t;
    for (int c = 0; c < t; ++c) po.cpus.push_back(c);
    po.spin_us = 0;
    po.name = "rates";
    auto pool = ss::ThreadPool::Create(po);
    if (!pool.ok()) return 1;
    (*pool)->PinCallingThread();
    ss::ThreadPool& p = **pool;
    for (const std::string& isa_name : o.isas) {
      auto isa = ss::expert::ParseIsa(isa_name);
      if (!isa.ok() || !ss::expert::IsaSupported(*isa)) continue;
      if (Has(o.sections, "fma")) Fma(p, o, isa_name);
    }
    if (Has(o.sections, "ops")) Ops(p, o);
    if (Has(o.sections, "stream")) {
      for (bool h : {true, false}) {
        std::unique_ptr<Region>& r = h ? huge : small;
        if (r == nullptr) {
          r = std::make_unique<Region>(static_cast<size_t>(o.gib * (1 << 30)), h);
          const size_t per = r->n / t;
          TimeEach(p, [&](int w) { std::memset(r->p + w * per, 1, per); });
          std::memset(r->p + per * t, 1, r->n - per * t);
          std::printf("buffer pages=%s anon_huge_mb=%ld\n", h ? "thp" : "4k", AnonHugeKb() / 1024);
        }
        Stream(p, o, *r, h ? "thp" : "4k");
      }
    }
    for (const std::string& isa_name : o.isas) {
      auto isa = ss::expert::ParseIsa(isa_name);
      if (!isa.ok() || !ss::expert::IsaSupported(*isa)) continue;
      const ss::expert::ExpertKernel* k = *ss::expert::KernelFor(*isa);
      if (Has(o.sections, "l2")) L2Rate(p, o, *k, 1);
      if (Has(o.sections, "l2rows")) {
        for (int64_t rows : o.rows) L2Rate(p, o, *k, rows);
      }
      if (Has(o.sections, "dram")) {
        DramRate(p, o, *k, true);
        DramRate(p, o, *k, false);
      }
    }
    std::fflush(stdout);
  }
  return 0;
}
