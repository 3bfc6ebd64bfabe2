// Why the expert store tiles its weights (cpu_expert_worker/expert_store.h): reading 1 GiB in
// the order the SIMD expert kernels consume a row-major MXFP4 matrix -- a tile of 16 rows,
// K block by K block (64 bytes a row), row by row: 16 streams 2 KB apart at Flash's k = 4096 --
// against reading the same bytes sequentially (the tiled layout's order). Both with the
// kernels' software prefetch (16 KB ahead in consumption order, non-temporal) and the bench's
// plain one (T0), on every core of the node given, one contiguous half each.
//
//   build/bin/read_order_bench [--threads 2] [--passes 3]
//
// Prints GB/s per pattern and pass, and the row-interleaved rate as a fraction of the
// sequential one measured in the same pass (the machine is shared and noisy).
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kBytes = size_t{1} << 30;
constexpr size_t kRowBytes = 2048;  // k = 4096 MXFP4
constexpr size_t kTileRows = 16, kLine = 64, kAheadLines = 256;

enum class Order { kSequential, kRowInterleaved };

template <int kHint>
uint64_t Read(const uint8_t* p, size_t n, Order order) {
  uint64_t a = 0;
  auto consume = [&](const uint8_t* line) {
    uint64_t w[8];
    std::memcpy(w, line, sizeof w);
    a += w[0] + w[3] + w[5] + w[7];
  };
  if (order == Order::kSequential) {
    for (size_t i = 0; i < n; i += kLine) {
      _mm_prefetch(reinterpret_cast<const char*>(p + i + kAheadLines * kLine),
                   static_cast<decltype(_MM_HINT_T0)>(kHint));
      consume(p + i);
    }
    return a;
  }
  const size_t tile = kTileRows * kRowBytes, nkb = kRowBytes / kLine;
  const size_t ahead = kAheadLines / kTileRows;  // in K-block steps
  for (size_t t0 = 0; t0 + tile <= n; t0 += tile) {
    for (size_t kb = 0; kb < nkb; ++kb) {
      const size_t pk = (kb + ahead) % nkb, pt = t0 + (kb + ahead) / nkb * tile;
      for (size_t r = 0; r < kTileRows; ++r) {
        if (pt + tile <= n) {
          _mm_prefetch(reinterpret_cast<const char*>(p + pt + r * kRowBytes + pk * kLine),
                       static_cast<decltype(_MM_HINT_T0)>(kHint));
        }
        consume(p + t0 + r * kRowBytes + kb * kLine);
      }
    }
  }
  return a;
}

double Pass(const uint8_t* buf, int threads, Order order, bool nta) {
  std::vector<std::thread> th;
  std::vector<uint64_t> sums(threads * 8);
  const size_t part = kBytes / threads / (kTileRows * kRowBytes) * (kTileRows * kRowBytes);
  const auto t0 = Clock::now();
  for (int c = 0; c < threads; ++c) {
    th.emplace_back([&, c] {
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(c, &set);
      pthread_setaffinity_np(pthread_self(), sizeof set, &set);
      const uint8_t* p = buf + c * part;
      sums[c * 8] = nta ? Read<_MM_HINT_NTA>(p, part, order) : Read<_MM_HINT_T0>(p, part, order);
    });
  }
  for (auto& t : th) t.join();
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  uint64_t total = 0;
  for (uint64_t v : sums) total += v;
  if (total == 42) std::printf(" ");
  return static_cast<double>(part) * threads / s / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, passes = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--threads") {
      threads = std::max(1, std::atoi(argv[i + 1]));
    } else if (a == "--passes") {
      passes = std::max(1, std::atoi(argv[i + 1]));
    } else {
      std::fprintf(stderr, "usage: %s [--threads N] [--passes N]\n", argv[0]);
      return 2;
    }
  }
  void* mem = std::aligned_alloc(size_t{2} << 20, kBytes);
  if (mem == nullptr) return 1;
  auto* buf = static_cast<uint8_t*>(mem);
  madvise(buf, kBytes, MADV_HUGEPAGE);
  for (size_t i = 0; i < kBytes; i += 4096) buf[i] = static_cast<uint8_t>(i >> 12);
  for (int pass = 0; pass < passes; ++pass) {
    for (const bool nta : {true, false}) {
      const double seq = Pass(buf, threads, Order::kSequential, nta);
      const double rows = Pass(buf, threads, Order::kRowInterleaved, nta);
      std::printf(
          "pass %d prefetch %s: sequential %.1f GB/s, 16 rows 2 KB apart %.1f GB/s = %.2f\n", pass,
          nta ? "NTA" : "T0 ", seq, rows, rows / seq);
    }
  }
  std::free(mem);
  return 0;
}
